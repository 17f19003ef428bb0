"""Edges of the op layer found in review: plug-ins loaded before the first selection, constraints
on dims the op does not have, unknown variants, strict-mode results and after-checks rolled
back, autograd leaves restored, positional-only custom ops."""

import sys
import textwrap
from typing import Annotated

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.operation import registry as op_module


def make_op(name, **options):
    @kc.op(name=name, returns="out", **options)
    def f(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x * 2)

    return f


def test_a_plugin_backend_is_judged_by_its_own_declaration_on_the_very_first_call(tmp_path, monkeypatch):
    (tmp_path / "first_call_plugin.py").write_text(textwrap.dedent("""
        import torch
        import kda_contracts as kc

        RAN = []

        def kernel(x, out):
            RAN.append(x.dtype)
            out.fill_(100)

        def backends():
            return [kc.Backend(name="half-only", kernel=kernel, devices=("cpu",), priority=99, op="first_call_op",
                               dtypes={"x": (torch.float16,)}, where=("D % 16 == 0",))]
    """))
    dist = tmp_path / "first_call_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: first-call-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kda_contracts.backends]\nhalf = first_call_plugin:backends\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(op_module, "_plugins_loaded", False)
    op = make_op("first_call_op")
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    op(x, out)  # float32, D=3: the plug-in supports neither
    assert torch.equal(out, x * 2) and sys.modules["first_call_plugin"].RAN == []
    op(torch.ones(2, 16, dtype=torch.float16), torch.zeros(2, 16, dtype=torch.float16))
    assert sys.modules["first_call_plugin"].RAN == [torch.float16]


def test_a_constraint_on_a_dim_the_op_does_not_have_is_refused():
    op = make_op("where_typo_op")
    with pytest.raises(kc.AnnotationError, match=r"where_typo_op: backend 'k': where 'd % 16 == 0' names d, not a "
                                                 r"dim of the op \(its dims: B, D\)"):
        op.backend("k", devices=("cpu",), where=["d % 16 == 0"])(lambda x, out: None)


def test_an_unknown_variant_is_a_contract_error():
    def nd(x: Float[Tensor, "B N D"], layout: str = "BND") -> None: ...

    def dn(x: Float[Tensor, "B D N"], layout: str = "BND") -> None: ...

    @kc.op(variants={"BND": nd, "BDN": dn}, variant=lambda layout: layout)
    def variant_op(x, layout: str = "BND"):
        return None

    for mode in ("off", "check", "strict"):
        with kc.mode(mode), pytest.raises(kc.ArgumentTypeError) as info:
            variant_op(torch.zeros(2, 3, 4), layout="LBD")
        assert "expected arguments naming one of the variants 'BND', 'BDN'\n      got      variant 'LBD'" in \
            str(info.value)


def test_strict_mode_rolls_back_a_result_that_breaks_the_return_annotation():
    @kc.op
    def bad_result(x: Float[Tensor, "B D"],
                   out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> Float[Tensor, "B"]:
        out.fill_(5)
        return torch.zeros(7)

    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(kc.ShapeError) as info:
        bad_result(x, out)
    assert torch.equal(out, torch.zeros(2, 3)) and "strict mode rolled the call back" in str(info.value)
    with kc.mode("check"), pytest.raises(kc.ShapeError):
        bad_result(x, out)


def test_an_after_check_that_raises_is_a_backend_error_and_the_call_is_rolled_back():
    def broken_after(ctx, backend):
        raise RuntimeError("after bug")

    op = make_op("after_bug_op", after=broken_after)
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(kc.BackendError, match=r"they raised RuntimeError: after bug"):
        op(x, out)
    assert torch.equal(out, torch.zeros(2, 3))


def test_an_autograd_op_writing_a_leaf_that_requires_grad_is_rolled_back_too():
    def never(ctx, backend):
        return [kc.Violation(kc.ValueRangeError, "out", "something", "else")]

    @kc.op(autograd=True, returns="out", after=never)
    def leaf_op(x: Float[Tensor, "B"], out: Annotated[Float[Tensor, "B"], kc.Spec(mutated=True)]) -> None:
        with torch.no_grad():
            out.fill_(9)

    x, out = torch.ones(3), torch.zeros(3, requires_grad=True)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError):
        leaf_op(x, out)
    assert torch.equal(out.detach(), torch.zeros(3))


