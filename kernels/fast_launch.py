"""A Triton kernel launched straight through its compiled launcher after the first launch of each
specialization: ``kernel[grid](...)`` spends 15-25 µs of host time per call in Triton's
``JITFunction.run`` (binding, the specialization key, the cache lookup), which is most of a small
kernel's cost and, where the device has caught up (after a host sync), all of it. The key holds
what Triton specializes a kernel on: each tensor's dtype and 16-byte alignment, each int's class
(== 1, a multiple of 16, i32 or i64), the constexprs. Anything unexpected turns the fast path off for the
process with a warning (every launch then takes ``kernel[grid]``); so does
``KDA_TRITON_FAST_LAUNCH=0``. Under ``TRITON_INTERPRET`` there is no compiled kernel: always the
normal launch. (``triton_decode`` has its own, with its plan cache.)

Example::

    launch = FastLaunch(_gather_kernel)
    launch(grid, pool, h0, slots, n, BLOCK=4096)      # as _gather_kernel[grid](pool, h0, slots, n, BLOCK=4096)
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

__all__ = ["FastLaunch"]

_ON = {"enabled": os.environ.get("KDA_TRITON_FAST_LAUNCH", "1") not in ("", "0")}


def _int_class(x: int) -> int:
    if x == 1:
        return 1
    c = 2 if x % 16 == 0 else 0
    if not -0x80000000 <= x <= 0x7FFFFFFF:
        c += 8 if x > 0x7FFFFFFFFFFFFFFF else 4
    return c


class FastLaunch:
    """``FastLaunch(kernel)(grid, *args, **constexprs)``: the kernel's positional runtime arguments
    in order, its constexprs by name (all of them, in the kernel's order)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.cache: dict[tuple, tuple] = {}
        self.env: tuple | None = None

    def __call__(self, grid: tuple[int, ...], *args: Any, **constexprs: Any) -> None:
        key = self._key(args, constexprs) if _ON["enabled"] else None
        if key is not None:
            entry = self.cache.get(key)
            if entry is not None:
                run, function, packed, get_stream = entry
                g = (*grid, 1, 1)[:3]
                try:
                    run(*g, get_stream(key[0]), function, packed, None, None, None, *args, *constexprs.values())
                    return
                except Exception as exc:
                    self._off(f"the compiled kernel's launcher failed ({exc!r})")
                    key = None
        compiled = self.kernel[grid](*args, **constexprs)
        if key is not None and compiled is not None and not hasattr(compiled, "result"):
            try:
                n = len(list(compiled.src.signature))
                if n != len(args) + len(constexprs):
                    raise ValueError(f"{n} parameters in the signature, {len(args) + len(constexprs)} given")
                self.cache[key] = (compiled.run, compiled.function, compiled.packed_metadata, self.env[2])  # type: ignore[index]
            except Exception as exc:
                self._off(f"the compiled kernel is not as expected ({exc!r})")

    def _key(self, args: tuple, constexprs: dict[str, Any]) -> tuple | None:
        env = self.env
        if env is None:
            try:
                from triton.runtime.driver import driver
                from triton.runtime.jit import JITFunction

                if not isinstance(self.kernel, JITFunction):  # the interpreter
                    return None
                env = self.env = (driver.active.get_current_device, None, driver.active.get_current_stream)
            except Exception as exc:
                self._off(f"triton's driver API is not as expected ({exc!r})")
                return None
        spec = tuple((a.dtype, a.data_ptr() & 15 == 0) if isinstance(a, torch.Tensor) else
                     _int_class(a) if type(a) is int else type(a) for a in args)
        return (env[0](), spec, tuple(constexprs.items()))

    @staticmethod
    def _off(why: str) -> None:
        if _ON["enabled"]:
            _ON["enabled"] = False
            warnings.warn(f"kda_kernels.fast_launch: fast launch disabled, using kernel[grid]: {why}", RuntimeWarning,
                          stacklevel=3)
