"""Never silent, never crashing: classes, configs of every kind, mutable configs, unknown
metadata and roles, and hostile arguments that must only ever raise a ContractError."""

from __future__ import annotations

import dataclasses
import functools
import typing
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


def test_no_type_check_and_already_contracted_methods_are_left_as_they_are():
    class Layer:
        @typing.no_type_check
        def raw(self, x: Float[Tensor, "B D"]) -> None: ...

        @kc.contract(name="own", register=False, where=["D == 3"])
        def own(self, x: Float[Tensor, "B D"]) -> None: ...

        def forward(self, x: Float[Tensor, "B D"]) -> None: ...

    raw, own = Layer.raw, Layer.own
    kc.contract(Layer)
    assert Layer.__kda_contracted__ == ("forward",)
    assert Layer.raw is raw and Layer.own is own and Layer.own.__kda_contract__.name == "own"


def test_property_and_cached_property_accessors_are_contracted():
    @kc.contract
    class Box:
        def __init__(self, n: int) -> None:
            self.n = n

        @property
        def data(self) -> Float[Tensor, "_"]:
            return torch.zeros(self.n)

        @data.setter
        def data(self, x: Float[Tensor, "B"]) -> None:
            self.n = x.shape[0]

        @functools.cached_property
        def grid(self) -> Float[Tensor, "_ _"]:
            return torch.zeros(self.n) if self.n == 1 else torch.zeros(self.n, self.n)

        def twice(self, x: Float[Tensor, "B"]) -> Float[Tensor, "B"]:
            return 2 * x

    assert Box.__kda_contracted__ == ("data", "grid", "twice")
    assert Box.data.fget.__kda_contract__.name.endswith("<locals>.Box.data")
    assert Box.data.fset.__kda_contract__.name.endswith("<locals>.Box.data.setter")
    box = Box(3)
    box.data = torch.zeros(2)
    assert box.data.shape == (2,) and box.grid.shape == (2, 2)
    with pytest.raises(kc.ShapeError, match=r"Box\.data\.setter"):
        box.data = torch.zeros(2, 2)
    with pytest.raises(kc.ShapeError, match=r"Box\.grid"):
        _ = Box(1).grid
    assert box.twice(torch.ones(4)).shape == (4,)


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
