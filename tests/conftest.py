import os

from hypothesis import HealthCheck, settings

# The Triton interpreter must be selected before any @triton.jit function runs.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Hypothesis profiles, for every module. The fuzz modules scale their budgets from the loaded
# profile's max_examples (200 in "dev" and "ci"). "ci" (under CI=true) extends Hypothesis' own CI
# profile: derandomized, no example database. "dev" (the default) draws new examples each run and
# replays past failures from .hypothesis/. "long": HYPOTHESIS_PROFILE=long, for long local runs.
# Every profile prints the @reproduce_failure blob; the fuzz cases are slow and heavily filtered.
_FUZZ = dict(deadline=None, print_blob=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("ci", settings.get_profile("ci"), max_examples=200, **_FUZZ)
settings.register_profile("dev", max_examples=200, **_FUZZ)
settings.register_profile("long", max_examples=5000, **_FUZZ)
_IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _IN_CI else "dev"))


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
