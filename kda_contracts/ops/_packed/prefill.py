"""What the packed (varlen) prefill ops share, KDA's and GDN's: the contract of one call per state
layout (the gate aside), its dims taken on trust in mode ``off``, random valid calls for tests.

A prefill call packs ``B`` sequences of ``T`` tokens in all: the activations are one row per token
(``mixed_qkv [T, 2*H*K + HV*V]``, ``a``, ``b``), ``cu_seqlens [B+1]`` (int32) marks where each
sequence starts and ends, and each sequence has one pool slot (``ssm_state_indices [B]``) and a
``has_initial_state [B]`` flag (continue from the slot's state, or start from zero). The outputs are
``out [T, HV, V]`` and the final state of every sequence, written to its slot.

Example::

    >>> sigs = prefill_signatures("packed_prefill", gate_per_head=False)
    >>> sigs["VK"].__annotations__["cu_seqlens"].__origin__.dim_str
    'B+1'
"""

# No `from __future__ import annotations`: the contract annotations are built from local values.

import importlib
from collections.abc import Callable
from typing import Annotated, Any

import torch
from annotated_types import Predicate
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..._engine import MatchConfig, Range, Spec, Where
from .config import KDAConfig, fits_gdn
from .dtypes import ACTIVATION_DTYPES, INDEX_DTYPES, STATE_DTYPES
from .layouts import LAYOUTS

PREFILL_SYMBOLS = ("T", "H", "HV", "K", "V", "N", "B")
"""The dims a prefill call binds, in the contracts' order (tokens first, sequences last)."""

CU_SEQLENS_DTYPES = (torch.int32,)
"""``cu_seqlens``: int32, as the varlen kernels (flash-attention, flash-linear-attention) take it."""

PREFILL_WHERE: tuple[Where, ...] = (
    Where("HV % H == 0", hint="value heads HV must be a multiple of the q/k heads H (each q/k head serves "
          "HV/H value heads); check the head counts and the width of mixed_qkv"),
    Where("HV >= 1"), Where("K >= 1"), Where("V >= 1"),
    Where("N >= 1", hint="the state pool has no slots"),
)


def prefill_signatures(name: str, *, gate_per_head: bool) -> dict[str, Callable[..., Any]]:
    """The contract of a prefill op named ``name``, one function per state layout: KDA's gate
    (``a [T, HV*K]``, ``dt_bias [HV*K]``, a ``lower_bound``) or, with ``gate_per_head``, GDN's
    (``a [T, HV]``, ``dt_bias [HV]``, no ``lower_bound``)."""
    return {layout: _signature(name, layout, gate_per_head) for layout in LAYOUTS}


def _signature(name: str, layout: str, gate_per_head: bool) -> Callable[..., Any]:
    state_dims = "N HV V K" if layout == "VK" else "N HV K V"
    gate = "HV" if gate_per_head else "HV*K"
    act = Spec(dtypes=ACTIVATION_DTYPES, inner_contiguous=1, config_dtype="activation")
    fp32 = Spec(dtypes=(torch.float32,), contiguous=True)
    MixedQKV = Annotated[Float[Tensor, "T 2*H*K+HV*V"], act]
    Gate = Annotated[Float[Tensor, f"T {gate}"], act]
    Beta = Annotated[Float[Tensor, "T HV"], act]
    ALog = Annotated[Float[Tensor, "HV"], fp32]
    DtBias = Annotated[Float[Tensor, gate], fp32]
    Scale = Annotated[float, Range(gt=0, finite=True), MatchConfig("scale", rel_tol=1e-6)]
    State = Annotated[Float[Tensor, state_dims], Spec(dtypes=STATE_DTYPES, inner_contiguous=3, config_dtype="state",
                                                      disjoint=True, mutated=True)]
    Out = Annotated[Float[Tensor, "T HV V"], Spec(dtypes=ACTIVATION_DTYPES, contiguous=True, same_dtype_as="mixed_qkv",
                                                  mutated=True)]
    CuSeqlens = Annotated[Int[Tensor, "B+1"], Spec(dtypes=CU_SEQLENS_DTYPES, contiguous=True)]
    Indices = Annotated[Int[Tensor, "B"], Spec(dtypes=INDEX_DTYPES, config_dtype="index", contiguous=True)]
    HasInit = Annotated[Bool[Tensor, "B"], Spec(dtypes=(torch.bool,), contiguous=True)]
    L2norm = Annotated[bool, MatchConfig("use_qk_l2norm")]
    LowerBound = Annotated[float | None, Range(lt=0, finite=True), MatchConfig("effective_lower_bound")]

    if gate_per_head:
        def prefill(mixed_qkv: MixedQKV, a: Gate, b: Beta, A_log: ALog, dt_bias: DtBias, scale: Scale,
                    initial_state: State, out: Out, cu_seqlens: CuSeqlens, ssm_state_indices: Indices,
                    has_initial_state: HasInit, use_qk_l2norm_in_kernel: L2norm = False, *,
                    config: Annotated[Any, Predicate(fits_gdn)] = None, state_layout: str | None = None) -> None:
            """GDN packed prefill (a KDA layer's config, bounded gate or ``kda_layers``, is refused)."""
    else:
        def prefill(mixed_qkv: MixedQKV, a: Gate, b: Beta, A_log: ALog, dt_bias: DtBias, scale: Scale,  # type: ignore[misc]
                    initial_state: State, out: Out, cu_seqlens: CuSeqlens, ssm_state_indices: Indices,
                    has_initial_state: HasInit, use_qk_l2norm_in_kernel: L2norm = False,
                    lower_bound: LowerBound = None, *, config: Any = None, state_layout: str | None = None) -> None:
                """KDA packed prefill."""

    prefill.__name__ = prefill.__qualname__ = name
    return prefill


