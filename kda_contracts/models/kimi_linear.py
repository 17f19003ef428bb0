"""A Kimi-Linear KDA attention layer for decode, with a contract on every public entry point.

The layer, per token (our own code, written from the public description of Kimi-Linear):

1. ``qkv_proj`` (hidden D -> C = 2*H*K + HV*V): q heads, k heads, v heads, head-major;
2. a short causal depthwise conv over those C channels (``conv_kernel_size`` taps, SiLU), whose
   last W = ``conv_kernel_size - 1`` inputs per request live in a conv-state pool ``[N, C, W]``;
3. the raw forget gate, low rank: ``f_a_proj`` (D -> K) then ``f_b_proj`` (K -> HV*K);
   beta logits from ``b_proj`` (D -> HV); ``A_log [HV]`` and ``dt_bias [HV*K]`` as in docs/semantics.md;
4. :func:`kda_contracts.packed_decode` on the recurrent-state pool ``[N, HV, V, K]``;
5. the gated RMSNorm output gate: ``g_a_proj`` (D -> V) then ``g_b_proj`` (V -> HV*V), sigmoid,
   times the RMSNorm (over V, per head, with weight ``o_norm [V]``) of the attention output;
6. ``o_proj`` (HV*V -> D); with tensor parallelism each rank holds HV/tp heads and the
   per-rank ``o_proj`` outputs are summed (all-reduce over ``tp_group``, any torch.distributed
   group: gloo on CPU, NCCL on GPUs; ``tests/test_tensor_parallel.py`` runs TP2 over gloo in CI
   and over NCCL when two GPUs are present).

(Kimi-Linear's low-rank width is its ``head_dim``, equal to K and V; we use K for the forget gate,
whose output is per key channel, and V for the output gate, whose output is per value channel.)

How the contracts get their dims. ``KDAConfig.contract_dims()`` fixes H, HV, K, V per rank; a
layer needs three more: D (``hidden_size``), C (the conv channels, ``2*H*K + HV*V`` per rank) and
W (``conv_kernel_size - 1``). The layer itself is the contract config of its methods: they are
decorated with ``@kc.contract(config_arg="self")`` and the layer exposes ``contract_dims()`` (the
config's dims plus D, C, W, all derived from its frozen ``KDAConfig`` once, at construction),
``contract_dim_source()`` and ``contract_dtypes()`` (fixed for the layer's life: the engine caches
what a config object fixes). So a TP1 pool handed to a TP2 layer is caught
with the config field it disagrees with, and a hint that names the TP degree the tensors were
built for.

Example::

    from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

    layer = KimiDeltaAttention.from_hf_config("config.json", tp_size=1)
    layer.load_weights(**random_weights(layer.config, seed=0))
    ssm_states, conv_states = layer.new_state_pools(64)
    idx = torch.tensor([3, -1, 7])                      # -1: a padding row
    layer.prefill(prompt, ssm_states, conv_states, idx)  # prompt [3, T, D]
    y = layer.decode(x, ssm_states, conv_states, idx)    # x [3, D] -> y [3, D]
"""

# No `from __future__ import annotations`: the contract annotations are evaluated at definition.

from typing import Annotated, Any

import torch
from jaxtyping import Float
from kda_kernels import reference
from torch import Tensor, nn

from .._engine import Spec, check, contract
from ..ops._packed.config import KDAConfig
from ..ops.packed_decode.decode import packed_decode
from ..ops.packed_prefill.prefill import packed_prefill
from .kimi_linear_weights import WEIGHT_NAMES as WEIGHT_NAMES
from .kimi_linear_weights import random_weights as random_weights
from .kimi_linear_weights import shard_weights as shard_weights
from .kimi_linear_weights import weights_from_hf as weights_from_hf
from .layer_contracts import (
    HAS_SLOTS,
    HINTS,
    ConvStatePool,
    CuSeqlens,
    HasInitialState,
    Hidden,
    SlotIndices,
    SSMStatePool,
    slot_value_checks,
)
from .layer_contracts import layer_dims as layer_dims
from .linear_attention import LinearAttentionDecode

__all__ = ["WEIGHT_NAMES", "KimiDeltaAttention", "layer_dims", "random_weights", "shard_weights", "weights_from_hf"]


