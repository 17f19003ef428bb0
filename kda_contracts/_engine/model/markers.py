"""Markers users write next to an annotation (``kc.Spec``, ``kc.Range``, ``kc.MatchConfig``,
``kc.Where``) and the config protocol: how a config object fixes dims and dtypes.

A config is a ``KDAConfig``, any object with ``contract_dims()`` (and optionally
``contract_dim_source(sym)`` and ``contract_dtypes()``), or a plain pydantic model whose int
fields are named like dims.

Example::

    scale: Annotated[float, kc.Range(gt=0), kc.MatchConfig("scale", rel_tol=1e-6)]
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import NoneType
from typing import Any

import torch

from ..errors import AnnotationError, ContractError, ShapeError
from ..source import define


# -- what users write next to an annotation ------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """Rules for one tensor beyond its shape, given as ``Annotated[Float[Tensor, ...], kc.Spec(...)]``.

    - ``dtypes``: the allowed dtypes (narrows the jaxtyping category, e.g. ``Float``).
    - ``contiguous``: the whole tensor must be contiguous.
    - ``inner_contiguous``: the last *n* dims must form one dense row-major block (``1``: the last
      dim has stride 1; ``3`` on a ``[N, HV, V, K]`` pool: each slot is dense, the pool stride is free).
    - ``dim_order``: the tensor is dense with its dims laid out in this order, outermost first (as
      ``torch.Tensor.dim_order()`` gives it): ``(1, 0)`` on ``[B, D]`` is a transposed
      (column-major) tensor, strides ``[1, B]``; ``(0, 2, 3, 1)`` on ``[N, C, H, W]`` is
      channels-last; ``(0, 1, ..., n-1)`` is contiguous. Every stride follows from the shape (size-1
      dims and empty tensors aside, as ``is_contiguous()`` has it), so on a return it is also the
      layout ``op.torch_op``'s fake implementation gives the result. A tensor of fixed rank only.
    - ``same_dtype_as``: name of another tensor argument whose dtype this one must equal.
    - ``config_dtype``: a role (``"state"``, ``"activation"``, ``"index"``) whose dtype the config
      may pin (see ``KDAConfig.contract_dtypes``).
    - ``same_device``: must share the device of the call's first tensor (default True).
    - ``disjoint``: the tensor is written in place, so its dense inner blocks must not share
      memory (with ``inner_contiguous=3`` on a pool: ``stride(0) >= HV*V*K`` unless N == 1; an
      ``.expand()``ed pool is rejected).
    - ``mutated``: the op writes this tensor in place (an op's custom op declares it mutated;
      docs mark it as written; in strict mode a ``@kc.contract`` function whose result is
      rejected has it copied back first, as an op's transaction does; check mode copies nothing).

    Example::

        state: Annotated[Float[Tensor, "N HV V K"], kc.Spec(inner_contiguous=3, config_dtype="state")]
        def f(...) -> Annotated[Float[Tensor, "B D"], kc.Spec(dim_order=(1, 0))]: ...   # a transposed result
    """

    dtypes: tuple[torch.dtype, ...] | None = None
    contiguous: bool = False
    inner_contiguous: int = 0
    same_dtype_as: str | None = None
    config_dtype: str | None = None
    same_device: bool = True
    disjoint: bool = False
    mutated: bool = False
    dim_order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("dim_order", "dtypes"):  # (a frozen Spec is hashed: keep tuples; a set's dtypes sorted)
            value = getattr(self, name)
            if isinstance(value, (list, set, frozenset)):
                object.__setattr__(self, name, tuple(sorted(value, key=str) if not isinstance(value, list) else value))
        if self.dtypes is not None and not (isinstance(self.dtypes, tuple)
                                            and all(isinstance(d, torch.dtype) for d in self.dtypes)):
            raise AnnotationError(f"kc.Spec(dtypes={self.dtypes!r}): give a tuple of torch dtypes, "
                                  "e.g. dtypes=(torch.float32, torch.bfloat16)")
        for name in ("contiguous", "same_device", "disjoint", "mutated"):
            _refuse_kind("kc.Spec", name, getattr(self, name), bool, "True or False")
        if not _is_int(self.inner_contiguous) or self.inner_contiguous < 0:
            raise AnnotationError(f"kc.Spec(inner_contiguous={self.inner_contiguous!r}): give the number of "
                                  "trailing dims that must be dense, an int >= 0")
        for name in ("same_dtype_as", "config_dtype"):
            _refuse_kind("kc.Spec", name, getattr(self, name), (str, NoneType), "a name (str) or None")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _refuse_kind(origin: str, name: str, value: Any, kind: type | tuple[type, ...], want: str) -> None:
    """AnnotationError unless ``value`` is of ``kind`` (a bool is not taken for a number)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple)
                                                                              else (kind,))):
        raise AnnotationError(f"{origin}({name}={value!r}): {name} must be {want}, got a {type(value).__name__}")


