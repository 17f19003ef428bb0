"""What the code generators of an op read of it (:class:`OpParts`): the dispatcher
(:mod:`.dispatch`), strict mode's run (:mod:`.strict`) and the custom op (:mod:`.torch_op`)
work on an op without importing the class that makes one (:class:`~.opdef.Op` satisfies this
protocol).

Example::

    def build_dispatcher(o: OpParts) -> Callable[..., Any]: ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from ..contract.compiled import Contract
from ..errors import Violation
from ..model.spec import CallContext, ContractOptions
from .table import BackendTable, Chosen


class OpParts(Protocol):
    """An op as its generated dispatcher and custom op see it."""

    name: str
    namespace: str
    fn: Callable[..., Any]
    options: ContractOptions
    signature: inspect.Signature
    contract: Contract
    returns: tuple[str, ...] | str | None
    returns_none: bool
    table: BackendTable
    unchecked_dims: Callable[..., tuple[int, ...]] | None
    after: Callable[[CallContext, str], list[Violation]] | None
    written: Callable[[CallContext], Mapping[str, Any]] | None
    variant_of: Callable[..., Any] | None
    _variant_raw: Callable[..., Any] | None
    _variant_expected: str
    _variant_params: tuple[str, ...]
    _key_layout: Any
    _dispatch: Callable[..., Any] | None

    @property
    def contracts(self) -> Mapping[str | None, Contract]: ...

    def alias_violations(self, ctx: CallContext, parts: Mapping[str, Any] | None = None) -> list[Violation]: ...

    def contract_for(self, values: Mapping[str, Any]) -> tuple[str | None, Contract]: ...

    def _bad_variant(self, key: Any) -> None: ...

    def _dims_off(self, variant: str | None, *vals_and_cfg: Any) -> tuple[int, ...] | None: ...

    def _failed(self, backend: str, exc: BaseException, vals: tuple[Any, ...] | None = None, config: Any = None,
                variant: str | None = None, *, rolled_back: bool = False, undeclared: Sequence[str] = ()) -> None: ...

    def _hook_failed(self, hook: str, expected: str, exc: Exception, *, subject: str = "it",
                     hint: str | None = ...) -> NoReturn: ...

    def _transact(self, chosen: Chosen, dims: tuple[int, ...], variant: str | None, vals: tuple[Any, ...],
                  config: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  memo: dict[str, Any] | None = None) -> Any: ...