# -- the layer -------------------------------------------------------------------------------------
class KimiDeltaAttention(LinearAttentionDecode):
    """One tensor-parallel rank of a Kimi-Linear KDA attention layer, for decode.

    ``config`` is the rank's :class:`~kda_contracts.KDAConfig` (``hidden_size`` set; VK state
    layout). Parameters start uninitialised: fill them with :meth:`load_weights` (e.g. from
    :func:`random_weights`). States live in caller-owned pools indexed by slot
    (:meth:`new_state_pools`); a slot index ``< 0`` marks a padding row (zero output, no state
    read or written). ``tp_group``: when given, :meth:`decode` and :meth:`prefill` all-reduce the
    per-rank ``o_proj`` outputs over it; when None they return this rank's partial sum.

    Example::

        >>> cfg = KDAConfig(num_heads=4, head_k_dim=16, hidden_size=64)
        >>> layer = KimiDeltaAttention(cfg)
        >>> layer.load_weights(**random_weights(cfg, seed=0))
        >>> ssm, conv = layer.new_state_pools(8)
        >>> layer.decode(torch.randn(2, 64), ssm, conv, torch.tensor([5, -1])).shape
        torch.Size([2, 64])
    """

    config_class = KDAConfig  # from_hf_config reads a Kimi-Linear config.json into it
    default_rms_norm_eps = 1e-5

    def __init__(
        self,
        config: KDAConfig,
        *,
        rms_norm_eps: float = 1e-5,
        tp_rank: int = 0,
        tp_group: Any = None,
        backend: str = "auto",
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(config, rms_norm_eps=rms_norm_eps, tp_rank=tp_rank, tp_group=tp_group, backend=backend,
                         dtype=dtype)
        D, HV, K, V, C, W = (self._dims[s] for s in ("D", "HV", "K", "V", "C", "W"))

        def linear(n_in: int, n_out: int) -> nn.Linear:
            return self._linear(n_in, n_out, device)

        def param(*shape: int, dt: torch.dtype = dtype) -> nn.Parameter:
            return self._param(*shape, device=device, dtype=dt)

        self.qkv_proj = linear(D, C)
        self.conv1d = param(C, W + 1)
        self.f_a_proj = linear(D, K)
        self.f_b_proj = linear(K, HV * K)
        self.b_proj = linear(D, HV)
        self.A_log = param(HV, dt=torch.float32)  # the kernels take these two in fp32
        self.dt_bias = param(HV * K, dt=torch.float32)
        self.g_a_proj = linear(D, V)
        self.g_b_proj = linear(V, HV * V)
        self.o_norm = param(V)
        self.o_proj = linear(HV * V, D)
        self.requires_grad_(False)  # a decode layer: no autograd bookkeeping per step

    # -- weights and pools -------------------------------------------------------------------------
    @contract(config_arg="self", hints=HINTS)
    def load_weights(
        self,
        qkv_proj: Float[Tensor, "C D"],
        conv1d: Float[Tensor, "C W+1"],
        f_a_proj: Float[Tensor, "K D"],
        f_b_proj: Float[Tensor, "HV*K K"],
        b_proj: Float[Tensor, "HV D"],
        A_log: Float[Tensor, "HV"],
        dt_bias: Float[Tensor, "HV*K"],
        g_a_proj: Float[Tensor, "V D"],
        g_b_proj: Float[Tensor, "HV*V V"],
        o_norm: Float[Tensor, "V"],
        o_proj: Float[Tensor, "D HV*V"],
    ) -> None:
        """Copy this rank's weights in (``nn.Linear`` layout, ``[out, in]``), casting to the layer's dtypes.

        A weight sharded for another TP degree than the config's is rejected before anything is
        copied, with a hint naming the TP degree it fits. Example::

            layer.load_weights(**shard_weights(full_weights, layer.config, layer.tp_rank))
        """
        self._load({"qkv_proj": qkv_proj, "conv1d": conv1d, "f_a_proj": f_a_proj, "f_b_proj": f_b_proj,
                    "b_proj": b_proj, "A_log": A_log, "dt_bias": dt_bias, "g_a_proj": g_a_proj, "g_b_proj": g_b_proj,
                    "o_norm": o_norm, "o_proj": o_proj})

    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS)
    def check_state_pools(self, ssm_states: SSMStatePool, conv_states: ConvStatePool) -> None:
        """Check a pair of state pools against this layer (both must have the same N slots).

        Pools come from :meth:`new_state_pools` or from an engine's allocator; every forward
        checks them again. Example::

            layer.check_state_pools(ssm_states, conv_states)
        """

    # -- forwards ----------------------------------------------------------------------------------
    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
    def conv_update(
        self,
        mixed_qkv: Annotated[Float[Tensor, "B C"], Spec(inner_contiguous=1, config_dtype="activation")],
        conv_states: Annotated[Float[Tensor, "N C W"], Spec(inner_contiguous=2, same_dtype_as="mixed_qkv")],
        state_indices: SlotIndices,
    ) -> Float[Tensor, "B C"]:
        """One step of the short causal conv: ``SiLU(sum_j window[:, :, j] * conv1d[:, j])`` over the
        slot's last W inputs and this one; the slot then keeps the last W inputs. Padding rows
        (index < 0) return zeros and touch no slot.

        Example::

            conv_out = layer.conv_update(layer.qkv_proj(x), conv_states, idx)   # [B, C]
        """
        return self._conv_step(mixed_qkv, conv_states, state_indices)

    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
    def decode(
        self,
        x: Hidden,
        ssm_states: SSMStatePool,
        conv_states: Annotated[Float[Tensor, "N C W"], Spec(inner_contiguous=2, same_dtype_as="x")],
        state_indices: SlotIndices,
    ) -> Float[Tensor, "B D"]:
        """One decode step for B requests (one token each) through :func:`kda_contracts.packed_decode`
        (``backend=self.backend``); updates the used slots of both pools in place.

        Padding rows (index < 0) give zero outputs and leave the pools untouched. Example::

            y = layer.decode(x, ssm_states, conv_states, torch.tensor([4, 0, -1]))   # x [3, D]
        """
        return self._decode(x, ssm_states, conv_states, state_indices, self._packed_decode)

    forward = decode

    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
    def prefill(
        self,
        x: Annotated[Float[Tensor, "*tokens D"], Spec(inner_contiguous=1, config_dtype="activation")],
        ssm_states: SSMStatePool,
        conv_states: Annotated[Float[Tensor, "N C W"], Spec(inner_contiguous=2, same_dtype_as="x")],
        state_indices: SlotIndices,
        cu_seqlens: CuSeqlens | None = None,
        has_initial_state: HasInitialState | None = None,
    ) -> Float[Tensor, "*tokens D"]:
        """Prefill B prompts; returns the output of every prompt token and leaves the slots ready for
        :meth:`decode`.

        Packed (varlen): ``x [T, D]`` with ``cu_seqlens [B+1]`` (int32), through
        :func:`kda_contracts.packed_prefill`; a sequence continues from its slots' states (recurrent
        and conv) where ``has_initial_state [B]`` says so (default: none does), else starts from zero.
        Padded: ``x [B, T, D]`` without ``cu_seqlens``: every prompt has T tokens and starts from zero
        (the slots are reset), run one token at a time with the reference kernel. Example::

            y = layer.prefill(tokens, ssm_states, conv_states, slots, cu_seqlens=cu)   # tokens [T, D]
            y = layer.prefill(prompt.unsqueeze(0), ssm_states, conv_states, torch.tensor([slot]))
        """
        check(x, "B _ D" if cu_seqlens is None else "_ D", name="x")  # padded [B, T, D], or packed [T, D]
        return self._prefill_either(x, ssm_states, conv_states, state_indices, cu_seqlens, has_initial_state,
                                    self._reference_decode, self._packed_prefill)

    # -- the computation (unchecked: the public methods above checked it) ------------------------
    def _inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Any]:
        a = self.f_b_proj(self.f_a_proj(x))  # [R, HV*K] raw forget-gate logits
        return self.qkv_proj(x), a, self.b_proj(x), None  # b: [R, HV] raw beta logits

    def _outputs(self, x: Tensor, o: Tensor, extra: Any) -> Tensor:
        d = self._dims
        R = x.shape[0]
        gate = self.g_b_proj(self.g_a_proj(x)).float().view(R, d["HV"], d["V"])
        o = o.reshape(R, d["HV"], d["V"]).float()
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + self.rms_norm_eps) * self.o_norm.float()
        o = o * torch.sigmoid(gate)  # padding rows: o == 0, so y == 0
        return self.o_proj(o.to(x.dtype).flatten(1))

    def _packed_prefill(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                        scale: float, ssm_states: Tensor, out: Tensor, cu_seqlens: Tensor, state_indices: Tensor,
                        has_initial_state: Tensor) -> None:
        cfg = self.config
        packed_prefill(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, cu_seqlens, state_indices,
                       has_initial_state, cfg.use_qk_l2norm, cfg.effective_lower_bound, config=cfg)

    def _packed_decode(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                       scale: float, ssm_states: Tensor, out: Tensor, state_indices: Tensor) -> None:
        cfg = self.config
        packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, state_indices,
                      use_qk_l2norm_in_kernel=cfg.use_qk_l2norm, lower_bound=cfg.effective_lower_bound,
                      config=cfg, backend=self.backend)

    def _reference_decode(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                          scale: float, ssm_states: Tensor, out: Tensor, state_indices: Tensor) -> None:
        cfg = self.config
        reference.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, state_indices,
                                num_heads=self._dims["H"], use_qk_l2norm=cfg.use_qk_l2norm,
                                lower_bound=cfg.effective_lower_bound, state_layout="VK")
