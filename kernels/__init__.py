"""KDA packed-decode kernels, installed under the import name ``kda_kernels``.

One module per backend: ``reference`` (PyTorch), ``triton_decode`` (Triton),
``helion_decode`` (Helion), ``fla_decode`` (flash-linear-attention, a peer); ``interface``
holds what they share (the signature of ``INTERFACE.md``, layouts, the q/k/v split, the
padding-safe row scatter). The kernels assume their inputs were already validated
by :mod:`kda_contracts`; this package imports nothing heavy at import time.
"""
