"""``kda-contracts demo``: a contract on a function of one's own, then a tour of what the shipped
packed-decode ops' contracts catch, then the reference kernel.

The first part runs the source it prints (:data:`USER_SOURCE`): an ordinary attention function
with jaxtyping annotations, called once correctly and once with a realistic mistake. In the tour,
every mistake shown is one that public serving stacks have shipped or a hazard the catalogues
(:mod:`.mistakes`, and GDN's :mod:`kda_contracts.ops.gdn_decode.mistakes`) list. Every message
printed is the real one the library raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._engine import ContractError, mode
from ..ops._packed.calls import make_decode_call
from ..ops._packed.config import KDAConfig
from ..ops._packed.mistakes import BATCH, POOL, Mistake, Reproduction
from ..ops.gdn_decode import mistakes as gdn_mistakes
from ..ops.gdn_decode.config import GDNConfig
from ..ops.packed_decode.decode import packed_decode, validate_packed_decode
from ..ops.packed_decode.mistakes import MISTAKES, reproduce

# The first part: a user's function, printed and then run as printed.
USER_SOURCE = '''\
import torch
import kda_contracts as kc
from kda_contracts import Float, Tensor

@kc.contract
def attention(q: Float[Tensor, "B T H D"], k: Float[Tensor, "B T H D"],
              v: Float[Tensor, "B T H D"]) -> Float[Tensor, "B T H D"]:
    w = torch.einsum("bthd,bshd->bhts", q, k).div(q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("bhts,bshd->bthd", w, v)
'''
USER_SIZES = {"B": 2, "T": 5, "H": 4, "D": 8}

# The mistakes the tour shows, by their key in the catalogue (kda_contracts.ops.packed_decode.mistakes), which
# defines how each is made; `kda-contracts docs` renders the same catalogue.
TOUR = ("unflattened-a", "tp-mismatch", "kv-for-vk", "int64-indices", "strided-state")
# And one of GDN's (Qwen3-Next), from its catalogue: the same call as KDA's but for the gate.
GDN_TOUR = ("gdn-kda-shaped-a",)
KDA_PRESET, GDN_PRESET = "kimi-linear-48b-a3b", "qwen3-next-80b-a3b"
B, N = 8, 64  # the valid KDA call's batch and pool (the mistakes use the catalogue's BATCH, POOL)


def _print_message(message: str, print_: Callable[[str], None]) -> None:
    for line in message.splitlines():
        print_("   " + line)


def _own_function(print_: Callable[[str], None]) -> int:
    """The first part: run :data:`USER_SOURCE`, call it right and wrong; 1 when the mistake was caught.
    In check mode whatever the mode in force (a contract decorated while off is the bare function)."""
    print_("\n== 1. A contract on your own function: the annotations are the contract")
    for line in USER_SOURCE.splitlines():
        print_("   " + line if line else "")
    namespace: dict[str, Any] = {}
    with mode("check"):
        exec(compile(USER_SOURCE, "<kda-contracts demo>", "exec"), namespace)  # the source printed above
        attention = namespace["attention"]
        shape = tuple(USER_SIZES.values())
        q, k, v = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0)).unbind(0)
        out = attention(q, k, v)
        print_(f"\n-- a correct call: q, k, v of [{', '.join(map(str, shape))}] -> out {list(out.shape)}")
        print_("\n-- v kept in [B, H, T, D], the layout F.scaled_dot_product_attention takes: "
               "attention(q, k, v.transpose(1, 2))")
        try:
            attention.__wrapped__(q, k, v.transpose(1, 2))
        except RuntimeError as exc:  # what the body itself says, without the contract
            print_(f"   without the contract, torch fails inside the body: {type(exc).__name__}: {exc}")
        try:
            attention(q, k, v.transpose(1, 2))
        except ContractError as err:
            print_(f"   with it, the call is rejected before the body runs: {type(err).kind_name}:")
            _print_message(str(err), print_)
            return 1
    print_("   NOT caught (this is a bug)")
    return 0


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
        _print_message(r.message, print_)
        caught += 1
    return caught


def _header(tp1: KDAConfig, gdn: GDNConfig, print_: Callable[[str], None]) -> None:
    sizes = ", ".join(f"{s}={n}" for s, n in USER_SIZES.items())
    print_("kda-contracts demo: a contract on a function of your own, then the packed-decode ops that ship "
           "with the library")
    print_(f"  1. your function: attention(q, k, v), {sizes} (float32, torch seed 0)")
    print_(f"  2. KDA packed decode, Kimi-Linear-48B-A3B (KDAConfig.preset({KDA_PRESET!r})): "
           f"H=HV={tp1.local_num_heads}, K=V={tp1.head_k}, fp32 state;")
    print_(f"     a valid call at B={B}, pool N={N}; the mistakes at B={BATCH}, pool N={POOL}")
    print_(f"  3. GDN packed decode, Qwen3-Next-80B-A3B (GDNConfig.preset({GDN_PRESET!r})): "
           f"H={gdn.local_num_heads}, HV={gdn.local_num_v_heads}, K=V={gdn.head_k}")
    print_("  4. the reference kernel on the valid KDA call")


def _reference_kernel(call: dict[str, Any], tp1: KDAConfig, print_: Callable[[str], None]) -> bool:
    """Run the torch reference on the valid call; True when it wrote what it should and nothing else."""
    state_before = call["initial_state"].clone()
    t0 = time.perf_counter()
    out, state = packed_decode(**call, config=tp1, backend="torch")
    ms = (time.perf_counter() - t0) * 1e3
    idx = call["ssm_state_indices"].long()
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[idx] = False
    same_elsewhere = torch.equal(state[untouched], state_before[untouched])
    changed = not torch.equal(state[idx], state_before[idx])
    print_(f"\n== 4. The reference kernel (backend='torch'): out {tuple(out.shape)} {str(out.dtype)[6:]}, "
           f"|out| mean {out.float().abs().mean().item():.4f}, {ms:.1f} ms on the CPU")
    print_(f"   the {B} used slots were updated: {changed}; the other {N - B} slots are bit-identical: "
           f"{same_elsewhere}")
    return same_elsewhere and changed and out is call["out"] and state is call["initial_state"]


def run_demo(print_: Callable[[str], None] = print) -> int:
    """Run the demo; return 0 when every mistake was caught and the kernel ran."""
    tp1 = KDAConfig.preset(KDA_PRESET, tp_size=1, index_dtype="int32")
    tp2 = tp1.with_tp(2)
    gdn = GDNConfig.preset(GDN_PRESET)
    _header(tp1, gdn, print_)
    caught = _own_function(print_)

    print_("\n== 2. KDA packed decode: kc.packed_decode(**call, config=cfg), sglang's arguments")
    call = make_decode_call(tp1, B, N)
    dims = validate_packed_decode(**call, config=tp1)
    print_(f"\n-- a correct TP1 call passes: {dims}")
    for sym, where in dims.provenance.items():
        print_(f"   {sym:>2} {where}")
    call2 = make_decode_call(tp2, B, N)
    print_(f"-- a correct TP2 call passes too: {validate_packed_decode(**call2, config=tp2)}")
    caught += _show_rejections(MISTAKES, TOUR, lambda m: reproduce(m, tp1), print_)

    print_(f"\n== 3. GDN packed decode, Qwen3-Next-80B-A3B (H={gdn.local_num_heads}, HV={gdn.local_num_v_heads}, "
           f"K=V={gdn.head_k}): KDA's call but for the gate, a [B, HV] and dt_bias [HV]")
    caught += _show_rejections(gdn_mistakes.MISTAKES, GDN_TOUR, lambda m: gdn_mistakes.reproduce(m, gdn), print_)

    kernel_ok = _reference_kernel(call, tp1, print_)
    shown = 1 + len(TOUR) + len(GDN_TOUR)
    ok = caught == shown and kernel_ok
    print_(f"\n{caught}/{shown} mistakes caught (1 in your function, {len(TOUR)} of KDA's, {len(GDN_TOUR)} of "
           f"GDN's); demo {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1
