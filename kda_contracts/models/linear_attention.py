"""What the linear-attention decode layers (Kimi-Linear KDA, Qwen3-Next GDN) share: one
tensor-parallel rank's config and per-rank dims (which their contracts read: the layer is the
config of its own contracts), the two slot-indexed state pools of continuous batching (recurrent
states ``[N, HV, V, K]`` and short-conv states ``[N, C, W]``), the one-token causal conv step, the
prefill loop, weight loading, the all-reduce of the row-parallel output projection, and the
shard helpers of their column-parallel weights.

A layer subclasses :class:`LinearAttentionDecode`, creates its parameters (one of them
``conv1d [C, W+1]``), writes ``_step`` (one token for B requests, given a packed-decode kernel)
and declares its public, contracted methods, which call the helpers here. Example::

    class MyLayer(LinearAttentionDecode):
        @contract(config_arg="self", hints=HINTS, where=HAS_SLOTS, value_checks=slot_value_checks)
        def decode(self, x: Hidden, ssm_states: SSMStatePool, conv_states: ..., state_indices: SlotIndices):
            return self._decode(x, ssm_states, conv_states, state_indices, self._kernel)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from kda_kernels.interface import row_slots, scatter_rows
from torch import Tensor, nn
from typing_extensions import Self

from .._engine import ShapeError, Violation, raise_violations
from ..ops._packed.config import KDAConfig, read_hf_json
from .layer_contracts import layer_dims

__all__ = ["LinearAttentionDecode", "StepKernel", "conv_channel_shard", "rank_columns", "rank_rows", "read_hf_config"]

StepKernel = Callable[..., None]
"""A packed-decode call in sglang's argument order, ``(mixed_qkv, a, b, A_log, dt_bias, scale,
ssm_states, out, state_indices)``, writing ``out`` and the used slots."""


def read_hf_config(source: Any) -> Mapping[str, Any]:
    """A Hugging Face config as a mapping: a ``config.json`` path, a mapping (returned as is) or a
    config object (``to_dict()`` or attributes; see :func:`~kda_contracts.ops._packed.config.read_hf_json`).

    Example::

        raw = read_hf_config("config.json"); eps = raw.get("rms_norm_eps", 1e-6)
    """
    return read_hf_json(source)[0]


def rank_rows(t: Tensor, rank: int, size: int, start: int = 0) -> Tensor:
    """Rank ``rank``'s block of ``size`` rows after ``start`` (a copy): the column-parallel shard.

    Example::

        >>> rank_rows(torch.arange(8), rank=1, size=2, start=4).tolist()
        [6, 7]
    """
    return t[start + rank * size: start + (rank + 1) * size].clone()


def rank_columns(t: Tensor, rank: int, size: int) -> Tensor:
    """Rank ``rank``'s block of ``size`` columns (a copy): the row-parallel shard of an output
    projection ``[D, HV*V]``, whose per-rank products are summed.

    Example::

        >>> rank_columns(torch.arange(8).view(2, 4), rank=1, size=2).tolist()
        [[2, 3], [6, 7]]
    """
    return t[:, rank * size: (rank + 1) * size].clone(memory_format=torch.contiguous_format)


def conv_channel_shard(t: Tensor, config: KDAConfig, rank: int) -> Tensor:
    """Rank ``rank``'s rows of a whole-layer tensor over the q/k/v conv channels (``q heads | k heads
    | v heads``, C = 2*H*K + HV*V rows): its q heads, its k heads and its v heads.

    Example::

        >>> cfg = KDAConfig(num_heads=2, head_k_dim=1, hidden_size=4, tp_size=2)
        >>> conv_channel_shard(torch.arange(6), cfg, rank=1).tolist()   # q0 q1 | k0 k1 | v0 v1
        [1, 3, 5]
    """
    full, loc = layer_dims(config.with_tp(1)), layer_dims(config)
    H, K, V, h, hv = full["H"], full["K"], full["V"], loc["H"], loc["HV"]
    return torch.cat([rank_rows(t, rank, h * K), rank_rows(t, rank, h * K, H * K),
                      rank_rows(t, rank, hv * V, 2 * H * K)])


class LinearAttentionDecode(nn.Module):
    """One tensor-parallel rank of a linear-attention layer for decode (the shared part; see the
    module docstring). ``config``: the rank's KDAConfig/GDNConfig (``hidden_size`` set, VK state
    layout); ``tp_group``: when given, outputs are all-reduced over it.

    Example::

        layer = KimiDeltaAttention(cfg)          # a subclass
        ssm_states, conv_states = layer.new_state_pools(64)
    """

    conv1d: nn.Parameter  # [C, W+1], set by the subclass
    #: the model's config class and its RMSNorm epsilon when config.json gives none (each subclass's)
    config_class: type[KDAConfig] = KDAConfig
    default_rms_norm_eps: float = 1e-6

    @classmethod
    def from_hf_config(
        cls, source: Any, *, tp_size: int = 1, tp_rank: int = 0,
        config_overrides: Mapping[str, Any] | None = None, **kwargs: Any,
    ) -> Self:
        """One rank's layer from the model's config: a ``config.json`` path, its dict, or a
        transformers config object (``model.config``; duck-typed) (``rms_norm_eps`` read when present,
        else :attr:`default_rms_norm_eps`); ``config_overrides`` go to the config class's
        ``from_hf_config``, the other keywords to the layer.

        Example::

            layer = KimiDeltaAttention.from_hf_config("config.json", tp_size=2, tp_rank=1)
            layer = Qwen3NextGatedDeltaNet.from_hf_config(hf_model.config, tp_size=2, tp_rank=1)
        """
        raw = read_hf_config(source)
        if raw.get("hidden_act", "silu") != "silu":  # the model's activation, its short conv's too
            raise ValueError(f"hidden_act={raw['hidden_act']!r}: {cls.__name__}'s short conv applies SiLU, as "
                             "Kimi-Linear and Qwen3-Next do (hidden_act='silu')")
        config = cls.config_class.from_hf_config(raw, tp_size=tp_size, **dict(config_overrides or {}))
        kwargs.setdefault("rms_norm_eps", float(raw.get("rms_norm_eps", cls.default_rms_norm_eps)))
        return cls(config, tp_rank=tp_rank, **kwargs)

    def __init__(self, config: KDAConfig, *, rms_norm_eps: float, tp_rank: int, tp_group: Any, backend: str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        name = type(self).__name__
        if config.state_layout != "VK":
            raise ValueError(f"{name} keeps its recurrent states as [N, HV, V, K] (state_layout='VK', "
                             f"sglang's layout); build its config with state_layout='VK'")
        if not 0 <= tp_rank < config.tp_size:
            raise ValueError(f"tp_rank={tp_rank} is outside 0..{config.tp_size - 1} (tp_size={config.tp_size})")
        self.config = config
        self.rms_norm_eps = rms_norm_eps
        self.tp_rank = tp_rank
        self.tp_group = tp_group
        self.backend = backend
        self.dtype = dtype
        self._dims = layer_dims(config)
        self._dim_sources = {
            **{s: config.contract_dim_source(s) for s in ("H", "HV", "K", "V")},
            "D": f"hidden_size={self._dims['D']}",
            "C": f"2*H*K+HV*V = {self._dims['C']}, the q/k/v conv channels per rank",
            "W": f"conv_kernel_size={config.conv_kernel_size} - 1",
        }

    def extra_repr(self) -> str:
        d = self._dims
        return (f"H={d['H']}, HV={d['HV']}, K={d['K']}, V={d['V']}, D={d['D']}, conv={d['W'] + 1}, "
                f"tp={self.tp_rank}/{self.config.tp_size}, backend={self.backend!r}")

    def _linear(self, n_in: int, n_out: int, device: str | torch.device | None) -> nn.Linear:
        return nn.Linear(n_in, n_out, bias=False, device=device, dtype=self.dtype)

    def _param(self, *shape: int, device: str | torch.device | None, dtype: torch.dtype | None = None,
               ) -> nn.Parameter:
        return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype or self.dtype))

    # -- what the contracts read ---------------------------------------------------------------------
    def contract_dims(self) -> dict[str, int]:
        """Per-rank dims H, HV, K, V (from the config) and D, C, W (see :func:`layer_dims`)."""
        return self._dims

    def contract_dim_source(self, symbol: str) -> str:
        """Where a dim comes from, for error messages (``"hidden_size=64"``)."""
        return self._dim_sources[symbol]

    def contract_dtypes(self) -> Mapping[str, torch.dtype]:
        """The dtypes the config pins (state, activation, index)."""
        return self.config.contract_dtypes()

    # -- pools ---------------------------------------------------------------------------------------
    def check_state_pools(self, ssm_states: Tensor, conv_states: Tensor) -> None:
        """Check a pair of state pools against this layer (each subclass contracts it)."""
        raise NotImplementedError

    def new_state_pools(
        self, num_slots: int, *, device: str | torch.device | None = None, state_dtype: torch.dtype | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Zeroed pools for ``num_slots`` requests: ``ssm [N, HV, V, K]`` (fp32 unless the config or
        ``state_dtype`` says otherwise) and ``conv [N, C, W]`` in the layer's dtype.

        Example::

            ssm_states, conv_states = layer.new_state_pools(256, device="cuda")
        """
        d = self._dims
        device = device if device is not None else self.conv1d.device
        dt = state_dtype or self.config.contract_dtypes().get("state", torch.float32)
        ssm = torch.zeros(num_slots, d["HV"], d["V"], d["K"], dtype=dt, device=device)
        conv = torch.zeros(num_slots, d["C"], d["W"], dtype=self.dtype, device=device)
        self.check_state_pools(ssm, conv)
        return ssm, conv

    # -- the computation (unchecked: the subclass's public methods checked it) ---------------------
    def _load(self, given: Mapping[str, Tensor]) -> None:
        """Copy weights in by attribute name (an ``nn.Linear``'s into its ``weight``)."""
        with torch.no_grad():
            for name, value in given.items():
                target = getattr(self, name)
                (target.weight if isinstance(target, nn.Linear) else target).copy_(value)

    def _conv_step(self, mixed_qkv: Tensor, conv_states: Tensor, state_indices: Tensor) -> Tensor:
        """``SiLU(sum_j window[:, :, j] * conv1d[:, j])`` over each slot's last W inputs and this one;
        the slot then keeps the last W inputs. Padding rows give zeros and write no slot."""
        y, kept = self._conv_window(mixed_qkv, conv_states, state_indices)
        scatter_rows(conv_states, state_indices.long(), kept)
        return y

    def _conv_window(self, mixed_qkv: Tensor, conv_states: Tensor, state_indices: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_conv_step` without the write: the output and what each slot is to keep (``[B, C, W]``)."""
        rows = row_slots(state_indices.long(), conv_states.shape[0])  # padding rows read a live slot harmlessly
        window = torch.cat([rows.gather(conv_states), mixed_qkv.unsqueeze(-1).to(conv_states.dtype)],
                           dim=-1)  # [B, C, W+1], oldest input first
        y = F.silu((window.float() * self.conv1d.float()).sum(-1))
        return y.masked_fill(~rows.valid.unsqueeze(-1), 0.0).to(mixed_qkv.dtype), window[..., 1:]

    def _step(self, x: Tensor, ssm_states: Tensor, conv_states: Tensor, state_indices: Tensor,
              kernel: StepKernel) -> Tensor:
        """One token for B requests (``x [B, D]``): this rank's partial output ``[B, D]``. The conv
        state is written after the kernel: a call the kernel's op rejects leaves it as it was."""
        d = self._dims
        mixed_qkv, a, b, extra = self._inputs(x)
        mixed_qkv, kept = self._conv_window(mixed_qkv, conv_states, state_indices)
        out = x.new_empty(x.shape[0], 1, d["HV"], d["V"])
        kernel(mixed_qkv, a, b, self.A_log, self.dt_bias, self.config.scale, ssm_states, out, state_indices)
        scatter_rows(conv_states, state_indices.long(), kept)
        return self._outputs(x, out, extra)

    def _decode(self, x: Tensor, ssm_states: Tensor, conv_states: Tensor, state_indices: Tensor,
                kernel: StepKernel) -> Tensor:
        """One token for B requests, all-reduced; an empty batch is a no-op on every rank."""
        if x.shape[0] == 0:  # every rank sees the same batch, so none enters the all-reduce
            return x.new_zeros(0, self._dims["D"])
        return self._all_reduce(self._step(x, ssm_states, conv_states, state_indices, kernel))

    def _prefill(self, x: Tensor, ssm_states: Tensor, conv_states: Tensor, state_indices: Tensor,
                 kernel: StepKernel) -> Tensor:
        """Reset the slots, then run the T tokens of ``x [B, T, D]`` one at a time; all-reduced. A step
        the kernel's op rejects puts the used slots of both pools back as they were before the call
        (the reset and the earlier steps undone: one copy of the B slots, beside a token loop)."""
        d = self._dims
        B = x.shape[0]
        if B == 0:
            return x.new_zeros(0, x.shape[1], d["D"])
        rows = row_slots(state_indices.long(), ssm_states.shape[0])
        saved = [(pool, rows.gather(pool)) for pool in (ssm_states, conv_states)]  # (index_select: a copy)
        scatter_rows(ssm_states, state_indices, ssm_states.new_zeros(B, d["HV"], d["V"], d["K"]))
        scatter_rows(conv_states, state_indices, conv_states.new_zeros(B, d["C"], d["W"]))
        try:
            ys = [self._step(x[:, t], ssm_states, conv_states, state_indices, kernel) for t in range(x.shape[1])]
        except BaseException:
            for pool, old in saved:
                rows.scatter(pool, old)
            raise
        y = torch.stack(ys, dim=1) if ys else x.new_zeros(B, 0, d["D"])
        return self._all_reduce(y)

    def _conv_varlen(self, mixed_qkv: Tensor, conv_states: Tensor, state_indices: Tensor, cu_seqlens: Tensor,
                     has_initial_state: Tensor) -> tuple[Tensor, Tensor]:
        """The short causal conv over packed sequences (``mixed_qkv [T, C]``): each token's window is
        the W inputs before it in its own sequence, reaching back into the slot's cached inputs when
        ``has_initial_state`` (else zeros) and never into another sequence. Returns the output and
        what each slot is to keep (``[B, C, W]``, its sequence's last W inputs; the caller writes the
        valid slots). Padding sequences, and tokens past ``cu_seqlens[B]``, give zeros. Offsets that
        break the value rules (checked in strict and watch mode, not here) give wrong values, never an
        index past the buffer."""
        from kda_kernels.prefill_reference import token_sequences

        T, W, B = mixed_qkv.shape[0], self._dims["W"], state_indices.shape[0]
        rows = row_slots(state_indices.long(), conv_states.shape[0])
        cache = torch.where((rows.valid & has_initial_state).view(B, 1, 1), rows.gather(conv_states),
                            torch.zeros((), dtype=conv_states.dtype, device=conv_states.device))
        # one buffer: the tokens, then each sequence's W cached inputs (oldest first), then a zero row
        buf = torch.cat([mixed_qkv.to(conv_states.dtype), cache.transpose(1, 2).reshape(B * W, -1),
                         conv_states.new_zeros(1, conv_states.shape[1])])
        cu = cu_seqlens.long()
        seq = token_sequences(cu, T)
        past = seq >= B  # a token past cu_seqlens[B]: no sequence's
        seq = seq.clamp(max=max(B - 1, 0))
        zero_row = T + B * W

        def window(s: Tensor, t: Tensor, lags: Tensor) -> Tensor:  # buf rows of token t (at sequence s) - lag
            pos = (t - cu.index_select(0, s)).unsqueeze(1) - lags  # position inside the sequence
            row = torch.where(pos >= 0, t.unsqueeze(1) - lags, T + s.unsqueeze(1) * W + W + pos)
            return torch.where((row >= 0) & (row <= zero_row), row, zero_row)  # (offsets out of order)

        lags = torch.arange(W, -1, -1, device=cu.device)  # oldest input first, the token itself last
        win = buf[window(seq, torch.arange(T, device=cu.device), lags)]  # [T, W+1, C]
        y = F.silu((win.transpose(1, 2).float() * self.conv1d.float()).sum(-1))
        ends = torch.arange(B, device=cu.device)
        kept = buf[window(ends, cu[1:], lags[:-1])].transpose(1, 2)
        live = (rows.valid.index_select(0, seq) & ~past).unsqueeze(-1)
        return y.masked_fill(~live, 0.0).to(mixed_qkv.dtype), kept

    def _prefill_either(self, x: Tensor, ssm_states: Tensor, conv_states: Tensor, state_indices: Tensor,
                        cu_seqlens: Tensor | None, has_initial_state: Tensor | None, step: StepKernel,
                        prefill: Callable[..., None]) -> Tensor:
        """A layer's ``prefill``: packed when ``cu_seqlens`` is given (``x [T, D]``), else padded
        (``x [B, T, D]``, from zero states); the caller checked ``x``'s rank."""
        if cu_seqlens is None:
            if has_initial_state is not None:
                raise_violations(f"{type(self).__name__}.prefill", [Violation(
                    ShapeError, "has_initial_state", "None without cu_seqlens (padded prompts start from zero)",
                    "a mask", hint="pack the prompts (x [T, D]) and pass cu_seqlens to continue from the slots")],
                    {}, {})
            return self._prefill(x, ssm_states, conv_states, state_indices, step)
        if has_initial_state is None:
            has_initial_state = torch.zeros(state_indices.shape[0], dtype=torch.bool, device=x.device)
        return self._prefill_packed(x, ssm_states, conv_states, state_indices, cu_seqlens, has_initial_state,
                                    prefill)

    def _prefill_packed(self, x: Tensor, ssm_states: Tensor, conv_states: Tensor, state_indices: Tensor,
                        cu_seqlens: Tensor, has_initial_state: Tensor, kernel: Callable[..., None]) -> Tensor:
        """Prefill of B sequences packed in ``x [T, D]`` (``cu_seqlens [B+1]``), each from its slots'
        states when ``has_initial_state``, else from zero; ``kernel`` is the prefill op's call in
        its argument order. All-reduced."""
        d = self._dims
        T = x.shape[0]
        mixed_qkv, a, b, extra = self._inputs(x)
        mixed_qkv, kept = self._conv_varlen(mixed_qkv, conv_states, state_indices, cu_seqlens, has_initial_state)
        out = x.new_empty(T, d["HV"], d["V"])
        kernel(mixed_qkv, a, b, self.A_log, self.dt_bias, self.config.scale, ssm_states, out, cu_seqlens,
               state_indices, has_initial_state)
        scatter_rows(conv_states, state_indices, kept)  # after the kernel: a rejected call leaves it as it was
        return self._all_reduce(self._outputs(x, out, extra))

    def _inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Any]:
        """The kernel's inputs for tokens ``x [R, D]``: ``(mixed_qkv before the conv, a, b, extra)``,
        ``extra`` what :meth:`_outputs` needs (each subclass's)."""
        raise NotImplementedError

    def _outputs(self, x: Tensor, o: Tensor, extra: Any) -> Tensor:
        """This rank's partial output ``[R, D]`` from the kernel's ``o [R, HV, V]`` (each subclass's)."""
        raise NotImplementedError

    def _all_reduce(self, y: Tensor) -> Tensor:
        if self.tp_group is not None:
            dist.all_reduce(y, group=self.tp_group)
        return y
