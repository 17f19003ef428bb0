"""A rejected call changes no tensor: strict mode rolls back what the backend wrote, check mode
refuses before any write what a kernel could not write safely (a tensor requiring grad, an
inference tensor outside inference mode), and a few small gaps closed (issue 13, items 1, 2, 5)."""

from typing import Annotated

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.operation.backends import BackendError
from kda_contracts.testing import make_decode_call

CFG = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)


def call_of(batch=3, pool=8, seed=0, **kw):
    call = make_decode_call(CFG, batch, pool, seed=seed, **kw)
    call["ssm_state_indices"] = torch.tensor([5, -1, 2][:batch] + list(range(6, 6 + max(batch - 3, 0))),
                                             dtype=torch.int32)[:batch]
    return call


def frozen(call):
    """Bit-level copies of every tensor of a call (to compare after a rejection)."""
    return {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}


def assert_unchanged(call, before):
    for k, v in before.items():
        assert torch.equal(call[k].view(torch.uint8), v.view(torch.uint8)), f"{k} changed"


@pytest.fixture
def faulty():
    """A backend that, like a kernel dying half-way, writes part of ``out`` and of the used slots
    and then raises (or, with ``raises=False``, writes NaN and returns)."""
    state = {"raises": True}

    def kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               use_qk_l2norm_in_kernel=False, lower_bound=None, *, config=None, state_layout=None):
        out[: max(1, out.shape[0] // 2)] = 7.0
        used = ssm_state_indices[ssm_state_indices >= 0].long()
        initial_state[used[:1]] = -3.0
        if state["raises"]:
            raise RuntimeError("kernel died half-way")
        out.fill_(float("nan"))

    kc.packed_decode.register_backend(kc.Backend(name="faulty", kernel=kernel, devices=("cpu",), priority=-1))
    yield state
    kc.packed_decode.unregister_backend("faulty")


# -- 1. transactional strict mode ------------------------------------------------------------------
def test_strict_mode_rolls_back_a_backend_that_raises_half_way(faulty):
    call = call_of()
    before = frozen(call)
    with kc.mode("strict"), pytest.raises(BackendError) as info:
        kc.packed_decode(**call, backend="faulty")
    assert_unchanged(call, before)
    assert str(info.value) == (
        "packed_decode(): 1 contract violation\n"
        "  [1] backend: BackendError\n"
        "      expected backend 'faulty' to run the validated call\n"
        "      got      it raised RuntimeError: kernel died half-way\n"
        "      fix: strict mode restored every tensor the op declares it writes")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_check_mode_says_it_does_not_roll_back(faulty):
    call = call_of()
    with kc.mode("check"), pytest.raises(BackendError, match="check mode keeps no copy: initial_state, out may hold "
                                                             "partial writes"):
        kc.packed_decode(**call, backend="faulty")


def test_strict_mode_rolls_back_a_call_its_after_checks_reject(faulty):
    faulty["raises"] = False
    call = call_of()
    before = frozen(call)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError) as info:
        kc.packed_decode(**call, backend="faulty")
    assert_unchanged(call, before)
    text = str(info.value)
    assert text.startswith("packed_decode (after backend 'faulty')(): 2 contract violations")  # NaN, padding
    assert "strict mode rolled the call back: every tensor the call writes is as it was before the call" in text


def test_a_finite_but_absurd_scale_is_rolled_back_not_written():
    call = call_of(activation_dtype=torch.float16)
    call["scale"] = 1e8  # finite, positive: the contract accepts it; fp16 out overflows
    before = frozen(call)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=r"out: ValueRangeError"):
        kc.packed_decode(**call, backend="torch")
    assert_unchanged(call, before)


def test_strict_mode_copies_only_the_used_slots_not_the_pool():
    from kda_contracts._engine.contract.transaction import Transaction, written_parts
    from kda_contracts._engine.model.spec import CallContext

    call = call_of(pool=64)
    c = kc.packed_decode.contracts["VK"]
    dims = dict(kc.validate_packed_decode(**call))
    ctx = CallContext(c.spec, dict(call, config=None), None, dims, {})
    saved = Transaction.begin(ctx.values, written_parts(kc.packed_decode.written, "packed_decode", ctx))
    assert saved is not None
    copied = {s.tensor.data_ptr(): s.copy.numel() for s in saved.saved}
    assert copied[call["initial_state"].data_ptr()] == 2 * 4 * 16 * 8  # 2 used slots of 64
    assert copied[call["out"].data_ptr()] == call["out"].numel()