@dataclass(frozen=True)
class Range:
    """Bounds for a scalar: ``Annotated[float, kc.Range(gt=0)]``. NaN is always out of range.

    Example::

        lower_bound: Annotated[float | None, kc.Range(lt=0)] = None   # None skips the check
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    finite: bool = False  # also refuse +-inf

    def __post_init__(self) -> None:
        for name in ("gt", "ge", "lt", "le"):  # numpy scalars as Python numbers (the checker prints them)
            v = getattr(self, name)
            _refuse_kind("kc.Range", name, v, (numbers.Real, NoneType), "a number or None")
            if v is not None:
                object.__setattr__(self, name, int(v) if isinstance(v, numbers.Integral) else float(v))
        _refuse_kind("kc.Range", "finite", self.finite, bool, "True or False")

    def holds(self, x: float) -> bool:
        """Whether ``x`` is in range: the generated checker's own test (``render``), compiled once."""
        return self._test(x)

    @cached_property
    def _test(self) -> Callable[[float], bool]:
        return define(f"def holds(x):\n    return bool({self.render('x')})\n", "<kda_contracts range>", "holds")

    def describe(self) -> str:
        parts = [f"{op} {v}" for op, v in (("> ", self.gt), (">=", self.ge), ("< ", self.lt), ("<=", self.le))
                 if v is not None]
        text = " and ".join(p.replace("  ", " ") for p in parts)
        if self.finite:
            return f"finite and {text}" if text else "finite"
        return text or "any number"

    def render(self, var: str) -> str:
        """Python source that is True when ``var`` is in range."""
        terms = [f"{var} - {var} == 0" if self.finite else f"{var} == {var}"]  # NaN (and inf) fail
        for op, v in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le)):
            if v is not None:  # repr(inf) is not Python source
                terms.append(f"{var} {op} {v!r}" if math.isfinite(v) else f"{var} {op} float({str(v)!r})")
        return " and ".join(terms)

    def malformed(self) -> str | None:
        """Why no value can satisfy this range (a NaN bound, bounds that exclude each other)."""
        bounds = [v for v in (self.gt, self.ge, self.lt, self.le) if v is not None]
        if any(v != v for v in bounds):
            return "a bound is NaN"
        lows = [(v, True) for v in (self.gt,) if v is not None] + [(v, False) for v in (self.ge,) if v is not None]
        highs = [(v, True) for v in (self.lt,) if v is not None] + [(v, False) for v in (self.le,) if v is not None]
        for lo, lo_strict in lows:
            for hi, hi_strict in highs:
                if lo > hi or (lo == hi and (lo_strict or hi_strict)):
                    return f"no number is {self.describe()}"
        return None


class _ConfigLacks:
    """What a config without a MatchConfig attribute gives for it (the scalar is then free)."""

    def __repr__(self) -> str:
        return "CONFIG_LACKS"


CONFIG_LACKS = _ConfigLacks()


