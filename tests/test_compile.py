"""torch.compile and torch.library: contracts are traced as guards, not graph breaks, and still
reject bad calls; the packed-decode custom op's fake implementation is the contract."""

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts.testing import make_decode_call

pytestmark = pytest.mark.kda_contracts("check")  # the mode compiled functions are traced in


def _mm(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
    return torch.relu(x @ w)


def fresh():
    torch._dynamo.reset()
    return kc.contract(mode="check", register=False)(_mm)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_contracted_function_compiles_with_fullgraph_and_still_rejects_a_bad_shape(backend):
    f = fresh()
    cf = torch.compile(f, fullgraph=True, backend=backend)
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    torch.testing.assert_close(cf(x, w), _mm(x, w))
    for b in (5, 7):  # new batch sizes: recompiled with a dynamic B, checks still traced
        assert cf(torch.randn(b, 3), w).shape == (b, 4)
    with pytest.raises(kc.ShapeError, match=r"(?s)\[1\] w: ShapeError.*dim 0 \(D\): expected 3"):
        cf(torch.randn(2, 3), torch.randn(5, 4))
    with pytest.raises(kc.DtypeError):
        cf(torch.randn(2, 3), torch.randn(3, 4).int())


def test_contract_checks_cause_no_graph_break():
    f = fresh()
    report = torch._dynamo.explain(f)(torch.randn(2, 3), torch.randn(3, 4))
    assert report.graph_break_count == 0 and report.graph_count == 1


def test_a_contracted_function_compiles_with_inductor():
    f = fresh()
    cf = torch.compile(f, fullgraph=True)  # inductor
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    torch.testing.assert_close(cf(x, w), _mm(x, w))
    with pytest.raises(kc.ShapeError):
        cf(torch.randn(4, 3), torch.randn(2, 2))


def test_the_compiled_function_counts_as_exercised():
    f = fresh()
    c = f.__kda_contract__
    torch.compile(f, fullgraph=True, backend="eager")(torch.randn(2, 3), torch.randn(3, 4))
    assert c.calls >= 1


# -- the custom op -------------------------------------------------------------------------------
ORDER = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices",
         "use_qk_l2norm_in_kernel", "lower_bound")


def op_args(call, layout="VK", backend="torch"):
    return [call[k] for k in ORDER] + [layout, backend]


@pytest.fixture(scope="module")
def ops():
    import kda_contracts.ops.packed_decode.custom_op

    return kda_contracts.ops.packed_decode.custom_op


def small_call(**kw):
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, **kw)
    return make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)


def test_the_custom_op_passes_opcheck(ops):
    result = torch.library.opcheck(torch.ops.kda_contracts.packed_decode.default, op_args(small_call()))
    assert set(result.values()) == {"SUCCESS"}


def test_the_custom_op_writes_in_place_like_packed_decode(ops):
    call, ref = small_call(), small_call()
    torch.ops.kda_contracts.packed_decode(*op_args(call))
    kc.packed_decode(**ref, backend="torch")
    assert torch.equal(call["out"], ref["out"]) and torch.equal(call["initial_state"], ref["initial_state"])


def test_the_fake_implementation_is_the_contract(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    call = small_call()
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in call.items()}
        torch.ops.kda_contracts.packed_decode(*op_args(fake))
        bad = dict(fake, a=fake["a"].view(3, 4, 8))
        with pytest.raises(kc.ShapeError, match="`a` looks unflattened"):
            torch.ops.kda_contracts.packed_decode(*op_args(bad))


def test_a_compiled_step_around_the_op_rejects_a_bad_call(ops):
    torch._dynamo.reset()

    def step(*args):
        torch.ops.kda_contracts.packed_decode(*args)
        return args[7] * 2

    cs = torch.compile(step, fullgraph=True, backend="aot_eager")
    call = small_call()
    assert cs(*op_args(call)).shape == (3, 1, 4, 16)
    bad = op_args(small_call())
    bad[1] = bad[1].view(3, 4, 8)
    # dynamo re-wraps errors of fake (meta) kernels; the contract's report is in the message
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"(?s)got ShapeError\('packed_decode\(\): 1 contract "
                                                                   r"violation.*`a` looks unflattened"):
        cs(*bad)
