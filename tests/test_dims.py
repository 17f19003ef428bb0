"""The dim grammar: parsed once into a whitelisted tree, never eval'd."""

import pytest

from kda_contracts._engine.errors import AnnotationError
from kda_contracts._engine.grammar.constraints import parse_constraint
from kda_contracts._engine.grammar.dims import (
    ANY,
    BinOp,
    Broadcast,
    Const,
    Sym,
    Variadic,
    linear_form,
    parse_dim,
    parse_shape,
)


def test_packed_width_parses_into_a_tree_with_precedence():
    e = parse_dim("2*H*K+HV*V")
    assert e == BinOp("+", BinOp("*", BinOp("*", Const(2), Sym("H")), Sym("K")), BinOp("*", Sym("HV"), Sym("V")))
    assert e.evaluate({"H": 2, "K": 4, "HV": 4, "V": 8}) == 48


def test_parentheses_floor_division_and_modulo_evaluate_like_python():
    assert parse_dim("(A+B)*2").evaluate({"A": 1, "B": 2}) == 6
    assert parse_dim("A//3").evaluate({"A": 10}) == 3
    assert parse_dim("A%3").evaluate({"A": 10}) == 1
    assert parse_dim("A-B-C").evaluate({"A": 10, "B": 3, "C": 2}) == 5


def test_constant_subexpressions_are_folded():
    assert parse_dim("2*64") == Const(128)


def test_render_round_trips_and_keeps_needed_parentheses():
    for text in ("2*H*K+HV*V", "(A+B)*C", "A-(B-C)", "A//(B*C)"):
        e = parse_dim(text)
        assert parse_dim(e.render()) == e


def test_shape_splits_on_whitespace_and_accepts_underscore():
    dims = parse_shape("B _ HV*K")
    assert dims[0] == Sym("B") and dims[1] is ANY and dims[2] == BinOp("*", Sym("HV"), Sym("K"))


@pytest.mark.parametrize("text,want", [
    ("*batch", Variadic("batch")), ("...", Variadic(None)), ("*_", Variadic(None)), ("*_rest", Variadic(None)),
    ("#*batch", Variadic("batch", broadcast=True)), ("#B", Broadcast(Sym("B"))),
    ("#2*H", Broadcast(BinOp("*", Const(2), Sym("H")))),
    ("rows=3", Const(3)), ("b=B", Sym("B")), ("_", ANY), ("_heads", ANY),
])
def test_jaxtypings_whole_grammar_parses(text, want):
    assert parse_shape(f"N {text}") == (Sym("N"), want)


def test_a_scalar_has_no_dims():
    assert parse_shape("") == ()


@pytest.mark.parametrize("text,why", [
    ("?B", "PyTree path"), ("*a *b", "more than one variadic"), ("... *b", "more than one variadic"),
    ("#_", "anonymous dim cannot be broadcastable"), ("##B", "at most once"), ("**B", "at most once"),
    ("B#", "# first"), ("B,H", "not commas"), ("*2", "a variadic dim is a name"), ("#*_", "anonymous variadic"),
])
def test_malformed_modifiers_are_annotation_errors(text, why):
    with pytest.raises(AnnotationError, match=why):
        parse_shape(text)


@pytest.mark.parametrize("text", ["H**2", "H+", "(H", "H)", "H$K", "__import__('os')", "H.K"])
def test_anything_outside_the_grammar_is_an_annotation_error(text):
    with pytest.raises(AnnotationError, match="cannot parse"):
        parse_dim(text)


def test_division_by_a_constant_zero_is_an_annotation_error():
    with pytest.raises(AnnotationError, match="divides by zero"):
        parse_dim("4//0")


def test_linear_form_solves_the_packed_width_for_h():
    coef, const = linear_form(parse_dim("2*H*K+HV*V"), "H")
    env = {"K": 128, "HV": 32, "V": 128}
    assert coef.evaluate(env) == 256 and const.evaluate(env) == 4096


@pytest.mark.parametrize("text", ["H*H", "K//H", "K%H", "H//2"])
def test_non_linear_uses_of_the_unknown_are_not_solved(text):
    assert linear_form(parse_dim(text), "H") is None


def test_constraints_compare_and_test_powers_of_two():
    assert parse_constraint("HV % H == 0").holds({"HV": 32, "H": 16})
    assert not parse_constraint("HV % H == 0").holds({"HV": 6, "H": 4})
    assert parse_constraint("pow2(K)").holds({"K": 128})
    assert not parse_constraint("pow2(K)").holds({"K": 96})
    assert parse_constraint("K <= 256").holds({"K": 256})


def test_a_constraint_without_a_comparison_is_an_annotation_error():
    with pytest.raises(AnnotationError, match="expected a comparison"):
        parse_constraint("HV % H")
