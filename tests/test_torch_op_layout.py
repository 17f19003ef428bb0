"""A result's layout, declared in the return annotation as an argument's is
(``kc.Spec(dim_order=...)``): checked on the result, shown by the docs, and the layout
``op.torch_op``'s fake implementation builds the result in, so opcheck and inductor see the
strides the backend returns. An undeclared layout is contiguous, and a custom op whose backend
returns another one is refused with the declaration to write (issue 29)."""

from typing import Annotated

import pytest
import torch
from torch._dynamo.utils import counters

import kda_contracts as kc
from kda_contracts import Float, Tensor

NS = "kc_layout_ops"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def transposed(t):
    """``t``'s values, dense in dim order (1, 0): strides ``[1, B]`` for a ``[B, E]`` tensor."""
    return t.t().contiguous().t()


def make_proj(name, layout, kernel):
    """An op ``x @ w`` whose return annotation carries ``layout`` (a kc.Spec or None) and whose
    fastest CPU backend is ``kernel``."""
    ret = Float[Tensor, "B E"] if layout is None else Annotated[Float[Tensor, "B E"], layout]

    def proj(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> ret:  # type: ignore[valid-type]
        """Reference: x @ w, laid out as declared."""
        return transposed(x @ w) if layout is not None and layout.dim_order == (1, 0) else x @ w

    proj.__name__ = proj.__qualname__ = name
    op = kc.op(namespace=NS)(proj)
    op.backend("colmajor", devices=("cpu",), priority=10)(kernel)
    return op


def colmajor_kernel(x, w):
    return (w.t() @ x.t()).t()  # computed as (x @ w)^T: the result is the transpose's view


def test_a_result_declared_transposed_runs_passes_opcheck_and_compiles_with_its_strides():
    op = make_proj("proj_colmajor", kc.Spec(dim_order=(1, 0)), colmajor_kernel)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    eager = op(x, w)
    assert eager.stride() == (1, 4)
    custom = op.torch_op(x, w)
    assert custom.stride() == (1, 4)
    torch.testing.assert_close(custom, x @ w)
    assert torch.library.opcheck(op.torch_op, (x, w)) == {
        "test_schema": "SUCCESS", "test_autograd_registration": "SUCCESS", "test_faketensor": "SUCCESS",
        "test_aot_dispatch_dynamic": "SUCCESS"}

    def step(x, w):
        y = torch.ops.kc_layout_ops.proj_colmajor(x, w)
        return y, y * 2 + 1

    compiled = torch.compile(step, backend="inductor", fullgraph=True)
    for B in range(2, 14):  # 12 calls: a static graph for B=2, one dynamic graph for the rest
        x = torch.randn(B, 3)
        y, z = compiled(x, w)
        assert y.stride() == (1, B)
        torch.testing.assert_close(y, x @ w)
        torch.testing.assert_close(z, x @ w * 2 + 1)
    assert counters["stats"]["unique_graphs"] == 2


def test_the_fake_implementation_builds_the_declared_layout_from_the_calls_dims():
    @kc.op(namespace=NS)
    def to_channels_last(x: Float[Tensor, "N C H W"]
                         ) -> Annotated[Float[Tensor, "N C H W"], kc.Spec(dim_order=(0, 2, 3, 1))]:
        return x.contiguous(memory_format=torch.channels_last)

    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 3, 4, 5)
    with FakeTensorMode() as mode:
        fake = to_channels_last.torch_op(mode.from_tensor(x))
    assert fake.shape == (2, 3, 4, 5) and fake.stride() == (60, 1, 15, 3) == to_channels_last.torch_op(x).stride()
    assert set(torch.library.opcheck(to_channels_last.torch_op, (x,)).values()) == {"SUCCESS"}


WRONG_LAYOUT = (r"proj_rowmajor \(after backend 'colmajor'\)\(\): 1 contract violation\n"
                r"  \[1\] return: LayoutError\n"
                r"      expected dense in dim order \(1, 0\) \(strides \[1, 4\]\)\n"
                r"      got      strides \[5, 1\]\n"
                r"      strict mode rolled the call back: every tensor the call writes is as it was before the call\n"
                r"  dims: B=4 from x.shape\[0\]; D=3 from x.shape\[1\]; E=5 from w.shape\[1\]$")


def test_a_result_in_another_layout_than_declared_is_refused_naming_the_result():
    op = make_proj("proj_rowmajor", kc.Spec(dim_order=(1, 0)), lambda x, w: x @ w)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(kc.LayoutError, match=WRONG_LAYOUT):
        op(x, w)
    with pytest.raises(kc.LayoutError, match=WRONG_LAYOUT):
        op.torch_op(x, w)
    # mode off checks no contract, but the custom op still holds its backend to its fake's layout
    with kc.mode("off"), pytest.raises(kc.LayoutError, match=(
            r"(?s)proj_rowmajor\(\): 1 contract violation\n  \[1\] return: LayoutError\n"
            r"      expected dense in dim order \(1, 0\) \(strides \[1, 4\]\)\n      got      strides \[5, 1\]\n"
            r"      op.torch_op's fake implementation \(what torch.compile and opcheck see\) makes it in its "
            r"declared layout\n      fix: return the result in its declared layout, or declare the result's "
            r"layout: Annotated\[Float\[Tensor, \"B E\"\], kc.Spec\(dim_order=\(0, 1\)\)\] as the return annotation "
            r"of proj_rowmajor$")):
        op.torch_op(x, w)


