"""Value rules held to what they must be, in three places (the rules themselves are in
:mod:`kda_contracts._engine.rules.values`):

- when one is made: its options of the right kind (:func:`refuse_options`: argument names are
  strs, a flag is True or False, a bound an int or a dim's name, ``hint=`` a str), else an
  AnnotationError;
- when a contract takes it (decoration, :func:`check_declared`): a rule of one's own is whole
  (``args``, ``_probe``, ``words``), it names tensor arguments and dims the contract has, and
  each argument's annotation allows a dtype the rule can read (``FiniteRows``' pool a float,
  its indices integers, its ``only=`` a bool mask), else an AnnotationError;
- during a call, for a rule of one's own (:func:`guarded_probe`, :func:`guarded_violation`): a
  ``_probe`` or ``words`` that raises or gives back the wrong kind is a BackendError naming the
  rule, never a raw exception.

Example::

    kc.StartsAt("cu_seqlens", 1.5)   # AnnotationError: the value is an int or a dim's name, got 1.5
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import torch
from torch import Tensor

from ..errors import AnnotationError, BackendError, ContractError, Violation, raise_violations

ValueRule = Any  # (a kc.ValueRule: typed loosely, since the rules module imports this one)
FLOAT, INT, BOOL = "float", "int", "bool"  # what an argument of a rule must be (ValueRule.kinds)
_KIND_WORDS = {
    FLOAT: ("for NaN and Inf, so its annotation must allow a float or complex dtype",
            "Float[Tensor, ...]", "an integer or bool tensor is always finite: the rule would check nothing"),
    INT: ("as row indices, so its annotation must allow integer dtypes only", "Int[Tensor, ...]",
          "a row is named by an integer"),
    BOOL: ("as a mask (the rows read where it is True), so its annotation must allow bool only",
           "Bool[Tensor, ...]", "pass mask.bool()"),
}
PROBE_SAYS = "a float64 tensor [4] (first bad flat index or -1, its value, the count, an extra) or None"


def as_bound(b: Any) -> Any:
    """A bound as given, an integer of another type (numpy's) as a Python int (a bool stays, refused)."""
    return int(b) if isinstance(b, numbers.Integral) and not isinstance(b, (bool, int)) else b


def refuse_options(rule: ValueRule, *, flags: Mapping[str, Any] = {}, bounds: Sequence[Any] = (),
                   what: str = "a bound", where: str = "") -> None:
    """AnnotationError when a rule was made with an option of the wrong kind: its argument names
    (non-empty strs), ``flags`` (True or False), ``bounds`` (ints or dim names), its ``hint``
    (``where``: what the message starts with, at decoration)."""
    for a in rule.args:
        if not isinstance(a, str) or not a:
            raise AnnotationError(f"{where}{rule!r}: an argument is named by a non-empty str, got {a!r}")
    if len(set(rule.args)) != len(rule.args):
        raise AnnotationError(f"{where}{rule!r}: names one argument twice; each of its arguments is another tensor")
    for option, value in flags.items():
        if not isinstance(value, bool):
            raise AnnotationError(f"{where}{rule!r}: {option} must be True or False, got {value!r}")
    for b in bounds:
        if isinstance(b, bool) or not isinstance(b, (int, str)):
            raise AnnotationError(f"{where}{rule!r}: {what} is an int or a dim's name, got {b!r}")
    if rule.hint is not None and not isinstance(rule.hint, str):
        raise AnnotationError(f"{where}{rule!r}: hint must be a str or None, got {rule.hint!r}")


def _dtype_words(dtypes: Any) -> str:
    names = sorted(str(d).replace("torch.", "") for d in dtypes)
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _kind_refused(kind: str, dtypes: frozenset[torch.dtype]) -> frozenset[torch.dtype] | None:
    """The dtypes that make an argument's annotation wrong for ``kind`` (None: it is fine)."""
    if kind == FLOAT:
        return None if any(d.is_floating_point or d.is_complex for d in dtypes) else dtypes
    if kind == INT:
        bad = frozenset(d for d in dtypes if d.is_floating_point or d.is_complex or d == torch.bool)
    else:
        bad = frozenset(d for d in dtypes if d != torch.bool)
    return bad or None


#: what a bare kc.ValueRule is told (when made, and at decoration for one made without __init__)
BASE_RULE = ("kc.ValueRule is the base of the value rules; use kc.InRange, kc.Distinct, kc.Finite, ... or a "
             "subclass that sets args and defines _probe and words")


def check_whole(rule: ValueRule, where: str, base: type) -> None:
    """A rule of one's own (a subclass of kc.ValueRule) has what a call needs: ``args`` (a tuple
    of argument names), ``index_args`` among them, ``_probe`` and ``words`` (or ``violation``)."""
    cls, name = type(rule), f"{where}: value_rules: {type(rule).__name__}"
    if cls is base:
        raise AnnotationError(f"{name}: {BASE_RULE}")
    args, index_args = getattr(rule, "args", None), getattr(rule, "index_args", None)
    if not isinstance(args, tuple) or not args:
        raise AnnotationError(f"{name}: args must be a non-empty tuple of the tensor arguments it reads (the first "
                              f"is the one it reports), got {args!r}")
    if not isinstance(index_args, tuple) or not set(index_args) <= set(args):
        raise AnnotationError(f"{name}: index_args must be a tuple of some of its args {args!r}, got {index_args!r}")
    if not callable(getattr(rule, "_probe", None)):
        raise AnnotationError(f"{name} defines no _probe(self, *tensors, dims): the probe of one call, {PROBE_SAYS}")
    if cls.words is base.words and cls.violation is base.violation:  # type: ignore[attr-defined]
        raise AnnotationError(f"{name} defines no words(self, found, shapes, dims): what a violation says, as "
                              "(expected, got)")


def check_declared(rule: ValueRule, where: str, tensors: Mapping[str, Any] | Sequence[str],
                   symbols: Sequence[str]) -> None:
    """AnnotationError at decoration when ``rule`` names no tensor argument (``tensors``: each
    tensor argument, with its annotation: ``dtypes``, ``dims``), an unknown dim, or an argument
    whose dtypes it cannot read (its ``kinds``); a mask (``"bool"``) is shaped as the indices before it."""
    refuse_options(rule, where=f"{where}: value_rules: ")
    for a in rule.args:
        if a not in tensors:
            raise AnnotationError(f"{where}: value_rules: {rule!r} names {a!r}, not a tensor argument "
                                  f"(tensor arguments: {', '.join(tensors) or 'none'})")
    try:
        bounds = tuple(rule.bounds())
    except Exception as exc:
        raise AnnotationError(f"{where}: value_rules: {rule!r}.bounds() raised {type(exc).__name__}: {exc}") from exc
    for b in bounds:
        if isinstance(b, str) and b not in symbols:
            raise AnnotationError(f"{where}: value_rules: {rule!r} names the dim {b!r}, which the contract "
                                  f"does not bind (dims: {', '.join(symbols) or 'none'})")
    if not isinstance(tensors, Mapping):
        return
    for a, kind in zip(rule.args, getattr(rule, "kinds", ()), strict=False):
        bad = None if kind is None else _kind_refused(kind, tensors[a].dtypes)
        if bad is not None:
            reads, write, why = _KIND_WORDS[kind]
            raise AnnotationError(f"{where}: value_rules: {rule!r} reads {a!r} {reads}; it allows "
                                  f"{_dtype_words(bad)}: annotate it {write} ({why})")
    kinds = tuple(getattr(rule, "kinds", ()))[:len(rule.args)]
    if BOOL in kinds and INT in kinds:  # (one flag per index: annotated alike)
        mask, idx = rule.args[kinds.index(BOOL)], rule.args[kinds.index(INT)]
        if tensors[mask].dim_str != tensors[idx].dim_str:
            raise AnnotationError(f"{where}: value_rules: {rule!r}: {mask!r} holds one flag per index, so it is "
                                  f"annotated as {idx!r} is ({tensors[idx].dim_str!r}), got {tensors[mask].dim_str!r}")


def _rule_failed(name: str, rule: ValueRule, expected: str, got: str, exc: BaseException | None = None) -> NoReturn:
    raise_violations(name or "value rules", [Violation(
        BackendError, f"value_rules: {rule!r}", expected, got,
        hint=f"fix {type(rule).__name__} (see kc.ValueRule: what _probe and words return)")], {}, {}, cause=exc)
    raise AssertionError  # unreachable: raise_violations raised


def guarded_probe(rule: ValueRule, values: Mapping[str, Any], dims: Mapping[str, Any], name: str) -> Tensor | None:
    """``rule.probe`` of a rule of one's own: its exception, or a result other than
    :data:`PROBE_SAYS`, is a BackendError naming the rule (a float tensor of 4 values is taken as float64)."""
    try:
        p = rule.probe(values, dims)
    except (ContractError, AnnotationError):
        raise
    except Exception as exc:
        _rule_failed(name, rule, f"its _probe to give {PROBE_SAYS}", f"it raised {type(exc).__name__}: {exc}", exc)
    if p is None:
        return None
    if not isinstance(p, Tensor) or p.numel() != 4 or not p.dtype.is_floating_point:
        got = (f"a {p.dtype} tensor of shape {list(p.shape)}" if isinstance(p, Tensor) else
               f"a {type(p).__name__}")
        _rule_failed(name, rule, f"its _probe to give {PROBE_SAYS}", f"it returned {got}")
    return p.reshape(4).to(torch.float64)


def guarded_violation(rule: ValueRule, found: Sequence[float], shapes: Mapping[str, Sequence[int]] | None,
                      dims: Mapping[str, Any], host: Mapping[str, Any] | None, name: str) -> Violation:
    """``rule.violation`` of a rule of one's own: an exception (an AnnotationError too: a
    kc.Violation its words could not make) or a result other than a kc.Violation is a
    BackendError naming the rule."""
    try:
        v = rule.violation(found, shapes, dims, host)
    except ContractError:
        raise
    except Exception as exc:
        _rule_failed(name, rule, "its words to say what its probe found, as (expected, got)",
                     f"they raised {type(exc).__name__}: {exc}", exc)
    if not isinstance(v, Violation):
        _rule_failed(name, rule, "its violation() to give a kc.Violation", f"it returned a {type(v).__name__}")
    return v