@dataclass(frozen=True)
class MatchConfig:
    """A scalar that must equal a config attribute when the call has a config:
    ``Annotated[float, kc.MatchConfig("scale", rel_tol=1e-6)]``. Without a config, or with a
    config that has no such attribute (a plain pydantic model of dims), it is free.

    Example::

        lower_bound: Annotated[float | None, kc.Range(lt=0), kc.MatchConfig("effective_lower_bound")] = None
    """

    attr: str
    rel_tol: float = 0.0

    def __post_init__(self) -> None:
        _refuse_kind("kc.MatchConfig", "attr", self.attr, str, "the config attribute's name (str)")
        _refuse_kind("kc.MatchConfig", "rel_tol", self.rel_tol, (int, float), "a number >= 0")
        if not self.rel_tol >= 0:
            raise AnnotationError(f"kc.MatchConfig(rel_tol={self.rel_tol!r}): rel_tol must be a number >= 0")

    def agrees(self, value: Any, config: Any) -> bool:
        return self.agrees_value(value, getattr(config, self.attr, CONFIG_LACKS))

    def agrees_value(self, value: Any, want: Any) -> bool:
        if want is CONFIG_LACKS:
            return True
        if value is None or want is None:
            return value is None and want is None
        if isinstance(value, (int, float)) and isinstance(want, (int, float)):
            # math.isclose(value, want, rel_tol=self.rel_tol) in arithmetic torch.compile can trace
            # (a float argument is a SymFloat under dynamic=True)
            if value == want:
                return True
            diff = abs(value - want)
            return diff < math.inf and (diff <= self.rel_tol * abs(want) or diff <= self.rel_tol * abs(value))
        return bool(value == want)


@dataclass(frozen=True)
class Where:
    """A cross-argument constraint on dims, ``kc.Where("HV % H == 0", hint="...")``; a plain
    string in ``where=[...]`` is the same without a hint. ``expr`` is Python's boolean syntax over
    dims (``and or not``, chained comparisons, ``in (...)``, ``pow2(...)``, ``X if arg is None``,
    ``itemsize(t)``; see :mod:`kda_contracts._engine.grammar.constraints`); ``kind`` is the error a failure raises.

    Example::

        kc.Where("N == B if state_batch_indices is None", hint="without indices, request i uses slot i")
    """

    expr: str
    hint: str | None = None
    kind: type[ContractError] = ShapeError

    def __post_init__(self) -> None:
        _refuse_kind("kc.Where", "expr", self.expr, str, "a constraint over dims (str), e.g. 'HV % H == 0'")
        _refuse_kind("kc.Where", "hint", self.hint, (str, NoneType), "a str or None")
        if not (isinstance(self.kind, type) and issubclass(self.kind, ContractError)):
            raise AnnotationError(f"kc.Where(kind={self.kind!r}): kind must be a kc.ContractError subclass "
                                  "(ShapeError, DtypeError, ...)")


# -- config access (KDAConfig, any object with contract_dims(), or a plain pydantic model) -------
# The dtype roles a kc.Spec(config_dtype=...) may name; a fixed config may add its own roles
# (the keys of its contract_dtypes()).
DTYPE_ROLES = frozenset({"activation", "state", "index", "weight", "output"})


class ConfigKindError(AnnotationError):
    """A config object the engine cannot read dims from: not a config (``5``), a config class
    rather than an instance, a ``contract_dims()`` that raises or returns no mapping (an
    AnnotationError, so a TypeError; reported as a ContractError on a call)."""


def _int_fields(items: Any) -> dict[str, int]:
    return {k: v for k, v in items if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}


