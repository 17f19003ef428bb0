"""The dim grammar: one small, whitelisted expression language, parsed once per contract.

A dim string is what jaxtyping puts in ``Float[Tensor, "B 2*H*K+HV*V"]``: dims separated by
whitespace, each dim an expression over integers and names with ``+ - * // %`` and parentheses
(no spaces inside one dim, as in jaxtyping). ``_`` is a dim of any size. ``itemsize(t)`` is the
element size in bytes of tensor argument ``t``'s dtype. Constraints between dims
(``"HV % H == 0"``, ``"pow2(K)"``, ``"1 <= D <= 256 and D in (64, 128, 256)"``,
``"N == B if idx is None"``) combine comparisons with Python's boolean syntax; see
:func:`parse_constraint`.

Nothing here ever calls ``eval`` on user text: expressions are parsed into a tiny tree, and the
code generator (``codegen``) renders that tree itself.

Example::

    >>> parse_dim("2*H*K+HV*V").symbols()
    frozenset({'H', 'HV', 'K', 'V'})
    >>> parse_dim("2*H*K+HV*V").evaluate({"H": 2, "K": 4, "HV": 4, "V": 8})
    48
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..errors import AnnotationError
from ..source import define


class Expr:
    """A node of a dim expression."""

    __slots__ = ()

    def evaluate(self, env: Mapping[str, int]) -> int:
        raise NotImplementedError

    def symbols(self) -> frozenset[str]:
        raise NotImplementedError

    def render(self, name: dict[str, str] | None = None) -> str:
        """Python source for this expression; ``name`` maps a symbol to the variable to use."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()


@dataclass(frozen=True)
class Const(Expr):
    value: int

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.value

    def symbols(self) -> frozenset[str]:
        return frozenset()

    def render(self, name: dict[str, str] | None = None) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Sym(Expr):
    name: str

    def evaluate(self, env: Mapping[str, int]) -> int:
        return env[self.name]

    def symbols(self) -> frozenset[str]:
        return frozenset((self.name,))

    def render(self, name: dict[str, str] | None = None) -> str:
        return name[self.name] if name is not None else self.name


@dataclass(frozen=True)
class ItemSize(Expr):
    """``itemsize(arg)``: the element size in bytes of tensor argument ``arg``'s dtype (2 for
    float16). Among an expression's symbols it is the argument fact ``"itemsize(arg)"``."""

    arg: str

    @property
    def key(self) -> str:
        return f"itemsize({self.arg})"

    def evaluate(self, env: Mapping[str, int]) -> int:
        return env[self.key]

    def symbols(self) -> frozenset[str]:
        return frozenset((self.key,))

    def render(self, name: dict[str, str] | None = None) -> str:
        return name[self.key] if name is not None else self.key


@dataclass(frozen=True)
class ArgFact:
    """A fact about an argument that dims and constraints may use, named among their symbols by
    ``key``: ``itemsize(arg)`` (``kind == "itemsize"``, an int) or ``arg is None``
    (``kind == "none"``, a bool). A symbol that is a fact is never a dim."""

    kind: str
    arg: str

    @property
    def key(self) -> str:
        return f"itemsize({self.arg})" if self.kind == "itemsize" else f"{self.arg} is None"


_NAME = r"[^\W\d]\w*"  # an identifier, as Python (and jaxtyping) have them: non-ASCII letters too
_FACT = re.compile(rf"itemsize\(({_NAME})\)|({_NAME}) is None")


def arg_fact(symbol: str) -> ArgFact | None:
    """The argument fact a symbol names (``"itemsize(k)"``, ``"idx is None"``), None for a dim."""
    m = _FACT.fullmatch(symbol)
    if m is None:
        return None
    return ArgFact("itemsize", m.group(1)) if m.group(1) else ArgFact("none", m.group(2))


