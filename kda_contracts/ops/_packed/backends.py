"""How a packed op's kernels are registered, one way for every packed op: an
:class:`InterfaceBackend` is a ``kc.Backend`` whose kernel takes the packed-decode kernel
interface (``kernels/INTERFACE.md``: ``kernel(mixed_qkv, a, b, A_log, dt_bias, scale, state, out,
indices, *, num_heads, use_qk_l2norm, lower_bound, state_layout)``) and which may restrict the
state dtypes, layouts and gates it supports; :func:`shipped_kernels` makes the ``kda_kernels``
ones. A kernel that cannot take that call is refused when it is registered (or, given as
``"module:function"``, when it is loaded), never chosen by ``auto``, and ``auto`` says so.

Plug-in packages ship backends through the entry-point group ``kda_contracts.backends``
(packed decode also reads its older group, ``kda_contracts.adapters``).

Example::

    op.register_backend(InterfaceBackend(name="mine", kernel="my_pkg.kernels:packed_decode",
                                         op="packed_decode", devices=("cuda",), priority=50))
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._engine import AnnotationError, Backend, CallInfo
from .checks import VALUE_RULES
from .layouts import SYMBOLS

#: the names of the checks a packed decode kernel makes itself in watch mode, in its order
#: (``kda_kernels.interface.WATCH_CHECKS``): :data:`~.checks.VALUE_RULES`, rule for rule
WATCH_CHECKS = ("in_range", "distinct", "finite_rows", "finite_mixed_qkv", "finite_a", "finite_b",
                "finite_A_log", "finite_dt_bias")

_INTERFACE_ARGS = 9  # mixed_qkv ... indices, then the keywords below
_INTERFACE_KEYWORDS = ("num_heads", "use_qk_l2norm", "lower_bound", "state_layout")


@dataclass(frozen=True)
class InterfaceBackend(Backend):
    """A backend of a packed op whose kernel takes the kernel interface. ``state_dtypes``,
    ``layouts`` and ``gates`` restrict what it supports (``gates`` matters to an op with a
    ``lower_bound`` argument, KDA's: None there is the softplus gate, a bound the bounded one)."""

    state_dtypes: frozenset[torch.dtype] | None = None
    layouts: frozenset[str] = frozenset({"VK", "KV"})
    gates: frozenset[str] = frozenset({"softplus", "bounded"})

    def __post_init__(self) -> None:
        super().__post_init__()
        who = self.who()
        for attr, allowed, takes in (("state_dtypes", None, "torch dtypes, e.g. (torch.float32,), or None for all"),
                                     ("layouts", ("VK", "KV"), "state layouts among 'VK' and 'KV'"),
                                     ("gates", ("softplus", "bounded"), "gates among 'softplus' and 'bounded'")):
            value = getattr(self, attr)
            if value is None and attr == "state_dtypes":
                continue
            # never silent: a typo ("vk", "float32") or an empty set would leave the backend never chosen
            items = tuple(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else None
            bad = None if items is None else next(
                (v for v in items if not (isinstance(v, torch.dtype) if allowed is None else v in allowed)), None)
            if not items or bad is not None:
                why = " (none: the backend would never run)" if items == () else f" ({bad!r} is not one)" \
                    if bad is not None else ""
                raise AnnotationError(f"{who}: {attr}= takes a collection of {takes}, got {value!r}{why}")
            object.__setattr__(self, attr, frozenset(items))

    def key_args(self, floating: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (("initial_state",) if self.state_dtypes is not None else (),
                ("lower_bound",) if self.gates != {"softplus", "bounded"} else ())

    def extra_unsupported(self, info: CallInfo) -> list[str]:
        why = []
        state = info.dtypes.get("initial_state")
        if self.state_dtypes is not None and state is not None and state not in self.state_dtypes:
            why.append(f"state dtype {str(state).removeprefix('torch.')} not supported")
        if info.variant is not None and info.variant not in self.layouts:
            why.append(f"state layout {info.variant} not supported")
        gate = "softplus" if "lower_bound" in info.absent else "bounded"
        if gate not in self.gates:
            why.append(f"{gate} gate not supported")
        return why

    def signature_problem(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter]) -> str | None:
        try:
            sig = inspect.signature(kernel)
        except (TypeError, ValueError) as exc:
            return f"its signature cannot be read ({exc})"
        try:
            sig.bind(*range(_INTERFACE_ARGS), **dict.fromkeys(_INTERFACE_KEYWORDS))
        except TypeError as exc:
            return (f"it cannot be called as kernels/INTERFACE.md says (9 tensors and scalars, then "
                    f"{', '.join(k + '=' for k in _INTERFACE_KEYWORDS)}): {exc}")
        return None

    def make_runner(self, kernel: Callable[..., Any], params: Sequence[inspect.Parameter],
                    dims_types: Mapping[str | None, type]) -> Callable[..., Any]:
        from kda_kernels.interface import DecodeBackend  # plain torch (no triton, helion or fla)

        launch = kernel.launch if isinstance(kernel, DecodeBackend) else None
        if launch is not None and all(t._fields == SYMBOLS for t in dims_types.values()):  # type: ignore[attr-defined]
            run = _launcher(launch, gated="lower_bound" in {p.name for p in params})
            if getattr(kernel, "watch_checks", None) == WATCH_CHECKS:  # (its kernel makes watch mode's checks)
                run.kda_watched = _watched(launch, gated="lower_bound" in {p.name for p in params})  # type: ignore[attr-defined]
            return run
        heads = {v: t._fields.index("H") for v, t in dims_types.items()}  # type: ignore[attr-defined]
        return _interface_caller(kernel, heads, gated="lower_bound" in {p.name for p in params})


def _launcher(launch: Callable[..., None], *, gated: bool) -> Callable[..., Any]:
    """A ``kda_kernels`` DecodeBackend handed the dims the contract bound (not read again)."""
    if gated:
        def run_with_dims(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any,
                          dt_bias: Any, scale: float, initial_state: Any, out: Any, ssm_state_indices: Any,
                          use_qk_l2norm_in_kernel: bool, lower_bound: float | None, *, config: Any,
                          state_layout: Any) -> None:
            launch(d, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   use_qk_l2norm_in_kernel, lower_bound, layout)

        return run_with_dims

    def run_softplus(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                     scale: float, initial_state: Any, out: Any, ssm_state_indices: Any,
                     use_qk_l2norm_in_kernel: bool = False, *, config: Any, state_layout: Any) -> None:
        launch(d, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               use_qk_l2norm_in_kernel, None, layout)

    return run_softplus


def _watched(launch: Callable[..., None], *, gated: bool) -> Callable[..., Any]:
    """Watch mode's runner of a kernel that makes :data:`~kda_kernels.interface.WATCH_CHECKS` itself:
    as :func:`_launcher`'s, handed what the engine gives it to record into (``own``: the fields of a
    ``kda_kernels.interface.WatchArgs``); ``rules``: the op's value rules in the kernel's check order."""
    def run_watched(own: Any, d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any,
                    dt_bias: Any, scale: float, initial_state: Any, out: Any, ssm_state_indices: Any,
                    use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None, *, config: Any,
                    state_layout: Any) -> None:
        launch(d, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               use_qk_l2norm_in_kernel, lower_bound if gated else None, layout, watch=own)

    run_watched.rules = VALUE_RULES  # type: ignore[attr-defined]
    return run_watched


def _interface_caller(kernel: Callable[..., Any], heads: Mapping[str | None, int], *,
                      gated: bool) -> Callable[..., Any]:
    """A kernel in the interface convention, called with the head count the contract bound."""
    if gated:
        def run(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                scale: float, initial_state: Any, out: Any, ssm_state_indices: Any, use_qk_l2norm_in_kernel: bool,
                lower_bound: float | None, *, config: Any, state_layout: Any) -> None:
            kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   num_heads=d[heads[layout]], use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=lower_bound,
                   state_layout=layout)

        return run

    def run_softplus(d: tuple[int, ...], layout: str, mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                     scale: float, initial_state: Any, out: Any, ssm_state_indices: Any,
                     use_qk_l2norm_in_kernel: bool = False, *, config: Any, state_layout: Any) -> None:
        kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               num_heads=d[heads[layout]], use_qk_l2norm=use_qk_l2norm_in_kernel, lower_bound=None,
               state_layout=layout)

    return run_softplus


