"""``kda-contracts demo``: a short tour of what the contracts catch, then the reference kernel.

Every mistake shown is one that public serving stacks have shipped or that the SPEC lists as a
hazard; each message is the real one the library raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .config import KDAConfig
from .decode import packed_decode, validate_packed_decode

__all__ = ["make_decode_call", "run_demo"]


def make_decode_call(
    cfg: KDAConfig,
    batch: int,
    pool: int,
    *,
    activation_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """Random, valid packed-decode arguments for one TP rank of ``cfg`` (by name, sglang order).

    Example::

        >>> call = make_decode_call(KDAConfig.preset("kimi-linear-48b-a3b", tp_size=8), batch=2, pool=4)
        >>> tuple(call["initial_state"].shape)
        (4, 4, 128, 128)
    """
    g = torch.Generator().manual_seed(seed)
    H, HV, K, V = cfg.local_num_heads, cfg.local_num_v_heads, cfg.head_k, cfg.head_v

    def rnd(*shape: int, dtype: torch.dtype = activation_dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    state_shape = (pool, HV, V, K) if cfg.state_layout == "VK" else (pool, HV, K, V)
    return {
        "mixed_qkv": rnd(batch, 2 * H * K + HV * V),
        "a": rnd(batch, HV * K),
        "b": rnd(batch, HV),
        "A_log": rnd(HV, dtype=torch.float32),
        "dt_bias": rnd(HV * K, dtype=torch.float32),
        "scale": cfg.scale,
        "initial_state": (0.1 * rnd(*state_shape, dtype=torch.float32)).to(state_dtype),
        "out": torch.zeros(batch, 1, HV, V, dtype=activation_dtype, device=device),
        "ssm_state_indices": torch.randperm(pool, generator=g)[:batch].to(dtype=index_dtype, device=device),
        "use_qk_l2norm_in_kernel": cfg.use_qk_l2norm,
        "lower_bound": cfg.effective_lower_bound,
    }


# The mistakes the tour shows, by their key in the catalogue (kda_contracts.mistakes), which
# defines how each is made; `kda-contracts docs` renders the same catalogue.
TOUR = ("unflattened-a", "tp-mismatch", "kv-for-vk", "int64-indices", "strided-state")


def _show_rejections(cfg: KDAConfig, print_: Callable[[str], None]) -> int:
    """Make each mistake of :data:`TOUR` on a call for ``cfg``; print its message; count the caught."""
    from .mistakes import MISTAKES, reproduce  # mistakes builds on this module's make_decode_call

    by_key = {m.key: m for m in MISTAKES}
    caught = 0
    for key in TOUR:
        mistake = by_key[key]
        print_(f"\n-- {mistake.title}")
        try:
            r = reproduce(mistake, cfg)
        except AssertionError as err:  # not caught, or caught as another kind
            print_(f"   NOT caught as documented (this is a bug): {err}")
            continue
        print_(f"   caught {r.error}{': ' + '; '.join(r.notes) if r.notes else ''}:")
        for line in r.message.splitlines():
            print_("   " + line)
        caught += 1
    return caught


def run_demo(print_: Callable[[str], None] = print) -> int:
    """Run the tour; return 0 when every mistake was caught and the kernel ran."""
    tp1 = KDAConfig.preset("kimi-linear-48b-a3b", tp_size=1, index_dtype="int32")
    tp2 = tp1.with_tp(2)
    B, N = 8, 64
    print_("kda-contracts demo: Kimi-Linear-48B-A3B KDA layer, packed decode "
           f"(H=HV={tp1.local_num_heads}, K=V={tp1.head_k}, B={B}, pool N={N}, fp32 state)")

    call = make_decode_call(tp1, B, N)
    dims = validate_packed_decode(**call, config=tp1)
    print_(f"\n-- a correct TP1 call passes: {dims}")
    for sym, where in dims.provenance.items():
        print_(f"   {sym:>2} {where}")
    call2 = make_decode_call(tp2, B, N)
    print_(f"-- a correct TP2 call passes too: {validate_packed_decode(**call2, config=tp2)}")

    caught = _show_rejections(tp1, print_)

    state_before = call["initial_state"].clone()
    t0 = time.perf_counter()
    out, state = packed_decode(**call, config=tp1, backend="torch")
    ms = (time.perf_counter() - t0) * 1e3
    idx = call["ssm_state_indices"].long()
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[idx] = False
    same_elsewhere = torch.equal(state[untouched], state_before[untouched])
    changed = not torch.equal(state[idx], state_before[idx])
    print_(f"\n-- reference kernel (backend='torch'): out {tuple(out.shape)} {str(out.dtype)[6:]}, "
           f"|out| mean {out.float().abs().mean().item():.4f}, {ms:.1f} ms on the CPU")
    print_(f"   the {B} used slots were updated: {changed}; the other {N - B} slots are bit-identical: "
           f"{same_elsewhere}")
    ok = caught == len(TOUR) and same_elsewhere and changed and out is call["out"] and state is call["initial_state"]
    print_(f"\n{caught}/{len(TOUR)} mistakes caught; demo {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1