_PREC = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    left: Expr
    right: Expr

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for ``env``: the generated checker's own arithmetic (``render``), compiled
        once; a divisor of zero raises ZeroDivisionError, as in the checker."""
        return self._value(env)

    @cached_property
    def _value(self) -> Callable[[Mapping[str, int]], int]:
        src = self.render({s: f"env[{s!r}]" for s in self.symbols()})
        return define(f"def value(env):\n    return {src}\n", "<kda_contracts dim>", "value")

    def symbols(self) -> frozenset[str]:
        return self.left.symbols() | self.right.symbols()

    def render(self, name: dict[str, str] | None = None) -> str:
        def side(e: Expr, right: bool) -> str:
            s = e.render(name)
            if isinstance(e, BinOp) and (_PREC[e.op] < _PREC[self.op] or (right and _PREC[e.op] == _PREC[self.op])):
                return f"({s})"
            return s

        return f"{side(self.left, False)}{self.op}{side(self.right, True)}"


class _Any:
    """The ``_`` dim: any size, binds nothing."""

    def __repr__(self) -> str:
        return "ANY"

    def __str__(self) -> str:
        return "_"


ANY = _Any()


@dataclass(frozen=True)
class Broadcast:
    """``#d``: an axis of size 1 (broadcast) or of the size of ``d``."""

    dim: Expr

    def __str__(self) -> str:
        return f"#{self.dim}"


@dataclass(frozen=True)
class Variadic:
    """``*name`` (any number of axes, the same tuple of sizes wherever ``name`` appears),
    ``#*name`` (each of those axes may also be 1: broadcast-compatible), or ``...`` / ``*_``
    (any number of axes, bound to nothing)."""

    name: str | None
    broadcast: bool = False

    @property
    def key(self) -> str:
        """The name the bound sizes go by among a call's dims (``*name``)."""
        assert self.name is not None
        return f"*{self.name}"

    def __str__(self) -> str:
        if self.name is None:
            return "..."
        return ("#*" if self.broadcast else "*") + self.name


DimSpec = Expr | _Any | Broadcast | Variadic

_TOKEN = re.compile(rf"\s*(?:(\d+)|({_NAME})|(//|==|!=|<=|>=|[-+*%()<>,\[\]]))")
_CMP = ("==", "!=", "<=", ">=", "<", ">")
_KEYWORDS = frozenset(("and", "or", "not", "in", "is", "None", "if", "else"))


def _tokenize(text: str, where: str) -> tuple[list[str], list[int]]:
    """The tokens of ``text`` and the position where each starts."""
    tokens: list[str] = []
    starts: list[int] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise AnnotationError(
                f"{where}: cannot parse {text!r} at position {pos} ({text[pos:pos + 8]!r}); "
                "a dim is an expression of integers and names with + - * // % and parentheses"
            )
        tokens.append(m.group(m.lastindex or 0))
        starts.append(m.start(m.lastindex or 0))
        pos = m.end()
    return tokens, starts


