"""``@kc.op``: an operation made of a contract (or one per variant), the torch reference (the
decorated body) and the backends registered on it later.

Example::

    @kc.op
    def scale_rows(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(2 * x)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from .. import hooks, modes
from ..contract.decorator import refuse_non_function, refuse_nothing_to_check, register_contract
from ..contract.options import check_op_options, contract_options, names_option
from ..errors import Violation
from ..model.markers import Where
from ..model.spec import CallContext
from ..rules.values import ValueRule
from . import registry
from .opdef import Op


def op(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, config: Any = None,
       config_arg: str | None = None, where: Iterable[str | Where] = (), bind_first: Sequence[str] = (),
       hints: Sequence[Callable[[Violation, CallContext], str | None]] = (),
       value_checks: Callable[[CallContext], list[Violation]] | None = None, value_rules: Sequence[ValueRule] = (),
       after: Callable[[CallContext, str], list[Violation]] | None = None,
       returns: str | Sequence[str] | None = None, variants: Mapping[str, Any] | None = None,
       variant: Callable[..., str] | None = None, unchecked_dims: Callable[..., tuple[int, ...]] | None = None,
       namespace: str = "kda_contracts_ops", mode: modes.ModeName | None = None, autograd: bool = False,
       written: Callable[[CallContext], Mapping[str, Any]] | None = None, doc: bool | None = None) -> Any:
    """Make an :class:`Op` of a function whose annotations are the contract and whose body is
    the torch reference (backend ``"torch"``).

    Options as :func:`kc.contract` (``config``, ``config_arg``, ``where``, ``hints``,
    ``value_checks``, ``value_rules``, ``mode``), plus:

    - ``returns``: the argument(s) the op returns (the tensors it writes), e.g. ``("out", "state")``;
      otherwise it returns what the backend returns (checked against a return annotation).
    - ``after``: ``(ctx, backend) -> [Violation]``, strict mode's checks after the backend ran.
    - ``variants``/``variant``: several contracts chosen per call (see the module docstring); a
      variant is a function, or ``(function, {option: value})`` overriding options for it.
    - ``unchecked_dims``: ``(variant, *args) -> dims`` read without checking, for mode ``off``.
    - ``namespace``: the ``torch.library`` namespace of :attr:`Op.torch_op`.
    - ``autograd``: tensors marked ``kc.Spec(mutated=True)`` may require grad.
    - ``written``: ``ctx -> {arg: None | rows}``, what the op writes of each mutated argument
      (None: all of it; a 1-D integer tensor: those rows of dim 0, padding left out); strict mode
      snapshots exactly that and restores it when the call is rejected after the backend ran
      (default: every argument marked ``kc.Spec(mutated=True)``, whole).
    - ``doc``: append the shape table of each variant to the op's ``__doc__``, as
      ``kc.contract(doc=True)`` does; None follows ``kc.set_contract_docs`` / ``KDA_CONTRACTS_DOC``.

    A hook (``value_checks``, ``after``, ``variant``, ``written``) that raises during a call is a
    BackendError naming it, its exception the cause.
    """
    options = contract_options("kc.op", config=config, config_arg=config_arg, where=where, bind_first=bind_first,
                               hints=hints, value_checks=value_checks, value_rules=value_rules, mode=mode,
                               name=name, register=False, autograd=autograd, doc=doc)
    check_op_options("kc.op", after=after, variant=variant, variants=variants, unchecked_dims=unchecked_dims,
               namespace=namespace, written=written)
    returns = names_option("kc.op", "returns", returns)

    def make(f: Callable[..., Any]) -> Op:
        refuse_non_function(f, "kc.op")
        made = Op(f, options, variants=variants, variant=variant, returns=returns, after=after,
                  unchecked_dims=unchecked_dims, namespace=namespace, written=written)
        for c in made.contracts.values():
            refuse_nothing_to_check(c.spec, options, "kc.op")
        # listed once the op is whole: a refused op leaves nothing in kc.ops() or kc.registered_contracts()
        for b, replace in registry.add_op(made):
            made.table.register(b, replace=replace)
        for key, c in made.contracts.items():
            register_contract(made.name if key is None else f"{made.name}[{key}]", c)
        hooks.decorated(cast(Any, made), made, options.doc)  # (the docstring's shape tables, when asked for)
        return made

    return make if fn is None else make(fn)
