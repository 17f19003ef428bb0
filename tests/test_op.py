"""kc.op: a user's own op — contract + torch reference + backends, dispatch, explain_backends,
plug-ins through entry points, the custom op, modes and torch.compile."""

import sys
import textwrap
from typing import Annotated

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.operation.backends import BackendError
from kda_contracts._engine.operation.torch_op import _FAKE_ERRORS_PASS as FAKE_ERRORS_PASS


def make_op(name="scale_rows", **options):
    @kc.op(name=name, returns="out", **options)
    def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
                   out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True, same_dtype_as="x")]) -> None:
        """Reference: out = x * w, row by row."""
        torch.mul(x, w, out=out)

    return scale_rows


def args(B=3, D=8, dtype=torch.float32):
    return torch.randn(B, D, dtype=dtype), torch.randn(D, dtype=dtype), torch.empty(B, D, dtype=dtype)


def logging_kernel(log, tag="fast"):
    def kernel(x, w, out, *, dims):
        log.append((tag, dims.B, dims.D))
        torch.mul(x, w, out=out)

    return kernel


# -- basics -------------------------------------------------------------------------------------
def test_an_op_runs_its_reference_and_returns_what_it_wrote():
    op = make_op("basic_op")
    x, w, out = args()
    assert op(x, w, out) is out
    torch.testing.assert_close(out, x * w)
    assert isinstance(op, kc.Op) and kc.ops()["basic_op"] is op
    assert [b.name for b in op.backends()] == ["torch"]
    assert op.backends()[0].description == "Reference: out = x * w, row by row."


def test_a_bad_call_is_a_contract_error_and_runs_no_backend():
    op = make_op("bad_call_op")
    log: list = []
    op.backend("fast", devices=("cpu",), priority=5)(logging_kernel(log))
    x, w, out = args()
    before = out.clone()
    with pytest.raises(kc.ShapeError) as info:
        op(x, w[:4], out)
    assert str(info.value) == (
        "bad_call_op(): 1 contract violation\n"
        "  [1] w: ShapeError\n"
        "      expected [D] = [8]\n"
        "      got      [4]\n"
        "      dim 0 (D): expected 8 (D from x.shape[1]), got 4\n"
        "  dims: B=3 from x.shape[0]; D=8 from x.shape[1]")
    assert not log and torch.equal(out.nan_to_num(0), before.nan_to_num(0))


def test_auto_picks_the_highest_priority_backend_that_supports_the_call():
    op = make_op("priority_op")
    log: list = []
    op.backend("mod16", devices=("cpu",), priority=30, where=["D % 16 == 0"])(logging_kernel(log, "mod16"))
    op.backend("any", devices=("cpu",), priority=20)(logging_kernel(log, "any"))
    op(*args(D=16))
    op(*args(D=8))
    assert log == [("mod16", 3, 16), ("any", 3, 8)]
    assert [b.name for b in op.backends()] == ["mod16", "any", "torch"]
    assert op.explain_backends(*args(D=8)) == (
        "   mod16: not chosen: needs D % 16 == 0 (got D=8)\n"
        "     any: chosen (priority 20, the highest that supports this call)\n"
        "   torch: supports this call, but any has a higher priority")


def test_dtypes_devices_and_requirements_decide_support():
    op = make_op("support_op")
    log: list = []
    op.backend("half", devices=("cpu",), priority=50, dtypes={"x": (torch.float16, torch.bfloat16)})(
        logging_kernel(log, "half"))
    op.backend("gpu", devices=("cuda",), priority=40)(logging_kernel(log, "gpu"))
    op.backend("needs", devices=("cpu",), priority=30, requires=("no_such_module_xyz",))(logging_kernel(log, "needs"))
    op.backend("floats", devices=("cpu",), priority=20, dtypes=(torch.float64,))(logging_kernel(log, "floats"))
    op(*args(dtype=torch.bfloat16))
    op(*args(dtype=torch.float64))
    op(*args(dtype=torch.float32))
    assert [t for t, *_ in log] == ["half", "floats"]
    text = op.explain_backends(*args())
    assert "    half: not chosen: x dtype float32 not supported (supports bfloat16/float16)" in text
    assert "     gpu: not chosen: runs on cuda, not cpu" in text
    assert "   needs: not chosen: no_such_module_xyz is not installed" in text
    assert "  floats: not chosen: x dtype float32 not supported (supports float64); w dtype float32 not supported " \
           "(supports float64); out dtype float32 not supported (supports float64)" in text
    assert op.available()["needs"] == (False, "no_such_module_xyz is not installed")


