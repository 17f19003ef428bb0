"""A Qwen3-Next Gated DeltaNet (GDN) linear-attention layer for decode, with a contract on every
public entry point.

The layer, per token (our own code, written from the public description of Qwen3-Next; Hugging
Face's weight layout, so a checkpoint loads through :func:`weights_from_hf`):

1. ``in_proj_qkvz`` (hidden D -> 2*H*K + 2*HV*V), grouped per key head: q, k, then the v and z of
   the key head's HV/H value heads; ``in_proj_ba`` (D -> 2*HV), per key head: b then a of its
   value heads (beta and gate logits, one per value head);
2. q heads | k heads | v heads packed into ``mixed_qkv`` (C = 2*H*K + HV*V channels) and passed
   through a short causal depthwise conv (``conv_kernel_size`` taps, SiLU), whose last
   W = ``conv_kernel_size - 1`` inputs per request live in a conv-state pool ``[N, C, W]`` indexed
   by the same slots as the recurrent states;
3. :func:`kda_contracts.gdn_packed_decode` on the recurrent-state pool ``[N, HV, V, K]`` with
   ``A_log [HV]`` and ``dt_bias [HV]`` (one decay per value head);
4. the gated RMSNorm: ``RMSNorm(o) * norm * silu(z)`` per value head (over V);
5. ``out_proj`` (HV*V -> D). With tensor parallelism each rank holds H/tp key heads and HV/tp
   value heads (the input projections, the conv and the gate parameters are column-parallel, cut
   by key-head groups) and ``out_proj`` is row-parallel: the per-rank outputs are summed
   (all-reduce over ``tp_group``, any torch.distributed group: gloo on CPU, NCCL on GPUs).

The contracts read their dims from the layer (``config_arg="self"``): H, HV, K, V from its
:class:`~kda_contracts.GDNConfig`, D, C, W as for the Kimi-Linear layer (the machinery both share
is in :mod:`.linear_attention` and :mod:`.layer_contracts`). A weight sharded for another TP
degree, or a pool allocated for another rank count, is rejected with the TP degree it fits.

Example::

    from kda_contracts.models.qwen3_next import Qwen3NextGatedDeltaNet, random_weights

    layer = Qwen3NextGatedDeltaNet.from_hf_config("config.json", tp_size=1)
    layer.load_weights(**random_weights(layer.config, seed=0))
    ssm_states, conv_states = layer.new_state_pools(64)
    y = layer.decode(x, ssm_states, conv_states, torch.tensor([3, -1, 7]))   # x [3, D] -> y [3, D]
"""

# No `from __future__ import annotations`: the contract annotations are evaluated at definition.

from typing import Annotated, Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from kda_kernels import gdn_reference
from torch import Tensor

from .._engine import Spec, check, contract
from ..ops.gdn_decode.config import GDNConfig
from ..ops.gdn_decode.decode import gdn_packed_decode
from ..ops.gdn_prefill.prefill import gdn_packed_prefill
from .layer_contracts import (
    HAS_SLOTS,
    ConvStatePool,
    CuSeqlens,
    HasInitialState,
    Hidden,
    SlotIndices,
    SSMStatePool,
    slot_value_checks,
)
from .linear_attention import LinearAttentionDecode
from .qwen3_next_contracts import HINTS
from .qwen3_next_weights import WEIGHT_NAMES as WEIGHT_NAMES
from .qwen3_next_weights import random_weights as random_weights
from .qwen3_next_weights import shard_weights as shard_weights
from .qwen3_next_weights import weights_from_hf as weights_from_hf

__all__ = ["WEIGHT_NAMES", "Qwen3NextGatedDeltaNet", "random_weights", "shard_weights", "weights_from_hf"]