# -- 2. pre-write checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["check", "strict"])
def test_a_pool_that_requires_grad_is_refused_before_any_write(mode):
    call = call_of()
    call["initial_state"] = torch.nn.Parameter(call["initial_state"])
    before = frozen(call)
    with kc.mode(mode), pytest.raises(kc.ArgumentTypeError) as info:
        kc.packed_decode(**call, backend="torch")
    assert_unchanged(call, before)
    assert ("  [1] initial_state: ArgumentTypeError\n"
            "      expected a tensor the op may write in place (requires_grad=False)\n"
            "      got      requires_grad=True\n"
            "      fix: the kernel writes it outside autograd; pass a detached tensor (or one made under "
            "torch.no_grad()), e.g. a state pool that is a buffer, not an nn.Parameter") in str(info.value)


def test_an_inference_tensor_is_refused_outside_inference_mode_and_accepted_inside():
    with torch.inference_mode():
        call = call_of()
    before = frozen(call)
    with kc.mode("check"), pytest.raises(kc.ArgumentTypeError, match=r"got      an inference tensor, outside "
                                                                      r"torch.inference_mode\(\)"):
        kc.packed_decode(**call, backend="torch")
    assert_unchanged(call, before)
    with torch.inference_mode():
        kc.packed_decode(**call, backend="torch")


def test_an_op_that_supports_autograd_accepts_a_written_tensor_that_requires_grad():
    from typing import Annotated

    from kda_contracts import Float, Tensor

    @kc.op(autograd=True, returns="out")
    def grad_ok(x: Float[Tensor, "B"], out: Annotated[Float[Tensor, "B"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x * 2)

    x = torch.ones(3)
    out = torch.zeros(3, requires_grad=True).clone()  # a non-leaf: autograd records the in-place write
    grad_ok(x, out)
    assert out.grad_fn is not None


def test_strict_mode_refuses_a_used_slot_that_already_holds_nan():
    call = call_of()
    call["initial_state"][5, 0, 0, 0] = float("nan")
    before = frozen(call)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError) as info:
        kc.packed_decode(**call, backend="torch")
    assert_unchanged(call, before)
    assert ("initial_state: ValueRangeError\n      expected finite values in the rows of initial_state that "
            "ssm_state_indices names") in str(info.value)
    call["initial_state"][7, 0, 0, 0] = float("nan")  # an unused slot: not this call's business
    call["initial_state"][5, 0, 0, 0] = 0.0
    with kc.mode("strict"):
        kc.packed_decode(**call, backend="torch")


# -- 5. small gaps ---------------------------------------------------------------------------------
def test_validate_packed_decode_follows_strict_mode():
    call = call_of()
    call["ssm_state_indices"] = torch.tensor([0, 8, 3], dtype=torch.int32)
    with kc.mode("check"):
        kc.validate_packed_decode(**call)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match="1 value"):
        kc.validate_packed_decode(**call)
    with kc.mode("strict"):
        kc.validate_packed_decode(**call, strict=False)


def test_a_bool_for_a_float_is_a_contract_error():
    call = call_of()
    call["scale"] = True
    with pytest.raises(kc.ArgumentTypeError) as info:
        kc.packed_decode(**call)
    assert ("  [1] scale: ArgumentTypeError\n      expected float\n      got      bool (True)\n"
            "      fix: a bool is not a number here; pass a float") in str(info.value)
    call["scale"] = 1  # an int still stands for a float
    kc.validate_packed_decode(**call)


def test_an_infinite_lower_bound_is_refused_by_the_contract_as_by_the_config():
    call = call_of()
    call["lower_bound"] = float("-inf")
    with pytest.raises(kc.ValueRangeError, match=r"lower_bound: ValueRangeError\n +expected finite and < 0"):
        kc.validate_packed_decode(**call)
    with pytest.raises(ValueError, match="lower_bound must be a finite float < 0"):
        kc.KDAConfig(num_heads=2, head_k_dim=8, head_v_dim=16, gate="bounded", lower_bound=float("-inf"))


# -- the property: nothing changes after a rejection, in both modes ----------------------------------
def _rejections_leave_everything_bit_identical(data, mode, batch, seed, backend):
    call = make_decode_call(CFG, batch, 8, seed=seed, activation_dtype=torch.float16)
    call["ssm_state_indices"] = torch.tensor(data.draw(st.lists(st.integers(-1, 7), min_size=batch, max_size=batch,
                                                                unique_by=lambda i: i if i >= 0 else object())),
                                             dtype=torch.int32)
    fault = data.draw(st.sampled_from(["scale", "nan-slot", "grad", "bool", "shape", "index", "none"]))
    if fault == "scale":
        call["scale"] = 1e9
    elif fault == "nan-slot":
        call["initial_state"][data.draw(st.integers(0, 7))].view(-1)[0] = float("nan")
    elif fault == "grad":
        call["out"].requires_grad_(True)
    elif fault == "bool":
        call["scale"] = False
    elif fault == "shape":
        call["a"] = call["a"][:, :-1]
    elif fault == "index":
        call["ssm_state_indices"][0] = 8
    before = frozen(call)
    with kc.mode(mode):
        try:
            kc.packed_decode(**call, backend=backend)
        except kc.ContractError:
            assert_unchanged(call, before)
            return
    # accepted: only value faults may pass (check mode reads no values; a NaN in an unused slot or a
    # large scale that does not overflow are no fault of this call), never a metadata fault
    assert fault in ("none", "scale", "nan-slot", "index")
    assert not (fault == "index" and mode == "strict")


