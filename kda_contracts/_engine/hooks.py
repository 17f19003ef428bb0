"""Where the periphery listens to the core. Contracts and ops call these hooks at the points a
tool may act on (a call being rejected, a function being decorated); the tools (dumps,
docstrings) add their listeners when they are imported. The core never imports a tool.

Example::

    from kda_contracts._engine import hooks

    hooks.on_rejection(lambda event: print(event.stage, event.error.function))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import ContractError


@dataclass(frozen=True)
class Rejection:
    """A call about to raise its ContractError: the contract or op (``target``), the arguments by
    name, the config, the error, the stage that rejected it (``"contract"``, ``"value checks"``,
    ``"after"``) and, after a backend ran, its name."""

    target: Any
    values: Mapping[str, Any]
    config: Any
    error: ContractError
    stage: str
    backend: str | None


_REJECTION: list[Callable[[Rejection], None]] = []
_DECORATED: list[Callable[[Callable[..., Any], Any, "bool | None"], None]] = []
_CLASS_DECORATED: list[Callable[[type, Sequence[str], "bool | None"], None]] = []


def on_rejection(listener: Callable[[Rejection], None]) -> None:
    """Call ``listener`` with every rejected call, before its error propagates."""
    _REJECTION.append(listener)


def on_decorated(listener: Callable[[Callable[..., Any], Any, bool | None], None]) -> None:
    """Call ``listener(wrapper, contract_or_op, doc_option)`` for every function decorated."""
    _DECORATED.append(listener)


def on_class_decorated(listener: Callable[[type, Sequence[str], bool | None], None]) -> None:
    """Call ``listener(cls, contracted_methods, doc_option)`` for every class ``kc.contract`` decorates."""
    _CLASS_DECORATED.append(listener)


@contextmanager
def rejecting(target: Any, values: Mapping[str, Any], config: Any, *, stage: str = "contract",
              backend: str | None = None) -> Iterator[None]:
    """Around the raise of a rejected call: the listeners see it, then the ContractError
    propagates unchanged.

    Example::

        with hooks.rejecting(contract, values, config, stage="value checks"):
            raise_violations(name, violations, dims, prov)
    """
    try:
        yield
    except ContractError as err:
        event = Rejection(target, values, config, err, stage, backend)
        for listener in tuple(_REJECTION):
            listener(event)
        raise


def decorated(wrapper: Callable[..., Any], target: Any, doc: bool | None) -> None:
    """Tell the listeners that ``wrapper`` now carries ``target`` (a contract or an op)."""
    for listener in tuple(_DECORATED):
        listener(wrapper, target, doc)


def class_decorated(cls: type, methods: Sequence[str], doc: bool | None) -> None:
    """Tell the listeners that ``kc.contract`` contracted ``methods`` of ``cls``."""
    for listener in tuple(_CLASS_DECORATED):
        listener(cls, methods, doc)
