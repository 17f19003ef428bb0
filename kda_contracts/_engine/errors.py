"""The exception hierarchy and the report a violated contract produces.

Two roles, as in jaxtyping: :class:`AnnotationError` says the *contract* is malformed (raised
once, at decoration time; its subclass :class:`ConfigError`, also a ValueError, says a config
is); :class:`ContractError` and its subclasses say a *call* broke a well-formed contract (raised
per call). A call that breaks several rules at once raises one error listing all of them; its
class derives from every subclass involved, so ``except DtypeError`` still catches a call whose
dtype *and* shape were wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

_F = TypeVar("_F")


class AnnotationError(TypeError):
    """A contract itself is malformed: bad dim grammar, a dim nothing can bind, a bad spec.

    Raised at decoration time, never per call.

    Example::

        @kc.contract
        def f(x: Float[Tensor, "B Q"]) -> None: ...   # fine: B and Q bind from x
        @kc.contract
        def g(x: Float[Tensor, "B 2*Q"]) -> None: ... # fine: Q is solved from x.shape[1]
        @kc.contract
        def h(x: Float[Tensor, "B Q*R"]) -> None: ... # AnnotationError: Q and R cannot both be solved
    """


class ConfigError(AnnotationError, ValueError):
    """A config is malformed: a ``KDAConfig``/``GDNConfig`` field of the wrong type or out of range,
    fields that disagree (heads not divisible by ``tp_size``), an unknown preset, a Hugging Face
    config that cannot be read. Raised when the config is made (or copied, or assigned to), never
    per call.

    Both an :class:`AnnotationError` (a bad contract input, like a bad ``config=``) and a
    :class:`ValueError` (what pydantic's own error was, so ``except ValueError`` keeps working).
    The pydantic error, when there is one, is its ``__cause__``; ``problems`` lists each problem
    as ``(field path, message)``.

    Example::

        try:
            kc.KDAConfig(num_heads=32, head_k_dim=128, tp_size=3)
        except kc.ConfigError as err:
            print(err)   # invalid KDAConfig: num_heads=32 is not divisible by tp_size=3; ...
    """

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)


class ContractError(ValueError):
    """A call broke its contract. Base class of every per-call error of this library.

    ``violations`` holds one :class:`Violation` per broken rule; ``dims`` the dims that could be
    bound, with ``provenance`` saying where each came from. ``str(err)`` is the full report.
    No tensor values are ever included.

    Example::

        try:
            kc.validate_packed_decode(...)
        except kc.ContractError as err:
            for v in err.violations:
                print(v.argument, v.kind.__name__)
    """

    kind_name: ClassVar[str] = "ContractError"

    def __init__(
        self,
        message: str,
        *,
        function: str = "",
        violations: Sequence[Violation] = (),
        dims: dict[str, int] | None = None,
        provenance: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.function = function
        self.violations: tuple[Violation, ...] = tuple(violations)
        self.dims: dict[str, int] = dict(dims or {})
        self.provenance: dict[str, str] = dict(provenance or {})

    def __reduce__(self):  # keep pickling working for the dynamically combined classes
        kinds = tuple(v.kind for v in self.violations) or (type(self),)
        return (_rebuild_error, (kinds, str(self), self.function, self.violations, self.dims, self.provenance))


class ShapeError(ContractError):
    """A rank or a dim does not match the contract (including dims solved from packed widths)."""

    kind_name = "ShapeError"


class DtypeError(ContractError):
    """A tensor's dtype is outside the allowed set, or differs from the one it must match."""

    kind_name = "DtypeError"


class DeviceError(ContractError):
    """Tensors of one call live on different devices."""

    kind_name = "DeviceError"


class LayoutError(ContractError):
    """Strides break the layout rule (contiguity of the last dim, of a state slot, of the tensor)."""

    kind_name = "LayoutError"


class ValueRangeError(ContractError):
    """A value is out of range: a scalar (``scale <= 0``), or, in strict mode, tensor contents
    (index out of the pool, duplicate slots, non-finite inputs, aliasing)."""

    kind_name = "ValueRangeError"


class ArgumentTypeError(ContractError, TypeError):
    """An argument has the wrong Python type (a list where a Tensor is due, an int for a bool).

    Also a :class:`TypeError`, since that is what it is; raised from beartype's verdict.
    """

    kind_name = "ArgumentTypeError"


class BackendError(ContractError):
    """The requested backend cannot run this call (not installed, wrong device, unsupported), or
    code of one's own that a call runs (an op's hook, a value rule's probe) raised or gave back
    the wrong kind."""

    kind_name = "BackendError"


@dataclass(frozen=True)
class Violation:
    """One broken rule of one call: what was expected, what was got, and how to fix it."""

    kind: type[ContractError]
    argument: str
    expected: str
    got: str
    details: tuple[str, ...] = ()
    hint: str | None = None
    # Typed facts for hints and tests (kda_contracts._engine.facts): what exactly broke, as data.
    facts: tuple[object, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        """AnnotationError when made with fields of the wrong kind (a report could not say them);
        ``details`` and ``facts`` given as a list are kept as tuples."""
        if not (isinstance(self.kind, type) and issubclass(self.kind, ContractError)):
            raise AnnotationError(f"kc.Violation(kind={self.kind!r}): kind must be a kc.ContractError subclass "
                                  "(kc.ShapeError, kc.DtypeError, kc.ValueRangeError, ...)")
        for name in ("argument", "expected", "got"):
            if not isinstance(getattr(self, name), str):
                raise AnnotationError(f"kc.Violation({name}={getattr(self, name)!r}): {name} must be a str")
        if self.hint is not None and not isinstance(self.hint, str):
            raise AnnotationError(f"kc.Violation(hint={self.hint!r}): hint must be a str or None")
        for name in ("details", "facts"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
                raise AnnotationError(f"kc.Violation({name}={value!r}): {name} must be a tuple (or list) of "
                                      f"{'str' if name == 'details' else 'objects'}")
            if name == "details" and not all(isinstance(d, str) for d in value):
                raise AnnotationError(f"kc.Violation(details={value!r}): details must be a tuple (or list) of str")
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def with_hint(self, hint: str | None) -> Violation:
        if hint is None or self.hint is not None:
            return self
        return Violation(self.kind, self.argument, self.expected, self.got, self.details, hint, self.facts)

    def fact(self, kind: type[_F]) -> _F | None:
        """The first fact of type ``kind`` this violation carries, or None."""
        return next((f for f in self.facts if isinstance(f, kind)), None)


def hook_violations(result: Any, who: str) -> list[Violation]:
    """What a contract's check hook (``value_checks=``, ``after=``) returned, as a list of
    :class:`Violation`; anything else is the contract's mistake, an AnnotationError naming the hook
    (a hook that found nothing returns ``[]``; ``None`` is refused, since a missing ``return`` looks
    the same).

    Example::

        hook_violations(value_checks(ctx), "f: value_checks")   # [] or [Violation(...), ...]
    """
    items = None if isinstance(result, (Violation, str, bytes)) or result is None else result
    try:
        found = list(items) if items is not None else None
    except TypeError:
        found = None
    if found is None or not all(isinstance(v, Violation) for v in found):
        what = type(result).__name__ if found is None else \
            f"a {type(result).__name__} holding {type(next(v for v in found if not isinstance(v, Violation))).__name__}"
        raise AnnotationError(f"{who} returned {what}; it must return a list of kc.Violation ([] when the call "
                              "is fine)")
    return found


def uninspectable(exc: Exception) -> Violation:
    """The violation of a call whose arguments the slow path could not inspect (it raised ``exc``):
    an object no rule foresaw is still a ContractError, never a crash."""
    return Violation(ArgumentTypeError, "arguments", "arguments the contract can inspect",
                     f"{type(exc).__name__}: {exc}",
                     hint="an argument is not what its annotation says (or a config is of the wrong kind)")


_COMBINED: dict[tuple[type[ContractError], ...], type[ContractError]] = {}


def error_class_for(kinds: Sequence[type[ContractError]]) -> type[ContractError]:
    """The class to raise for a set of violation kinds: the kind itself, or a cached class that
    derives from each distinct kind (so every matching ``except`` clause catches it)."""
    distinct: list[type[ContractError]] = []
    for k in kinds:
        if k not in distinct:
            distinct.append(k)
    if not distinct:  # (no violation to report: the caller's inconsistency, still a ContractError)
        return ContractError
    if len(distinct) == 1:
        return distinct[0]
    key = tuple(distinct)
    cls = _COMBINED.get(key)
    if cls is None:
        name = "And".join(k.kind_name for k in key)
        cls = type(name, key, {"kind_name": name, "__module__": __name__})
        _COMBINED[key] = cls
    return cls


def _rebuild_error(kinds, message, function, violations, dims, provenance):
    cls = error_class_for(kinds)
    return cls(message, function=function, violations=violations, dims=dims, provenance=provenance)


_PASSTHROUGH: dict[type[ContractError], type[ContractError]] = {}


def passthrough_for_compile(err: ContractError) -> ContractError:
    """The same error as a class that also derives from AssertionError and IndexError.

    torch.compile re-wraps any exception raised while tracing into an InternalTorchDynamoError,
    except a few kinds (AssertionError among them) that it lets through unchanged, and any
    exception of a fake (meta) kernel into a TorchRuntimeError, except an IndexError; this keeps
    ``except kc.ShapeError`` working around a compiled function and a compiled custom op.
    """
    base = type(err)
    cls = _PASSTHROUGH.get(base)
    if cls is None:
        cls = _PASSTHROUGH[base] = type(base.__name__, (base, AssertionError, IndexError),
                                        {"kind_name": base.kind_name, "__module__": __name__})
    return cls(str(err), function=err.function, violations=err.violations, dims=err.dims,
               provenance=err.provenance)


def format_report(
    function: str,
    violations: Sequence[Violation],
    dims: dict[str, int],
    provenance: dict[str, str],
) -> str:
    """Render the multi-line report of a rejected call (every violation, with provenance and fixes)."""
    n = len(violations)
    lines = [f"{function}(): {n} contract violation{'s' if n != 1 else ''}"]
    for i, v in enumerate(violations, 1):
        lines.append(f"  [{i}] {v.argument}: {v.kind.kind_name}")
        lines.append(f"      expected {v.expected}")
        lines.append(f"      got      {v.got}")
        for d in v.details:
            lines.append(f"      {d}")
        if v.hint:
            lines.append(f"      fix: {v.hint}")
    if dims:
        bound = "; ".join(f"{k}={dims[k]} {provenance.get(k, '')}".rstrip() for k in dims)
        lines.append(f"  dims: {bound}")
    return "\n".join(lines)


def raise_violations(
    function: str,
    violations: Sequence[Violation],
    dims: dict[str, int],
    provenance: dict[str, str],
    *,
    cause: BaseException | None = None,
) -> None:
    """Raise one error carrying every violation of the call (``cause``: the exception behind it)."""
    cls = error_class_for([v.kind for v in violations])
    message = format_report(function, violations, dims, provenance)
    raise cls(message, function=function, violations=violations, dims=dims, provenance=provenance) from cause


def _hint_text(tp: Any) -> str:
    """A hint as a report words it: a class by its name, anything else without module prefixes."""
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("jaxtyping.", "").replace("typing.", "").replace("torch.", "")
