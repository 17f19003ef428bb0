"""Tensor parallelism on a real process group: the Kimi-Linear KDA layer sharded TP2 over two
processes (torch.distributed, gloo on CPU, rendezvous on a free port of 127.0.0.1), each rank
checked against its own per-rank config, the o_proj outputs all-reduced, and the result equal to
the TP1 layer's (1e-5, fp32) under continuous batching.

NCCL variant: on a machine with two GPUs, ``test_tp2_over_nccl_matches_tp1`` runs the same
worker with ``backend="nccl"`` (one GPU per rank, the ``auto`` decode backend); by hand:
``python tests/test_tensor_parallel.py --backend nccl``. Otherwise it is skipped.
"""

import argparse
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tp_harness import NCCL_PAIR, process_group, spawn

import kda_contracts as kc
from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

TINY = Path(__file__).parent / "data" / "kimi_linear_tiny_config.json"


def _worker(rank: int, world: int, port: int, backend: str, mode: str) -> None:
    """One rank: build its shard, check its contracts, decode, compare with TP1 built in-process."""
    with process_group(rank, world, port, backend, mode) as device:
        kernel = "auto" if backend == "nccl" else "torch"
        layer = KimiDeltaAttention.from_hf_config(TINY, tp_size=world, tp_rank=rank, tp_group=dist.group.WORLD,
                                                  backend=kernel, device=device)
        layer.load_weights(**random_weights(layer.config, seed=0, rank=rank))
        tp1 = KimiDeltaAttention.from_hf_config(TINY, backend=kernel, device=device)
        tp1.load_weights(**random_weights(tp1.config, seed=0))

        # This rank's contracts are bound to its per-rank config ...
        assert layer.config == kc.KDAConfig.from_hf_config(TINY, tp_size=world)
        assert layer.contract_dims() == {"H": 4 // world, "HV": 4 // world, "K": 16, "V": 16, "D": 64,
                                         "C": 192 // world, "W": 3}
        # ... so whole-layer (TP1) pools and weights are rejected, with a message that says why.
        for attempt in (lambda: layer.check_state_pools(*tp1.new_state_pools(2)),
                        lambda: layer.load_weights(**random_weights(tp1.config, seed=0))):
            try:
                attempt()
            except kc.ShapeError as err:
                assert "TP mismatch" in str(err) and f"config is for tp_size={world}" in str(err), str(err)
            else:
                raise AssertionError("a TP1 tensor passed a TP2 rank's contract")

        # Continuous batching: the same seeded schedule and inputs on every rank.
        rng, gen = random.Random(1), torch.Generator().manual_seed(1)
        slots, rows = 6, 4
        shard_pools, full_pools = layer.new_state_pools(slots), tp1.new_state_pools(slots)
        free, active = list(range(slots)), {}  # slot -> tokens left
        for step in range(12):
            if step % 3 == 0 and free:  # a request joins with a prompt of 1..4 tokens
                slot = free.pop(0)
                prompt = torch.randn(1, rng.randint(1, 4), 64, generator=gen).to(device)
                idx = torch.tensor([slot], device=device)
                torch.testing.assert_close(layer.prefill(prompt, *shard_pools, idx),
                                           tp1.prefill(prompt, *full_pools, idx), atol=1e-5, rtol=1e-5)
                active[slot] = rng.randint(2, 6)
            batch = list(active)[:rows]
            idx = torch.full((rows,), -1, dtype=torch.int64)
            idx[: len(batch)] = torch.tensor(batch, dtype=torch.int64)
            idx = idx[torch.randperm(rows, generator=gen)].to(device)  # padding rows anywhere
            x = torch.randn(rows, 64, generator=gen).to(device)
            torch.testing.assert_close(layer.decode(x, *shard_pools, idx), tp1.decode(x, *full_pools, idx),
                                       atol=1e-5, rtol=1e-5)
            for slot in batch:
                active[slot] -= 1
                if not active[slot]:  # the request leaves; its slot goes back to the free list
                    del active[slot]
                    free.append(slot)


def run_tp(backend: str) -> None:
    spawn(_worker, backend)


def test_tp2_over_gloo_matches_tp1_and_each_rank_checks_its_own_config():
    run_tp("gloo")


@pytest.mark.skipif(not NCCL_PAIR, reason="needs two GPUs and NCCL")
def test_tp2_over_nccl_matches_tp1():
    run_tp("nccl")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    run_tp(parser.parse_args().backend)
    print("TP2 matches TP1")