def test_a_positional_only_op_cannot_be_a_custom_op():
    @kc.op(namespace="kc_edge_ops")
    def pos_only(x: Float[Tensor, "B"], /) -> Float[Tensor, "B"]:
        return x * 2

    assert torch.equal(pos_only(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(kc.AnnotationError, match=r"parameter 'x' is positional-only; a custom op passes its arguments "
                                                 r"by name: drop the '/'"):
        pos_only.torch_op  # noqa: B018


def test_the_older_adapters_group_is_read_on_the_first_dispatch(tmp_path, monkeypatch):
    (tmp_path / "old_adapter_plugin.py").write_text(textwrap.dedent("""
        from kda_contracts.ops.packed_decode.adapters import Adapter

        def kernel(*args, **kwargs):
            pass

        def adapters():
            return [Adapter(name="old-style", kernel=kernel, devices=("cuda",), priority=1)]
    """))
    dist = tmp_path / "old_adapter_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: old-adapter-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kda_contracts.adapters]\nold = old_adapter_plugin:adapters\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = kc.packed_decode.table
    monkeypatch.setattr(table, "plugins_loaded", False)
    try:
        assert "old-style" in kc.adapters.names()
    finally:
        table.unregister("old-style")


def _ld(x: Float[Tensor, "B L D"], layout: str = "BLD") -> Float[Tensor, "B D"]: ...


def _dl(x: Float[Tensor, "B D L"], layout: str = "BLD") -> Float[Tensor, "B D"]: ...


LAYOUTS = {"BLD": _ld, "BDL": _dl}  # the two variants of the ops below


def test_unhashable_variant_keys_and_backend_names_are_contract_errors():
    @kc.op(variants=LAYOUTS, variant=lambda layout: layout)
    def unhashable_variant_op(x, layout: str = "BLD"):
        return x.sum(1 if layout == "BLD" else 2)

    x = torch.ones(2, 3, 5)
    with pytest.raises(kc.ArgumentTypeError, match=r"layout: ArgumentTypeError\n +expected arguments naming one of "
                                                   r"the variants 'BLD', 'BDL'"):
        unhashable_variant_op(x, layout=["BDL"])  # before: a raw TypeError (unhashable type: 'list')
    with pytest.raises(kc.BackendError, match=r"unknown backend \['torch'\]"):
        unhashable_variant_op(x, layout="BDL", backend=["torch"])
    assert unhashable_variant_op(x, layout="BDL").shape == (2, 3)


def test_a_backend_naming_no_variant_or_dtypes_for_contained_tensors_is_refused():
    @kc.op(variants=LAYOUTS, variant=lambda layout: layout)
    def typo_variant_op(x, layout: str = "BLD"):
        return x.sum(1 if layout == "BLD" else 2)

    with pytest.raises(kc.AnnotationError, match=r"typo_variant_op: backend 'fast': variants= names BDl, not a "
                                                 r"variant of the op \(its variants: BDL, BLD\)"):
        typo_variant_op.backend("fast", devices=("cpu",), variants=("BDl",))(lambda x, layout="BLD": x.sum(2))

    @kc.op
    def contained_total(xs: list[Float[Tensor, "B D"]]) -> Float[Tensor, "B D"]:
        return sum(xs)

    # before: chosen for float32 lists, the fp16-only kernel handed float32 tensors
    with pytest.raises(kc.AnnotationError, match=r"contained_total: backend 'fp16': dtypes= cannot judge tensors "
                                                 r"inside a container \(xs\)"):
        contained_total.backend("fp16", devices=("cpu",), dtypes=(torch.float16,))(lambda xs: sum(xs))


def test_a_call_with_the_wrong_arguments_names_the_op_as_python_names_a_function():
    @kc.op(namespace="kc_test_op_arity")
    def scale_rows(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(2 * x)

    x = torch.zeros(2, 3)
    for _ in range(2):  # the first call (the plug-ins' bootstrap) and the dispatcher itself
        with pytest.raises(TypeError, match=r"^scale_rows\(\) missing 1 required positional argument: 'out'$"):
            scale_rows(x)
    with pytest.raises(TypeError, match=r"^scale_rows\(\): missing a required argument: 'out'$"):
        scale_rows.explain_backends(x)
