"""The Kimi-Linear and Qwen3-Next layers against transformers' own modules (``KimiLinearDeltaAttention``,
``Qwen3NextGatedDeltaNet``): tiny configs, random weights, CPU, fp32. The weights go through
``weights_from_hf``, the configs through ``from_hf_config(hf_config)``, the caches through
``hf_interop``; our packed varlen prefill is compared with the Hugging Face forward of each sequence
(unbatched), then a few decode steps with each side's cached decode, both ways round (our states
into Hugging Face's cache, and Hugging Face's into our pools). Skipped without transformers.

``pytest -s`` prints the largest relative errors (max |ours - hf| / max |hf|, per output)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _import_hub_kernels() -> None:
    """transformers imports the ``kernels`` package (Hugging Face's hub kernels) when it is
    installed; under pytest the repository root is on ``sys.path`` (pyproject's ``pythonpath``), where
    our ``kernels/`` folder (installed as ``kda_kernels``) would be found under that name instead.
    Import the installed one first, with the root out of the path."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    try:
        importlib.import_module("kernels")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved


_import_hub_kernels()
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import (  # noqa: E402
    Qwen3NextGatedDeltaNet as HFQwen3NextGatedDeltaNet,
)

from kda_contracts.models import kimi_linear, qwen3_next  # noqa: E402
from kda_contracts.models.hf_interop import (  # noqa: E402
    hf_cache_states,
    set_hf_cache_states,
    states_from_hf,
    states_to_hf,
)

D = 32
LENS = (5, 70, 1, 9)  # 70: past one 64-token chunk on both sides
SLOTS = (4, 0, 2, 5)
STEPS = 3
TOL = 2e-5  # relative, fp32 on both sides


def _build(kind: str):
    """(transformers' module with random weights, its config, our layer loaded from it)."""
    torch.manual_seed(0)
    if kind == "kimi":
        hc = transformers.KimiLinearConfig(hidden_size=D, num_hidden_layers=1, linear_num_heads=2,
                                           linear_head_dim=8, layer_types=["linear_attention"])
        hf, ours_cls, weights_from_hf = KimiLinearDeltaAttention(hc, 0), kimi_linear.KimiDeltaAttention, \
            kimi_linear.weights_from_hf
    else:
        hc = transformers.Qwen3NextConfig(hidden_size=D, num_hidden_layers=1, linear_num_key_heads=2,
                                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                                          layer_types=["linear_attention"])
        hf, ours_cls, weights_from_hf = HFQwen3NextGatedDeltaNet(hc, 0), qwen3_next.Qwen3NextGatedDeltaNet, \
            qwen3_next.weights_from_hf
    hf = hf.float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.normal_(1.0, 0.1)
        gate = hf.forget_gate if kind == "kimi" else hf
        gate.A_log.uniform_(-1.0, 1.0)  # A in [0.37, 2.7]
        gate.dt_bias.normal_(0.0, 1.0)
    ours = ours_cls.from_hf_config(hc, backend="torch")
    ours.load_weights(**weights_from_hf(hf.state_dict()))
    return hf, hc, ours


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def _cu(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("kind", ["kimi", "qwen"])
def test_prefill_and_decode_match_transformers(kind):
    hf, hc, ours = _build(kind)
    gen = torch.Generator().manual_seed(1)
    cu, slots = _cu(LENS), torch.tensor(SLOTS, dtype=torch.int32)
    x = torch.randn(sum(LENS), D, generator=gen)
    ssm, conv = ours.new_state_pools(6)
    y = ours.prefill(x, ssm, conv, slots, cu_seqlens=cu)

    errors = {"prefill": 0.0, "state": 0.0, "decode (our states in HF's cache)": 0.0,
              "decode (HF's states in our pools)": 0.0}
    hf_caches, from_ours = [], []
    with torch.no_grad():
        for i in range(len(LENS)):
            cache = DynamicCache(config=hc)
            ref = hf(x[cu[i]:cu[i + 1]].unsqueeze(0), cache=cache)[0]
            errors["prefill"] = max(errors["prefill"], _rel(y[cu[i]:cu[i + 1]], ref))
            recurrent, conv_hf = states_to_hf(ours, ssm, conv, slots[i:i + 1])
            hf_recurrent, hf_conv = hf_cache_states(cache, 0)
            errors["state"] = max(errors["state"], _rel(recurrent, hf_recurrent))
            torch.testing.assert_close(conv_hf[..., 1:], hf_conv[..., 1:])  # the conv inputs, as they came in
            hf_caches.append(cache)
            mine = DynamicCache(config=hc)  # a fresh Hugging Face cache holding our states
            set_hf_cache_states(mine, 0, recurrent, conv_hf)
            from_ours.append(mine)

        ssm2, conv2 = ours.new_state_pools(6)  # Hugging Face's states in fresh pools
        for i, cache in enumerate(hf_caches):
            states_from_hf(ours, *hf_cache_states(cache, 0), ssm2, conv2, slots[i:i + 1])

        for _ in range(STEPS):
            step = torch.randn(len(LENS), D, generator=gen)
            y_ours, y_from_hf = ours.decode(step, ssm, conv, slots), ours.decode(step, ssm2, conv2, slots)
            for i in range(len(LENS)):
                ref = hf(step[i].view(1, 1, D), cache=hf_caches[i])[0, 0]
                ref_mine = hf(step[i].view(1, 1, D), cache=from_ours[i])[0, 0]
                key = "decode (our states in HF's cache)"
                errors[key] = max(errors[key], _rel(y_ours[i], ref_mine), _rel(y_ours[i], ref))
                key = "decode (HF's states in our pools)"
                errors[key] = max(errors[key], _rel(y_from_hf[i], ref))

    print(f"\n{kind} vs transformers {transformers.__version__} (fp32, max relative error):",
          ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert all(v < TOL for v in errors.values()), errors


@pytest.mark.parametrize("kind", ["kimi", "qwen"])
def test_two_tensor_parallel_ranks_sum_to_the_transformers_output(kind):
    """weights_from_hf then shard_weights: the ranks' partial outputs (no process group: each
    returns its share of the row-parallel output projection) add up to Hugging Face's output."""
    hf, hc, ours = _build(kind)
    module = kimi_linear if kind == "kimi" else qwen3_next
    weights = module.weights_from_hf(hf.state_dict())
    x = torch.randn(1, 11, D, generator=torch.Generator().manual_seed(2))
    total = torch.zeros(11, D)
    for rank in range(2):
        layer = type(ours).from_hf_config(hc, tp_size=2, tp_rank=rank, backend="torch")
        layer.load_weights(**module.shard_weights(weights, layer.config, rank))
        ssm, conv = layer.new_state_pools(1)
        total += layer.prefill(x[0], ssm, conv, torch.tensor([0], dtype=torch.int32),
                               cu_seqlens=torch.tensor([0, 11], dtype=torch.int32))
    with torch.no_grad():
        ref = hf(x)[0]
    assert _rel(total, ref) < TOL
