"""Never silent, never crashing: classes, configs of every kind, mutable configs, unknown
metadata and roles, and hostile arguments that must only ever raise a ContractError."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pytest
import torch
from pydantic import BaseModel

import kda_contracts as kc
from kda_contracts import Float, Tensor


@kc.contract
class Projector(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(d, e))

    def forward(self, x: Float[Tensor, "*batch D"]) -> Float[Tensor, "*batch _"]:
        return x @ self.w

    @staticmethod
    def pad(x: Float[Tensor, "N"]) -> Float[Tensor, "N+1"]:
        return torch.cat([x, x[:1]])


def test_kc_contract_on_a_class_contracts_its_annotated_methods() -> None:
    m = Projector(3, 4)
    for b in range(1, 12):
        assert m(torch.zeros(b, 2, 3)).shape == (b, 2, 4)
    with pytest.raises(kc.ShapeError, match=r"Projector\.pad"):
        Projector.pad(torch.zeros(2, 2))
    assert Projector.pad(torch.zeros(3)).shape == (4,)
    assert Projector.__kda_contracted__ == ("forward", "pad")


def test_kc_contract_on_a_class_without_tensor_annotations_is_refused() -> None:
    with pytest.raises(kc.AnnotationError, match="has none"):
        @kc.contract
        class Nothing:
            def f(self, x: int) -> int:
                return x


class Mutable(BaseModel):
    D: int = 4


@dataclasses.dataclass
class DataDims:
    D: int


def test_a_mutated_mutable_config_is_seen_on_the_next_call() -> None:
    @kc.contract(config_arg="cfg")
    def f(x: Float[Tensor, "B D"], cfg: object = None) -> None:
        return None

    cfg = Mutable()
    f(torch.zeros(2, 4), cfg)
    cfg.D = 5
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(2, 4), cfg)
    f(torch.zeros(2, 5), cfg)


@pytest.mark.parametrize("cfg", [DataDims(4), {"D": 4}, Mutable()])
def test_dataclass_and_mapping_configs_bind_dims_too(cfg) -> None:
    @kc.contract(config_arg="cfg")
    def f(x: Float[Tensor, "B 2*D"], cfg: object = None) -> None:
        return None

    f(torch.zeros(3, 8), cfg)
    with pytest.raises(kc.ShapeError):
        f(torch.zeros(3, 6), cfg)


def test_a_config_of_the_wrong_kind_is_a_contract_error_with_a_hint() -> None:
    @kc.contract(config_arg="cfg")
    def f(x: Float[Tensor, "B D"], cfg: object = None) -> None:
        return None

    with pytest.raises(kc.ArgumentTypeError, match="is not a config"):
        f(torch.zeros(2, 4), 42)


def test_unknown_metadata_is_refused_at_decoration() -> None:
    with pytest.raises(kc.AnnotationError, match="cannot check the metadata"):
        @kc.contract
        def f(x: Annotated[Float[Tensor, "B"], object()]) -> None: ...


@pytest.mark.parametrize("hostile", [
    object(), "tensor", torch.zeros(2, 3).to_sparse(), torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]),
    torch.zeros(2, 0), 3.5, None, [torch.zeros(2, 4)], torch.zeros((), dtype=torch.bool),
])
def test_hostile_arguments_raise_only_contract_errors(hostile) -> None:
    @kc.contract
    def f(x: Float[Tensor, "B D//H"], D: int = 8, H: int = 2) -> None:
        return None

    for h in (2, 0, -1):
        try:
            f(hostile, 8, h)
        except kc.ContractError:
            pass
        try:
            f(torch.zeros(2, 4), 8, h)
        except kc.ContractError:
            pass


def test_an_unknown_config_dtype_role_is_refused_at_decoration() -> None:
    with pytest.raises(kc.AnnotationError, match=r"config_dtype='stat' is not a dtype role \(known: activation"):
        @kc.contract
        def f(x: Annotated[Float[Tensor, "B"], kc.Spec(config_dtype="stat")]) -> None: ...
