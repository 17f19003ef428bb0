"""torch.compile and torch.library: contracts are traced as guards, not graph breaks, and still
reject bad calls; the packed-decode custom op's fake implementation is the contract.

One compile per shape class however many calls: each case below calls a compiled function
``CALLS`` times over ``len(SIZES)`` batch sizes with ``fullgraph=True`` and counts the graphs
dynamo built (``torch._dynamo.utils.counters``). By default dynamo compiles the first size
statically and, on the second, one graph with a dynamic batch (2 graphs); with
``dynamic=True`` or ``torch._dynamo.mark_dynamic`` it builds one.
"""

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, NamedTuple

import pytest
import torch
import torch._dynamo.testing
from kda_oracle import assert_close_to_oracle
from pydantic import BaseModel, ConfigDict
from torch._dynamo.utils import counters

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.operation.torch_op import _FAKE_ERRORS_PASS
from kda_contracts.testing import make_decode_call

pytestmark = pytest.mark.kda_contracts("check")  # the mode compiled functions are traced in


def _mm(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
    return torch.relu(x @ w)


def fresh():
    torch._dynamo.reset()
    return kc.contract(mode="check", register=False)(_mm)


SIZES = tuple(range(2, 13))  # 11 batch sizes
CALLS = 22
GRAPHS = {"automatic": 2, "dynamic=True": 1, "mark_dynamic": 1}  # graphs dynamo builds for SIZES


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def compile_as(fn, how, backend="eager", fullgraph=True):
    return torch.compile(fn, fullgraph=fullgraph, backend=backend, dynamic=True if how == "dynamic=True" else None)


def batch(b, how, *trailing):
    x = torch.randn(b, *trailing)
    if how == "mark_dynamic":
        torch._dynamo.mark_dynamic(x, 0)
    return x


def graphs_over_sizes(cf, make_args):
    """Call ``cf`` CALLS times, cycling through SIZES; the number of graphs dynamo built."""
    for i in range(CALLS):
        cf(*make_args(SIZES[i % len(SIZES)]))
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_contracted_function_compiles_with_fullgraph_and_still_rejects_a_bad_shape(backend):
    f = fresh()
    cf = torch.compile(f, fullgraph=True, backend=backend)
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    torch.testing.assert_close(cf(x, w), _mm(x, w))
    for b in (5, 7):  # new batch sizes: recompiled with a dynamic B, checks still traced
        assert cf(torch.randn(b, 3), w).shape == (b, 4)
    with pytest.raises(kc.ShapeError, match=r"(?s)\[1\] w: ShapeError.*dim 0 \(D\): expected 3"):
        cf(torch.randn(2, 3), torch.randn(5, 4))
    with pytest.raises(kc.DtypeError):
        cf(torch.randn(2, 3), torch.randn(3, 4).int())


def test_contract_checks_cause_no_graph_break():
    f = fresh()
    report = torch._dynamo.explain(f)(torch.randn(2, 3), torch.randn(3, 4))
    assert report.graph_break_count == 0 and report.graph_count == 1


def test_a_contracted_function_compiles_with_inductor_once_for_every_batch_size():
    f = fresh()
    cf = compile_as(f, "dynamic=True", backend="inductor")
    w = torch.randn(3, 2)
    x = torch.randn(4, 3)
    torch.testing.assert_close(cf(x, w), _mm(x, w))
    assert graphs_over_sizes(cf, lambda b: (torch.randn(b, 3), w)) == 1
    with pytest.raises(kc.ShapeError):
        cf(torch.randn(4, 3), torch.randn(2, 2))


def test_the_compiled_function_counts_as_exercised():
    f = fresh()
    c = f.__kda_contract__
    torch.compile(f, fullgraph=True, backend="eager")(torch.randn(2, 3), torch.randn(3, 4))
    assert c.calls >= 1


# -- one compile per shape class -----------------------------------------------------------------
W = torch.randn(4, 5)


@pytest.mark.parametrize("how", GRAPHS)
def test_a_contracted_function_compiles_once_per_shape_class(how):
    f = fresh()
    cf = compile_as(f, how)
    assert graphs_over_sizes(cf, lambda b: (batch(b, how, 4), W)) == GRAPHS[how]


@pytest.mark.parametrize("how", GRAPHS)
def test_a_contracted_method_compiles_once_per_shape_class(how):
    class Projection:
        def __init__(self):
            self.w = torch.randn(4, 4)

        @kc.contract(register=False)
        def apply(self, x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
            return x @ self.w

    cf = compile_as(Projection().apply, how)
    assert graphs_over_sizes(cf, lambda b: (batch(b, how, 4),)) == GRAPHS[how]


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    @kc.contract(register=False)
    def forward(self, x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return torch.relu(x @ self.w)


@pytest.mark.parametrize("how", GRAPHS)
def test_a_compiled_module_with_a_contracted_forward_compiles_once_per_shape_class(how):
    cm = compile_as(Layer(), how, backend="aot_eager")
    assert graphs_over_sizes(cm, lambda b: (batch(b, how, 4),)) == GRAPHS[how]


def test_module_compile_in_place_compiles_once_per_shape_class():
    m = Layer()
    m.compile(fullgraph=True, backend="eager")
    assert graphs_over_sizes(m, lambda b: (torch.randn(b, 4),)) == GRAPHS["automatic"]


class Dims(BaseModel):  # a mutable pydantic model
    D: int
    E: int


class FrozenDims(BaseModel):
    model_config = ConfigDict(frozen=True)
    D: int
    E: int


@pytest.mark.parametrize("model", [Dims, FrozenDims])
@pytest.mark.parametrize("how", GRAPHS)
def test_a_static_config_compiles_on_a_cold_first_call_once_per_shape_class(model, how):
    @kc.contract(config=model(D=4, E=5), register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
        return x @ w

    cf = compile_as(f, how)  # never called eagerly: its config is first read while tracing
    assert graphs_over_sizes(cf, lambda b: (batch(b, how, 4), W)) == GRAPHS[how]


@pytest.mark.parametrize("how", GRAPHS)
def test_a_per_call_config_compiles_once_per_shape_class(how):
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"], cfg: Dims) -> Float[Tensor, "B E"]:
        return x @ w

    cfg = Dims(D=4, E=5)
    cf = compile_as(f, how)
    assert graphs_over_sizes(cf, lambda b: (batch(b, how, 4), W, cfg)) == GRAPHS[how]


@dataclasses.dataclass
class DataDims:  # a plain dataclass with defaults: what a half-built one would show
    D: int = 4
    E: int = 5


@dataclasses.dataclass(frozen=True)
class FrozenDataDims:
    D: int = 4
    E: int = 5


# (dynamo cannot build a pydantic model inside the region at all: it cannot trace its validator)
@pytest.mark.parametrize("model", [DataDims, FrozenDataDims])
def test_a_config_built_inside_the_compiled_region_is_refused_never_judged_on_its_defaults(model):
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"], cfg: model) -> Float[Tensor, "B E"]:
        return x @ w

    def g(x, w):  # dynamo builds the config without running __init__ when it traces
        return f(x, w, model(D=8, E=5))

    cg = torch.compile(g, fullgraph=True, backend="eager")
    for d in (8, 4):  # D=8 is valid, D=4 is what a dataclass's defaults would wrongly accept
        with pytest.raises(kc.ArgumentTypeError, match=r"(?s)cfg: ArgumentTypeError.*built outside the region "
                                                       r"torch.compile traces.*fix: build the"):
            cg(torch.ones(2, d), torch.ones(d, 5))
    assert g(torch.ones(2, 8), torch.ones(8, 5)).shape == (2, 5)  # eager: fine


def test_an_object_built_inside_the_compiled_region_passes_a_type_check():
    class Tag:
        def __init__(self, k):
            self.k = k

    @kc.contract(mode="check", register=False)
    def f(x: Float[Tensor, "B D"], tag: Tag) -> Float[Tensor, "B D"]:
        return x * tag.k

    cg = torch.compile(lambda x: f(x, Tag(3)), fullgraph=True, backend="eager")
    for b in SIZES:
        torch.testing.assert_close(cg(torch.ones(b, 3)), torch.full((b, 3), 3.0))
    with pytest.raises(kc.ShapeError, match=r"x: ShapeError"):
        cg(torch.ones(2, 3, 1))


def test_a_wrong_type_for_a_parameter_beartype_checks_raises_the_contract_error_in_compiled_code():
    class Tag:
        k = 2

    @kc.contract(mode="check", register=False)
    def f(x: Float[Tensor, "B D"], tag: Tag) -> Float[Tensor, "B D"]:
        return x * tag.k

    tag = Tag()
    assert not f.__kda_contract__.types_in_checker  # beartype decides this hint, before the shape checker
    cf = compile_as(f, "automatic")
    assert graphs_over_sizes(cf, lambda b: (torch.ones(b, 3), tag)) == GRAPHS["automatic"]
    rejections = f.__kda_contract__.rejections
    with pytest.raises(kc.ArgumentTypeError, match=r"(?s)tag: ArgumentTypeError.*got +int"):
        cf(torch.ones(2, 3), 5)
    assert f.__kda_contract__.rejections == rejections + 1


def test_the_kimi_linear_layer_decode_compiles_once_per_shape_class():
    from pathlib import Path

    from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

    cfg = kc.KDAConfig.from_hf_config(Path(__file__).parent / "data" / "kimi_linear_tiny_config.json")
    layer = KimiDeltaAttention(cfg, tp_rank=0, backend="torch")  # the layer is its contracts' config
    layer.load_weights(**random_weights(cfg, seed=0, rank=0))
    ssm, conv = layer.new_state_pools(16)
    decode = torch.compile(layer.decode, fullgraph=True, backend="eager")
    graphs = graphs_over_sizes(decode, lambda b: (torch.randn(b, cfg.hidden_size), ssm, conv, torch.randperm(16)[:b]))
    assert graphs == GRAPHS["automatic"]


def test_config_views_used_eagerly_meanwhile_do_not_recompile():
    @kc.contract(config_arg="cfg", register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"], cfg: Dims) -> Float[Tensor, "B E"]:
        return x @ w

    cfg = Dims(D=4, E=5)
    cf = compile_as(f, "dynamic=True")
    for i in range(CALLS):
        cf(torch.randn(SIZES[i % len(SIZES)], 4), W, cfg)
        f(torch.randn(2, 4), W, Dims(D=4, E=5))  # eager calls with other configs fill the view cache
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # kc.check's parser
def test_a_body_with_kc_check_compiles_once_per_shape_class_and_still_rejects():
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
        return kc.check(x @ w, "B 5", name="y")  # against the call's B, compiled as eagerly

    cf = compile_as(f, "automatic")
    assert graphs_over_sizes(cf, lambda b: (torch.randn(b, 4), W)) == GRAPHS["automatic"]
    with pytest.raises(kc.ShapeError, match=r"\[1\] y: ShapeError"):
        cf(torch.randn(3, 4), torch.randn(4, 6))


def test_without_fullgraph_nothing_falls_back_to_eager():
    @kc.contract(config=FrozenDims(D=4, E=5), register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
        return x @ w

    cf = torch.compile(f, backend="eager")  # graph breaks would be silent here
    assert graphs_over_sizes(cf, lambda b: (torch.randn(b, 4), W)) == GRAPHS["automatic"]
    assert not counters["graph_break"]


# -- bad calls after warm-up ---------------------------------------------------------------------
def warm(cf, make_args):
    graphs_over_sizes(cf, make_args)
    return cf


@pytest.mark.parametrize("how", GRAPHS)
def test_a_bad_shape_after_warm_up_raises_shape_error(how):
    cf = warm(compile_as(fresh(), how), lambda b: (batch(b, how, 3), torch.randn(3, 4)))
    with pytest.raises(kc.ShapeError, match=r"dim 0 \(D\): expected 3") as info:
        cf(torch.randn(7, 3), torch.randn(5, 4))
    assert not isinstance(info.value, torch._dynamo.exc.TorchDynamoException)


@pytest.mark.parametrize("how", GRAPHS)
def test_a_bad_dtype_after_warm_up_raises_dtype_error(how):
    cf = warm(compile_as(fresh(), how), lambda b: (batch(b, how, 3), torch.randn(3, 4)))
    with pytest.raises(kc.DtypeError):
        cf(torch.randn(7, 3), torch.randn(3, 4).int())


@pytest.mark.parametrize("how", GRAPHS)
def test_a_bad_result_after_warm_up_raises_shape_error(how):
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x[:, :-1] if x.shape[0] == 99 else x  # drops a column for one batch size

    cf = warm(compile_as(f, how), lambda b: (batch(b, how, 4),))
    with pytest.raises(kc.ShapeError, match=r"(?s)\[1\] return: ShapeError.*got +\[99, 3\]"):
        cf(torch.randn(99, 4))


def test_a_call_against_a_static_config_after_warm_up_raises_shape_error():
    @kc.contract(config=FrozenDims(D=4, E=5), register=False)
    def f(x: Float[Tensor, "B D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "B E"]:
        return x @ w

    cf = warm(compile_as(f, "automatic"), lambda b: (torch.randn(b, 4), W))
    with pytest.raises(kc.ShapeError, match=r"E from config \(FrozenDims.E=5\)"):
        cf(torch.randn(3, 4), torch.randn(4, 6))


def test_a_bad_call_to_a_compiled_module_after_warm_up_raises_shape_error():
    cm = warm(compile_as(Layer(), "automatic"), lambda b: (torch.randn(b, 4),))
    with pytest.raises(kc.ShapeError, match="rank 2"):
        cm(torch.randn(3, 4, 1))


def test_a_dynamic_scalar_argument_compiles_once_and_a_bad_call_still_raises_the_contract_error():
    @kc.contract(mode="check", register=False)
    def scaled(x: Float[Tensor, "B D"], n: int) -> Float[Tensor, "B D"]:
        return x * n

    cf = compile_as(scaled, "dynamic=True")
    for i in range(CALLS):  # dynamo makes the int (and the batch) symbolic: one graph for every value
        b = SIZES[i % len(SIZES)]
        torch.testing.assert_close(cf(torch.ones(b, 3), i), torch.full((b, 3), float(i)))
    assert counters["stats"]["unique_graphs"] == 1
    # the rejected traces hand the report builder the symbolic n as its value (specialised)
    with pytest.raises(kc.ShapeError, match=r"x: ShapeError"):
        cf(torch.ones(2, 3, 1), 3)
    with pytest.raises(kc.ArgumentTypeError, match=r"n: ArgumentTypeError"):
        cf(torch.ones(2, 3), 3.5)


# -- tensors, objects and sizes inside containers ------------------------------------------------
# Each case: a contracted function, its arguments for batch size b (new containers and objects on
# every call), a bad call, the error it raises and a pinned fragment of the report.
class Tag:  # a plain user class, checked by beartype eagerly and traced as isinstance tests
    def __init__(self, k):
        self.k = k


@dataclasses.dataclass
class Pair:
    x: Float[Tensor, "B D"]
    y: Float[Tensor, "B D"]


@dataclasses.dataclass
class Holder:  # a dataclass holding a dataclass holding tensors
    pair: Pair
    w: Float[Tensor, "D E"]


class Batch(BaseModel):  # a pydantic model holding a tensor
    model_config = ConfigDict(arbitrary_types_allowed=True)
    x: Float[Tensor, "B D"]
    scale: float


class Step(NamedTuple):
    x: Float[Tensor, "B D"]
    n: int


@kc.contract(register=False)
def summed(xs: list[Float[Tensor, "B D"]]) -> Float[Tensor, "B D"]:
    return xs[0] + xs[1]


@kc.contract(register=False)
def paired(xs: tuple[Float[Tensor, "B D"], Float[Tensor, "B D"]]) -> Float[Tensor, "B D"]:
    return xs[0] * xs[1]


@kc.contract(register=False)
def keyed(xs: dict[str, Float[Tensor, "B D"]], bias: Float[Tensor, "D"] | None) -> Float[Tensor, "B D"]:
    return xs["a"] - xs["b"] if bias is None else xs["a"] + bias


@kc.contract(register=False)
def tagged(x: Float[Tensor, "B D"], tags: list[Tag]) -> Float[Tensor, "B D"]:
    return x * tags[0].k + len(tags)


@kc.contract(register=False)
def sized(x: Float[Tensor, "B D"], shape: tuple[int, ...]) -> Float[Tensor, "B D"]:
    return x * shape[1]


@kc.contract(register=False)
def held(h: Holder) -> Float[Tensor, "B E"]:
    return (h.pair.x + h.pair.y) @ h.w


@kc.contract(register=False)
def batched(b: Batch, steps: list[Step]) -> Float[Tensor, "B D"]:
    return b.x * b.scale + steps[0].x * steps[0].n


def _bad_holder():
    return (Holder(Pair(torch.randn(3, 4), torch.randn(3, 5)), W),)


CONTAINERS = {
    "list of tensors": (summed, lambda b: ([torch.randn(b, 4), torch.randn(b, 4)],),
                        lambda: ([torch.randn(3, 4), torch.randn(3, 5)],), kc.ShapeError,
                        r"\[1\] xs: ShapeError\n +expected list\[Tensor\[B D\]\]\n"
                        r" +got +xs\[1\]: shape \[3, 5\]: dim 1 \(D\): expected 4, got 5"),
    "tuple of tensors": (paired, lambda b: ((torch.randn(b, 4), torch.randn(b, 4)),),
                         lambda: ((torch.randn(3, 4), torch.randn(2, 4)),), kc.ShapeError,
                         r"got +xs\[1\]: shape \[2, 4\]: dim 0 \(B\): expected 3, got 2"),
    "dict of tensors": (keyed, lambda b: ({"a": torch.randn(b, 4), "b": torch.randn(b, 4)}, None),
                        lambda: ({"a": torch.randn(3, 4), "b": torch.ones(3, 4, dtype=torch.int32)}, None),
                        kc.DtypeError, r"\[1\] xs: DtypeError\n.*\n +got +xs\['b'\]: dtype int32, expected bfloat16"),
    "list of objects": (tagged, lambda b: (torch.randn(b, 4), [Tag(2), Tag(b)]),
                        lambda: (torch.randn(3, 4), [3, 3]), kc.ArgumentTypeError,  # (eager beartype samples one)
                        r"\[1\] tags: ArgumentTypeError\n +expected list\[Tag\]\n"
                        r" +got +list \(tags\[0\]: expected Tag, got int\)"),
    "tuple of sizes": (sized, lambda b: (torch.randn(b, 4), (b, 4)),
                       lambda: (torch.randn(3, 4), (3.0, 4.0)), kc.ArgumentTypeError,
                       r"expected tuple\[int, \.\.\.\]\n +got +tuple \(shape\[0\]: expected int, got float\)"),
    "nested dataclasses": (held, lambda b: (Holder(Pair(torch.randn(b, 4), torch.randn(b, 4)), W),),
                           _bad_holder, kc.ShapeError,
                           r"\[1\] h: ShapeError\n +expected Holder\n"
                           r" +got +h.pair.y: shape \[3, 5\]: dim 1 \(D\): expected 4, got 5"),
    "pydantic model and NamedTuples": (
        batched, lambda b: (Batch(x=torch.randn(b, 4), scale=0.5), [Step(torch.randn(b, 4), b)]),
        lambda: (Batch(x=torch.randn(3, 4), scale=0.5), [Step(torch.randn(3, 4, 1), 2)]), kc.ShapeError,
        r"\[1\] steps: ShapeError\n.*\n +got +steps\[0\].x: shape \[3, 4, 1\]: expected rank 2, got 3"),
}
CONTAINER_GRAPHS = {"automatic": 2, "dynamic=True": 1}  # as for plain tensors: one compile per shape class


def graphs_matching_eager(cf, f, make_args):
    """Call ``cf`` CALLS times over SIZES, each result equal to ``f``'s eager one; the graphs built."""
    for i in range(CALLS):
        args = make_args(SIZES[i % len(SIZES)])
        torch.testing.assert_close(cf(*args), f(*args))
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph breaks allowed"])
@pytest.mark.parametrize("how", CONTAINER_GRAPHS)
@pytest.mark.parametrize("case", CONTAINERS)
def test_a_container_argument_compiles_once_per_shape_class(case, how, fullgraph):
    f, make_args, *_ = CONTAINERS[case]
    cf = compile_as(f, how, fullgraph=fullgraph)
    assert graphs_matching_eager(cf, f, make_args) == CONTAINER_GRAPHS[how]
    assert not counters["graph_break"]


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph breaks allowed"])
@pytest.mark.parametrize("case", CONTAINERS)
def test_a_bad_container_argument_after_warm_up_raises_the_contract_error(case, fullgraph):
    f, make_args, make_bad, error, message = CONTAINERS[case]
    cf = warm(compile_as(f, "automatic", fullgraph=fullgraph), make_args)
    with pytest.raises(error, match=message) as info:
        cf(*make_bad())
    assert info.value.kind_name == error.kind_name  # that very kind, nothing combined
    assert not isinstance(info.value, torch._dynamo.exc.TorchDynamoException)
    with pytest.raises(error, match=message):
        f(*make_bad())  # the eager report, word for word


@pytest.mark.parametrize("how", CONTAINER_GRAPHS)
def test_a_tuple_of_sizes_built_from_x_shape_in_the_region_stays_symbolic(how):
    cf = compile_as(lambda x: sized(x, tuple(x.shape)), how)
    assert graphs_matching_eager(cf, lambda x: sized(x, tuple(x.shape)), lambda b: (torch.randn(b, 4),)) \
        == CONTAINER_GRAPHS[how]
    with pytest.raises(kc.ShapeError, match=r"\[1\] x: ShapeError"):
        cf(torch.randn(3, 4, 1))


def test_compiled_code_checks_every_item_of_a_container():
    """beartype samples one item of a container per eager call; the traced check reads them all."""
    cf = warm(compile_as(tagged, "automatic"), lambda b: (torch.randn(b, 4), [Tag(1)] * 5))
    for _ in range(CALLS):
        with pytest.raises(kc.ArgumentTypeError, match=r"got +list \(tags\[5\]: expected Tag, got str\)"):
            cf(torch.randn(3, 4), [Tag(1)] * 5 + ["x"])


def test_a_hint_only_beartype_decides_is_checked_at_trace_time():
    @kc.contract(register=False)
    def f(x: Float[Tensor, "B D"], tags: list[Tag], how: Literal["add", "mul"]) -> Float[Tensor, "B D"]:
        return x + tags[0].k if how == "add" else x * tags[0].k

    # the Literal reaches beartype as the constant it is; the fresh tags are traced as isinstance tests
    cf = compile_as(f, "automatic")
    assert graphs_matching_eager(cf, f, lambda b: (torch.randn(b, 4), [Tag(b)], "add")) == 2
    with pytest.raises(kc.ArgumentTypeError, match=r"\[1\] how: ArgumentTypeError\n +expected .*Literal"):
        cf(torch.randn(3, 4), [Tag(3)], "sub")


@pytest.mark.parametrize("how", CONTAINER_GRAPHS)
def test_a_dataclass_of_tensors_built_inside_the_compiled_region(how):
    def g(x, y):  # dynamo builds the Pair without running __init__ when it traces
        return held(Holder(Pair(x, y), W))

    cg = compile_as(g, how)
    assert graphs_matching_eager(cg, g, lambda b: (torch.randn(b, 4), torch.randn(b, 4))) == CONTAINER_GRAPHS[how]
    # a bad call is still rejected; the report cannot read what dynamo has not initialised, so says so
    with pytest.raises(kc.ArgumentTypeError, match=r"(?s)\[1\] h: ArgumentTypeError.*got +a Holder built inside it"):
        cg(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(kc.ShapeError, match=r"got +h.pair.y: shape \[3, 5\]"):
        g(torch.randn(3, 4), torch.randn(3, 5))  # eager: the full report


TYPE_CASES = [  # (hint, value): values whose every item agrees, so beartype's one sampled item decides too
    (int, 3), (int, True), (int, 3.0), (float, 3), (float, 2.5), (complex, 1.5), (str, "a"), (Tag, Tag(1)),
    (Tag, 3), (Tag | None, None), (int | str, "a"), (int | str, 2.5), (list[int], [1, 2]), (list[int], (1, 2)),
    (list[Tag], [Tag(1)]), (list[Tag], ["x"]), (tuple[int, ...], (1, 2)), (tuple[int, ...], ()),
    (tuple[int, str], (1, "a")), (tuple[int, str], (1, 2)), (tuple[int, str], (1,)),
    (dict[str, Tag], {"a": Tag(1)}), (dict[str, Tag], {1: Tag(1)}),
    (Sequence[str], "abc"), (Sequence[int], [1]), (Mapping[str, int], {"a": 1}), (dict[str, int], MappingProxyType({})),
    (list[list[float]], [[1, 2.5]]), (torch.Size, torch.Size([2])), (tuple[int, ...], torch.Size([2, 3])),
    (set[int], {1, 2}), (set[int], {"a"}), (frozenset[str], frozenset({"a"})),
    (Batch, Batch(x=torch.zeros(1, 1), scale=1.0)), (Step, Step(torch.zeros(1, 1), 1)), (Any, object()),
]


@pytest.mark.parametrize(("hint", "value"), TYPE_CASES, ids=lambda v: getattr(v, "__name__", None) or repr(v)[:20])
def test_a_traced_type_tree_gives_beartypes_verdict(hint, value):
    from beartype import BeartypeConf
    from beartype.door import is_bearable

    from kda_contracts._engine.reading.type_trees import read_types

    tree = read_types(hint)
    assert tree is not None
    assert (tree.match(value, {}, "v") is None) == is_bearable(value, hint, conf=BeartypeConf(is_pep484_tower=True))


@pytest.mark.parametrize("hint", [Literal["a"], Callable[[int], int], type[int], Annotated[int, "x"]],
                         ids=repr)
def test_a_hint_more_than_types_decide_has_no_traced_type_tree(hint):
    from kda_contracts._engine.reading.type_trees import read_types

    assert read_types(hint) is None  # beartype decides it, at trace time under torch.compile


def test_the_trace_time_functions_receive_containers_rebuilt_around_their_leaves():
    from collections import OrderedDict

    from kda_contracts._engine.compile.trace_args import flatten, rebuild

    t, tag = torch.ones(2), Tag(1)
    value = [t, (3, {"a": tag, 4: [t]}), Step(t, 2), torch.Size([2, 3]), OrderedDict(b=t), Tag]
    leaves = []
    layout = flatten(value, leaves)
    back = rebuild(layout, leaves)
    assert type(back[2]) is Step and type(back[3]) is torch.Size and type(back[4]) is OrderedDict
    assert back[1][1][4][0] is t and back[1][1]["a"] is tag and back[5] is Tag and back[3] == (2, 3)
    assert sum(leaf is t for leaf in leaves) == 4  # each tensor crosses on its own

# -- what "calls" counts under compile -----------------------------------------------------------
def test_under_compile_calls_counts_the_traces_one_per_graph():
    f = fresh()
    c = f.__kda_contract__
    graphs = graphs_over_sizes(compile_as(f, "automatic"), lambda b: (torch.randn(b, 3), torch.randn(3, 4)))
    assert c.calls == graphs == 2  # runs of the compiled code execute no Python; dynamo's guards hold them
    f(torch.randn(2, 3), torch.randn(3, 4))
    assert c.calls == 3  # an eager call counts one


def test_under_compile_a_rejected_trace_counts_a_call_and_a_rejection():
    f = fresh()
    c = f.__kda_contract__
    cf = warm(compile_as(f, "dynamic=True"), lambda b: (torch.randn(b, 3), torch.randn(3, 4)))
    calls, rejections = c.calls, c.rejections
    with pytest.raises(kc.ShapeError):
        cf(torch.randn(2, 3), torch.randn(5, 4))
    assert (c.calls - calls, c.rejections - rejections) == (1, 1)


# -- the custom op -------------------------------------------------------------------------------
ORDER = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out", "ssm_state_indices",
         "use_qk_l2norm_in_kernel", "lower_bound")


def op_args(call, layout="VK", backend="torch"):
    return [call[k] for k in ORDER] + [layout, backend]


@pytest.fixture(scope="module")
def ops():
    import kda_contracts.ops.packed_decode.custom_op

    return kda_contracts.ops.packed_decode.custom_op


def small_call(**kw):
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, **kw)
    return make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)


def test_the_custom_op_passes_opcheck(ops):
    result = torch.library.opcheck(torch.ops.kda_contracts.packed_decode.default, op_args(small_call()))
    assert set(result.values()) == {"SUCCESS"}


def test_the_custom_op_writes_in_place_like_packed_decode(ops):
    call, ref = small_call(), small_call()
    torch.ops.kda_contracts.packed_decode(*op_args(call))
    kc.packed_decode(**ref, backend="torch")
    assert torch.equal(call["out"], ref["out"]) and torch.equal(call["initial_state"], ref["initial_state"])


def test_the_fake_implementation_is_the_contract(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    call = small_call()
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in call.items()}
        torch.ops.kda_contracts.packed_decode(*op_args(fake))
        bad = dict(fake, a=fake["a"].view(3, 4, 8))
        with pytest.raises(kc.ShapeError, match="`a` looks unflattened"):
            torch.ops.kda_contracts.packed_decode(*op_args(bad))


def small_calls(cfg, how):
    """A valid packed-decode call for each batch size of SIZES (one pool shared by all)."""
    calls = {b: make_decode_call(cfg, b, 16, activation_dtype=torch.float32) for b in SIZES}
    if how == "mark_dynamic":
        for call in calls.values():
            for name in ("mixed_qkv", "a", "b", "out", "ssm_state_indices"):
                torch._dynamo.mark_dynamic(call[name], 0)
    return calls


SMALL = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)


def op_step(*args):
    torch.ops.kda_contracts.packed_decode(*args)
    return args[7] * 2


@pytest.mark.parametrize("how", GRAPHS)
def test_a_compiled_step_around_the_op_compiles_once_per_shape_class(ops, how):
    calls = small_calls(SMALL, how)
    cs = compile_as(op_step, how, backend="aot_eager")
    assert graphs_over_sizes(cs, lambda b: op_args(calls[b])) == GRAPHS[how]


def test_a_compiled_step_around_the_op_matches_eager(ops):
    call, ref = small_call(), small_call()
    out = compile_as(op_step, "automatic", backend="aot_eager")(*op_args(call))
    kc.packed_decode(**ref, backend="torch")
    torch.testing.assert_close(out, ref["out"] * 2)
    torch.testing.assert_close(call["initial_state"], ref["initial_state"])


def test_a_bad_call_to_the_op_after_warm_up_raises_shape_error(ops):
    calls = small_calls(SMALL, "automatic")
    cs = warm(compile_as(op_step, "automatic", backend="aot_eager"), lambda b: op_args(calls[b]))
    bad = op_args(small_call())
    bad[1] = bad[1].view(3, 4, 8)
    with pytest.raises(kc.ShapeError, match=r"(?s)packed_decode\(\): 1 contract violation.*`a` looks unflattened") \
            as info:
        cs(*bad)
    assert not isinstance(info.value, torch._dynamo.exc.TorchDynamoException)


# -- kc.packed_decode in compiled code -------------------------------------------------------------
def decode_step(call, config):
    kc.packed_decode(**call, config=config, backend="auto")
    return call["out"] * 2


@pytest.mark.parametrize("with_config", [False, True], ids=["no config", "KDAConfig"])
@pytest.mark.parametrize("how", GRAPHS)
def test_packed_decode_compiles_once_per_shape_class(how, with_config):
    calls = small_calls(SMALL, how)
    cs = compile_as(decode_step, how)
    assert graphs_over_sizes(cs, lambda b: (calls[b], SMALL if with_config else None)) == GRAPHS[how]


def test_packed_decode_compiled_matches_eager():
    call, ref = small_call(), small_call()
    out = compile_as(decode_step, "automatic", backend="aot_eager")(call, SMALL)
    kc.packed_decode(**ref, config=SMALL, backend="torch")
    torch.testing.assert_close(out, ref["out"] * 2)
    torch.testing.assert_close(call["initial_state"], ref["initial_state"])


def test_a_bad_packed_decode_call_after_warm_up_raises_shape_error():
    calls = small_calls(SMALL, "automatic")
    cs = warm(compile_as(decode_step, "automatic"), lambda b: (calls[b], SMALL))
    bad = dict(small_call())
    bad["a"] = bad["a"].view(3, 4, 8)
    with pytest.raises(kc.ShapeError, match="`a` looks unflattened"):
        cs(bad, SMALL)


def test_packed_decode_under_compile_counts_one_call_per_trace():
    c = kc.packed_decode_contract("VK")
    calls = small_calls(SMALL, "automatic")
    before = c.calls
    graphs = graphs_over_sizes(compile_as(decode_step, "automatic"), lambda b: (calls[b], SMALL))
    assert c.calls - before == graphs == 2


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(("device", "kernel", "mode"), [
    ("cpu", "torch", None),
    pytest.param("cpu", "triton", None, marks=pytest.mark.skipif(  # (the Triton interpreter, tiny heads)
        os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")),
    pytest.param("cuda", "triton", None, marks=_CUDA), pytest.param("cuda", "triton", "reduce-overhead", marks=_CUDA),
    pytest.param("cuda", "helion", None, marks=_CUDA), pytest.param("cuda", "auto", "reduce-overhead", marks=_CUDA),
])
def test_packed_decode_runs_our_kernel_in_compiled_code_once_per_shape_class(device, kernel, mode):
    """As a serving engine runs it: a decode step compiled with inductor (and CUDA graphs) with our
    kernel inside, dozens of calls over 11 batch sizes and random slots of one pool, each matching the
    eager torch reference. In compiled code a kernel runs through the ``kda_kernels::packed_decode``
    custom op (dynamo cannot trace a launch)."""
    cfg = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=128 if device == "cuda" else 8,
                       head_v_dim=128 if device == "cuda" else 16)
    pool = make_decode_call(cfg, 1, 48, activation_dtype=torch.float32, device=device)["initial_state"]

    def step(call):
        kc.packed_decode(**call, config=cfg, backend=kernel)
        return call["out"] * 2

    cs = torch.compile(step, fullgraph=True, mode=mode)
    sizes = SIZES[::4] if (device, kernel) == ("cpu", "triton") else SIZES  # (the interpreter is slow)
    for i in range(len(sizes) if (device, kernel) == ("cpu", "triton") else CALLS):
        b = sizes[i % len(sizes)]
        call = make_decode_call(cfg, b, 48, activation_dtype=torch.float32, device=device, seed=i)
        call["initial_state"] = pool
        call["ssm_state_indices"] = torch.randperm(48, device=device)[:b].to(torch.int32)
        ref = dict(call, initial_state=pool.clone(), out=call["out"].clone())
        kc.packed_decode(**ref, config=cfg, backend="torch")
        assert_close_to_oracle(cs(call), ref["out"] * 2)
        assert_close_to_oracle(pool, ref["initial_state"])
    assert counters["stats"]["unique_graphs"] == GRAPHS["automatic"]


@pytest.mark.kda_contracts("strict")
def test_in_strict_mode_compiled_code_is_checked_as_in_check_mode_and_says_so():
    calls = small_calls(SMALL, "automatic")
    cs = compile_as(decode_step, "automatic")
    with pytest.warns(RuntimeWarning, match="strict mode's value checks .* cannot run inside torch.compile"):
        assert graphs_over_sizes(cs, lambda b: (calls[b], SMALL)) == GRAPHS["automatic"]
    duplicate_slots = dict(calls[3], ssm_state_indices=torch.tensor([0, 0, 1], dtype=torch.int32))
    with pytest.raises(kc.ValueRangeError):  # eager code still runs them
        decode_step(duplicate_slots, SMALL)


@pytest.mark.kda_contracts("strict")
def test_a_contract_with_value_checks_compiles_in_strict_mode():
    def positive(ctx):
        return [] if bool((ctx.values["x"] > 0).all()) else [kc.Violation(kc.ValueRangeError, "x", "> 0", "not")]

    @kc.contract(value_checks=positive, register=False)
    def f(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        return x * 2

    with pytest.warns(RuntimeWarning, match="cannot run inside torch.compile"):
        assert graphs_over_sizes(compile_as(f, "automatic"), lambda b: (torch.rand(b, 4) + 1,)) == 2
    with pytest.raises(kc.ValueRangeError):
        f(-torch.rand(2, 4) - 1)


def test_a_backend_with_dim_constraints_is_never_judged_on_one_traced_size():
    """Under torch.compile the dims may be symbolic: ``auto`` passes over a backend whose support
    depends on them (the next one runs), and asking for it by name is refused, not judged on the
    sizes seen when tracing."""
    kc.packed_decode.register_backend(kc.Backend(name="even", kernel=kc.packed_decode.fn, devices=("cpu",),
                                                 priority=10_000, where=("B % 2 == 0",)))
    try:
        call, ref = small_call(), small_call()
        out = compile_as(decode_step, "automatic")(call, None)
        kc.packed_decode(**ref, backend="torch")
        torch.testing.assert_close(out, ref["out"] * 2)

        def forced(call):
            kc.packed_decode(**call, backend="even")
            return call["out"] * 2

        with pytest.raises(kc.ContractError, match=r"'even', which needs B % 2 == 0"):
            compile_as(forced, "automatic")(small_call())
    finally:
        kc.packed_decode.unregister_backend("even")


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # kc.check's parser
@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks-allowed", "fullgraph"])
def test_a_compiled_body_checks_against_the_calls_dims(fullgraph):
    # kc.check and kc.dims() in a compiled body saw no call (they checked standalone): a check that
    # only the call's D decides passed compiled and failed eagerly
    @kc.contract(register=False)
    def head(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
        kc.check(x[:, :2], "B D", name="head")  # holds only when D == 2
        return x * kc.dims()["D"]

    counts = torch._dynamo.testing.CompileCounter()
    cf = torch.compile(head, backend=counts, fullgraph=fullgraph, dynamic=True)
    for b in range(2, 26):
        assert cf(torch.ones(b, 2)).eq(2).all()
    assert counts.frame_count <= 2, counts.frame_count
    for call in (head, cf):
        with pytest.raises(kc.ShapeError, match=r"\[1\] head: ShapeError\n +expected \[B D\]\n +got +\[5, 2\]"):
            call(torch.zeros(5, 3))


def test_an_ops_custom_op_returning_a_tensor_compiles_once_over_batch_sizes():
    # its fake kernel shaped the output from the full explain, which read every size as an int:
    # one graph per batch size under dynamic=True
    @kc.op(namespace="kc_compile_ops")
    def add_row(x: Float[Tensor, "*batch D"], w: Float[Tensor, "D"]) -> Float[Tensor, "*batch D"]:
        return x + w

    top = add_row.torch_op
    counts = torch._dynamo.testing.CompileCounter()
    cf = torch.compile(lambda x, w: top(x, w), backend=counts, dynamic=True)
    for b in range(2, 26):
        assert cf(torch.ones(b, 3, 8), torch.ones(8)).shape == (b, 3, 8)
    assert counts.frame_count <= 2, counts.frame_count
    # (torch 2.11: dynamo wraps what a fake kernel raises, as test_op.py's custom-op tests say)
    error = kc.ShapeError if _FAKE_ERRORS_PASS else torch._dynamo.exc.TorchRuntimeError
    with pytest.raises(error, match=r"w: ShapeError"):
        cf(torch.ones(4, 3, 8), torch.ones(7))
