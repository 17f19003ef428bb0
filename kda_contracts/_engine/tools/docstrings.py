"""Shape tables in docstrings: ``@kc.contract(doc=True)`` appends the contract's rendered table
(the same Markdown ``kda-contracts docs`` writes: arguments, symbolic shapes, dtypes, layout,
where each dim is bound from, constraints, return) to the wrapper's ``__doc__``, so that IDE
hovers, ``help()`` and Sphinx autodoc show it.

The table goes in a reST literal block (a paragraph ending in ``::``, then indented lines):
Sphinx shows it verbatim instead of reading ``|`` as reST syntax, and ``help()`` and IDE hovers
show it as preformatted text.

Whether a contract gets one: its ``doc=`` option, else the process setting
(:func:`set_contract_docs`), which starts as ``$KDA_CONTRACTS_DOC`` (``1``/``true``/``yes``/``on``;
empty, unset or ``0``/``false``/``no``/``off``: no tables). The setting is read at decoration
time. A contract decorated while the mode is ``off`` is the function itself, left untouched.

The table is rendered once, at decoration, and only for contracts that ask for it (without one,
``kda_contracts._engine.tools.docs`` is not even imported): about 0.07 ms for a two-tensor contract, against
about 1.5 ms for the decoration itself (4-7 % more; one CPU core).

Example::

    kc.set_contract_docs(True)

    @kc.contract
    def project(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        \"\"\"Project x.\"\"\"

    help(project)          # "Project x." then "Contract (kda-contracts)::" and the tables
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import hooks
from ..errors import AnnotationError

if TYPE_CHECKING:
    from ..contract.compiled import Contract


ENV_VAR = "KDA_CONTRACTS_DOC"
HEADING = "Contract (kda-contracts)::"
SUMMARY = "Arguments checked by kda-contracts (see below)."  # the first line of a docstring that had none
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def _from_environment(raw: str | None) -> bool:
    value = (raw or "").strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        warnings.warn(f"{ENV_VAR}={raw!r} is neither on ({', '.join(_ON)}) nor off (empty, {', '.join(_OFF[1:])}); "
                      "contracts get no shape table in their docstrings", RuntimeWarning, stacklevel=2)
    return False


_enabled = _from_environment(os.environ.get(ENV_VAR))


def set_contract_docs(enabled: bool) -> bool:
    """Append the shape table to the docstring of every contract decorated from now on (unless
    its ``doc=`` says otherwise); return the previous setting. Starts as ``$KDA_CONTRACTS_DOC``.

    Example::

        previous = kc.set_contract_docs(True)   # e.g. in docs/conf.py, before autodoc imports
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise AnnotationError(f"kc.set_contract_docs: expected True or False, got {enabled!r}")
    previous, _enabled = _enabled, enabled
    return previous


def contract_docs() -> bool:
    """Whether contracts decorated now without ``doc=`` get the shape table in their docstring."""
    return _enabled


def wants_doc(option: bool | None) -> bool:
    """A contract's ``doc=`` option, else the process setting."""
    return _enabled if option is None else bool(option)


def _indented(lines: Sequence[str]) -> list[str]:
    return [f"    {line}" if line else "" for line in lines]


def _table(c: Contract) -> list[str]:
    """The tables ``kda-contracts docs`` renders for ``c``, without its heading."""
    from .docs import describe_contract, render_contract  # docs imports the decorator: here, not at the top

    table = render_contract(describe_contract(c.name, c, None), heading=False, errors_page=None)
    while table and not table[-1]:
        table.pop()
    return table


def _with_block(doc: str | None, lines: list[str]) -> str:
    # the first line must not be the heading: help() dedents the lines after the first, the block's too
    head = inspect.cleandoc(doc) if doc and doc.strip() else SUMMARY
    return head + "\n\n" + "\n".join([HEADING, "", *_indented(lines)])


def contract_docstring(doc: str | None, c: Contract) -> str:
    """``doc`` (cleaned as ``inspect.getdoc`` would) followed by the contract's tables.

    Example::

        wrapper.__doc__ = contract_docstring(fn.__doc__, wrapper.__kda_contract__)
    """
    return _with_block(doc, _table(c))


def op_docstring(doc: str | None, contracts: Mapping[str | None, Contract]) -> str:
    """``doc`` followed by the tables of an op's contract, or of each of its variants in turn."""
    if list(contracts) == [None]:
        return contract_docstring(doc, contracts[None])
    lines: list[str] = []
    for variant, c in contracts.items():
        lines += [f"Variant ``{variant}``:", "", *_table(c), ""]
    return _with_block(doc, lines[:-1])


def add_contract_doc(wrapper: Callable[..., Any], c: Contract) -> None:
    """Append ``c``'s tables to ``wrapper.__doc__`` (the wrapped function's own is left alone)."""
    wrapper.__doc__ = contract_docstring(wrapper.__doc__, c)


def add_class_note(cls: type, methods: Sequence[str]) -> None:
    """Say in a class's docstring which of its methods carry a contract (each has its own table)."""
    names = ", ".join(f"``{m}``" for m in methods)
    note = f"Contracted methods (kda-contracts): {names}; each method's docstring has its shape table."
    doc = inspect.cleandoc(cls.__doc__) + "\n\n" if cls.__doc__ and cls.__doc__.strip() else ""
    cls.__doc__ = doc + note


def _document(wrapper: Callable[..., Any], c: Any, option: bool | None) -> None:
    """The decoration hook: the shape tables in the docstring when the contract or op asks for them."""
    if not wants_doc(option):
        return
    if hasattr(c, "spec"):
        add_contract_doc(wrapper, c)
    elif isinstance(getattr(c, "contracts", None), Mapping):  # an op: its variants' contracts
        wrapper.__doc__ = op_docstring(wrapper.__doc__, c.contracts)


def _note_class(cls: type, methods: Sequence[str], option: bool | None) -> None:
    if wants_doc(option):
        add_class_note(cls, methods)


hooks.on_decorated(_document)
hooks.on_class_decorated(_note_class)
