"""The options of ``kc.contract`` and ``kc.op`` read into a :class:`ContractOptions`, each checked
for its kind at decoration: a wrong one is an AnnotationError naming the option, never a TypeError
from deep inside the engine, a string read letter by letter, nor an option taken and ignored.

Example::

    contract_options("kc.contract", where="H > 0")
    # AnnotationError: kc.contract: where= takes a list of constraints, got the str 'H > 0' (write ['H > 0'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import modes
from ..errors import AnnotationError
from ..model.markers import Where, config_dims
from ..model.spec import ContractOptions
from ..rules.values import ValueRule


def _items(owner: str, option: str, value: Any, kind: type | tuple[type, ...] | None, what: str) -> tuple[Any, ...]:
    """``value`` (an iterable, not a str) as a tuple whose items are each a ``kind`` (None: callable)."""
    if isinstance(value, (str, bytes)):
        raise AnnotationError(f"{owner}: {option}= takes a list of {what}, got the str {value!r} (write [{value!r}])")
    try:
        items = tuple(value)
    except TypeError:
        raise AnnotationError(f"{owner}: {option}= takes a list of {what}, got {type(value).__name__} "
                              f"{value!r}") from None
    for item in items:
        if not (callable(item) if kind is None else isinstance(item, kind)):
            raise AnnotationError(f"{owner}: {option}= takes a list of {what}; {item!r} ({type(item).__name__}) "
                                  "is not one")
    return items


def optional_callable(owner: str, option: str, value: Any, what: str) -> None:
    """``value`` must be None or callable (``what``: what the function computes, for the message)."""
    if value is not None and not callable(value):
        raise AnnotationError(f"{owner}: {option}= takes a function ({what}) or None, got {type(value).__name__} "
                              f"{value!r}")


def check_config(owner: str, config: Any) -> None:
    """A config fixed at decoration must give its dims now: an object with ``contract_dims()``, a
    pydantic model, a dataclass or a mapping, whose int dims are not negative."""
    if config is None:
        return
    try:
        dims = config_dims(config)
    except AnnotationError as exc:  # (a ConfigKindError: not a config, or contract_dims() broke)
        raise AnnotationError(f"{owner}: config=: {exc}") from exc
    negative = {k: v for k, v in dims.items() if isinstance(v, int) and not isinstance(v, bool) and v < 0}
    if negative:
        k, v = next(iter(negative.items()))
        raise AnnotationError(f"{owner}: config=: {k} = {v}, and a dim is a size (>= 0)")


def contract_options(owner: str, *, config: Any = None, config_arg: Any = None, where: Any = (),
                     bind_first: Any = (), hints: Any = (), value_checks: Any = None, value_rules: Any = (),
                     mode: Any = None, name: Any = None, register: bool = True, doc: Any = None,
                     autograd: Any = False) -> ContractOptions:
    """The options of ``owner`` (``"kc.contract"`` / ``"kc.op"``), each checked for its kind."""
    check_config(owner, config)
    if config_arg is not None and not isinstance(config_arg, str):
        raise AnnotationError(f"{owner}: config_arg= takes the name of a parameter, got {config_arg!r}")
    if mode is not None:
        modes.parse_mode(mode, f"{owner}(mode={mode!r})")
    if name is not None and (not isinstance(name, str) or not name):
        raise AnnotationError(f"{owner}: name= takes a non-empty str, got {name!r}")
    for option, value in (("register", register), ("autograd", autograd)):
        if not isinstance(value, bool):
            raise AnnotationError(f"{owner}: {option}= takes True or False, got {value!r}")
    if doc is not None and not isinstance(doc, bool):
        raise AnnotationError(f"{owner}: doc= takes True, False or None, got {doc!r}")
    optional_callable(owner, "value_checks", value_checks, "ctx -> [Violation]")
    return ContractOptions(
        config=config, config_arg=config_arg, where=_items(owner, "where", where, (str, Where), "constraints"),
        bind_first=_items(owner, "bind_first", bind_first, str, "parameter names"),
        hints=_items(owner, "hints", hints, None, "functions (violation, ctx) -> str | None"),
        value_checks=value_checks,
        value_rules=_items(owner, "value_rules", value_rules, ValueRule, "value rules (kc.InRange, kc.Finite, ...)"),
        mode=mode, name=name, register=register, doc=doc, autograd=autograd)


def names_option(owner: str, option: str, value: Any) -> tuple[str, ...] | str | None:
    """``returns=``: None, a parameter's name, or a list of them."""
    if value is None or isinstance(value, str):
        return value
    return _items(owner, option, value, str, "parameter names")


def check_op_options(owner: str, *, after: Any, variant: Any, variants: Any, unchecked_dims: Any, namespace: Any,
               written: Any) -> None:
    """``kc.op``'s own options, each checked for its kind (what they name is checked when the op is built)."""
    optional_callable(owner, "after", after, "ctx, backend -> [Violation]")
    optional_callable(owner, "variant", variant, "the op's parameters -> the call's variant")
    optional_callable(owner, "unchecked_dims", unchecked_dims, "(variant, *args) -> dims")
    optional_callable(owner, "written", written, "ctx -> {argument: None | rows}")
    if variants is not None and not isinstance(variants, Mapping):
        raise AnnotationError(f"{owner}: variants= takes a mapping of variant name -> function, got "
                              f"{type(variants).__name__}")
    if not isinstance(namespace, str) or not namespace.isidentifier():
        raise AnnotationError(f"{owner}: namespace= takes a Python identifier (torch.library's namespace), got "
                              f"{namespace!r}")
