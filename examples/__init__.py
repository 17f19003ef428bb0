"""Worked examples: user-written ops on the public API (``kc.op``), importable from the
repository root as ``examples.paged_attention`` and ``examples.selective_state_update``."""
