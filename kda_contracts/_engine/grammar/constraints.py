"""The constraint language of ``where=[...]``: conditions over dims and argument facts.

A constraint is Python's boolean syntax over the dim expressions of :mod:`dims`, parsed once
into a small tree (never ``eval``-ed; the generated checker inlines ``render``, and ``holds``
compiles that same source):

==========================================  ===================================================
``HV % H == 0``, ``K <= 256``, ``D != 0``   a comparison (``== != < <= > >=``)
``1 <= D <= 256``                            a chained comparison, as in Python
``D in (64, 80, 96, 128, 256)``              membership (``not in`` too; ``[...]`` works)
``pow2(K)``                                  K is a power of two (1, 2, 4, ...)
``and``, ``or``, ``not``, ``( ... )``        Python's precedence: not > and > or
``idx is None``, ``idx is not None``         whether argument ``idx`` was passed as None
``N == B if idx is None``                    only when ``idx is None`` (``else ...`` optional;
                                             without it the constraint holds otherwise)
``x == 16 // itemsize(k)``                   ``itemsize(k)``: element size in bytes of ``k``'s dtype
==========================================  ===================================================

An unconditional equality ``x == expr`` (alone, or one of the constraint's top-level ``and``
terms) also *binds* ``x`` when nothing else does and ``expr`` is known (see ``plan``).

Example::

    >>> c = parse_constraint("N == B if idx is None")
    >>> c.holds({"N": 8, "B": 2, "idx is None": False}), c.holds({"N": 8, "B": 2, "idx is None": True})
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..errors import AnnotationError
from ..source import define
from .dims import _CMP, _KEYWORDS, ArgFact, Expr, Sym, _Parser, arg_fact


class Cond:
    """A node of a constraint: a condition over dims and argument facts."""

    __slots__ = ()

    def symbols(self) -> frozenset[str]:
        raise NotImplementedError

    def render(self, name: dict[str, str] | None = None) -> str:
        """Python source that is true when the condition holds; ``name`` maps each symbol (dims
        and argument facts) to the variable to use."""
        raise NotImplementedError


@dataclass(frozen=True)
class Compare(Cond):
    """``a OP b [OP c ...]``: a comparison, chained as in Python."""

    ops: tuple[str, ...]
    operands: tuple[Expr, ...]

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(e.symbols() for e in self.operands))

    def render(self, name: dict[str, str] | None = None) -> str:
        out = f"({self.operands[0].render(name)})"
        for op, e in zip(self.ops, self.operands[1:], strict=True):
            out += f" {op} ({e.render(name)})"
        return out


@dataclass(frozen=True)
class Pow2(Cond):
    """``pow2(e)``: ``e`` is a positive power of two."""

    expr: Expr

    def symbols(self) -> frozenset[str]:
        return self.expr.symbols()

    def render(self, name: dict[str, str] | None = None) -> str:
        v = self.expr.render(name)
        return f"(({v}) > 0 and ({v}) & (({v}) - 1) == 0)"


@dataclass(frozen=True)
class Member(Cond):
    """``e in (v1, v2, ...)`` (``negated``: ``not in``)."""

    expr: Expr
    values: tuple[Expr, ...]
    negated: bool = False

    def symbols(self) -> frozenset[str]:
        return self.expr.symbols().union(*(v.symbols() for v in self.values))

    def render(self, name: dict[str, str] | None = None) -> str:
        items = ", ".join(f"({v.render(name)})" for v in self.values) + ("," if len(self.values) == 1 else "")
        return f"({self.expr.render(name)}) {'not in' if self.negated else 'in'} ({items})"


@dataclass(frozen=True)
class IsNone(Cond):
    """``arg is None`` (``negated``: ``arg is not None``): the argument fact ``"arg is None"``."""

    arg: str
    negated: bool = False

    @property
    def key(self) -> str:
        return ArgFact("none", self.arg).key

    def symbols(self) -> frozenset[str]:
        return frozenset((self.key,))

    def render(self, name: dict[str, str] | None = None) -> str:
        if name is None:
            return f"{self.arg} is {'not ' if self.negated else ''}None"
        return f"(not {name[self.key]})" if self.negated else f"({name[self.key]})"


@dataclass(frozen=True)
class Not(Cond):
    cond: Cond

    def symbols(self) -> frozenset[str]:
        return self.cond.symbols()

    def render(self, name: dict[str, str] | None = None) -> str:
        return f"(not {self.cond.render(name)})"


@dataclass(frozen=True)
class AllOf(Cond):
    """``a and b and ...``"""

    parts: tuple[Cond, ...]

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(p.symbols() for p in self.parts))

    def render(self, name: dict[str, str] | None = None) -> str:
        return "(" + " and ".join(p.render(name) for p in self.parts) + ")"


@dataclass(frozen=True)
class AnyOf(Cond):
    """``a or b or ...``"""

    parts: tuple[Cond, ...]

    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(p.symbols() for p in self.parts))

    def render(self, name: dict[str, str] | None = None) -> str:
        return "(" + " or ".join(p.render(name) for p in self.parts) + ")"


@dataclass(frozen=True)
class IfElse(Cond):
    """``then if cond [else other]``: without ``else``, it holds whenever ``cond`` does not."""

    then: Cond
    cond: Cond
    other: Cond | None = None

    def symbols(self) -> frozenset[str]:
        other = self.other.symbols() if self.other is not None else frozenset()
        return self.then.symbols() | self.cond.symbols() | other

    def render(self, name: dict[str, str] | None = None) -> str:
        other = self.other.render(name) if self.other is not None else "True"
        return f"({self.then.render(name)} if {self.cond.render(name)} else {other})"


@dataclass(frozen=True)
class Constraint:
    """One parsed ``where`` constraint: its text (what errors and docs show) and its tree."""

    text: str
    cond: Cond

    def symbols(self) -> frozenset[str]:
        """The dims and argument facts (``"itemsize(k)"``, ``"idx is None"``) it reads."""
        return self.cond.symbols()

    def dims(self) -> list[str]:
        """The dims it reads, sorted (argument facts left out)."""
        return sorted(s for s in self.symbols() if arg_fact(s) is None)

    def facts(self) -> list[ArgFact]:
        """The argument facts it reads, sorted by key."""
        return [f for s in sorted(self.symbols()) if (f := arg_fact(s)) is not None]

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether the constraint holds for ``env`` (dims and argument facts by symbol): the
        generated checker's own test (``render``), compiled once, so the two cannot disagree."""
        return self._test(env)

    @cached_property
    def _test(self) -> Callable[[Mapping[str, int]], bool]:
        src = self.render({s: f"env[{s!r}]" for s in self.symbols()})
        return define(f"def holds(env):\n    return bool({src})\n", "<kda_contracts constraint>", "holds")

    def render(self, name: dict[str, str] | None = None) -> str:
        """Python source of a boolean expression that is True when the constraint holds."""
        return self.cond.render(name)

    def equalities(self) -> list[tuple[str, Expr]]:
        """``(dim, expr)`` for each unconditional ``dim == expr`` (either side; a top-level ``and``
        term, or one link of a chain ``a == b == c``): what may bind ``dim``."""
        terms = self.cond.parts if isinstance(self.cond, AllOf) else (self.cond,)
        out: list[tuple[str, Expr]] = []
        for t in terms:
            if not isinstance(t, Compare):
                continue
            for op, a, b in zip(t.ops, t.operands, t.operands[1:], strict=False):
                if op != "==":
                    continue
                out += [(a.name, b)] if isinstance(a, Sym) else []
                out += [(b.name, a)] if isinstance(b, Sym) else []
        return out


