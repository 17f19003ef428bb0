"""Backend declarations and the torch reference, from a third adversarial review (2026-12-06): a bare
``@op.backend`` took the kernel for the name and registered nothing; ``devices=()`` or
``variants=()`` made a backend ``auto`` could never choose; an availability probe returning ``"no"``
read as ``ok="n"`` and the backend was chosen; unregistering a name that is not registered did
nothing; a plug-in declared for another op registered anyway; and the torch reference of an op that
writes in place recorded a graph into the written tensors from an input that requires grad, so the
next call refused them. Messages pinned."""

import re
from typing import Annotated, Any

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts.testing import make_decode_call


def _op(name: str, *, variants: bool = False) -> Any:
    if variants:
        def a(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None: ...
        return kc.op(name=name, variants={"a": a}, variant=lambda x: "a")(_body)
    return kc.op(name=name)(_annotated_body)


def _body(x, out):  # type: ignore[no-untyped-def]
    out.copy_(x * 2)


def _annotated_body(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
    out.copy_(x * 2)


def _kernel(x, out):  # type: ignore[no-untyped-def]
    out.copy_(x * 10)


def test_a_bare_backend_decorator_is_an_annotation_error() -> None:
    op = _op("edge_bare_backend")
    with pytest.raises(kc.AnnotationError, match=r"^edge_bare_backend: write @edge_bare_backend.backend\('name', "
                                                 r"\.\.\.\): a backend needs a name$"):
        op.backend(_kernel)
    assert [b.name for b in op.backends()] == ["torch"]


def test_a_backend_no_call_could_choose_is_an_annotation_error() -> None:
    op = _op("edge_never_chosen", variants=True)
    with pytest.raises(kc.AnnotationError, match=r"^edge_never_chosen: backend 'nd': devices= takes a sequence of "
                                                 r"device types such as \('cpu', 'cuda'\) \('\*': any device\), "
                                                 r"got \(\) \(with no device and no explicit_devices= the "
                                                 r"backend would never run\)$"):
        op.backend("nd", devices=())(_kernel)
    with pytest.raises(kc.AnnotationError, match=r"^edge_never_chosen: backend 'nv': variants= takes the op's "
                                                 r"variants it supports, or None for all, got \(\) \(with no variant "
                                                 r"the backend would never run\)$"):
        op.backend("nv", devices=("cpu",), variants=())(_kernel)
    with pytest.raises(kc.AnnotationError, match=r"^edge_never_chosen: backend 'desc': description= takes a str, "
                                                 r"got 5$"):
        op.backend("desc", devices=("cpu",), description=5)(_kernel)  # type: ignore[arg-type]
    op.backend("explicit-only", devices=(), explicit_devices=("cpu",))(_kernel)  # runs when asked by name
    assert sorted(b.name for b in op.backends()) == ["explicit-only", "torch"]


@pytest.mark.parametrize(("case", "answer"), enumerate(["no", (0, "why"), (True, 5), True, None]))
def test_an_availability_probe_answering_in_the_wrong_kind_makes_the_backend_broken(case: int, answer: Any) -> None:
    op = _op(f"edge_probe_{case}")
    op.register_backend(kc.Backend(name="odd", kernel=_kernel, devices=("cpu",), priority=99,
                                   availability=lambda: answer))
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.warns(RuntimeWarning, match=re.escape(f"kda_contracts: edge_probe_{case}: backend 'odd' is broken, so "
                                                      "backend='auto' will not choose it: availability check "
                                                      f"returned {answer!r}, not (ok: bool, why: str)")):
        op(x, out)
    assert torch.equal(out, x * 2)  # the torch reference ran, not 'odd'


def test_unregistering_a_backend_that_is_not_registered_is_an_annotation_error() -> None:
    op = _op("edge_unregister")
    with pytest.raises(kc.AnnotationError, match=r"^edge_unregister: no backend named 'tritn' to unregister "
                                                 r"\(its backends: torch\)$"):
        op.unregister_backend("tritn")
    with pytest.raises(kc.AnnotationError, match=r"no backend named \[1\] to unregister"):
        op.unregister_backend([1])  # type: ignore[arg-type]


def test_a_backend_declared_for_another_op_or_replace_of_the_wrong_kind_is_refused() -> None:
    op = _op("edge_other_op")
    with pytest.raises(kc.AnnotationError, match=r"^edge_other_op: backend 'elsewhere' is declared for the op "
                                                 r"'packed_decode' \(op=\), not 'edge_other_op'$"):
        op.register_backend(kc.Backend(name="elsewhere", kernel=_kernel, devices=("cpu",), op="packed_decode"))
    with pytest.raises(kc.AnnotationError, match=r"^edge_other_op: replace= takes True or False, got 'yes'$"):
        op.backend("r", devices=("cpu",), replace="yes")(_kernel)  # type: ignore[arg-type]


def test_the_torch_reference_writes_outside_autograd_as_a_kernel_does() -> None:
    # an input that requires grad (an nn.Parameter) made the reference record a graph into the pool
    # and the output; the next call then refused the pool, blaming it
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
    call = make_decode_call(cfg, 3, 8, activation_dtype=torch.float32)
    call["A_log"].requires_grad_()
    for _ in range(3):
        kc.packed_decode(**call, backend="torch")
        assert not call["initial_state"].requires_grad and not call["out"].requires_grad

    @kc.op(name="edge_autograd_kept", autograd=True)
    def scale(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x * 2)

    w = torch.ones(2, 3, requires_grad=True)
    out = torch.zeros(2, 3)
    scale(w, out)  # autograd=True: the op's writes are part of the graph
    assert out.requires_grad

    @kc.op(name="edge_pure")
    def pure(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x * 2

    assert pure(w).requires_grad  # an op that writes nothing in place keeps its result's graph


def test_explain_backends_takes_the_backend_a_call_names() -> None:
    # before: explain_backends(..., backend="torch") was a TypeError (unexpected keyword), though the
    # op's own call takes backend=
    op = _op("edge_explain_asked")
    op.backend("gpu-only", devices=("cuda",), priority=5)(_kernel)
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    lines = op.explain_backends(x, out, backend="gpu-only").splitlines()
    assert lines[-1] == "backend='gpu-only': a call asking for it is refused: runs on cuda, not cpu"
    assert op.explain_backends(x, out, backend="torch").splitlines()[-1] == \
        "backend='torch': runs this call when asked by name"
    assert op.explain_backends(x, out, backend="tritn").splitlines()[-1] == \
        "backend='tritn': a call asking for it is refused: no backend of this name (registered: gpu-only, torch)"
    assert op.explain_backends(x, out) == op.explain_backends(x, out, backend="auto")
    op.register_backend(kc.Backend(name="absent", kernel=_kernel, devices=("cpu",),
                                   availability=lambda: (False, "lib not installed")))
    assert op.explain_backends(x, out, backend="absent").splitlines()[-1] == \
        "backend='absent': a call asking for it is refused: lib not installed"
    with pytest.raises(kc.BackendError, match="lib not installed"):
        op(x, out, backend="absent")


def test_an_op_that_writes_and_returns_a_fresh_result_keeps_its_results_graph() -> None:
    @kc.op(name="edge_mixed")
    def mixed(x: Float[Tensor, "B D"], cache: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]
              ) -> Float[Tensor, "B D"]:
        cache.copy_(x.detach())
        return x * 3

    x = torch.ones(2, 3, requires_grad=True)
    (mixed(x, torch.zeros(2, 3)) + x).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.full((2, 3), 4.0))  # not silently cut to 1
