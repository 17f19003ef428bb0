"""Where watch mode's violations are recorded and how they reach the host (:mod:`.watch` runs the
checks): a device's float64 flag, :data:`FLAG` long, holding the first violation (the call's
serial, the rule, the element, its value, the count, an extra), and the channel that brings it to
the host without a sync (:class:`CudaChannel`: pinned memory the check kernel writes itself; a
decode kernel that checks its own call rings the same doorbell); :func:`fold` records torch probes'
findings into it.

Example::

    w = Watcher(torch.device("cuda"), CudaChannel(torch.device("cuda")))
    row = w.read(wait=True, order_of=lambda serial: range(8))   # None: nothing recorded
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ..rules import fused
from ..rules.values import ValueRule

FLAG = 7  # (recorded, call serial, stacked row, element index, value, count, extra)
_F64 = torch.float64


@dataclass(frozen=True)
class CallRecord:
    """What a report says of a watched call: its op, serial, rules (``rows``: the rule of each
    stacked probe), dims and argument shapes (None under torch.compile) and what it may write."""

    name: str
    serial: int
    rules: tuple[ValueRule, ...]
    rows: tuple[int, ...]
    dims: dict[str, Any]
    shapes: dict[str, tuple[int, ...]] | None
    written: tuple[str, ...]
    order: tuple[int, ...] = ()  # (an op kernel's record: its check numbers in rule order; ``rows`` by check)


class Channel(Protocol):
    """How a device's flag reaches the host: :class:`CudaChannel`, or a stand-in in tests."""

    def send(self, flag: Tensor) -> None: ...  # enqueue a copy of the flag (no sync)
    def arrived(self, flag: Tensor) -> list[float] | None: ...  # the newest copy that has arrived, never waiting
    def wait(self, flag: Tensor) -> list[float]: ...  # the flag as it is once the device is done (waits)
    def reset(self) -> None: ...  # forget every copy sent so far (the flag was cleared)


class HostChannel:
    """The flag of a CPU tensor (code compiled on the CPU): already in host memory."""

    def send(self, flag: Tensor) -> None:
        pass

    def arrived(self, flag: Tensor) -> list[float] | None:
        return flag.tolist()  # type: ignore[no-any-return]

    def wait(self, flag: Tensor) -> list[float]:
        return flag.tolist()  # type: ignore[no-any-return]

    def reset(self) -> None:
        pass


class CudaChannel:
    """The flag's pinned host copy, written by the fused check kernel itself when it records a
    violation (and by :meth:`send`, a non-blocking copy, after probes folded with torch ops).
    :meth:`arrived` reads it without waiting; a recorded row may be caught mid-write, so it is
    then read again from the device after a sync (only on the way to an error)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host = torch.zeros(FLAG, dtype=_F64, pin_memory=True)
        self.recorded = ctypes.c_double.from_address(self.host.data_ptr())  # (its first element, read in ~0.1 µs)

    def send(self, flag: Tensor) -> None:
        self.host.copy_(flag, non_blocking=True)

    def arrived(self, flag: Tensor) -> list[float] | None:
        if not self.recorded.value:
            return None
        return self.wait(flag)

    def wait(self, flag: Tensor) -> list[float]:
        torch.cuda.synchronize(flag.device)
        return flag.cpu().tolist()  # type: ignore[no-any-return]

    def reset(self) -> None:
        self.host.zero_()


class Watcher:
    """One device's flag and the channel that brings it to the host (and the record an op's own
    kernel keeps, :meth:`~kda_contracts._engine.rules.fused.FusedState.own_row`)."""

    def __init__(self, device: torch.device, channel: Channel) -> None:
        self.device = device
        self.flag = torch.zeros(FLAG, dtype=_F64, device=device)
        self.channel = channel
        # the fused check kernel's buffers (made with the flag, never during a capture); on CUDA the
        # kernel copies a recorded flag into the channel's pinned buffer itself
        self.fused = fused.FusedState(device, self.flag, channel.host if isinstance(channel, CudaChannel) else None)

    def clear(self) -> None:
        self.flag.zero_()
        self.channel.reset()
        if self.fused is not None:
            self.fused.clear()

    def rung(self) -> bool:
        """Whether something may have been recorded: on CUDA, the pinned doorbell (no sync, ~0.1 µs);
        elsewhere always (the channel's read is cheap there)."""
        return not isinstance(self.channel, CudaChannel) or bool(self.channel.recorded.value)

    def read(self, wait: bool, order_of: Callable[[int], Sequence[int]]) -> list[float] | None:
        """The recorded violation's flag row, or None: ``wait``, once the device is done; else only
        when it has arrived (never waiting). An op kernel's own record is read only when its
        doorbell rang (the CUDA channel has then synced already); ``order_of(serial)``: its checks
        in the call's rule order."""
        row = self.channel.wait(self.flag) if wait else self.channel.arrived(self.flag)
        if row is not None and row[0]:
            return row
        if wait or row is not None:
            rung = self.channel.recorded.value if isinstance(self.channel, CudaChannel) else self.fused.doorbell[0]
            if rung:
                return self.fused.own_row(order_of)
        return None


def fold(flag: Tensor, found: Tensor, serial: int, base: int = 0) -> None:
    """Record in ``flag`` the first bad probe of ``found`` (``[rows, 4]``) for call ``serial`` (its
    row as ``base`` + the row), unless the flag already holds a violation. Device ops only (no
    sync, nothing copied from the host: capturable and traceable)."""
    bad = found[:, 0] >= 0
    r = bad.to(torch.uint8).argmax()
    row = found.index_select(0, r.reshape(1)).reshape(4)
    head = torch.full((2,), float(serial), dtype=_F64, device=flag.device)
    head.narrow(0, 0, 1).fill_(1.0)
    new = torch.cat([head, (r.reshape(1) + base).to(_F64), row])
    flag.copy_(torch.where((flag[0] == 0) & bad.any(), new, flag))