class Qwen3NextGatedDeltaNet(LinearAttentionDecode):
    """One tensor-parallel rank of a Qwen3-Next GDN linear-attention layer, for decode.

    ``config`` is the rank's :class:`~kda_contracts.GDNConfig` (``hidden_size`` set; VK state
    layout). Parameters start uninitialised: fill them with :meth:`load_weights`. States live in
    caller-owned pools indexed by slot (:meth:`new_state_pools`); a slot index ``< 0`` marks a
    padding row (zero output, no state read or written). ``tp_group``: when given, :meth:`decode`
    and :meth:`prefill` all-reduce the per-rank ``out_proj`` outputs over it.

    Example::

        >>> cfg = GDNConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, hidden_size=32)
        >>> layer = Qwen3NextGatedDeltaNet(cfg)
        >>> layer.load_weights(**random_weights(cfg, seed=0))
        >>> ssm, conv = layer.new_state_pools(8)
        >>> layer.decode(torch.randn(2, 32), ssm, conv, torch.tensor([5, -1])).shape
        torch.Size([2, 32])
    """

    config_class = GDNConfig  # from_hf_config reads a Qwen3-Next config.json into it
    default_rms_norm_eps = 1e-6

    def __init__(
        self,
        config: GDNConfig,
        *,
        rms_norm_eps: float = 1e-6,
        tp_rank: int = 0,
        tp_group: Any = None,
        backend: str = "auto",
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not isinstance(config, GDNConfig):
            raise TypeError(f"Qwen3NextGatedDeltaNet takes a GDNConfig (GDNConfig.from_hf_config(path)), got "
                            f"{type(config).__name__}")
        super().__init__(config, rms_norm_eps=rms_norm_eps, tp_rank=tp_rank, tp_group=tp_group, backend=backend,
                         dtype=dtype)
        D, HV, V, C, W = (self._dims[s] for s in ("D", "HV", "V", "C", "W"))
        self.in_proj_qkvz = self._linear(D, C + HV * V, device)
        self.in_proj_ba = self._linear(D, 2 * HV, device)
        self.conv1d = self._param(C, W + 1, device=device)
        self.A_log = self._param(HV, device=device, dtype=torch.float32)  # the kernels take these two in fp32
        self.dt_bias = self._param(HV, device=device, dtype=torch.float32)
        self.norm = self._param(V, device=device)
        self.out_proj = self._linear(HV * V, D, device)
        self.requires_grad_(False)  # a decode layer: no autograd bookkeeping per step

    # -- weights and pools -------------------------------------------------------------------------
    @contract(config_arg="self", hints=HINTS)
    def load_weights(
        self,
        in_proj_qkvz: Float[Tensor, "C+HV*V D"],
        in_proj_ba: Float[Tensor, "2*HV D"],
        conv1d: Float[Tensor, "C W+1"],
        A_log: Float[Tensor, "HV"],
        dt_bias: Float[Tensor, "HV"],
        norm: Float[Tensor, "V"],
        out_proj: Float[Tensor, "D HV*V"],
    ) -> None:
        """Copy this rank's weights in (``nn.Linear`` layout ``[out, in]``; the conv as ``[C, k]``),
        casting to the layer's dtypes.

        A weight sharded for another TP degree than the config's is rejected before anything is
        copied, with a hint naming the TP degree it fits. Example::

            layer.load_weights(**shard_weights(weights_from_hf(sd, prefix), layer.config, layer.tp_rank))
        """
        self._load({"in_proj_qkvz": in_proj_qkvz, "in_proj_ba": in_proj_ba, "conv1d": conv1d, "A_log": A_log,
                    "dt_bias": dt_bias, "norm": norm, "out_proj": out_proj})

    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS)
    def check_state_pools(self, ssm_states: SSMStatePool, conv_states: ConvStatePool) -> None:
        """Check a pair of state pools against this layer (both must have the same N slots).

        Example::

            layer.check_state_pools(ssm_states, conv_states)
        """

    # -- forwards ----------------------------------------------------------------------------------
    @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
    def decode(
        self,
        x: Hidden,
        ssm_states: SSMStatePool,
        conv_states: Annotated[Float[Tensor, "N C W"], Spec(inner_contiguous=2, same_dtype_as="x")],
        state_indices: SlotIndices,
    ) -> Float[Tensor, "B D"]:
        """One decode step for B requests (one token each) through :func:`kda_contracts.gdn_packed_decode`
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
        """Prefill B prompts; returns every prompt token's output and leaves the slots ready for
        :meth:`decode`. Packed: ``x [T, D]`` with ``cu_seqlens [B+1]`` (int32), through
        :func:`kda_contracts.gdn_packed_prefill`, each sequence continuing from its slots' states
        (recurrent and conv) where ``has_initial_state [B]`` says so, else from zero. Padded:
        ``x [B, T, D]`` without ``cu_seqlens``, from zero states, one token at a time with the
        reference kernel. Example::

            y = layer.prefill(tokens, ssm_states, conv_states, slots, cu_seqlens=cu)   # tokens [T, D]
            y = layer.prefill(prompt.unsqueeze(0), ssm_states, conv_states, torch.tensor([slot]))
        """
        check(x, "B _ D" if cu_seqlens is None else "_ D", name="x")  # padded [B, T, D], or packed [T, D]
        return self._prefill_either(x, ssm_states, conv_states, state_indices, cu_seqlens, has_initial_state,
                                    self._reference_decode, self._packed_prefill)

    # -- the computation (unchecked: the public methods above checked it) ------------------------
    def _inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Any]:
        d = self._dims
        R, H, HV, K, V = x.shape[0], d["H"], d["HV"], d["K"], d["V"]
        group = HV // H  # value heads per key head
        q, k, v, z = self.in_proj_qkvz(x).view(R, H, 2 * K + 2 * group * V).split(
            [K, K, group * V, group * V], dim=-1)
        b, a = (t.reshape(R, HV).contiguous()
                for t in self.in_proj_ba(x).view(R, H, 2 * group).split([group, group], dim=-1))
        mixed_qkv = torch.cat([q.reshape(R, H * K), k.reshape(R, H * K), v.reshape(R, HV * V)], dim=-1)
        return mixed_qkv, a, b, z

    def _outputs(self, x: Tensor, o: Tensor, extra: Any) -> Tensor:
        d = self._dims
        R, HV, V = x.shape[0], d["HV"], d["V"]
        o = o.reshape(R, HV, V).float()
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + self.rms_norm_eps) * self.norm.float()
        o = o * F.silu(extra.reshape(R, HV, V).float())  # padding rows: o == 0, so y == 0
        return self.out_proj(o.to(x.dtype).flatten(1))

    def _packed_prefill(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                        scale: float, ssm_states: Tensor, out: Tensor, cu_seqlens: Tensor, state_indices: Tensor,
                        has_initial_state: Tensor) -> None:
        cfg = self.config
        gdn_packed_prefill(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, cu_seqlens, state_indices,
                           has_initial_state, cfg.use_qk_l2norm, config=cfg)

    def _packed_decode(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                       scale: float, ssm_states: Tensor, out: Tensor, state_indices: Tensor) -> None:
        cfg = self.config
        gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, state_indices,
                          cfg.use_qk_l2norm, config=cfg, backend=self.backend)

    def _reference_decode(self, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                          scale: float, ssm_states: Tensor, out: Tensor, state_indices: Tensor) -> None:
        gdn_reference.gdn_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, out, state_indices,
                                        num_heads=self._dims["H"], use_qk_l2norm=self.config.use_qk_l2norm,
                                        state_layout="VK")