def config_dims(config: Any) -> Mapping[str, int]:
    """The dims a config fixes, by symbol: ``contract_dims()`` if it has one, else the int fields
    of a pydantic model or a dataclass, or the int values of a mapping (read fresh each time).
    Anything else (``5``, a config class rather than an instance, a ``contract_dims()`` that
    raises or returns no mapping) is a :class:`ConfigKindError`, an AnnotationError naming it."""
    if config is None:
        return {}
    if isinstance(config, type):
        raise ConfigKindError(f"{config.__name__} is a class, not a config: pass an instance of it")
    getter = getattr(config, "contract_dims", None)
    if getter is None:
        return _int_fields(_plain_config_items(config))
    try:
        dims = getter()
    except AnnotationError:
        raise
    except Exception as exc:
        raise ConfigKindError(f"{type(config).__name__}.contract_dims() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(dims, Mapping):
        raise ConfigKindError(f"{type(config).__name__}.contract_dims() returned {type(dims).__name__}, "
                              "not a mapping of dims")
    return dims


def _plain_config_items(config: Any) -> Any:
    """``(name, value)`` of a plain config: a pydantic model's or a dataclass's fields, a mapping's items."""
    fields = getattr(type(config), "model_fields", None)
    if fields is not None:  # a plain pydantic model: its fields, by name
        return ((k, getattr(config, k)) for k in fields)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return ((f.name, getattr(config, f.name)) for f in dataclasses.fields(config))
    if isinstance(config, Mapping):
        return config.items()
    raise ConfigKindError(f"{type(config).__name__} is not a config: pass an object with contract_dims(), "
                          "a pydantic model, a dataclass or a mapping of dims")


def is_int_dim(value: Any) -> bool:
    """Whether a config's value binds a dim: an int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_dim_fix(value: Any) -> str:
    """How to make a config's non-int dim value an int."""
    return "int(...) it, or compute it with //" if isinstance(value, float) else "int(...) it"


def config_nonint_dims(config: Any, dims: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a config gives by name that is not an int nor None (None: not fixed): a float (a dim
    computed with ``/``), a str, a bool, a numpy integer; from ``contract_dims()`` if it has one
    (``dims``: what it returned, when the caller has it already), else from a plain config's
    fields. Only the names the contract uses as dims matter (the caller picks them): such a value
    binds nothing, and is refused rather than left unchecked."""
    if config is None:
        return {}
    getter = getattr(config, "contract_dims", None)
    try:
        if getter is not None:
            items = (dims if dims is not None else getter()).items()
        else:
            items = _plain_config_items(config)
    except Exception:  # (reported where the dims are read)
        return {}
    return {k: v for k, v in items if isinstance(k, str) and v is not None and not is_int_dim(v)}


def config_is_frozen(config: Any, _depth: int = 0) -> bool:
    """Whether what a config fixes cannot change: a frozen pydantic model or dataclass; one whose
    ``contract_dims()``/``contract_dtypes()`` may read anything must also hold only immutable values
    (numbers, strings, dtypes, enums, tuples of those, frozen models or dataclasses likewise). Only
    then may it be cached between calls: a frozen model holding a mutable one that its
    ``contract_dims()`` reads (``cfg.heads.D = 5``) is read afresh, like a mutable config. A plain
    config (its top-level int fields are what binds) needs only the frozen flag."""
    model_config = getattr(type(config), "model_config", None)
    if isinstance(model_config, Mapping):
        frozen = bool(model_config.get("frozen"))
    else:
        params = getattr(type(config), "__dataclass_params__", None)
        frozen = bool(params is not None and params.frozen)
    if not frozen or _depth > 8:
        return False
    if _depth == 0 and not (hasattr(config, "contract_dims") or hasattr(config, "contract_dtypes")):
        return True  # a plain config: only its top-level fields are read, and frozen keeps those
    try:
        items = list(_plain_config_items(config))
    except ConfigKindError:
        return False
    return all(_immutable(v, _depth + 1) for _, v in items) and not getattr(config, "__pydantic_extra__", None)


_IMMUTABLE = (int, float, complex, str, bytes, NoneType, torch.dtype, torch.device, enum.Enum, type)


def _immutable(value: Any, depth: int) -> bool:
    if isinstance(value, _IMMUTABLE):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v, depth + 1) for v in value)
    return config_is_frozen(value, depth)


def config_dim_source(config: Any, sym: str) -> str:
    """Where a config's dim ``sym`` comes from, for messages: its ``contract_dim_source(sym)``, else
    ``"Type.sym=value"``. A dim the config does not fix, or a ``contract_dim_source`` that raises,
    is an AnnotationError naming it.

    Example::

        >>> config_dim_source({"H": 4}, "H")
        'dict.H=4'
    """
    getter = getattr(config, "contract_dim_source", None) if not isinstance(config, type) else None
    if getter is not None:
        try:
            return str(getter(sym))
        except AnnotationError:
            raise
        except Exception as exc:
            raise ConfigKindError(f"{type(config).__name__}.contract_dim_source({sym!r}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
    dims = config_dims(config)
    if sym not in dims:
        raise AnnotationError(f"{type(config).__name__} fixes no dim {sym!r}; it fixes "
                              f"{', '.join(map(str, dims)) or 'none'}")
    return f"{type(config).__name__}.{sym}={dims[sym]}"


def config_dtypes(config: Any) -> Mapping[str, torch.dtype]:
    getter = getattr(config, "contract_dtypes", None) if config is not None else None
    return getter() if getter is not None else {}


# -- annotated_types and pydantic Field metadata -------------------------------------------------
@dataclass(frozen=True)
class Metadata:
    """What the non-kc metadata of one argument asks for: number bounds (merged with a kc.Range),
    a multiple, length bounds and predicates (``annotated_types`` or pydantic ``Field``)."""

    range: Range | None = None
    multiple_of: float | None = None
    length: tuple[int, int | None] | None = None
    predicates: tuple[Callable[[Any], bool], ...] = ()

    def any(self) -> bool:
        return self != Metadata()

    def rules(self, name: str, optional: bool) -> tuple[Any, ...]:
        """The rules beyond the range (see kda_contracts._engine.rules.tensor)."""
        from ..rules.scalar import LengthIn, MultipleOf, Satisfies  # they import this module

        out: list[Any] = []
        if self.multiple_of is not None:
            out.append(MultipleOf(name, self.multiple_of, optional))
        if self.length is not None:
            out.append(LengthIn(name, self.length[0], self.length[1], optional))
        out += [Satisfies(name, p, optional) for p in self.predicates]
        return tuple(out)


_BOUNDS = ("gt", "ge", "lt", "le")


def read_metadata(meta: list[Any], where: str) -> Metadata:
    """Read ``kc.Range``, ``annotated_types`` constraints and pydantic ``FieldInfo`` metadata; a
    string is documentation; anything else is an AnnotationError naming it (never ignored)."""
    import annotated_types as at

    bounds: dict[str, float] = {}
    finite = False
    multiple: float | None = None
    least, most = 0, None
    has_length = False
    predicates: list[Callable[[Any], bool]] = []
    items = list(meta)
    while items:
        m = items.pop(0)
        if isinstance(m, str):
            continue
        if type(m).__name__ == "FieldInfo" and hasattr(m, "metadata"):  # pydantic.Field(...)
            items = list(m.metadata) + items
            continue
        if isinstance(m, (Range, at.Interval, at.Gt, at.Ge, at.Lt, at.Le)):
            finite = finite or bool(getattr(m, "finite", False))
            for k in _BOUNDS:
                v = getattr(m, k, None)
                if v is None:
                    continue
                if k in bounds:
                    raise AnnotationError(f"{where}: two '{k}' bounds ({bounds[k]!r} and {v!r})")
                bounds[k] = v
        elif isinstance(m, at.MultipleOf):
            multiple = m.multiple_of  # type: ignore[assignment]
        elif isinstance(m, (at.MinLen, at.MaxLen, at.Len)):
            has_length = True
            least = max(least, getattr(m, "min_length", 0) or 0)
            m_most = getattr(m, "max_length", None)
            most = m_most if most is None else (most if m_most is None else min(most, m_most))
        elif isinstance(m, at.Predicate):
            predicates.append(m.func)
        elif isinstance(m, (Spec, MatchConfig)):
            raise AnnotationError(f"{where}: at most one kc.Spec, one kc.Range and one kc.MatchConfig per argument")
        else:
            raise AnnotationError(
                f"{where}: cannot check the metadata {m!r}; kda-contracts enforces kc.Spec, kc.Range, "
                "kc.MatchConfig, annotated_types (Gt, Ge, Lt, Le, Interval, MultipleOf, MinLen, MaxLen, Len, "
                "Predicate) and pydantic Field constraints, and refuses the rest rather than ignore it")
    rng = Range(**bounds, finite=finite) if bounds or finite else None  # type: ignore[arg-type]
    return Metadata(rng, multiple, (least, most) if has_length else None, tuple(predicates))