def test_a_probe_that_raises_makes_the_backend_unavailable_not_the_call_fail():
    op = make_op("probe_op")

    def probe():
        raise OSError("driver exploded")

    op.backend("flaky", devices=("cpu",), priority=9, availability=probe)(logging_kernel([]))
    op(*args())
    ok, why = op.available()["flaky"]
    assert not ok and why == "availability check failed: OSError('driver exploded')"


def test_forcing_a_backend_that_cannot_run_the_call_is_a_backend_error():
    op = make_op("force_op")
    op.backend("mod16", devices=("cpu",), priority=30, where=["D % 16 == 0"])(logging_kernel([]))
    x, w, out = args(D=8)
    with pytest.raises(BackendError) as info:
        op(x, w, out, backend="mod16")
    assert str(info.value) == (
        "force_op(): 1 contract violation\n"
        "  [1] backend: BackendError\n"
        "      expected a backend that can run this call ('mod16' was asked for)\n"
        "      got      'mod16': needs D % 16 == 0 (got D=8)\n"
        "      fix: pass backend='auto' to let kda_contracts pick, or see force_op.explain_backends(...)\n"
        "  dims: B=3; D=8")
    with pytest.raises(BackendError, match=r"force_op: unknown backend 'nope'; registered: mod16, torch \(or 'auto'\)"):
        op(x, w, out, backend="nope")
    assert isinstance(info.value, kc.ContractError)
    op(x, w, out, backend="torch")


# -- the signature check --------------------------------------------------------------------------
@pytest.mark.parametrize(("kernel", "why"), [
    (lambda x, weight, out: None, "parameter 2 is 'weight', the op's is 'w'"),
    (lambda x, w: None, "missing parameter(s) out"),
    (lambda x, w, out, extra: None, "extra parameter(s) extra (a kernel may add only keyword-only dims and variant)"),
    (lambda x, w, *, out: None, "parameter 'out' is keyword-only, the op's is positional or keyword"),
])
def test_a_kernel_whose_signature_is_not_the_ops_is_refused_at_registration(kernel, why):
    op = make_op("sig_op")
    with pytest.raises(TypeError) as info:
        op.backend("k", devices=("cpu",))(kernel)
    assert str(info.value) == f"sig_op: backend 'k': the kernel '<lambda>' does not take the op's parameters: {why}"
    assert [b.name for b in op.backends()] == ["torch"]