@settings(max_examples=120, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["check", "strict"]), batch=st.integers(1, 5), seed=st.integers(0, 99))
def test_after_any_rejection_out_and_the_pool_are_bit_identical(data, mode, batch, seed):
    _rejections_leave_everything_bit_identical(data, mode, batch, seed, "torch")


@pytest.mark.parametrize("backend", ["triton", "helion"])
def test_the_same_holds_for_our_kernels_on_the_cpu(backend):
    """The property for every backend that runs on the CPU (ours, under the interpreters): fewer
    cases, as each interpreted call is slow."""
    ok, why = kc.adapters.get(backend).available()
    if not ok:
        pytest.skip(why)

    @settings(max_examples=12, deadline=None)
    @given(data=st.data(), mode=st.sampled_from(["check", "strict"]), batch=st.integers(1, 3),
           seed=st.integers(0, 99))
    def prop(data, mode, batch, seed):
        _rejections_leave_everything_bit_identical(data, mode, batch, seed, backend)

    prop()


def test_a_backend_that_resizes_an_output_then_fails_is_rolled_back_shape_and_all():
    # the write-back raised a raw RuntimeError (shape mismatch), which replaced the call's report
    @kc.op(name="nothing_lost_resizer_op", returns="out")
    def cp(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x)

    @cp.backend("resizer", devices=("cpu",), priority=-1)
    def _(x, out):
        out.resize_(7, 7)
        raise RuntimeError("kernel failed")

    out = torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(kc.BackendError, match=r"backend 'resizer'"):
        cp(torch.ones(2, 3), out, backend="resizer")
    assert out.shape == (2, 3) and out.eq(0).all()


def test_a_contracted_function_writing_into_another_argument_is_refused_in_strict_mode():
    # an op's call was refused; the same call to a @kc.contract function ran and wrote through x
    @kc.contract(register=False)
    def add_(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.add_(x)

    x = torch.ones(4, 3)
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=r"out: ValueRangeError\n +expected memory of its "
                                                                     r"own \(out is written: no byte shared with x\)"):
        add_(x, x[:, :])
    assert x.eq(1).all()
    with kc.mode("strict"):
        add_(torch.ones(4, 3), torch.zeros(4, 3))


def _scale_op(namespace: str):
    @kc.op(namespace=namespace)
    def scale(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
              out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x * w)

    return scale


def test_strict_mode_names_an_argument_a_failing_backend_wrote_without_declaring_it():
    # (the rollback restores what the op declares it writes; an argument written through torch that it
    # does not declare has no copy, and the report says so instead of claiming every tensor is back)
    scale = _scale_op("kc_test_undeclared_raises")

    @scale.backend("dies", devices=("cpu",))
    def dies(x, w, out):
        out.fill_(7.0)
        w.fill_(3.0)
        raise RuntimeError("boom")

    x, w, out = torch.ones(2, 3), torch.ones(3), torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(BackendError) as info:
        scale(x, w, out, backend="dies")
    assert str(info.value).splitlines()[-1] == (
        "      fix: strict mode restored every tensor the op declares it writes; w, not declared, has no copy and "
        "keeps what the backend wrote (mark it kc.Spec(mutated=True) if the op writes it)")
    assert torch.equal(out, torch.zeros(2, 3)) and torch.equal(w, torch.full((3,), 3.0))


def test_strict_mode_rejects_a_backend_that_writes_an_argument_it_does_not_declare():
    scale = _scale_op("kc_test_undeclared_returns")

    @scale.backend("sneaky", devices=("cpu",))
    def sneaky(x, w, out):
        w.mul_(2)
        out.copy_(x * w)

    x, w, out = torch.ones(2, 3), torch.ones(3), torch.zeros(2, 3)
    with kc.mode("strict"), pytest.raises(BackendError) as info:
        scale(x, w, out, backend="sneaky")
    assert str(info.value).splitlines()[1:4] == [
        "  [1] w: BackendError", "      expected backend 'sneaky' to write only what the op declares it writes",
        "      got      it wrote w in place"]
    assert torch.equal(out, torch.zeros(2, 3))  # (rolled back)
    w.fill_(1.0)
    with kc.mode("check"):  # check mode keeps no counters: the call runs
        scale(x, w, out, backend="sneaky")
    with kc.mode("strict"):  # a view of the written tensor's own storage is not told apart (shared counter)
        buf = torch.zeros(9)
        scale(x, buf[6:], buf[:6].view(2, 3), backend="torch")
