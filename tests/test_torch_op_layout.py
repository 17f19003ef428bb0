"""A layout declared as an argument's or a result's (``kc.Spec(dim_order=...)``): checked, fixed
and shown by the docs (issue 29)."""

from typing import Annotated

import pytest
import torch
from torch._dynamo.utils import counters

import kda_contracts as kc
from kda_contracts import Float, Tensor


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def transposed(t):
    """``t``'s values, dense in dim order (1, 0): strides ``[1, B]`` for a ``[B, E]`` tensor."""
    return t.t().contiguous().t()


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