def test_a_lazy_kernel_with_the_wrong_signature_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "wrong_kernels_mod.py").write_text("def kernel(x, out):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    op = make_op("lazy_sig_op")
    op.register_backend(kc.Backend(name="lazy", kernel="wrong_kernels_mod:kernel", devices=("cpu",), priority=5))
    op(*args())  # auto falls through to the reference
    assert op.available()["lazy"] == (False, "kernel 'wrong_kernels_mod:kernel' cannot be loaded: it does not take "
                                             "the op's parameters: parameter 2 is 'out', the op's is 'w'")
    with pytest.raises(BackendError, match="'lazy': kernel 'wrong_kernels_mod:kernel' cannot be loaded"):
        op(*args(), backend="lazy")


def test_declaration_mistakes_are_named():
    op = make_op("decl_op")
    with pytest.raises(TypeError, match=r"devices= takes a sequence of strings, got 'cpu'"):
        op.backend("s", devices="cpu")(logging_kernel([]))
    with pytest.raises(TypeError, match=r"decl_op: backend 'd': dtypes= names y, not parameters of the op"):
        op.backend("d", devices=("cpu",), dtypes={"y": (torch.float16,)})(logging_kernel([]))
    with pytest.raises(kc.AnnotationError, match=r"backend 'f': where 'x is None': a backend constraint is on dims"):
        op.backend("f", devices=("cpu",), where=["x is None"])(logging_kernel([]))
    with pytest.raises(kc.AnnotationError, match="a backend named 'torch' is already registered"):
        op.backend("torch", devices=("cpu",))(logging_kernel([]))
    with pytest.raises(kc.AnnotationError, match=r"an op parameter cannot be named 'backend'"):
        @kc.op
        def clash(x: Float[Tensor, "B"], backend: str) -> None: ...
    with pytest.raises(kc.AnnotationError, match=r"returns= names y, not parameters of the op"):
        @kc.op(returns="y")
        def bad_returns(x: Float[Tensor, "B"]) -> None: ...


# -- the selection cache ------------------------------------------------------------------------
def test_selection_is_computed_once_per_call_signature(monkeypatch):
    op = make_op("cache_op")
    op.backend("mod16", devices=("cpu",), priority=30, where=["D % 16 == 0"])(logging_kernel([]))
    chosen = []
    original = op.table.choose
    monkeypatch.setattr(op.table, "choose", lambda *a, **k: chosen.append(a[0]) or original(*a, **k))
    for _ in range(40):
        for D in (8, 16):
            op(*args(D=D))
            op(*args(D=D), backend="torch")
    assert sorted(chosen) == ["auto", "auto", "torch", "torch"]  # 160 calls, 4 call signatures


def test_registering_a_backend_forgets_earlier_choices():
    op = make_op("forget_op")
    log: list = []
    op(*args())
    op.backend("late", devices=("cpu",), priority=99)(logging_kernel(log, "late"))
    op(*args())
    op.unregister_backend("late")
    op(*args())
    assert [t for t, *_ in log] == ["late"]


def test_a_call_the_check_cache_answered_runs_the_backend_its_own_arguments_choose():
    # the dispatcher keeps its last choice for the dims object of a check-cache entry (an entry fixes the
    # dims, the device, the dtypes and which arguments are None); another entry, or a call the checker
    # answered, or another backend= is chosen afresh
    op = make_op("last_choice_op")
    log: list = []
    op.backend("mod16", devices=("cpu",), priority=60, where=["D % 16 == 0"])(lambda x, w, out: log.append("mod16"))
    op.backend("on_meta", devices=("meta",), priority=55)(lambda x, w, out: log.append("meta"))
    op.backend("half", devices=("cpu",), priority=50, dtypes={"x": (torch.bfloat16,)})(
        lambda x, w, out: log.append("half"))
    op.backend("any", devices=("cpu",), priority=10)(lambda x, w, out: log.append("any"))
    calls = {"mod16": args(D=16), "any": args(), "meta": tuple(t.to("meta") for t in args(B=4)),
             "half": args(B=5, dtype=torch.bfloat16), "any ": args(B=4)}  # (the meta call's shape, on the CPU)
    with kc.mode("check"):  # (strict mode chooses as check mode does)
        for _ in range(4):
            for a in calls.values():
                op(*a)
                op(*a)  # (the same entry and backend= again: the last choice)
                op(*a, backend="torch")  # (the body: not logged)
        for _ in range(2):
            for a in calls.values():  # (one entry after another)
                op(*a)
    assert log == [name.strip() for _ in range(4) for name in calls for _ in range(2)] + [*map(str.strip, calls)] * 2
    dims, backend, chosen = op.table.last[0]
    assert backend == "auto" and chosen.name == "any"
    assert any(dims is e[2] for e in op.contract._check.__kda_entries__.values())  # (answered by the cache)


def test_registering_a_backend_forgets_the_last_choice_too():
    op = make_op("forget_last_op")
    log: list = []
    a = args()
    with kc.mode("check"):
        for _ in range(4):
            op(*a)
        assert op.table.last[0][2].name == "torch"  # kept for the entry that answers this call
        op.backend("late", devices=("cpu",), priority=99)(lambda x, w, out: log.append("late"))
        op(*a)
        op(*a)
        op.unregister_backend("late")
        op(*a)
    assert log == ["late", "late"] and op.table.last[0][2].name == "torch"


# -- modes --------------------------------------------------------------------------------------
def test_mode_off_checks_nothing_but_still_dispatches_with_dims():
    op = make_op("off_op")
    log: list = []
    op.backend("fast", devices=("cpu",), priority=5, where=["D % 4 == 0"])(logging_kernel(log))
    c = op.contract
    calls = c.calls
    with kc.mode("off"):
        op(*args())
    assert log == [("fast", 3, 8)] and c.calls == calls


def test_strict_mode_runs_value_checks_before_and_after_checks_after_the_backend():
    def positive_w(ctx):
        """w must be positive (strict mode)."""
        return [] if bool((ctx.values["w"] > 0).all()) else [kc.Violation(kc.ValueRangeError, "w", "> 0", "<= 0")]

    def finite_out(ctx, backend):
        out = ctx.values["out"]
        return [] if bool(torch.isfinite(out).all()) else [
            kc.Violation(kc.ValueRangeError, "out", "finite values", "NaN or Inf", hint=f"blame {backend}")]

    op = make_op("strict_op", value_checks=positive_w, after=finite_out)
    op.backend("broken", devices=("cpu",), priority=5)(lambda x, w, out: out.fill_(float("nan")))
    x, w, out = args()
    w = w.abs() + 0.1
    with kc.mode("check"):
        op(x, w, out)  # check mode: nothing read
    with kc.mode("strict"):
        with pytest.raises(kc.ValueRangeError, match=r"strict_op \(after backend 'broken'\)(.|\n)*fix: blame broken"):
            op(x, w, out)
        with pytest.raises(kc.ValueRangeError, match=r"w: ValueRangeError"):
            op(x, -w, out, backend="torch")
        op(x, w, out, backend="torch")


def test_the_reference_body_sees_the_calls_dims():
    @kc.op
    def dims_op(x: Float[Tensor, "B D"]) -> Float[Tensor, "B"]:
        B = kc.dims()["B"]
        return x.sum(-1) + B

    assert dims_op(torch.zeros(3, 2)).tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(kc.ShapeError, match=r"return"):
        dims_op.register_backend(kc.Backend(name="wrong", kernel=lambda x: x, devices=("cpu",), priority=1))
        dims_op(torch.zeros(3, 2))


# -- variants -----------------------------------------------------------------------------------
def test_an_op_with_layout_variants_checks_each_call_against_its_variant():
    def nd(x: Float[Tensor, "B N D"], layout: str = "BND") -> None: ...

    def dn(x: Float[Tensor, "B D N"], layout: str = "BND") -> None: ...

    seen = []

    @kc.op(variants={"BND": nd, "BDN": dn}, variant=lambda layout: layout)
    def layout_op(x, layout: str = "BND"):
        seen.append(x.shape)

    @layout_op.backend("k", devices=("cpu",), priority=3, variants=("BDN",))
    def _(x, layout="BND", *, dims, variant):
        seen.append((variant, dims.N, dims.D))

    layout_op(torch.zeros(2, 3, 4))
    layout_op(torch.zeros(2, 4, 3), layout="BDN")
    assert seen == [torch.Size([2, 3, 4]), ("BDN", 3, 4)]
    assert "       k: not chosen: variant BND not supported" in layout_op.explain_backends(torch.zeros(2, 3, 4))
    assert set(layout_op.contracts) == {"BND", "BDN"}
    with pytest.raises(kc.AnnotationError, match="remove the op function's own"):
        @kc.op(variants={"BND": nd}, variant=lambda layout: layout)
        def annotated(x: Float[Tensor, "B N D"], layout: str = "BND") -> None: ...


# -- plug-ins -----------------------------------------------------------------------------------
def test_a_third_party_backend_plugs_in_through_its_entry_point(tmp_path, monkeypatch):
    """A real distribution on sys.path (dist-info with entry_points.txt), as pip would install it."""
    op = make_op("plugged_op")
    (tmp_path / "my_op_plugin.py").write_text(textwrap.dedent("""
        import torch
        import kda_contracts as kc

        CALLS = []

        def kernel(x, w, out):
            CALLS.append(x.shape[0])
            torch.mul(x, w, out=out)

        def backends():
            return [kc.Backend(name="plugin", kernel=kernel, devices=("cpu",), priority=77, op="plugged_op")]
    """))
    dist = tmp_path / "my_op_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-op-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kda_contracts.backends]\nplugin = my_op_plugin:backends\n"
                                           "broken = my_op_plugin:does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from kda_contracts._engine.operation import registry as op_module

    errors = op_module.load_plugins(force=True)
    assert errors["broken (my_op_plugin:does_not_exist)"].startswith("AttributeError")
    op(*args())
    assert sys.modules["my_op_plugin"].CALLS == [3]
    text = op.explain_backends(*args())
    assert "  plugin: chosen (priority 77" in text
    assert "plug-in broken (my_op_plugin:does_not_exist): failed to load: AttributeError" in text
    op_module._PLUGIN_ERRORS.clear()


# -- the custom op ------------------------------------------------------------------------------
def test_the_custom_op_of_a_user_op_passes_opcheck_and_its_fake_is_the_contract():
    @kc.op(namespace="kc_test_ops")
    def row_norms(x: Float[Tensor, "B D"], idx: Annotated[Int[Tensor, "B"], kc.Spec()],
                  scale: float = 1.0) -> Annotated[Float[Tensor, "B"], kc.Spec(same_dtype_as="x")]:
        """Reference."""
        return x.norm(dim=-1) * scale + idx.to(x.dtype) * 0

    x, idx = torch.randn(4, 8), torch.arange(4)
    result = torch.library.opcheck(row_norms.torch_op, (x, idx, 2.0))
    assert set(result.values()) == {"SUCCESS"}
    torch.testing.assert_close(torch.ops.kc_test_ops.row_norms(x, idx, 2.0), x.norm(dim=-1) * 2)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx, fi = mode.from_tensor(x), mode.from_tensor(idx)
        assert row_norms.torch_op(fx, fi).shape == (4,)
        with pytest.raises(kc.ShapeError, match=r"idx: ShapeError"):
            row_norms.torch_op(fx, mode.from_tensor(torch.arange(3)))


def test_a_bad_compiled_call_of_a_custom_op_with_outputs_carries_the_report():
    @kc.op(namespace="kc_test_ops")
    def row_scale(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
        return x * w

    row_scale.torch_op  # noqa: B018  # registers torch.ops.kc_test_ops.row_scale

    def step(x, w):
        return torch.ops.kc_test_ops.row_scale(x, w) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x, w = torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(compiled(x, w), x * w * 2)
    report = r"(?s)row_scale\(\): 1 contract violation.*w: ShapeError.*dim 0 \(D\): expected 8"
    if FAKE_ERRORS_PASS:  # torch >= 2.13: the fake kernel's error as itself
        with pytest.raises(kc.ShapeError, match=report):
            compiled(x, w[:4])
    else:  # torch 2.11: dynamo wraps what a fake kernel raises; an op with outputs cannot go on without shapes
        with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=report):
            compiled(x, w[:4])


def test_a_mutating_custom_op_declares_what_it_writes_and_a_bad_compiled_call_is_a_shape_error():
    op = make_op("mut_op", namespace="kc_test_ops")
    schema = str(op.torch_op._opoverload._schema)
    assert schema == ("kc_test_ops::mut_op(Tensor x, Tensor w, Tensor(a2!) out, str backend=\"auto\") -> ()")
    x, w, out = args()
    assert set(torch.library.opcheck(op.torch_op, (x, w, out)).values()) == {"SUCCESS"}

    def step(x, w, out):
        torch.ops.kc_test_ops.mut_op(x, w, out)
        return out * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, w, out), x * w * 2)
    with pytest.raises(kc.ShapeError, match=r"w: ShapeError"):
        compiled(x, w[:4], out)


