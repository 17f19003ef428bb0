import os

# The Triton interpreter must be selected before any @triton.jit function runs.
os.environ.setdefault("TRITON_INTERPRET", "1")


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
