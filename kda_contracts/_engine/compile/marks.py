"""torch.compile glue: functions dynamo runs at trace time instead of tracing them
(:func:`mark_constant_result`), and what tells whether a trace is under way.

Example::

    current_mode = mark_constant_result(current_mode)   # dynamo reads the mode at trace time
"""

from __future__ import annotations

import ctypes
import enum
import functools
import operator
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..errors import (
    ContractError,
    passthrough_for_compile,
)
from ..source import define, precompiled
from .trace_args import flatten, rebuild

F = TypeVar("F", bound=Callable[..., object])


# what a constant-result function gets as itself under torch.compile (see mark_constant_result)
#: torch >= 2.13 (some of dynamo's behaviour the engine adapts to changed there; 2.12 is not checked)
TORCH_2_13 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)
_OBJECTS_PASS = TORCH_2_13
_AS_ITSELF = (torch.Tensor, int, float, complex, str, bytes, type(None),
              torch.dtype, torch.device, torch.Size,
              tuple, list, dict, set, frozenset, type, enum.Enum, range, slice, type(len), type(lambda: None))


def _by_reference(value: Any) -> bool:
    """Whether dynamo hands ``value`` to a constant-result function by ``id`` (an object of a
    user class, an nn.Module, a config) rather than as itself (tensors, plain constants): only on
    torch < 2.13, which refuses such objects ("... is not a constant"); torch 2.13 hands them over
    (an object built inside the compiled region has no id of its own there)."""
    return not _OBJECTS_PASS and not isinstance(value, _AS_ITSELF)


def made_in_trace(obj: Any) -> bool:
    """Whether ``obj`` was built inside the region dynamo is tracing now: dynamo has then created it
    without running its ``__init__`` (its attributes are pending in the trace), so what it holds
    cannot be read at trace time. False outside a trace, or where dynamo's bookkeeping differs."""
    if not tracing_context():
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.variables.base import AttributeMutationNew

        var = InstructionTranslator.current_tx().output.side_effects.id_to_variable.get(id(obj))
        return var is not None and isinstance(var.mutation_type, AttributeMutationNew)
    except Exception:  # dynamo internals moved: not known, so not refused
        return False


def tracing_context() -> bool:
    """Whether a torch.compile/torch.export tracing context is active (also in the plain Python
    dynamo runs at trace time, where torch 2.11's ``is_compiling()`` is False)."""
    guards = sys.modules.get("torch._guards")
    return guards is not None and guards.TracingContext.try_get() is not None


def _concrete(value: Any) -> Any:
    """A symbolic int or float (a dynamic scalar argument under torch.compile) as its value in the
    traced call: read under dynamo, this specialises the trace on it (a guard), since a
    constant-result function takes only constants. Plain values come back as they are."""
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):  # (dynamo: a SymInt is an int)
        return operator.index(value)  # (dynamo keeps int(value) symbolic)
    if isinstance(value, (float, torch.SymFloat)):
        return value.__float__()  # (the same for a float; dynamo keeps float(value) symbolic)
    return value


