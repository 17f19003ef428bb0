import os
import random

import pytest
import torch
from hypothesis import HealthCheck, settings

# The Triton interpreter must be selected before any @triton.jit function runs.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Hypothesis profiles, for every module. The fuzz modules scale their budgets from the loaded
# profile's max_examples (200 in "ci" and "dev"). "ci" (Hypothesis' own CI profile extended) is the
# default, with or without CI set: derandomized and without an example database, so the README's
# test command gives the same verdict on every run and a fresh clone never replays an old failure.
# Random exploration is opt-in: HYPOTHESIS_PROFILE=dev draws new examples each run and replays past
# failures from .hypothesis/; HYPOTHESIS_PROFILE=long draws 5000 random examples per fuzz.
# Every profile prints the @reproduce_failure blob; the fuzz cases are slow and heavily filtered.
_FUZZ = dict(deadline=None, print_blob=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("ci", settings.get_profile("ci"), max_examples=200, **_FUZZ)
# (parented on "default" explicitly: with CI set, Hypothesis makes "ci" the parent of a new profile)
settings.register_profile("dev", settings.get_profile("default"), max_examples=200, **_FUZZ)
settings.register_profile("long", settings.get_profile("default"), max_examples=5000, **_FUZZ)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


def pytest_configure(config):
    # Helion's generated code calls libdevice.exp through inductor's triton_compat module, which
    # has no CPU implementation under the Triton interpreter; triton.language.math does.
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language
        from torch._inductor.runtime import triton_compat
    except Exception:  # triton or inductor absent: nothing to patch
        return
    triton_compat.libdevice = triton.language.math


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, whatever ran before it in its worker: a test
    drawing tensors with torch.randn gets the same values in every run and every file order."""
    random.seed(0)
    torch.manual_seed(0)
