"""The recurrent and conv states of a Hugging Face (transformers) cache, moved into a layer's slot
pools and back, for the Kimi-Linear and Qwen3-Next layers (transformers is never imported: a cache
is read through its methods, duck-typed).

How the two sides store a request's states (transformers' ``LinearAttentionLayer`` of a
``DynamicCache``, per layer):

============  ==================================  =========================================
state         Hugging Face (one row per request)  ours (one slot per request)
============  ==================================  =========================================
recurrent     ``[B, HV, K, V]`` (KV), fp32        ``[N, HV, V, K]`` (VK), the pool's dtype
conv          ``[B, C, k]``: the last k inputs    ``[N, C, k-1]``: the last k-1 inputs
============  ==================================  =========================================

(k = ``conv_kernel_size``; C = the q/k/v conv channels, q heads | k heads | v heads on both sides.)
The oldest of Hugging Face's k conv columns is never read by the next step (its window is the
last k-1 inputs and the new token), so :func:`states_from_hf` drops it and :func:`states_to_hf`
gives zeros there: ours -> HF -> ours is exact, HF -> ours -> HF loses only that unused column.

Example::

    states_from_hf(layer, *hf_cache_states(cache, layer_idx=0), ssm_states, conv_states, slots)
    recurrent, conv = states_to_hf(layer, ssm_states, conv_states, slots)  # [B, HV, K, V], [B, C, k]
"""

# No `from __future__ import annotations`: the contract annotations are evaluated at definition.

from typing import Any

import torch
from jaxtyping import Float
from kda_kernels.interface import row_slots, scatter_rows
from torch import Tensor

from .._engine import CallContext, ShapeError, Violation, contract
from .._engine.facts import AxisMismatch
from .layer_contracts import HAS_SLOTS, HINTS, ConvStatePool, SlotIndices, SSMStatePool, slot_value_checks
from .linear_attention import LinearAttentionDecode

__all__ = ["hf_cache_states", "set_hf_cache_states", "states_from_hf", "states_to_hf"]

HFRecurrentState = Float[Tensor, "B HV K V"]
HFConvState = Float[Tensor, "B C W+1"]


def _hint_hf_layout(v: Violation, ctx: CallContext) -> str | None:
    """Our layouts given where Hugging Face's are expected: a VK state, a conv state of k-1 columns."""
    t, d = ctx.values.get(v.argument), ctx.config.contract_dims()
    if v.kind is not ShapeError or not isinstance(t, Tensor) or t.dim() != 3 + (v.argument == "recurrent_state"):
        return None
    if v.argument == "recurrent_state" and d["K"] != d["V"] and tuple(t.shape[1:]) == (d["HV"], d["V"], d["K"]):
        return (f"recurrent_state looks like our VK layout [B, HV, V, K] = {list(t.shape)}; a Hugging Face cache "
                "holds [B, HV, K, V] (KV): pass the cache's tensor as it is (hf_cache_states(cache, layer_idx)), "
                "or .transpose(-1, -2) ours")
    axis = v.fact(AxisMismatch)
    if v.argument == "conv_state" and axis is not None and axis.axis == 2 and axis.got == d["W"]:
        return (f"conv_state has k-1 = {d['W']} columns, our pool's; a Hugging Face cache keeps the last k = "
                f"conv_kernel_size = {d['W'] + 1} inputs of each channel: pass the cache's conv state as it is "
                "(hf_cache_states(cache, layer_idx))")
    return None


STATE_HINTS = (*HINTS, _hint_hf_layout)


@contract(config_arg="layer", hints=STATE_HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
def states_from_hf(
    layer: LinearAttentionDecode,
    recurrent_state: HFRecurrentState,
    conv_state: HFConvState,
    ssm_states: SSMStatePool,
    conv_states: ConvStatePool,
    state_indices: SlotIndices,
) -> None:
    """Scatter B requests' Hugging Face states (``recurrent_state [B, HV, K, V]``, ``conv_state
    [B, C, k]``, e.g. from :func:`hf_cache_states`) into ``layer``'s pools at ``state_indices``
    (cast to the pools' dtypes); a negative index skips its row. The layer then decodes (or
    prefills with ``has_initial_state``) from where Hugging Face left off.

    Example::

        states_from_hf(layer, *hf_cache_states(cache, 0), ssm_states, conv_states, torch.tensor([3]))
    """
    scatter_rows(ssm_states, state_indices, recurrent_state.transpose(-1, -2))
    scatter_rows(conv_states, state_indices, conv_state[..., 1:])


@contract(config_arg="layer", hints=STATE_HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
def states_to_hf(
    layer: LinearAttentionDecode,
    ssm_states: SSMStatePool,
    conv_states: ConvStatePool,
    state_indices: SlotIndices,
) -> tuple[Float[Tensor, "B HV K V"], Float[Tensor, "B C W+1"]]:
    """Gather the states of the slots ``state_indices`` in Hugging Face's layouts: ``(recurrent_state
    [B, HV, K, V], conv_state [B, C, k])``, dense, in the pools' dtypes (the conv state's oldest
    column, which the next step does not read, is zero; a negative index gives zero rows). Hand
    them to a cache with :func:`set_hf_cache_states`.

    Example::

        recurrent, conv = states_to_hf(layer, ssm_states, conv_states, torch.tensor([3]))
    """
    rows = row_slots(state_indices.long(), ssm_states.shape[0])
    keep = rows.valid.view(-1, 1, 1)
    recurrent = rows.gather(ssm_states).transpose(-1, -2).mul(keep.unsqueeze(-1)).contiguous()
    conv = torch.nn.functional.pad(rows.gather(conv_states) * keep, (1, 0))
    return recurrent, conv


def hf_cache_states(cache: Any, layer_idx: int) -> tuple[Tensor, Tensor]:
    """``(recurrent_state, conv_state)`` of layer ``layer_idx`` of a transformers cache (read through
    its ``get_recurrent_state``/``get_conv_state``): ``[B, HV, K, V]`` and ``[B, C, k]``.

    Example::

        recurrent, conv = hf_cache_states(cache, layer_idx=0)
    """
    recurrent, conv = cache.get_recurrent_state(layer_idx), cache.get_conv_state(layer_idx)
    if recurrent is None or conv is None:
        raise ValueError(f"layer {layer_idx} of the {type(cache).__name__} holds no state yet (run a forward with "
                         "it first), or is not a linear-attention layer")
    return recurrent, conv


def set_hf_cache_states(cache: Any, layer_idx: int, recurrent_state: Tensor, conv_state: Tensor) -> None:
    """Put ``(recurrent_state [B, HV, K, V], conv_state [B, C, k])`` (from :func:`states_to_hf`) in layer
    ``layer_idx`` of a transformers cache: copied into the states it holds, else handed to its
    ``update_conv_state``/``update_recurrent_state`` as a first state. A Hugging Face forward with
    the cache then continues from them.

    Example::

        set_hf_cache_states(cache, 0, *states_to_hf(layer, ssm_states, conv_states, slots))
    """
    held = cache.get_conv_state(layer_idx)
    if held is None:
        cache.update_conv_state(conv_state, layer_idx)
    else:
        held.copy_(conv_state)
    held = cache.get_recurrent_state(layer_idx)
    if held is None:
        cache.update_recurrent_state(recurrent_state, layer_idx)
    else:
        held.copy_(recurrent_state)