def mark_constant_result(fn: F, *, at_trace: Callable[..., Any] | None = None) -> F:
    """What ``torch.compiler.assume_constant_result`` does, without importing ``torch._dynamo``:
    that import loads triton, and importing kda_contracts must not (the pytest plugin imports it
    before a conftest can select the Triton interpreter, which must precede triton's import).

    Dynamo traces a small stand-in (``_torchdynamo_inline``) that calls the real ``fn`` as a
    constant-result function at trace time, with symbolic ints and floats specialised (dynamo
    hands such functions only constants). Tensors and plain constants go to it as they are. Any
    other object (a config, a model layer) goes as itself on torch 2.13; torch 2.11 refuses it
    ("... is not a constant"), so there it goes by ``id``, which dynamo guards on (the object's
    identity, ID_MATCH), and is looked up again before ``fn`` runs (the object is alive: the
    frame being traced holds it). Lists, tuples and dicts are taken apart and rebuilt around their
    leaves (:mod:`kda_contracts._engine.compile.trace_args`), so each leaf goes as above, at any depth. Eager
    calls run ``fn`` unchanged: the stand-in is only an attribute of it. ``at_trace``, when
    given, runs at trace time instead of ``fn`` (for a function whose exception must become the
    contract's own error there: dynamo wraps any other exception a constant-result function
    raises).

    Example::

        current_mode = mark_constant_result(current_mode)   # dynamo reads the mode at trace time
    """
    run = fn if at_trace is None else at_trace

    def at_trace_time(layout: tuple[Any, ...], refs: tuple[bool, ...], names: tuple[str, ...], *leaves: Any) -> Any:
        real = [ctypes.cast(a, ctypes.py_object).value if r else a for r, a in zip(refs, leaves, strict=True)]
        values = [rebuild(part, real) for part in layout]
        cut = len(values) - len(names)
        return run(*values[:cut], **dict(zip(names, values[cut:], strict=True)))

    at_trace_time._dynamo_marked_constant = True  # type: ignore[attr-defined]  # the flag dynamo reads

    # closure-free (dynamo guards a stand-in's closure through the source of ``fn``, which has none)
    ns = {"_kc_at_trace_time": at_trace_time, "_kc_by_reference": _by_reference, "_kc_concrete": _concrete,
          "_kc_flatten": flatten}
    fn._torchdynamo_inline = define(_TRACED_CODE, "", "traced", ns)  # type: ignore[attr-defined]  # what dynamo traces
    return fn


_TRACED_SOURCE = """
def traced(*args, **kwargs):
    leaves = []
    layout = tuple(_kc_flatten(v, leaves) for v in (*args, *kwargs.values()))
    values = tuple(_kc_concrete(v) for v in leaves)
    refs = tuple(_kc_by_reference(v) for v in values)
    return _kc_at_trace_time(layout, refs, tuple(kwargs), *(id(v) if r else v for v, r in zip(values, refs)))
"""


_TRACED_CODE = precompiled(_TRACED_SOURCE, "<kda_contracts constant-result stand-in>")


def tracing() -> bool:
    """Whether torch.compile (or torch.export) is tracing: in traced code, where dynamo reads
    ``torch.compiler.is_compiling()`` as True, and in the plain Python it runs at trace time (a
    constant-result function, a fake kernel). torch 2.13 sets ``is_compiling``'s flag around
    constant-result functions; torch 2.11 does not, and there the active tracing context tells.
    Cheap enough for error paths, not meant for an eager hot path (a context lookup).

    Example::

        except ContractError as err:
            if tracing():
                raise passthrough_for_compile(err) from None
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return torch.compiler.is_compiling() or tracing_context()


def outside_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` so that torch.compile runs it in plain Python on the real arguments at trace
    time instead of tracing it (beartype's wrapper, the report builder, strict value checks).
    The generated shape checker itself *is* traced: its compares become guards. No eager cost:
    the marker is an attribute on the same function object."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContractError as err:
            if tracing():
                raise passthrough_for_compile(err) from None
            raise

    return mark_constant_result(run)


def eager_value_checks(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` (strict mode's value checks, which read tensor values) in eager code; inside
    torch.compile a warning at trace time instead, since reading values would break the graph
    (and a check run while tracing would judge only the traced call's values): compiled code
    is held to ``check`` mode. Costs the strict path one call; ``check`` mode nothing.

    Example::

        value_checks = eager_value_checks(run_value_checks, "my_op")
    """
    def warn() -> None:
        warnings.warn(f"kda_contracts: {name}: strict mode's value checks read tensor values and cannot run inside "
                      "torch.compile; the compiled code is checked as in check mode", RuntimeWarning, stacklevel=2)

    inside = mark_constant_result(warn)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # a constant under dynamo: the branch is not traced
            return inside()
        return fn(*args, **kwargs)

    return run
