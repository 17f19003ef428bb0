"""The Kimi-Linear and Qwen3-Next layers' packed (varlen) prefill: equal to the padded prefill of
each sequence, two parts equal one (the conv and recurrent states carried in the slots), and
prefill then decode equals decoding every token."""

from __future__ import annotations

import pytest
import torch

import kda_contracts as kc
from kda_contracts.models import kimi_linear, qwen3_next

D = 32
LENS = (5, 1, 9, 3)
SLOTS = (4, 0, 2, -1)  # the last sequence is padding


def _layer(kind):
    if kind == "kimi":
        cfg = kc.KDAConfig(num_heads=2, head_k_dim=8, hidden_size=D)
        layer = kimi_linear.KimiDeltaAttention(cfg)
        layer.load_weights(**kimi_linear.random_weights(cfg, seed=0))
    else:
        cfg = kc.GDNConfig(num_heads=1, num_v_heads=2, head_k_dim=8, hidden_size=D)
        layer = qwen3_next.Qwen3NextGatedDeltaNet(cfg)
        layer.load_weights(**qwen3_next.random_weights(cfg, seed=0))
    return layer


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


KINDS = ["kimi", "qwen"]


@pytest.mark.parametrize("kind", KINDS)
def test_packed_prefill_equals_the_padded_prefill_of_each_sequence(kind):
    layer = _layer(kind)
    torch.manual_seed(1)
    x, cu, slots = torch.randn(sum(LENS), D), _cu(LENS), torch.tensor(SLOTS, dtype=torch.int32)
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_(), conv.normal_()  # stale slots: a fresh prefill must not read them
    ssm2, conv2 = ssm.clone(), conv.clone()
    before = (ssm.clone(), conv.clone())
    y = layer.prefill(x, ssm, conv, slots, cu_seqlens=cu)
    for i in range(3):
        yp = layer.prefill(x[cu[i]:cu[i + 1]].unsqueeze(0), ssm2, conv2, slots[i:i + 1])
        torch.testing.assert_close(y[cu[i]:cu[i + 1]], yp[0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ssm, ssm2, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(conv, conv2, atol=2e-6, rtol=1e-5)
    assert y[cu[3]:].eq(0).all()  # the padding sequence
    for pool, old in zip((ssm, conv), before, strict=True):
        assert torch.equal(pool[[1, 3, 5]], old[[1, 3, 5]])  # unused slots bit-identical


@pytest.mark.parametrize("kind", KINDS)
def test_two_packed_prefills_equal_one(kind):
    layer = _layer(kind)
    torch.manual_seed(2)
    lens, slots = (7, 12, 2), torch.tensor([3, 1, 5], dtype=torch.int32)
    cut = (3, 1, 0)  # shorter than, equal to and past the conv window
    x, cu = torch.randn(sum(lens), D), _cu(lens)
    ssm, conv = layer.new_state_pools(6)
    y = layer.prefill(x, ssm, conv, slots, cu_seqlens=cu)
    ssm2, conv2 = layer.new_state_pools(6)
    first = [r for i in range(3) for r in range(int(cu[i]), int(cu[i]) + cut[i])]
    second = [r for r in range(sum(lens)) if r not in first]
    y1 = layer.prefill(x[first], ssm2, conv2, slots, cu_seqlens=_cu(cut))
    y2 = layer.prefill(x[second], ssm2, conv2, slots, cu_seqlens=_cu([n - c for n, c in zip(lens, cut, strict=True)]),
                       has_initial_state=torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(y1, y[first], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(y2, y[second], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ssm2, ssm, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(conv2, conv, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_decode_equals_decoding_every_token(kind):
    layer = _layer(kind)
    torch.manual_seed(3)
    lens, slots = (6, 2), torch.tensor([2, 0], dtype=torch.int32)
    x, cu = torch.randn(sum(lens), D), _cu(lens)
    ssm, conv = layer.new_state_pools(4)
    decoded = [layer.decode(x[[int(cu[0]) + t, int(cu[1]) + min(t, 1)]][: 2 if t < 2 else 1], ssm, conv,
                            slots[: 2 if t < 2 else 1]) for t in range(6)]
    ssm2, conv2 = layer.new_state_pools(4)
    y = layer.prefill(x[[0, 1, 2, 6, 7]], ssm2, conv2, slots, cu_seqlens=_cu([3, 2]))
    rest = [layer.decode(x[[3 + t]], ssm2, conv2, slots[:1]) for t in range(3)]
    torch.testing.assert_close(y[:3], torch.stack([d[0] for d in decoded[:3]]), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(y[3:], torch.stack([decoded[0][1], decoded[1][1]]), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(rest), torch.stack([d[0] for d in decoded[3:]]), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ssm2, ssm, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(conv2, conv, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_packed_call_is_checked(kind):
    layer = _layer(kind)
    ssm, conv = layer.new_state_pools(4)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(kc.DtypeError, match="cu_seqlens"):
        layer.prefill(torch.randn(5, D), ssm, conv, slots, cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(kc.ShapeError, match="x"):
        layer.prefill(torch.randn(1, 5, D), ssm, conv, slots, cu_seqlens=_cu([2, 3]))
    with pytest.raises(kc.ShapeError, match="has_initial_state"):
        layer.prefill(torch.randn(2, 5, D), ssm, conv, slots, has_initial_state=torch.ones(2, dtype=torch.bool))


BAD_OFFSETS = {
    "not from 0": (1, 6, 7, 16, 19),
    "decreasing": (0, 5, 3, 15, 18),
    "ending early": (0, 5, 6, 15, 16),
    "ending late": (0, 5, 6, 15, 30),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [*BAD_OFFSETS, "NaN in x"])
def test_a_call_strict_mode_rejects_leaves_both_pools_as_they_were(kind, bad):
    # the conv state is written after the op accepted the call (the op's own transaction puts its slots
    # back); offsets that break the value rules never index past the conv's buffer (was a raw IndexError)
    layer = _layer(kind)
    torch.manual_seed(3)
    x, slots = torch.randn(sum(LENS), D), torch.tensor(SLOTS, dtype=torch.int32)
    cu = torch.tensor(BAD_OFFSETS[bad], dtype=torch.int32) if bad in BAD_OFFSETS else _cu(LENS)
    if bad == "NaN in x":
        x[2, 3] = float("nan")
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_(), conv.normal_()
    before = (ssm.clone(), conv.clone())
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError):
        layer.prefill(x, ssm, conv, slots, cu_seqlens=cu, has_initial_state=torch.tensor([True, False, True, True]))
    assert torch.equal(ssm, before[0]) and torch.equal(conv, before[1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["decode", "padded prefill"])
def test_strict_mode_refuses_a_nan_hidden_state_before_any_write(kind, path):
    # the padded prefill runs the reference step itself (no op to refuse the NaN): the layer checks x
    layer = _layer(kind)
    torch.manual_seed(4)
    slots = torch.tensor((4, 0, 2), dtype=torch.int32)
    x = torch.randn(3, D) if path == "decode" else torch.randn(3, 5, D)
    x.view(-1)[7] = float("inf")
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_(), conv.normal_()
    before = (ssm.clone(), conv.clone())
    name = type(layer).__name__ + (".decode" if path == "decode" else ".prefill")
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match=rf"(?s){name}\(\).*\[1\] x: ValueRangeError\n"
                                          r"      expected finite values\n      got      1 NaN or Inf"):
        (layer.decode if path == "decode" else layer.prefill)(x, ssm, conv, slots)
    assert torch.equal(ssm, before[0]) and torch.equal(conv, before[1])


@pytest.mark.parametrize("kind", KINDS)
def test_check_mode_offsets_ending_early_are_a_contract_error_and_write_no_slot(kind):
    # check mode trusts the offsets' values; the conv still never indexes past its buffer, and the
    # op's backend failure is a BackendError saying what may hold partial writes (the conv state not)
    layer = _layer(kind)
    x, slots = torch.randn(sum(LENS), D), torch.tensor(SLOTS, dtype=torch.int32)
    ssm, conv = layer.new_state_pools(6)
    conv.normal_()
    before = conv.clone()
    with kc.mode("check"), pytest.raises(kc.ContractError, match="may hold partial writes"):
        layer.prefill(x, ssm, conv, slots, cu_seqlens=torch.tensor(BAD_OFFSETS["ending early"], dtype=torch.int32))
    assert torch.equal(conv, before)


@pytest.mark.parametrize("kind", KINDS)
def test_a_rejected_padded_prefill_step_puts_the_reset_slots_back(kind, monkeypatch):
    # the padded prefill resets its slots, then steps; a step the kernel rejects undoes all of it
    layer = _layer(kind)
    ssm, conv = layer.new_state_pools(6)
    ssm.normal_(), conv.normal_()
    before = (ssm.clone(), conv.clone())
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise kc.BackendError("the third step's kernel failed")
        return layer._reference_decode(*args)

    monkeypatch.setattr(layer, "_reference_decode", failing)
    with pytest.raises(kc.BackendError, match="third step"):
        layer.prefill(torch.randn(2, 5, D), ssm, conv, torch.tensor([4, 0], dtype=torch.int32))
    assert len(calls) == 3 and torch.equal(ssm, before[0]) and torch.equal(conv, before[1])
