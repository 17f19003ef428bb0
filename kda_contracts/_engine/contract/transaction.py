"""Strict mode's transactions: before an op's backend runs, copy exactly what the op writes;
if the backend raises or a post-run check rejects the call, copy it back. Check mode copies
nothing (zero-copy): a backend that fails there may leave its outputs partly written.

What an op writes is declared: every argument marked ``kc.Spec(mutated=True)``, whole, unless the
op gives ``written=ctx -> {arg: None | rows}`` (rows: an index tensor along dim 0, e.g. the pool
slots a decode step updates), so a state pool of gigabytes is never copied, only its used slots.
``written=`` is also asked during CUDA-graph capture (for the aliasing check): it must not sync
then (name only what it writes whole).

Example::

    saved = snapshot(op, ctx)      # before the backend
    ...
    restore(saved)                 # the call is rejected: every written element as it was
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..errors import AnnotationError

if TYPE_CHECKING:
    from ..op.opdef import Op
    from ..reading.annotations import CallContext

__all__ = ["ROLLED_BACK", "Saved", "restore", "snapshot"]

ROLLED_BACK = "strict mode rolled the call back: every tensor the op writes is as it was before the call"

Saved = list[tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor]]  # (tensor, rows or None, copy)


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def written_parts(op: Op, ctx: CallContext) -> Mapping[str, Any]:
    """What the call writes: ``{arg: None (all) | rows}``."""
    mutated = [n for n, tp in ctx.spec.tensors.items() if tp.spec.mutated]
    if op.written is None:
        return dict.fromkeys(mutated)
    parts = dict(op.written(ctx))
    unknown = set(parts) - set(mutated)
    if unknown:
        raise AnnotationError(f"{op.name}: written= names {', '.join(sorted(unknown))}, not marked "
                              "kc.Spec(mutated=True)")
    return parts


def snapshot(op: Op, ctx: CallContext, parts: Mapping[str, Any] | None = None) -> Saved | None:
    """Copies of what the call writes (``parts``: :func:`written_parts`, if already asked); None
    when nothing can be copied (fake or meta tensors, CUDA-graph capture: the call then runs as in
    check mode). Rows given on the host go to the device without a sync."""
    saved: Saved = []
    tensors = [v for v in ctx.values.values() if isinstance(v, torch.Tensor)]
    if any(v.is_meta or type(v).__name__ == "FakeTensor" or _capturing(v) for v in tensors):
        return None  # no data, or no copy outside the graph being captured: as in check mode
    for name, rows in (written_parts(op, ctx) if parts is None else parts).items():
        t = ctx.values.get(name)
        if not isinstance(t, torch.Tensor):
            continue
        if t.is_meta or _capturing(t) or type(t).__name__ == "FakeTensor":
            return None
        with torch.no_grad():  # a copy, not a step of autograd (autograd=True ops write such tensors)
            if rows is None:
                saved.append((t, None, t.clone()))
            else:
                # host rows: an asynchronous copy (from pageable memory the driver stages it at
                # once, so nothing waits for the device)
                rows = rows.to(device=t.device, dtype=torch.long, non_blocking=True)
                saved.append((t, rows, t.index_select(0, rows)))
    return saved


def restore(saved: Saved | None) -> None:
    """Put every saved element back (bit for bit). A tensor the backend resized gets its shape back
    first; one that cannot be written back is reported in a RuntimeWarning, never in place of the
    call's own report."""
    with torch.no_grad():  # a leaf that requires grad (autograd=True) may be written back too
        for t, rows, copy in saved or ():
            try:
                if rows is None:
                    if t.shape != copy.shape:  # (a backend that called resize_)
                        t.resize_(copy.shape)
                    t.copy_(copy)
                else:
                    t.index_copy_(0, rows, copy)
            except RuntimeError as exc:
                warnings.warn(f"kda_contracts: strict mode could not roll a {tuple(t.shape)} tensor back: {exc}",
                              RuntimeWarning, stacklevel=2)
