"""Ops and contracts as a user writes them, in an importable module, for the dump tests
(``tests/test_dumps.py``): ``kda-contracts validate`` imports them back by module:qualname."""

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import BaseModel, ConfigDict

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor


@kc.op(returns="out")
def dump_scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
                    out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True, contiguous=True)]) -> None:
    """Reference: out = x * w."""
    torch.mul(x, w, out=out)


@dump_scale_rows.backend("fast", devices=("cpu",), priority=30, where=["D % 4 == 0"])
def _fast(x, w, out, *, dims):
    torch.mul(x, w, out=out)


@dump_scale_rows.backend("gpu", devices=("cuda",), priority=40)
def _gpu(x, w, out):
    torch.mul(x, w, out=out)


class GatherConfig(BaseModel):
    """The pool's shape, as a model config would state it."""

    model_config = ConfigDict(frozen=True)
    slots: int
    width: int

    def contract_dims(self) -> dict[str, int]:
        return {"N": self.slots, "W": self.width}


def _indices_in_pool(ctx):
    idx, n = ctx.values["idx"], ctx.dims["N"]
    bad = int(((idx < 0) | (idx >= n)).sum())
    if bad:
        return [kc.Violation(kc.ValueRangeError, "idx", f"slots in [0, N) = [0, {n})", f"{bad} out of range")]
    return []


def _out_finite(ctx, backend):
    if not torch.isfinite(ctx.values["out"]).all():
        return [kc.Violation(kc.ValueRangeError, "out", "finite values", f"non-finite values after backend {backend}")]
    return []


@kc.op(returns="out", config_arg="config", value_checks=_indices_in_pool, after=_out_finite)
def dump_gather(pool: Float[Tensor, "N W"], idx: Int[Tensor, "B"],
                out: Annotated[Float[Tensor, "B W"], kc.Spec(mutated=True)], *,
                config: GatherConfig | None = None) -> None:
    """Reference: out = pool[idx]."""
    out.copy_(pool[idx])


@dump_gather.backend("nan", devices=("cpu",), priority=-1)
def _nan(pool, idx, out, *, config=None):
    out.fill_(float("nan"))  # a broken kernel: strict mode's after checks catch it


@dataclass(frozen=True)
class NormConfig:
    """A dataclass config: its int fields are dims."""

    D: int


NORM_CONFIG = NormConfig(D=8)


@kc.contract(config=NORM_CONFIG)
def dump_rmsnorm(x: Float[Tensor, "*batch D"], weight: Float[Tensor, "D"],
                 eps: float = 1e-6) -> Float[Tensor, "*batch D"]:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _positive_total(ctx):
    if ctx.values["x"].item() <= 0:  # a bug: .item() on a tensor of more than one element raises
        return [kc.Violation(kc.ValueRangeError, "x", "a positive total", "not positive")]
    return []


@kc.contract(value_checks=_positive_total)
def dump_fragile(x: Float[Tensor, "B"]) -> None:
    """A contract whose strict value check has a bug."""


@kc.contract
class Projector:
    """A class whose tensor-annotated methods get contracts."""

    def __init__(self, width: int) -> None:
        self.width = width

    def project(self, x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
        return x @ w
