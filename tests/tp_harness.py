"""Tensor-parallel test harness shared by the layer tests: run a worker on ``world`` processes
joined in one torch.distributed group (gloo on CPU, rendezvous on a free port of 127.0.0.1; NCCL
with one GPU per rank), each under the parent's contract mode.

Example::

    def _worker(rank, world, port, backend, mode):
        with process_group(rank, world, port, backend, mode) as device:
            ...                                  # dist.group.WORLD is this run's group

    spawn(_worker, "gloo")
"""

import datetime
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kda_contracts as kc

WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def process_group(rank: int, world: int, port: int, backend: str, mode: str) -> Iterator[torch.device]:
    """Join the group as ``rank`` under contract mode ``mode``; yields this rank's device. A
    barrier on a clean exit, then the group is destroyed."""
    kc.set_default_mode(mode)  # the parent's mode (strict under pytest)
    if backend == "gloo" and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo's own sockets on loopback
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(worker: Callable[..., None], backend: str, *args: Any, world: int = WORLD) -> None:
    """Run ``worker(rank, world, port, backend, mode, *args)`` on ``world`` processes; a failure
    in any rank fails the call."""
    mp.spawn(worker, args=(world, free_port(), backend, kc.get_mode(), *args), nprocs=world, join=True)


NCCL_PAIR = torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()
"""Whether two GPUs and NCCL are here (the NCCL variants of the TP tests run only then)."""