def prefill_dims_on_trust(layout: str, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                          scale: float, initial_state: Tensor, out: Tensor, cu_seqlens: Tensor,
                          ssm_state_indices: Tensor, *rest: Any) -> tuple[int, ...]:
    """The dims of a prefill call taken on trust (mode ``off``), in :data:`PREFILL_SYMBOLS` order."""
    N, HV, X, Y = initial_state.shape
    V, K = (X, Y) if layout == "VK" else (Y, X)
    T, W = mixed_qkv.shape
    return T, (W - HV * V) // (2 * K), HV, K, V, N, ssm_state_indices.shape[0]


def make_prefill_call(cfg: KDAConfig, lengths: tuple[int, ...] | list[int], pool: int, *, gdn: bool = False,
                      activation_dtype: torch.dtype = torch.bfloat16, state_dtype: torch.dtype = torch.float32,
                      index_dtype: torch.dtype = torch.int32, device: str | torch.device = "cpu",
                      seed: int = 0) -> dict[str, Any]:
    """Random, valid packed-prefill arguments (by name) for one TP rank of ``cfg``: one sequence per
    entry of ``lengths``, each on its own slot of a pool of ``pool``, every other one continuing from
    its slot's state; ``gdn``: GDN's gate (``a [T, HV]``, ``dt_bias [HV]``, no ``lower_bound``).

    Example::

        >>> call = make_prefill_call(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), [3, 5], pool=4)
        >>> call["cu_seqlens"].tolist(), tuple(call["out"].shape)
        ([0, 3, 8], (8, 4, 128))
    """
    g = torch.Generator().manual_seed(seed)
    H, HV, K, V = cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v
    B, T = len(lengths), sum(lengths)

    def rnd(*shape: int, dtype: torch.dtype = activation_dtype) -> Tensor:
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    state_shape = (pool, HV, V, K) if cfg.state_layout == "VK" else (pool, HV, K, V)
    cu = torch.tensor([0, *torch.tensor(list(lengths), dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)
    gate = HV if gdn else HV * K
    call = {
        "mixed_qkv": rnd(T, 2 * H * K + HV * V), "a": rnd(T, gate), "b": rnd(T, HV),
        "A_log": rnd(HV, dtype=torch.float32), "dt_bias": rnd(gate, dtype=torch.float32), "scale": cfg.scale,
        "initial_state": (0.1 * rnd(*state_shape, dtype=torch.float32)).to(state_dtype),
        "out": torch.zeros(T, HV, V, dtype=activation_dtype, device=device), "cu_seqlens": cu.to(device),
        "ssm_state_indices": torch.randperm(pool, generator=g)[:B].to(dtype=index_dtype, device=device),
        "has_initial_state": (torch.arange(B) % 2 == 1).to(device),
        "use_qk_l2norm_in_kernel": cfg.use_qk_l2norm,
    }
    if not gdn:
        call["lower_bound"] = cfg.effective_lower_bound
    return call


def prefill_kernel(target: str, doc: str, *, gated: bool) -> Callable[..., None]:
    """A prefill op's backend kernel: ``target`` (``"module:function"`` in ``kda_kernels``, imported on
    the first call) called with the prefill interface (the op's arguments, then ``num_heads``,
    ``use_qk_l2norm``, ``lower_bound`` when ``gated`` (KDA's) and ``state_layout``, the call's variant).

    Example::

        kernel = prefill_kernel("kda_kernels.fla_prefill:packed_prefill", "fla's chunk_kda", gated=True)
    """
    module, _, name = target.partition(":")
    found: list[Callable[..., None]] = []

    def load() -> Callable[..., None]:
        if not found:
            found.append(getattr(importlib.import_module(module), name))
        return found[0]

    if gated:
        def run(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: float, initial_state: Any, out: Any,
                cu_seqlens: Any, ssm_state_indices: Any, has_initial_state: Any, use_qk_l2norm_in_kernel: bool = False,
                lower_bound: float | None = None, *, config: Any = None, state_layout: Any = None, dims: Any,
                variant: str) -> None:
            load()(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens, ssm_state_indices,
                   has_initial_state, num_heads=dims.H, use_qk_l2norm=use_qk_l2norm_in_kernel,
                   lower_bound=lower_bound, state_layout=variant)
    else:
        def run(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any, scale: float,  # type: ignore[misc]
                initial_state: Any, out: Any, cu_seqlens: Any, ssm_state_indices: Any, has_initial_state: Any,
                use_qk_l2norm_in_kernel: bool = False, *, config: Any = None, state_layout: Any = None, dims: Any,
                variant: str) -> None:
            load()(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, cu_seqlens, ssm_state_indices,
                   has_initial_state, num_heads=dims.H, use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout=variant)
    run.__doc__, run.__name__ = doc, name
    return run
