"""``kda-contracts demo``: a short tour of what the contracts catch, then the reference kernel.

Every mistake shown is one that public serving stacks have shipped or a hazard the catalogue
(:mod:`.mistakes`) lists; each message is the real one the library raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ...testing import make_decode_call
from .config import KDAConfig
from .decode import packed_decode, validate_packed_decode
from .mistakes import MISTAKES, reproduce

__all__ = ["run_demo"]


# The mistakes the tour shows, by their key in the catalogue (kda_contracts.ops.packed_decode.mistakes), which
# defines how each is made; `kda-contracts docs` renders the same catalogue.
TOUR = ("unflattened-a", "tp-mismatch", "kv-for-vk", "int64-indices", "strided-state")


def _show_rejections(cfg: KDAConfig, print_: Callable[[str], None]) -> int:
    """Make each mistake of :data:`TOUR` on a call for ``cfg``; print its message; count the caught."""

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
