"""A continuous-batching decode schedule shared by the layer tests (Kimi-Linear, Qwen3-Next):
requests of different lengths decoded through a layer (or the TP ranks of one) in a fixed-width
batch with padding rows; requests join when a slot is free and leave when done, their slots going
back to a free list.

Example::

    run = run_continuous_batching([layer], prompts_via_prefill=False)
    for r, ys in enumerate(run.outputs): compare(ys, my_reference(run.inputs[r]))
"""

import random
from dataclasses import dataclass

import torch


@dataclass
class BatchingRun:
    inputs: list[torch.Tensor]  # per request: its tokens [T, D]
    outputs: list[torch.Tensor]  # per request: the summed outputs of its tokens [T, D]
    final_states: list[list[tuple[torch.Tensor, torch.Tensor]]]  # per request, per layer: (ssm, conv) slot at leave


def run_continuous_batching(layers, *, prompts_via_prefill, seed=0, slots=5, rows=4, requests=7,
                            dtype=torch.int64) -> BatchingRun:
    """Decode ``requests`` through ``layers`` (one per TP rank; their outputs are summed). Every pool
    starts full of junk, so a slot that is not reset on join would show; padding rows carry junk
    inputs and must give zero outputs. A joining request is reset by the engine (zeroed slot) or
    prefilled with a random part of its tokens (``prompts_via_prefill``)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    D = layers[0].contract_dims()["D"]
    lengths = [rng.randint(3, 9) for _ in range(requests)]
    xs = [torch.randn(n, D, generator=gen) for n in lengths]
    pools = [layer.new_state_pools(slots) for layer in layers]
    for ssm, conv in pools:
        ssm.normal_(generator=gen)
        conv.normal_(generator=gen)
    free, waiting = list(range(slots)), list(range(requests))
    active: dict[int, tuple[int, int]] = {}  # request -> (slot, next position)
    outputs: dict[int, list[torch.Tensor]] = {r: [] for r in range(requests)}
    final: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    steps, decoded = 0, [0] * requests
    while waiting or active:
        while waiting and free and len(active) < rows and rng.random() < 0.7:
            r, slot = waiting.pop(0), free.pop(0)
            pos = 0
            if prompts_via_prefill:
                pos = rng.randint(1, lengths[r] - 1)
                idx = torch.tensor([slot], dtype=dtype)
                y = sum(layer.prefill(xs[r][None, :pos], ssm, conv, idx)
                        for layer, (ssm, conv) in zip(layers, pools, strict=True))
                outputs[r].extend(y[0])
            else:  # what an engine's allocator does for a fresh request
                for ssm, conv in pools:
                    ssm[slot].zero_()
                    conv[slot].zero_()
            active[r] = (slot, pos)
        if not active:
            continue
        order = list(active)
        rng.shuffle(order)
        row_of = dict(zip(order, rng.sample(range(rows), len(order)), strict=True))
        idx = torch.full((rows,), -1, dtype=dtype)
        x = torch.randn(rows, D, generator=gen)  # padding rows carry junk
        for r, row in row_of.items():
            slot, pos = active[r]
            idx[row] = slot
            x[row] = xs[r][pos]
        y = sum(layer.decode(x, ssm, conv, idx) for layer, (ssm, conv) in zip(layers, pools, strict=True))
        assert y[idx < 0].eq(0).all(), "padding rows must give zero outputs"
        for r, row in row_of.items():
            slot, pos = active[r]
            outputs[r].append(y[row])
            decoded[r] += 1
            if pos + 1 == lengths[r]:
                del active[r]
                free.append(slot)
                final[r] = [(ssm[slot].clone(), conv[slot].clone()) for ssm, conv in pools]
            else:
                active[r] = (slot, pos + 1)
        steps += 1
    assert steps >= max(decoded) and all(decoded)  # every request decoded, one token per step
    return BatchingRun(xs, [torch.stack(outputs[r]) for r in range(requests)], [final[r] for r in range(requests)])