UNDECLARED = (r"proj_undeclared\(\): 1 contract violation\n"
              r"  \[1\] return: LayoutError\n"
              r"      expected contiguous \(strides \[5, 1\]\)\n"
              r"      got      strides \[1, 4\]\n"
              r"      op.torch_op's fake implementation \(what torch.compile and opcheck see\) makes it contiguous: "
              r"the return annotation declares no layout\n"
              r"      fix: declare the result's layout: Annotated\[Float\[Tensor, \"B E\"\], "
              r"kc.Spec\(dim_order=\(1, 0\)\)\] as the return annotation of proj_undeclared$")


def test_an_undeclared_strided_result_is_refused_by_the_custom_op_with_the_declaration_to_write():
    op = make_proj("proj_undeclared", None, colmajor_kernel)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    assert op(x, w).stride() == (1, 4)  # the op itself returns what its backend returns
    with pytest.raises(kc.LayoutError, match=UNDECLARED):
        op.torch_op(x, w)
    compiled = torch.compile(lambda x, w: torch.ops.kc_layout_ops.proj_undeclared(x, w) + 1, backend="inductor")
    with pytest.raises(kc.LayoutError, match=UNDECLARED):
        compiled(x, w)


def test_an_undeclared_result_keeps_the_other_spec_fields_in_the_fix_and_a_non_dense_one_is_told_to_be_dense():
    @kc.op(namespace=NS)
    def two_views(x: Float[Tensor, "B D"]) -> tuple[Float[Tensor, "B D"],
                                                     Annotated[Float[Tensor, "D B"], kc.Spec(same_dtype_as="x")]]:
        return x * 1, (x * 1).t()

    @kc.op(namespace=NS)
    def padded(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return torch.cat([x, x], 1)[:, :x.shape[1]]

    x = torch.randn(4, 3)
    with pytest.raises(kc.LayoutError, match=(
            r"(?s)  \[1\] return\[1\]: LayoutError\n.*fix: declare the result's layout: Annotated\[Float\[Tensor, "
            r"\"D B\"\], kc.Spec\(same_dtype_as='x', dim_order=\(1, 0\)\)\] as item 1 of the return annotation of "
            r"two_views$")):
        two_views.torch_op(x)
    with pytest.raises(kc.LayoutError, match=(
            r"(?s)expected contiguous \(strides \[3, 1\]\)\n      got      strides \[6, 1\]\n.*"
            r"fix: return a dense tensor from the backend \(.contiguous\(\), or one dense in an order declared with "
            r"kc.Spec\(dim_order=...\) in the return annotation\)$")):
        padded.torch_op(x)


def test_dim_order_is_an_argument_rule_too_with_its_fix_and_its_docs():
    @kc.contract(doc=True)
    def colsum(x: Annotated[Float[Tensor, "B D"], kc.Spec(dim_order=(1, 0))]
               ) -> Annotated[Float[Tensor, "D B"], kc.Spec(dim_order=(1, 0))]:
        return transposed(x.t())

    x = torch.randn(4, 3)
    assert colsum(transposed(x)).stride() == (1, 3)
    assert colsum(torch.randn(1, 3)).shape == (3, 1)  # a size-1 dim may have any stride
    with pytest.raises(kc.LayoutError, match=(
            r"  \[1\] x: LayoutError\n      expected dense in dim order \(1, 0\) \(strides \[1, 4\]\)\n"
            r"      got      strides \[3, 1\]\n"
            r"      fix: pass x.permute\(1, 0\).contiguous\(\).permute\(1, 0\) \(the same values, dense in that "
            r"order\)\n")):
        colsum(x)
    compiled = torch.compile(colsum, backend="eager", fullgraph=True)
    for B in range(2, 14):
        assert compiled(transposed(torch.randn(B, 3))).stride() == (1, 3)
    assert counters["stats"]["unique_graphs"] == 2
    with pytest.raises(kc.LayoutError, match=r"x: LayoutError"):
        compiled(torch.randn(5, 3))
    doc = colsum.__doc__
    assert "| `x` | `[B, D]` | bfloat16, float16, float32, float64, any float8 | dense, dim order `(1, 0)`: strides " \
           "`[1, B]` |" in doc
    assert doc.endswith("Returns: `return` `[D, B]` (bfloat16, float16, float32, float64, any float8; dense, dim order "
                        "`(1, 0)`: strides `[1, D]`)")


@pytest.mark.parametrize(("spec", "annotation", "why"), [
    (kc.Spec(dim_order=(0, 0)), "B D", r"dim_order=\(0, 0\) must list each of the tensor's 2 axes once, "
                                       r"outermost first \(a permutation of \(0, 1\), as torch's Tensor.dim_order\(\) "
                                       r"gives it\)"),
    (kc.Spec(dim_order=(0,)), "*b D", r"dim_order=\(0,\) needs a tensor of fixed rank; this one has a variadic dim"),
    (kc.Spec(dim_order=(1, 0), contiguous=True), "B D",
     r"dim_order= fixes every stride; drop contiguous= \(contiguous=True is dim_order=\(0, 1\)\)"),
    (kc.Spec(dim_order=(1, 0), inner_contiguous=1), "B D", r"dim_order= fixes every stride; drop inner_contiguous="),
])
def test_a_malformed_dim_order_is_an_annotation_error(spec, annotation, why):
    with pytest.raises(kc.AnnotationError, match=r"f: return: " + why):
        @kc.contract
        def f(x: Float[Tensor, "B D"]) -> Annotated[Float[Tensor, annotation], spec]:  # type: ignore[valid-type]
            return x