_EXPECTED = "expected a comparison (== != < <= > >=) or pow2(...) (or: in (...), not in (...), NAME is None)"


class _ConstraintParser(_Parser):
    """Python's boolean grammar over dim expressions::

        constraint := disj ['if' disj ['else' constraint]]
        disj       := conj ('or' conj)*
        conj       := neg ('and' neg)*
        neg        := 'not' neg | 'pow2' '(' expr ')' | NAME 'is' ['not'] 'None'
                    | expr ['not'] 'in' '(' expr (',' expr)* ')' | expr (CMP expr)+ | '(' constraint ')'
    """

    def fail(self, why: str, at: int | None = None) -> AnnotationError:
        i = self.i if at is None else at
        pos = f"{self.starts[i]}" if i < len(self.tokens) else f"{len(self.text)} (the end)"
        return AnnotationError(f"{self.where}: cannot parse {self.text!r}: {why}, at position {pos}")

    def expect(self, tok: str) -> None:
        if self.peek() != tok:
            raise self.fail(f"expected {tok!r}" + ("" if self.peek() is None else f", not {self.peek()!r}"))
        self.i += 1

    def ahead(self, k: int) -> str | None:
        return self.tokens[self.i + k] if self.i + k < len(self.tokens) else None

    def constraint(self) -> Cond:
        then = self.disj()
        if self.peek() != "if":
            return then
        self.take()
        cond = self.disj()
        if self.peek() != "else":
            return IfElse(then, cond)
        self.take()
        return IfElse(then, cond, self.constraint())

    def disj(self) -> Cond:
        parts = [self.conj()]
        while self.peek() == "or":
            self.take()
            parts.append(self.conj())
        return parts[0] if len(parts) == 1 else AnyOf(tuple(parts))

    def conj(self) -> Cond:
        parts = [self.neg()]
        while self.peek() == "and":
            self.take()
            parts.append(self.neg())
        return parts[0] if len(parts) == 1 else AllOf(tuple(parts))

    def neg(self) -> Cond:
        tok = self.peek()
        if tok == "not":
            self.take()
            return Not(self.neg())
        if tok == "pow2" and self.ahead(1) == "(":
            self.i += 2
            arg = self.expr()
            self.expect(")")
            return Pow2(arg)
        if tok is not None and tok.isidentifier() and tok not in _KEYWORDS and self.ahead(1) == "is":
            self.i += 2
            negated = self.peek() == "not"
            self.i += negated
            self.expect("None")
            return IsNone(tok, negated)
        if tok == "(":  # "(HV - H) % 2 == 0" is a comparison; "(D > 1 or E > 1)" a group
            start = self.i
            try:
                return self.comparison()
            except AnnotationError:
                self.i = start + 1
            group = self.constraint()
            self.expect(")")
            return group
        return self.comparison()

    def comparison(self) -> Cond:
        left = self.expr()
        tok = self.peek()
        if tok == "in" or (tok == "not" and self.ahead(1) == "in"):
            self.i += 1 if tok == "in" else 2
            return Member(left, self.values(), tok == "not")
        ops, operands = [], [left]
        while self.peek() in _CMP:
            ops.append(self.take())
            operands.append(self.expr())
        if not ops:
            raise self.fail(_EXPECTED)
        return Compare(tuple(ops), tuple(operands))

    def values(self) -> tuple[Expr, ...]:
        close = {"(": ")", "[": "]"}.get(self.peek() or "")
        if close is None:
            raise self.fail("'in' takes a parenthesised list of values: in (64, 128)")
        self.take()
        values = [self.expr()]
        while self.peek() == ",":
            self.take()
            if self.peek() == close:
                break
            values.append(self.expr())
        self.expect(close)
        return tuple(values)

    def atom(self) -> Expr:
        tok = self.peek()
        if tok in _KEYWORDS:
            raise self.fail(f"unexpected {tok!r}")
        if tok == "pow2" and self.ahead(1) == "(":
            raise self.fail("pow2(...) is a condition, not a number")
        return super().atom()


@lru_cache(maxsize=256)
def parse_constraint(text: str, where: str = "constraint") -> Constraint:
    """Parse one ``where`` constraint (grammar above; spaces allowed). A malformed one is an
    AnnotationError naming it and the position.

    Example::

        >>> parse_constraint("1 <= D <= 256 and D in (64, 128)").holds({"D": 128})
        True
    """
    stripped = text.strip()
    p = _ConstraintParser(stripped, where)
    if not p.tokens:
        raise p.fail("an empty constraint")
    cond = p.constraint()
    p.done()
    return Constraint(stripped, cond)