def test_returns_must_be_marked_mutated_at_decoration():
    # (refused only by op.torch_op before: strict mode did not snapshot it, so a rejected call kept the write)
    with pytest.raises(kc.AnnotationError, match=r"unmarked: returns= out, which the op must then write: mark them "
                                                 r"kc.Spec\(mutated=True\)"):
        @kc.op(returns="out", namespace="kc_test_ops")
        def unmarked(x: Float[Tensor, "B"], out: Float[Tensor, "B"]) -> None:
            out.copy_(x)


def test_returns_with_a_plain_return_annotation_is_refused():
    with pytest.raises(kc.AnnotationError, match=r"counted: returns= \(the op returns its own arguments\) and a "
                                                 r"return annotation \(-> int\) cannot both describe the result"):
        @kc.op(returns="out", namespace="kc_test_ops")
        def counted(x: Float[Tensor, "B"], out: Annotated[Float[Tensor, "B"], kc.Spec(mutated=True)]) -> int:
            out.copy_(x)
            return 1


def test_a_required_keyword_only_output_after_defaults_becomes_an_optional_custom_op_argument():
    @kc.op(returns="out", namespace="kc_test_ops")
    def shifted(x: Float[Tensor, "B"], shift: int = 1, *,
                out: Annotated[Float[Tensor, "B"], kc.Spec(mutated=True)]) -> None:
        torch.add(x, shift, out=out)

    schema = str(shifted.torch_op._opoverload._schema)
    assert schema == 'kc_test_ops::shifted(Tensor x, SymInt shift=1, Tensor(a2!)? out=None, str backend="auto") -> ()'
    x, out = torch.randn(5), torch.zeros(5)
    assert set(torch.library.opcheck(shifted.torch_op, (x,), {"out": out}).values()) == {"SUCCESS"}
    torch.ops.kc_test_ops.shifted(x, 2, out=out)
    torch.testing.assert_close(out, x + 2)
    if not FAKE_ERRORS_PASS:  # torch 2.11's autograd shim of a mutating op indexes the omitted output first
        with pytest.raises(IndexError, match="tuple index out of range"):
            torch.ops.kc_test_ops.shifted(x, 2)
        return
    with pytest.raises(kc.ArgumentTypeError, match=r"out: ArgumentTypeError\n.*\n +got +NoneType"):
        torch.ops.kc_test_ops.shifted(x, 2)


