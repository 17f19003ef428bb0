"""The machinery of a mistakes catalogue, shared by the packed ops: a :class:`Mistake` makes a
wrong call from a valid one, :func:`reproduce` runs it through the op's validating entry point
and captures the error the library really raises, :func:`catalogue_lines` renders a catalogue
for ``errors.md``. Each op keeps its own catalogue.

Example::

    rows, body = catalogue_lines(MISTAKES, lambda m: reproduce(m, cfg, validate=validate_packed_decode))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._engine import ContractError, cell
from .config import KDAConfig

BATCH, POOL = 4, 8  # small, so the messages stay short and the catalogue builds fast


@dataclass
class Attempt:
    """One call of ``validate_packed_decode``: the arguments by name and its keywords."""

    call: dict[str, Any]
    config: KDAConfig | None
    strict: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Mistake:
    """A known mistake: how it is made (``code``), what it costs without a contract
    (``hazard``), how to fix it, and a builder of the wrong call for a config."""

    key: str
    title: str
    code: str
    hazard: str
    fix: str
    error: type[ContractError]
    build: Callable[[KDAConfig], Attempt]


@dataclass(frozen=True)
class Reproduction:
    """What running a :class:`Mistake` gave: the error class name and the full message."""

    mistake: Mistake
    error: str
    message: str
    config: KDAConfig | None
    notes: tuple[str, ...]


def reproduce(mistake: Mistake, cfg: KDAConfig, *, validate: Callable[..., Any]) -> Reproduction:
    """Make ``mistake`` on a valid call for ``cfg`` and capture the error the library raises
    (``validate``: the op's validating entry point, ``validate_packed_decode`` for KDA's catalogue).

    Raises ``AssertionError`` when the mistake is not caught, or caught as another kind: the
    catalogue must describe what the code does.
    """
    attempt = mistake.build(cfg)
    try:
        validate(**attempt.call, config=attempt.config, strict=attempt.strict)
    except ContractError as err:
        if not isinstance(err, mistake.error):
            raise AssertionError(f"mistake {mistake.key!r}: expected a {mistake.error.__name__}, got "
                                 f"{type(err).__name__}:\n{err}") from None
        return Reproduction(mistake, type(err).kind_name, str(err), attempt.config, tuple(attempt.notes))
    raise AssertionError(f"mistake {mistake.key!r} was not caught for {cfg!r}")


def catalogue_lines(mistakes: Sequence[Mistake], run: Callable[[Mistake], Reproduction]) -> tuple[list[str], list[str]]:
    """A catalogue in Markdown: the table rows (after a ``| mistake | error | fix |`` header) and
    one section per mistake with the message ``run`` reproduced (anchored by its key). A mistake
    ``run`` cannot make for this config (a ValueError) gets a row saying so and no section."""
    rows: list[str] = []
    body: list[str] = []
    for m in mistakes:
        try:
            r = run(m)
        except ValueError as exc:  # a mistake this config cannot express (e.g. no other TP degree)
            rows.append(f"| {m.title} | — | not reproducible for this config: {exc} |")
            continue
        rows.append(f"| [{cell(m.title)}](#{m.key}) | `{r.error}` | {cell(m.fix)} |")
        body += [f"<a id=\"{m.key}\"></a>", f"## {m.title}", "", f"The mistake: `{m.code}`. Without a contract: "
                 f"{m.hazard}.", ""]
        if r.notes:
            body += ["(" + "; ".join(r.notes) + ")", ""]
        body += ["```text", r.message, "```", "", f"**Fix:** {m.fix}.", ""]
    return rows, body