class _Parser:
    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = where
        self.tokens, self.starts = _tokenize(text, where)
        self.i = 0

    def fail(self, why: str, at: int | None = None) -> AnnotationError:
        """The error for this text; ``at``: the index of the offending token (default: the next)."""
        return AnnotationError(f"{self.where}: cannot parse {self.text!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.fail("unexpected end")
        self.i += 1
        return tok

    def expr(self) -> Expr:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = self.fold(BinOp(op, node, self.term()))
        return node

    def term(self) -> Expr:
        node = self.atom()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            node = self.fold(BinOp(op, node, self.atom()))
        return node

    def atom(self) -> Expr:
        tok = self.take()
        if tok == "(":
            node = self.expr()
            if self.take() != ")":
                raise self.fail("missing ')'")
            return node
        if tok.isdigit():
            return Const(int(tok))
        if tok[0].isalpha() or tok[0] == "_":
            if tok == "_":
                raise self.fail("'_' (any size) must be a dim on its own, not part of an expression")
            if tok == "itemsize" and self.peek() == "(":
                return self.itemsize()
            return Sym(tok)
        raise self.fail(f"unexpected {tok!r}", self.i - 1)

    def itemsize(self) -> ItemSize:
        self.take()
        arg = self.take()
        if not arg.isidentifier() or arg in _KEYWORDS:
            raise self.fail(f"itemsize(...) takes the name of a tensor argument, not {arg!r}", self.i - 1)
        if self.take() != ")":
            raise self.fail("itemsize(...) takes one argument name")
        return ItemSize(arg)

    def fold(self, node: BinOp) -> Expr:
        try:
            return _fold(node)
        except AnnotationError:
            raise self.fail(f"{node} divides by zero") from None

    def done(self) -> None:
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")


def _fold(node: BinOp) -> Expr:
    """Fold constant sub-expressions so ``2*64`` is stored as ``128``."""
    if isinstance(node.left, Const) and isinstance(node.right, Const):
        try:
            return Const(node.evaluate({}))
        except ZeroDivisionError:
            raise AnnotationError(f"{node} divides by zero") from None
    return node


@lru_cache(maxsize=1024)
def parse_dim(text: str, where: str = "dim") -> Expr:
    """Parse one dim expression (``"HV*K"``, ``"2*H*K+HV*V"``, ``"128"``)."""
    p = _Parser(text, where)
    node = p.expr()
    p.done()
    return node


@lru_cache(maxsize=1024)
def parse_shape(dim_str: str, where: str = "shape") -> tuple[DimSpec, ...]:
    """Parse a jaxtyping dim string into one :data:`DimSpec` per axis (a variadic one stands for
    any number of axes): jaxtyping's whole grammar for torch — names, integers, expressions,
    ``_`` and ``_name`` (anonymous), ``#`` (broadcastable), ``*name`` and ``#*name`` (variadic),
    ``...`` and ``*_`` (anonymous variadic), ``name=dim`` (a label), and ``""`` (a scalar).
    Expressions use ``+ - * // %`` and parentheses, never ``eval``. At most one variadic per
    string; ``?`` (PyTree paths) is an AnnotationError: contracts check arguments, not PyTrees.

    Example::

        >>> parse_shape("*batch #H 2*D")
        (Variadic(name='batch', broadcast=False), Broadcast(dim=Sym(name='H')), BinOp(...))
    """
    dims: list[DimSpec] = []
    for tok in dim_str.split():
        dims.append(_parse_axis(tok, dim_str, where))
    if sum(isinstance(d, Variadic) for d in dims) > 1:
        raise AnnotationError(f"{where}: {dim_str!r} has more than one variadic dim (*name or ...); "
                              "a shape can have at most one")
    return tuple(dims)


def _parse_axis(tok: str, dim_str: str, where: str) -> DimSpec:
    def refuse(why: str) -> AnnotationError:
        return AnnotationError(f"{where}: dim {tok!r} in {dim_str!r}: {why}")

    if tok == "...":
        return Variadic(None)
    if "," in tok and "(" not in tok:
        raise refuse("separate dims with spaces, not commas")
    if tok.endswith("#"):
        raise refuse("a broadcastable dim is written with # first (#B), not last")
    text, broadcast, variadic = tok, False, False
    if text.startswith("#"):
        text, broadcast = text[1:], True
    if text.startswith("*"):
        text, variadic = text[1:], True
    if text.startswith(("#", "*")):
        raise refuse("use # and * at most once each, # first (#*batch)")
    if text.startswith("?"):
        raise refuse("'?' (a dim that depends on a PyTree path) is not supported: contracts check arguments")
    if text.count("=") == 1 and text.split("=")[0].isidentifier():
        text = text.split("=")[1]  # jaxtyping's label syntax: "rows=3" is the dim 3
    if variadic:
        if text == "_" or (text.startswith("_") and text.isidentifier()):
            if broadcast:
                raise refuse("an anonymous variadic dim cannot be broadcastable")
            return Variadic(None)
        if not text.isidentifier():
            raise refuse("a variadic dim is a name (*batch), not an expression or a number")
        return Variadic(text, broadcast)
    if text == "_" or (text.startswith("_") and text.isidentifier()):
        if broadcast:
            raise refuse("an anonymous dim cannot be broadcastable (#_)")
        return ANY  # _ and _name: any size, bound to nothing (the name is documentation)
    if not text:
        raise refuse("empty dim")
    expr = parse_dim(text, f"{where}: dim {tok!r}")
    return Broadcast(expr) if broadcast else expr


def linear_form(expr: Expr, x: str) -> tuple[Expr, Expr] | None:
    """Write ``expr`` as ``coef*x + rest`` with ``x`` absent from both; None if not linear in x.

    This is what lets ``H`` be solved from ``mixed_qkv.shape[1] == 2*H*K + HV*V``.
    """
    if x not in expr.symbols():
        return Const(0), expr
    if isinstance(expr, Sym):
        return Const(1), Const(0)
    if not isinstance(expr, BinOp):
        return None
    lf, rf = linear_form(expr.left, x), linear_form(expr.right, x)
    if lf is None or rf is None:
        return None
    (la, lc), (ra, rc) = lf, rf
    if expr.op in ("+", "-"):
        return _simplify(BinOp(expr.op, la, ra)), _simplify(BinOp(expr.op, lc, rc))
    if expr.op == "*":
        if x not in expr.left.symbols():  # c * (a x + b)
            return _simplify(BinOp("*", expr.left, ra)), _simplify(BinOp("*", expr.left, rc))
        if x not in expr.right.symbols():
            return _simplify(BinOp("*", la, expr.right)), _simplify(BinOp("*", lc, expr.right))
    return None  # x*x, x//c, c%x ...: not solvable by one division


def _simplify(node: BinOp) -> Expr:
    l, r = node.left, node.right
    if node.op == "*":
        if l == Const(0) or r == Const(0):
            return Const(0)
        if l == Const(1):
            return r
        if r == Const(1):
            return l
    if node.op in ("+", "-") and r == Const(0):
        return l
    if node.op == "+" and l == Const(0):
        return r
    return _fold(node)


# -- variadic dims -------------------------------------------------------------------------------
def broadcast_sizes(*occurrences: tuple[Sequence[int], bool]) -> tuple[int, ...] | None:
    """The sizes a variadic dim stands for, from every ``(sizes, broadcastable)`` occurrence: the
    broadcast of all of them (numpy's rule: aligned on the right, each axis equal or 1), which
    each non-broadcastable occurrence must equal. None when they do not agree. Order-independent."""
    out: list[int] = []
    for sizes, _ in occurrences:
        sizes = tuple(sizes)
        if len(sizes) > len(out):
            out = [1] * (len(sizes) - len(out)) + out
        for i in range(1, len(sizes) + 1):
            a, b = out[-i], sizes[-i]
            if a == 1:
                out[-i] = b
            elif b != 1 and b != a:
                return None
    result = tuple(out)
    if any(not bc and tuple(sizes) != result for sizes, bc in occurrences):
        return None
    return result


class WideSizes(tuple):  # type: ignore[type-arg]
    """The sizes of a variadic dim only broadcastable occurrences (``#*name``) bound so far: a
    plain occurrence, a tensor inside a container or the result may still widen them, as torch's
    broadcasting would. Equal to (and hashed as) the plain tuple of the same sizes."""

    __slots__ = ()


def bind_variadic(*occurrences: tuple[Sequence[int] | None, bool]) -> tuple[int, ...] | bool | None:
    """A variadic dim bound from every ``(sizes, broadcastable)`` occurrence given (sizes None:
    an optional argument that is None): their broadcast (see :func:`broadcast_sizes`), a
    :class:`WideSizes` when every occurrence given is broadcastable; None when none is given;
    False when they do not agree.

    Example::

        bind_variadic(((1, 3), True), ((2, 3), False))   # (2, 3)
        bind_variadic(((1, 3), True), (None, False))     # WideSizes((1, 3)): a result may widen it
    """
    given = [(sizes, bc) for sizes, bc in occurrences if sizes is not None]
    if not given:
        return None
    merged = broadcast_sizes(*given)  # type: ignore[arg-type]
    if merged is None:
        return False
    return WideSizes(merged) if all(bc for _, bc in given) else merged


def broadcast_dim(*sizes: int) -> int | None:
    """The size a dim only broadcastable axes (``#N``) carry: the first size that is not 1 (the
    checks that follow reject any other), or None when all are 1 (then it is bound by nothing,
    as in torch's broadcasting: a later argument, item or the return may fix it)."""
    return next((s for s in sizes if s != 1), None)


def fits_variadic(sizes: Sequence[int], broadcastable: bool, bound: Sequence[int] | None) -> bool:
    """Whether one occurrence of a variadic dim agrees with the sizes it is bound to (anything
    fits a variadic dim nothing bound)."""
    if bound is None:
        return True
    return broadcast_sizes((bound, True), (sizes, broadcastable)) == tuple(bound) if broadcastable \
        else tuple(sizes) == tuple(bound)


def dim_symbols(d: DimSpec) -> frozenset[str]:
    """The symbols a dim mentions (a variadic dim's is its key, ``*name``)."""
    if isinstance(d, Expr):
        return d.symbols()
    if isinstance(d, Broadcast):
        return d.dim.symbols()
    if isinstance(d, Variadic) and d.name is not None:
        return frozenset((d.key,))
    return frozenset()
