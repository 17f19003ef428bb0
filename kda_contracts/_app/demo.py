"""``kda-contracts demo``: a short tour of what the contracts catch, then the reference kernel.

Every mistake shown is one that public serving stacks have shipped or a hazard the catalogues
(:mod:`.mistakes`, and GDN's :mod:`kda_contracts.ops.gdn_decode.mistakes`) list; each message is
the real one the library raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ..ops._packed.calls import make_decode_call
from ..ops._packed.config import KDAConfig
from ..ops._packed.mistakes import Mistake, Reproduction
from ..ops.gdn_decode import mistakes as gdn_mistakes
from ..ops.gdn_decode.config import GDNConfig
from ..ops.packed_decode.decode import packed_decode, validate_packed_decode
from ..ops.packed_decode.mistakes import MISTAKES, reproduce

# The mistakes the tour shows, by their key in the catalogue (kda_contracts.ops.packed_decode.mistakes), which
# defines how each is made; `kda-contracts docs` renders the same catalogue.
TOUR = ("unflattened-a", "tp-mismatch", "kv-for-vk", "int64-indices", "strided-state")
# And one of GDN's (Qwen3-Next), from its catalogue: the same call as KDA's but for the gate.
GDN_TOUR = ("gdn-kda-shaped-a",)


def _show_rejections(catalogue: Sequence[Mistake], keys: Sequence[str], run: Callable[[Mistake], Reproduction],
                     print_: Callable[[str], None]) -> int:
    """Make each mistake of ``catalogue`` named in ``keys`` with ``run``; print its message; count the caught."""

    by_key = {m.key: m for m in catalogue}
    caught = 0
    for key in keys:
        mistake = by_key[key]
        print_(f"\n-- {mistake.title}")
        try:
            r = run(mistake)
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

    caught = _show_rejections(MISTAKES, TOUR, lambda m: reproduce(m, tp1), print_)
    gdn = GDNConfig.preset("qwen3-next-80b-a3b")
    print_(f"\n-- GDN packed decode, Qwen3-Next-80B-A3B (H={gdn.local_num_heads}, HV={gdn.local_num_v_heads}, "
           f"K=V={gdn.head_k}): KDA's call but for the gate, a [B, HV] and dt_bias [HV]")
    caught += _show_rejections(gdn_mistakes.MISTAKES, GDN_TOUR, lambda m: gdn_mistakes.reproduce(m, gdn), print_)

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
    shown = len(TOUR) + len(GDN_TOUR)
    ok = caught == shown and same_elsewhere and changed and out is call["out"] and state is call["initial_state"]
    print_(f"\n{caught}/{shown} mistakes caught; demo {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1
