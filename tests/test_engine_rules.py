"""The engine's rules: one implementation shared by the generated checker and the explainer,
hygienic generated names, return annotations checked by generated code."""

from __future__ import annotations

from typing import Annotated

import pytest
import torch
from pydantic import BaseModel

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.rules.tensor import Disjoint, DtypeIn, InnerDense, Slots


class _Dims(BaseModel):
    D: int = 4


def test_a_dim_only_the_static_config_binds_can_be_used_inside_an_expression() -> None:
    @kc.contract(config=_Dims())
    def f(x: Float[Tensor, "B 2*D"]) -> Float[Tensor, "B D"]:
        return x[:, :4]

    for b in range(1, 12):
        assert f(torch.zeros(b, 8)).shape == (b, 4)
    with pytest.raises(kc.ShapeError, match=r"dim 1 \(2\*D\): expected 8, got 6"):
        f(torch.zeros(3, 6))


@pytest.mark.parametrize("names", [
    ("_kc_a0", "_kc_a1"), ("_kc_cfg", "_kc_d0"), ("_kc_mode", "_kc_fn"), ("bias", "dt_bias"), ("check", "self"),
])
def test_parameters_named_like_generated_names_do_not_collide(names: tuple[str, str]) -> None:
    first, second = names
    ns: dict[str, object] = {"Float": Float, "Tensor": Tensor}
    exec(f'def f({first}: Float[Tensor, "B D"], {second}: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:\n'
         f'    return {first} + {second}\n', ns)
    f = kc.contract(ns["f"])
    assert torch.equal(f(torch.ones(2, 3), torch.ones(3)), torch.full((2, 3), 2.0))
    with pytest.raises(kc.ShapeError, match=second):
        f(torch.ones(2, 3), torch.ones(4))
    header = f.__kda_contract__.checker_source.splitlines()[0]
    assert header.startswith("def check(_kc_") and first not in header.split("(", 1)[1]  # args go by position


def test_a_function_named_like_a_generated_name_is_wrapped() -> None:
    def _kc_check(x: Float[Tensor, "B"]) -> Float[Tensor, "B"]:
        return x

    f = kc.contract(_kc_check)
    assert f(torch.ones(3)).shape == (3,)


def test_the_return_annotation_is_checked_by_generated_code() -> None:
    @kc.contract
    def f(x: Float[Tensor, "B D"], wrong: bool = False) -> Float[Tensor, "B D"]:
        return x[:, :1] if wrong else x

    c = f.__kda_contract__
    assert c.return_source is not None and "def check_return(" in c.return_source
    for b in range(1, 25):
        f(torch.zeros(b, 3))
    with pytest.raises(kc.ShapeError, match=r"the function returned a tensor of the wrong shape"):
        f(torch.zeros(2, 3), True)


def _verdicts(rule, **values):  # the fast path's source, evaluated as the generated code would
    consts = {k: v for k, v in rule.constants().items()}
    names = Slots(constants={k: f"c_{k}" for k in consts})
    env = {**values, **{f"c_{k}": v for k, v in consts.items()}}
    fast = bool(eval(rule.test(names), {}, env))
    return fast, rule.broken(**values)


@pytest.mark.parametrize("shape,strides", [
    ((4, 2, 3), (6, 3, 1)), ((4, 2, 3), (12, 3, 1)), ((4, 2, 3), (6, 1, 2)), ((4, 2, 3), (0, 3, 1)),
    ((4, 1, 3), (3, 99, 1)), ((1, 2, 3), (0, 3, 1)), ((4, 2, 3), (5, 3, 1)), ((4, 0, 3), (3, 3, 1)),
])
def test_stride_rules_give_one_verdict_on_both_paths(shape, strides) -> None:
    rules = (InnerDense("x", 2), InnerDense("x", 1), Disjoint("x", 3, 2), Disjoint("x", 3, 1), Disjoint("x", None, 2))
    for rule in rules:
        fast, slow = _verdicts(rule, shape=shape, strides=strides)
        assert fast == slow, (rule, shape, strides)


def test_the_dtype_rule_follows_the_config_pin_on_both_paths() -> None:
    rule = DtypeIn("x", frozenset({torch.float32, torch.bfloat16}), role="state")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for pin in (None, torch.float32, torch.bfloat16):
            fast, slow = _verdicts(rule, dtype=dt, config_value=pin)
            assert fast == slow == (dt not in rule.allowed or (pin is not None and dt != pin))


def test_an_annotated_spec_with_disjoint_blocks_rejects_an_expanded_pool() -> None:
    @kc.contract
    def f(pool: Annotated[Float[Tensor, "N D"], kc.Spec(inner_contiguous=1, disjoint=True)]) -> None:
        return None

    f(torch.zeros(4, 3))
    with pytest.raises(kc.LayoutError, match="do not overlap"):
        f(torch.zeros(1, 3).expand(4, 3))


def test_no_generated_name_can_collide_with_a_parameter_of_that_name() -> None:
    """Every name the generated checker and wrapper use, tried as a parameter name."""
    @kc.contract(config_arg="cfg")
    def probe(x: Float[Tensor, "B D"], y: Float[Tensor, "D"] | None = None, cfg: object = None,
              s: Annotated[float, kc.Range(gt=0)] = 1.0) -> Float[Tensor, "B D"]:
        kc.check(x, "B D")
        return x

    c = probe.__kda_contract__
    import re

    names = set(re.findall(r"_kc_\w+", c.checker_source + (c.return_source or "")))
    names |= {"_kc_mode", "_kc_dims", "_kc_res", "_kc_fn", "_kc_check", "_kc_fail", "_kc_body", "_kc_self",
              "_kc_static_cfg", "_kc_current_mode", "_kc_fixed_mode", "_kc_check_return", "_kc_fail_return"}
    assert len(names) > 20
    for name in sorted(names):
        ns: dict[str, object] = {"Float": Float, "Tensor": Tensor, "kc": kc}
        exec(f'def f(x: Float[Tensor, "B D"], {name}: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:\n'
             f'    kc.check({name}, "D")\n    return x + {name}\n', ns)
        f = kc.contract(ns["f"])
        assert f(torch.ones(2, 3), torch.ones(3)).shape == (2, 3), name
        with pytest.raises(kc.ShapeError):
            f(torch.ones(2, 3), torch.ones(4))