def cpu_if_interpreting() -> tuple[str, ...]:
    """``("cpu",)`` under ``TRITON_INTERPRET`` (a backend then runs on the CPU when asked by name,
    for tests). Read per call: a conftest may set it after kda_contracts is imported."""
    return ("cpu",) if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else ()


def probe(module: str, check: str = "is_available", *, interpreted: bool = False) -> Callable[[], tuple[bool, str]]:
    """An availability check that imports ``module`` only when asked and calls its ``check()``;
    ``interpreted``: under ``TRITON_INTERPRET`` a module that imports is available (it then runs on
    the CPU when asked by name)."""

    def available() -> tuple[bool, str]:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            return False, f"{module} fails to import ({type(exc).__name__}: {exc})"
        ok, why = getattr(mod, check)()
        if not ok and interpreted and cpu_if_interpreting() and "CUDA" in why:
            return True, "the Triton interpreter (TRITON_INTERPRET is set)"
        return ok, why

    return available


def shipped_kernels(op: str, kernels: Mapping[str, tuple[int, str, str, str, str, bool]],
                    make: Callable[..., InterfaceBackend] = InterfaceBackend, *, interpreter_probe: bool = False
                    ) -> list[InterfaceBackend]:
    """The ``kda_kernels`` backends of a packed op, one per entry ``name: (priority, module,
    function, availability check, description, runs on the CPU when asked by name under the
    interpreter)``; ``interpreter_probe``: see :func:`probe`."""
    return [make(name=name, kernel=f"{module}:{function}", devices=("cuda",), priority=priority, requires=(name,),
                 availability=probe(module, check, interpreted=interpreter_probe), description=description, op=op,
                 explicit_devices=cpu_if_interpreting if interpreted else ())
            for name, (priority, module, function, check, description, interpreted) in kernels.items()]