# -- torch.compile ------------------------------------------------------------------------------
def test_a_compiled_function_calling_an_op_compiles_once_per_shape_class():
    op = make_op("compiled_op")
    op.backend("fast", devices=("cpu",), priority=5)(lambda x, w, out: torch.mul(x, w, out=out))
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    def step(x, w, out):
        op(x, w, out)
        return out + 1

    compiled = torch.compile(step, backend=counter)
    for B in [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13] * 3:
        x, w, out = args(B=B)
        torch.testing.assert_close(compiled(x, w, out), x * w + 1)
    assert counter.frame_count == 2  # one static graph for B=2, one dynamic for the rest
    with pytest.raises(kc.ShapeError):
        compiled(*args(B=5)[:2], torch.empty(5, 4))


def test_the_dispatchers_last_choice_is_never_traced():
    # eager calls keep and replace the last choice; compiled code traces the selection itself, so they
    # neither add a graph nor make it recompile
    op = make_op("traced_last_op")
    op.backend("fast", devices=("cpu",), priority=5)(lambda x, w, out: torch.mul(x, w, out=out))
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda x, w, out: op(x, w, out) + 1, backend=counter, fullgraph=True)
    x, w, out = args()
    for _ in range(3):
        op(x, w, out)  # answered by the check cache from the second call: the last choice is kept
    torch.testing.assert_close(compiled(x, w, out), x * w + 1)
    for B in (5, 6, 5, 6):
        op(*args(B=B))  # other entries, other last choices
    torch.testing.assert_close(compiled(x, w, out), x * w + 1)
    assert counter.frame_count == 1


# -- the overhead benchmark runs (its figures are in docs/benchmarks.md, never asserted here) -----
def test_the_op_overhead_benchmark_runs_and_compares_like_with_like(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "op_overhead.py"
    spec = importlib.util.spec_from_file_location("op_overhead_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "op.md"
    assert bench.main(["--number", "50", "--repeats", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| user op (3 tensors) | check |" in text and "| packed decode | off |" in text
    assert "bench-noop" not in kc.packed_decode.table.registry  # the benchmark cleans up after itself
