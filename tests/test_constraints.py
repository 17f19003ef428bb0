"""The constraint language of ``where=[...]``: boolean structure, membership, chained comparisons,
conditions on an argument being None, dims from a dtype's item size, and dims bound by an
equality. Every form is decided by one rendered source on both paths (fast checker and
explainer); the random test at the end holds them to the same verdict."""

import itertools
import random
import re
from typing import Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.grammar.constraints import parse_constraint


def t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(kc.ContractError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def contract_of(fn) -> Any:
    return fn.__kda_contract__


# -- each form, both verdicts -----------------------------------------------------------------------
FORMS = [
    # (constraint, an env where it holds, an env where it does not)
    ("HV % H == 0", {"HV": 8, "H": 4}, {"HV": 6, "H": 4}),
    ("K <= 256", {"K": 256}, {"K": 257}),
    ("D != 0", {"D": 1}, {"D": 0}),
    ("1 <= D <= 256", {"D": 256}, {"D": 257}),
    ("1 <= D <= 256", {"D": 1}, {"D": 0}),
    ("0 < H < HV == 2*H", {"H": 2, "HV": 4}, {"H": 2, "HV": 3}),
    ("D in (64, 80, 96, 128, 256)", {"D": 80}, {"D": 72}),
    ("D in [64, 2*H]", {"D": 8, "H": 4}, {"D": 9, "H": 4}),
    ("D in (64,)", {"D": 64}, {"D": 32}),
    ("D not in (3, 5)", {"D": 4}, {"D": 5}),
    ("pow2(K)", {"K": 128}, {"K": 96}),
    ("pow2(K)", {"K": 1}, {"K": 0}),
    ("pow2(HV // H)", {"HV": 8, "H": 2}, {"HV": 6, "H": 2}),
    ("K <= 256 and pow2(K)", {"K": 64}, {"K": 512}),
    ("K <= 256 and pow2(K)", {"K": 64}, {"K": 96}),
    ("D == 1 or D % 8 == 0", {"D": 1}, {"D": 3}),
    ("D == 1 or D % 8 == 0", {"D": 16}, {"D": 12}),
    ("not pow2(D)", {"D": 6}, {"D": 8}),
    ("not D > 4", {"D": 4}, {"D": 5}),
    ("not (D > 4 or D < 2)", {"D": 3}, {"D": 1}),
    ("(HV - H) % 2 == 0", {"HV": 6, "H": 2}, {"HV": 5, "H": 2}),
    ("(D > 4 or E > 4) and D + E < 12", {"D": 5, "E": 1}, {"D": 1, "E": 1}),
    ("D > 4 or E > 4 and D + E > 100", {"D": 5, "E": 1}, {"D": 1, "E": 5}),  # and binds tighter than or
    ("idx is None", {"idx is None": True}, {"idx is None": False}),
    ("idx is not None", {"idx is None": False}, {"idx is None": True}),
    ("N == B if idx is None", {"N": 3, "B": 4, "idx is None": False}, {"N": 3, "B": 4, "idx is None": True}),
    ("N == B if idx is None", {"N": 4, "B": 4, "idx is None": True}, {"N": 3, "B": 4, "idx is None": True}),
    ("N == B if idx is None else N >= B", {"N": 5, "B": 4, "idx is None": False},
     {"N": 3, "B": 4, "idx is None": False}),
    ("x == 16 // itemsize(k)", {"x": 8, "itemsize(k)": 2}, {"x": 8, "itemsize(k)": 4}),
    ("D % (16 // itemsize(k)) == 0", {"D": 64, "itemsize(k)": 1}, {"D": 8, "itemsize(k)": 1}),
]


@pytest.mark.parametrize(("text", "good", "bad"), FORMS, ids=[f"{f[0]} | {sorted(f[2].items())}" for f in FORMS])
def test_each_form_holds_and_fails_as_python_would(text, good, bad):
    c = parse_constraint(text)
    assert c.holds(good) is True
    assert c.holds(bad) is False
    for env in (good, bad):  # Python's own verdict on the same text (the test may eval; the library never does)
        python = text + (" else True" if " if " in text and " else " not in text else "")  # Python needs else
        assert c.holds(env) == eval(python, python_namespace(env))


def python_namespace(env: dict[str, int]) -> dict[str, Any]:
    """What Python needs to evaluate a constraint's text itself: dims by name, each argument None
    or not, and ``itemsize(k)`` as ``k``'s element size."""
    ns: dict[str, Any] = {"pow2": lambda v: v > 0 and v & (v - 1) == 0, "itemsize": lambda size: size}
    for key, value in env.items():
        if m := re.fullmatch(r"(\w+) is None", key):
            ns[m.group(1)] = None if value else object()
        elif m := re.fullmatch(r"itemsize\((\w+)\)", key):
            ns[m.group(1)] = value
        else:
            ns[key] = value
    return ns


def test_todays_constraints_render_the_same_source():
    assert parse_constraint("HV % H == 0").render() == "(HV%H) == (0)"
    assert parse_constraint("pow2(K)").render() == "((K) > 0 and (K) & ((K) - 1) == 0)"


# -- through a contract: fast path, slow path, pinned messages --------------------------------------
@kc.contract(where=[kc.Where("1 <= D <= 256 and D in (64, 80, 96, 128, 256)", hint="a head size the kernel has"),
                    "not (H > 64)", "pow2(H) or H == 3"])
def attend(q: Float[Tensor, "B H D"]) -> None: ...


def test_a_compound_constraint_accepts_and_rejects_on_both_paths():
    c = contract_of(attend)
    for shape, ok in [((2, 4, 64), True), ((2, 3, 256), True), ((2, 4, 72), False), ((2, 4, 512), False),
                      ((2, 128, 64), False), ((2, 6, 64), False)]:
        assert (c.check(t(*shape)) is not None) == ok, shape
        assert (not c.explain(t(*shape))[1]) == ok, shape


def test_a_failed_membership_names_the_constraint_the_values_and_their_sources():
    assert message(attend, t(2, 4, 72)) == (
        "attend(): 1 contract violation\n"
        "  [1] dims: ShapeError\n"
        "      expected 1 <= D <= 256 and D in (64, 80, 96, 128, 256)\n"
        "      got      D=72\n"
        "      D from q.shape[2]\n"
        "      fix: a head size the kernel has\n"
        "  dims: B=2 from q.shape[0]; H=4 from q.shape[1]; D=72 from q.shape[2]"
    )


@kc.contract(where=[kc.Where("HV % H == 0", hint="HV must be a multiple of H"), "pow2(K)"])
def heads(x: Float[Tensor, "B H K"], y: Float[Tensor, "B HV"]) -> None: ...


def test_todays_constraint_messages_are_unchanged():
    assert message(heads, t(2, 3, 8), t(2, 4)) == (
        "heads(): 1 contract violation\n"
        "  [1] dims: ShapeError\n"
        "      expected HV % H == 0\n"
        "      got      H=3, HV=4\n"
        "      H from x.shape[1]\n"
        "      HV from y.shape[1]\n"
        "      fix: HV must be a multiple of H\n"
        "  dims: B=2 from x.shape[0]; H=3 from x.shape[1]; K=8 from x.shape[2]; HV=4 from y.shape[1]"
    )
    assert message(heads, t(2, 3, 6), t(2, 6)) == (
        "heads(): 1 contract violation\n"
        "  [1] dims: ShapeError\n"
        "      expected pow2(K)\n"
        "      got      K=6\n"
        "      K from x.shape[2]\n"
        "  dims: B=2 from x.shape[0]; H=3 from x.shape[1]; K=6 from x.shape[2]; HV=6 from y.shape[1]"
    )


# -- conditional on an argument being None ----------------------------------------------------------
@kc.contract(where=["N == B if state_batch_indices is None"])
def update(x: Float[Tensor, "B D"], state: Float[Tensor, "N D"],
           state_batch_indices: Int[Tensor, "B"] | None = None) -> None: ...


def test_without_the_optional_argument_the_condition_applies():
    update(t(4, 8), t(4, 8))
    assert message(update, t(4, 8), t(9, 8)) == (
        "update(): 1 contract violation\n"
        "  [1] dims: ShapeError\n"
        "      expected N == B if state_batch_indices is None\n"
        "      got      B=4, N=9, state_batch_indices is None\n"
        "      B from x.shape[0]\n"
        "      N from state.shape[0]\n"
        "  dims: B=4 from x.shape[0]; D=8 from x.shape[1]; N=9 from state.shape[0]"
    )


def test_with_the_optional_argument_the_condition_is_lifted():
    update(t(4, 8), t(9, 8), t(4, dtype=torch.int32))
    update(t(4, 8), t(9, 8), state_batch_indices=t(4, dtype=torch.int64))
    c = contract_of(update)
    assert c.check(t(4, 8), t(9, 8), t(4, dtype=torch.int32)) is not None
    assert c.check(t(4, 8), t(9, 8), None) is None


def test_is_not_none_and_else_branches():
    @kc.contract(where=["N >= B if idx is not None else N == B"])
    def f(x: Float[Tensor, "B"], pool: Float[Tensor, "N"], idx: Int[Tensor, "B"] | None = None) -> None: ...

    f(t(2), t(2))
    f(t(2), t(5), t(2, dtype=torch.int32))
    with pytest.raises(kc.ShapeError, match=r"got +B=4, N=2, idx is not None"):
        f(t(4), t(2), t(4, dtype=torch.int32))
    with pytest.raises(kc.ShapeError, match=r"got +B=2, N=5, idx is None"):
        f(t(2), t(5))


def test_an_optional_scalar_can_condition_too():
    @kc.contract(where=["D % 8 == 0 if block is not None"])
    def f(x: Float[Tensor, "D"], block: int | None = None) -> None: ...

    f(t(12))
    f(t(16), 4)
    with pytest.raises(kc.ShapeError, match=r"expected D % 8 == 0 if block is not None"):
        f(t(12), 4)


# -- dims from a dtype: vLLM's paged key cache --------------------------------------------------------
# vLLM packs x = 16 // itemsize elements of a head into the last axis of the key cache:
# key_cache [num_blocks, num_kv_heads, head_size // x, block_size, x]
@kc.contract(where=["x == 16 // itemsize(key_cache)", "D % x == 0"])
def paged_attention(query: Float[Tensor, "T NH D"], key_cache: Float[Tensor, "NB NKV D//x BS x"],
                    value_cache: Float[Tensor, "NB NKV D BS"]) -> None: ...


def paged_args(dtype: torch.dtype, x: int | None = None, D: int = 128) -> tuple[torch.Tensor, ...]:
    x = 16 // dtype.itemsize if x is None else x
    return (t(3, 8, D), torch.empty(10, 2, D // x, 16, x, dtype=dtype), torch.empty(10, 2, D, 16, dtype=dtype))


CACHE_DTYPES = [torch.float16, torch.bfloat16, torch.float32] + \
    [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", CACHE_DTYPES, ids=str)
def test_a_paged_key_cache_packs_16_bytes_whatever_the_dtype(dtype):
    paged_attention(*paged_args(dtype))
    dims = contract_of(paged_attention).validate(*paged_args(dtype))
    assert dims.x == 16 // dtype.itemsize and dims.D == 128
    wrong = 8 if dtype.itemsize != 2 else 4
    with pytest.raises(kc.ShapeError, match=rf"expected x == 16 // itemsize\(key_cache\)\n +got +x={wrong}, "
                                            rf"itemsize\(key_cache\)={dtype.itemsize}"):
        paged_attention(*paged_args(dtype, x=wrong))


def test_a_key_cache_packed_for_another_dtype_names_the_dtype():
    assert message(paged_attention, *paged_args(torch.float32, x=8)) == (
        "paged_attention(): 1 contract violation\n"
        "  [1] dims: ShapeError\n"
        "      expected x == 16 // itemsize(key_cache)\n"
        "      got      x=8, itemsize(key_cache)=4\n"
        "      x from key_cache.shape[4]\n"
        "      itemsize(key_cache) from key_cache.dtype (float32)\n"
        "  dims: T=3 from query.shape[0]; NH=8 from query.shape[1]; D=128 from query.shape[2]; "
        "NB=10 from key_cache.shape[0]; NKV=2 from key_cache.shape[1]; x=8 from key_cache.shape[4]; "
        "BS=16 from key_cache.shape[3]"
    )


def test_itemsize_works_inside_a_dim_too():
    @kc.contract
    def f(query: Float[Tensor, "T D"],
          key_cache: Float[Tensor, "NB D//(16//itemsize(key_cache)) 16//itemsize(key_cache)"]) -> None: ...

    f(t(2, 64), torch.empty(4, 8, 8, dtype=torch.float16))
    f(t(2, 64), torch.empty(4, 16, 4, dtype=torch.float32))
    with pytest.raises(kc.ShapeError, match=r"dim 2 \(16//itemsize\(key_cache\)\): expected 4, got 8"):
        f(t(2, 64), torch.empty(4, 8, 8, dtype=torch.float32))


# -- binding by an equality constraint ----------------------------------------------------------------
def test_a_dim_only_an_equality_defines_is_bound_by_it():
    @kc.contract(where=["x == 16 // itemsize(key_cache)"])
    def f(query: Float[Tensor, "T D"], key_cache: Float[Tensor, "NB D//x BS*x"]) -> None: ...

    dims = contract_of(f).validate(t(2, 64), torch.empty(4, 8, 16 * 8, dtype=torch.float16))
    assert (dims.x, dims.BS) == (8, 16)  # x from the equality, then BS solved from BS*x
    assert dims.provenance["x"] == "from where x == 16 // itemsize(key_cache)"
    assert dims.provenance["BS"] == "solved from key_cache.shape[2] = BS*x"
    with pytest.raises(kc.ShapeError, match=r"dim 1 \(D//x\): expected 8, got 16"):
        f(t(2, 64), torch.empty(4, 16, 16 * 8, dtype=torch.float16))


def test_binding_by_equality_is_order_independent():
    """y needs S, solved from a width only once x (from an equality) is known; every order of the
    constraints and of the arguments binds the same dims."""
    texts = ["x == 16 // itemsize(k)", "y == 2*S", "pow2(y)"]
    for where in itertools.permutations(texts):
        for flip in (False, True):
            if flip:
                def f(q: Float[Tensor, "T y"], k: Float[Tensor, "S*x"]) -> None: ...
            else:
                def f(k: Float[Tensor, "S*x"], q: Float[Tensor, "T y"]) -> None: ...  # type: ignore[misc]
            c = contract_of(kc.contract(where=list(where), register=False)(f))
            kw = {"k": torch.empty(4 * 8, dtype=torch.float16), "q": t(3, 8)}
            dims = c.validate(**kw)
            assert (dims.x, dims.S, dims.y) == (8, 4, 8), where
            assert c.check(*(kw[n] for n in c._param_names)) is not None
            kw["q"] = t(3, 6)
            assert c.check(*(kw[n] for n in c._param_names)) is None
            assert c.explain(**kw)[1]


def test_an_equality_binds_an_int_argument_named_only_in_a_constraint():
    @kc.contract(where=["n_tokens == B * 2"])
    def f(x: Float[Tensor, "B D"], n_tokens: int) -> None: ...

    f(t(3, 4), 6)
    with pytest.raises(kc.ShapeError, match=r"got +B=3, n_tokens=5"):
        f(t(3, 4), 5)


def test_a_conditional_equality_does_not_bind():
    def f(x: Float[Tensor, "B D//x"], idx: Int[Tensor, "B"] | None = None) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"cannot bind dim 'x' \(in x: 'B D//x'\)|cannot bind dim 'D'"):
        kc.contract(where=["x == 4 if idx is None"])(f)


def test_an_unbindable_dim_is_still_an_annotation_error_naming_it():
    def f(x: Float[Tensor, "B D"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: cannot bind dim 'y' \(in a constraint or the return\), 'z'"):
        kc.contract(where=["y == z + 1"])(f)


def test_an_equality_that_divides_by_zero_rejects_on_both_paths():
    @kc.contract(where=["x == 16 // (itemsize(k) - 2)"])
    def f(k: Float[Tensor, "B x"]) -> None: ...

    f(torch.empty(3, 8, dtype=torch.float32))
    c = contract_of(f)
    assert c.check(torch.empty(3, 8, dtype=torch.float16)) is None
    with pytest.raises(kc.ShapeError, match=r"expected x == 16 // \(itemsize\(k\) - 2\)"):
        f(torch.empty(3, 8, dtype=torch.float16))

    @kc.contract(where=["y == 16 // (itemsize(k) - 2)"])
    def g(q: Float[Tensor, "D"], k: Float[Tensor, "B D//y"]) -> None: ...  # y: only the equality binds it

    g(t(64), torch.empty(3, 8, dtype=torch.float32))
    assert contract_of(g).check(t(64), torch.empty(3, 8, dtype=torch.float16)) is None
    with pytest.raises(kc.ShapeError, match=r"got +16//\(itemsize\(k\)-2\) divides by zero with itemsize\(k\)=2"):
        g(t(64), torch.empty(3, 8, dtype=torch.float16))


# -- malformed constraints: AnnotationError at decoration, naming it and the position ---------------
MALFORMED = [
    ("D % 2", r": expected a comparison \(== != < <= > >=\) or pow2\(\.\.\.\) "
              r"\(or: in \(\.\.\.\), not in \(\.\.\.\), NAME is None\), at position 5 \(the end\)$"),
    ("1 < D <", r": unexpected end, at position 7 \(the end\)$"),
    ("D in 64", r": 'in' takes a parenthesised list of values: in \(64, 128\), at position 5$"),
    ("D in (64, 128", r": expected '\)', at position 13 \(the end\)$"),
    ("D > 1 and", r": unexpected end, at position 9 \(the end\)$"),
    ("D > 1 D", r": unexpected 'D', at position 6$"),
    ("and D > 1", r": unexpected 'and', at position 0$"),
    ("(D > 1", r": expected '\)', at position 6 \(the end\)$"),
    ("D == pow2(K)", r": pow2\(\.\.\.\) is a condition, not a number, at position 5$"),
    ("idx is 3", r": expected 'None', not '3', at position 7$"),
    ("x == itemsize(3)", r": itemsize\(\.\.\.\) takes the name of a tensor argument, not '3', at position 14$"),
    ("D >= 1 if", r": unexpected end, at position 9 \(the end\)$"),
    ("D = 2", r" at position 1 \(' = 2'\)"),  # the tokenizer's message, unchanged
    ("", r": an empty constraint, at position 0 \(the end\)$"),
]


@pytest.mark.parametrize(("text", "pattern"), MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_a_malformed_constraint_is_an_annotation_error_naming_it_and_the_position(text, pattern):
    def f(x: Float[Tensor, "B D"], idx: Int[Tensor, "B"] | None = None) -> None: ...

    quoted = re.escape(repr(text))
    with pytest.raises(kc.AnnotationError, match=rf"\.f: where {quoted}: cannot parse {quoted}" + pattern):
        kc.contract(where=[text])(f)


MISUSED = [
    ("itemsize(idx) == 4", r"itemsize\(idx\): 'idx' is an optional tensor \(it may be None\)"),
    ("itemsize(n) == 4", r"itemsize\(n\): 'n' is not a tensor argument"),
    ("itemsize(nope) == 4", r"itemsize\(nope\): 'nope' is not a tensor argument"),
    ("D > 1 if x is None", r"where 'x is None': 'x' is not an argument that may be None"),
    ("D > 1 if nope is None", r"where 'nope is None': 'nope' is not an argument that may be None"),
]


@pytest.mark.parametrize(("text", "pattern"), MISUSED, ids=[m[0] for m in MISUSED])
def test_an_argument_fact_the_contract_cannot_know_is_an_annotation_error(text, pattern):
    def f(x: Float[Tensor, "B D"], n: int, idx: Int[Tensor, "B"] | None = None) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"f: " + pattern):
        kc.contract(where=[text])(f)


def test_itemsize_in_the_return_annotation_is_refused():
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "B 16//itemsize(x)"]: ...

    with pytest.raises(kc.AnnotationError, match=r"itemsize\(\) cannot be used in the return annotation"):
        kc.contract(f)


# -- fast path and slow path agree -------------------------------------------------------------------
AGREEMENT_WHERE = [
    "1 <= D <= 64 and D in (8, 16, 24, 32, 64)",
    "pow2(H) or H == 3",
    "not (G > H)",
    "H % G == 0 if idx is None else N >= B",
    "x == 16 // itemsize(k)",
    "D % x == 0 or D < x",
]


@kc.contract(where=AGREEMENT_WHERE, register=False)
def agreement(q: Float[Tensor, "B H D"], k: Float[Tensor, "N G D//x x"],
              idx: Int[Tensor, "B"] | None = None) -> None: ...


def test_fast_and_slow_paths_agree_over_random_dims():
    c = contract_of(agreement)
    rng = random.Random(11)
    verdicts = {True: 0, False: 0}
    for _ in range(400):
        # mostly valid values, each sometimes broken, so both verdicts come up often
        B, N = rng.randint(1, 4), rng.randint(1, 6)
        H = rng.choice([1, 2, 3, 4, 8]) if rng.random() < 0.85 else rng.randint(1, 9)
        G = rng.choice([g for g in range(1, H + 1) if H % g == 0]) if rng.random() < 0.85 else rng.randint(1, 9)
        D = rng.choice([8, 16, 24, 32, 64]) if rng.random() < 0.85 else rng.choice([4, 12, 48, 72, 128])
        dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
        x = 16 // dtype.itemsize if rng.random() < 0.85 else rng.choice([2, 4, 8])
        q, k = t(B, H, D), torch.empty(N, G, D // x, x, dtype=dtype)
        idx = t(B, dtype=torch.int32) if rng.random() < 0.5 else None
        fast = c.check(q, k, idx)
        dims, violations = c.explain(q, k, idx)
        assert (fast is not None) == (not violations), (B, H, G, N, D, dtype, x, idx is None, violations)
        if fast is not None:
            assert dict(zip(c.spec.symbols, fast, strict=True)) == dict(dims)
        verdicts[fast is not None] += 1
    assert min(verdicts.values()) >= 40, verdicts  # both verdicts well exercised


def test_a_backend_constraint_on_an_argument_fact_is_refused():
    from kda_contracts.ops.packed_decode.adapters import Adapter

    Adapter(name="fine", kernel="x:y", devices=("cpu",), where=("K in (64, 128) and not V > 256",))
    with pytest.raises(kc.AnnotationError, match=r"adapter 'bad': where 'K <= 16 // itemsize\(out\)': a backend "
                                                 r"constraint is on dims only; itemsize\(out\) is not a dim"):
        Adapter(name="bad", kernel="x:y", devices=("cpu",), where=("K <= 16 // itemsize(out)",))


def test_argument_facts_trace_without_graph_breaks():
    """itemsize(t) and `t is None` are read in the traced checker (graph counts per shape class are
    issue 11 item 1's tests)."""
    compiled = torch.compile(paged_attention, fullgraph=True, backend="eager")
    torch._dynamo.reset()
    for dtype in (torch.float16, torch.float16, torch.float32):
        compiled(*paged_args(dtype))
    with pytest.raises(kc.ShapeError):
        compiled(*paged_args(torch.float32, x=8))
    compiled_update = torch.compile(update, fullgraph=True, backend="eager")
    compiled_update(t(4, 8), t(4, 8))
    compiled_update(t(4, 8), t(9, 8), t(4, dtype=torch.int32))
