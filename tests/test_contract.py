"""The contract engine on small, non-KDA functions: binding, checks, modes, errors."""

import pickle
from typing import Annotated

import pytest
import torch
from pydantic import BaseModel

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor


def t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


# -- binding --------------------------------------------------------------------------------------
@kc.contract
def gated(a: Float[Tensor, "B HV*K"], state: Float[Tensor, "N HV V K"]) -> None:
    """`a` comes before the argument that binds HV and K."""


def test_binding_is_order_independent():
    gated(t(2, 3 * 4), t(5, 3, 6, 4))


def test_a_disagreeing_expression_names_the_argument_and_the_computed_size():
    pattern = r"(?s)\[1\] a: ShapeError.*expected \[B, HV\*K\] = \[2, 12\].*got +\[2, 13\]"
    with pytest.raises(kc.ShapeError, match=pattern):
        gated(t(2, 13), t(5, 3, 6, 4))


@kc.contract
def packed(x: Float[Tensor, "B 2*H*K+HV*V"], state: Float[Tensor, "N HV V K"]) -> None:
    pass


def test_a_single_unknown_is_solved_from_a_linear_width():
    dims = packed.__kda_contract__.validate(t(1, 2 * 3 * 4 + 2 * 5), t(1, 2, 5, 4))
    assert dims.H == 3
    assert dims.provenance["H"] == "solved from x.shape[1] = 2*H*K+HV*V"


def test_a_width_with_no_integer_solution_says_why():
    with pytest.raises(kc.ShapeError, match=r"gives no whole H >= 0 with HV=2, K=4, V=5: H = \(35 - 10\) / 8"):
        packed(t(1, 35), t(1, 2, 5, 4))


def test_a_dim_nothing_can_bind_is_an_annotation_error_naming_it():
    with pytest.raises(kc.AnnotationError, match=r"cannot bind dim 'Q' .*'R'|cannot bind dim 'Q'"):
        @kc.contract
        def f(x: Float[Tensor, "B Q*R"]) -> None: ...


def test_a_dim_only_in_an_optional_tensor_is_an_annotation_error():
    with pytest.raises(kc.AnnotationError, match="cannot bind dim 'D'"):
        @kc.contract
        def f(x: Float[Tensor, "B"], y: Float[Tensor, "B D"] | None = None) -> None: ...


def test_an_int_argument_named_like_a_dim_binds_it():
    @kc.contract
    def f(x: Float[Tensor, "B H*K"], H: int, K: int) -> None: ...

    f(t(2, 12), 3, 4)
    with pytest.raises(kc.ShapeError, match=r"dim 1 \(H\*K\): expected 12, got 13"):
        f(t(2, 13), 3, 4)


class LayerCfg(BaseModel):
    D: int
    E: int


def test_a_static_pydantic_config_binds_dims_and_is_checked():
    @kc.contract(config=LayerCfg(D=4, E=7))
    def f(x: Float[Tensor, "B D"]) -> None: ...

    f(t(3, 4))
    with pytest.raises(kc.ShapeError, match=r"expected 4 \(D from config \(LayerCfg.D=4\)\), got 5"):
        f(t(3, 5))


def test_a_per_call_config_argument_is_read_from_the_call():
    @kc.contract(config_arg="cfg")
    def f(x: Float[Tensor, "B D"], cfg=None) -> None: ...

    f(t(3, 5))
    f(t(3, 4), cfg=LayerCfg(D=4, E=1))
    with pytest.raises(kc.ShapeError):
        f(t(3, 5), cfg=LayerCfg(D=4, E=1))


# -- constraints beyond shapes ----------------------------------------------------------------------
def test_where_constraints_are_checked_with_their_hint():
    @kc.contract(where=[kc.Where("HV % H == 0", hint="HV must be a multiple of H"), "pow2(K)"])
    def f(q: Float[Tensor, "H K"], v: Float[Tensor, "HV K"]) -> None: ...

    f(t(2, 8), t(4, 8))
    with pytest.raises(kc.ShapeError, match=r"(?s)expected HV % H == 0.*got +H=3, HV=4.*fix: HV must be a multiple"):
        f(t(3, 8), t(4, 8))
    with pytest.raises(kc.ShapeError, match=r"expected pow2\(K\)"):
        f(t(2, 6), t(4, 6))


def test_spec_narrows_dtypes_and_pins_dtype_equality():
    @kc.contract
    def f(x: Annotated[Float[Tensor, "B"], kc.Spec(dtypes=(torch.bfloat16, torch.float32))],
          y: Annotated[Float[Tensor, "B"], kc.Spec(same_dtype_as="x")]) -> None: ...

    f(t(2), t(2))
    with pytest.raises(kc.DtypeError, match=r"x: DtypeError\n +expected bfloat16 or float32\n +got +float16"):
        f(t(2, dtype=torch.float16), t(2, dtype=torch.float16))
    with pytest.raises(kc.DtypeError, match=r"expected float32 \(same as x\)"):
        f(t(2), t(2, dtype=torch.bfloat16))


def test_jaxtyping_dtype_category_is_enforced():
    @kc.contract
    def f(i: Int[Tensor, "B"]) -> None: ...

    with pytest.raises(kc.DtypeError, match=r"got +float32"):
        f(t(2))


def test_spec_dtypes_outside_the_annotation_category_is_an_annotation_error():
    with pytest.raises(kc.AnnotationError, match="outside the annotation's dtype category"):
        @kc.contract
        def f(x: Annotated[Float[Tensor, "B"], kc.Spec(dtypes=(torch.int32,))]) -> None: ...


def test_tensors_must_share_a_device():
    @kc.contract
    def f(x: Float[Tensor, "B"], y: Float[Tensor, "B"]) -> None: ...

    with pytest.raises(kc.DeviceError, match=r"y: DeviceError\n +expected cpu \(device of x\)\n +got +meta"):
        f(t(2), torch.zeros(2, device="meta"))


def test_layout_rules_contiguous_and_inner_block():
    @kc.contract
    def f(x: Annotated[Float[Tensor, "A B"], kc.Spec(contiguous=True)],
          pool: Annotated[Float[Tensor, "N C D"], kc.Spec(inner_contiguous=2)]) -> None: ...

    big = t(10, 3, 4)
    f(t(2, 3), big[::2])  # a strided pool is fine: only each slot must be dense
    pattern = r"x: LayoutError\n +expected contiguous \(strides \[3, 1\]\)\n +got +strides \[1, 2\]"
    with pytest.raises(kc.LayoutError, match=pattern):
        f(t(3, 2).T, big)
    with pytest.raises(kc.LayoutError, match=r"expected last 2 dims dense \(strides \[\*, 4, 1\]\)"):
        f(t(2, 3), t(10, 4, 3).transpose(1, 2))


def test_scalar_ranges_reject_out_of_range_and_nan():
    @kc.contract
    def f(x: Float[Tensor, "B"], scale: Annotated[float, kc.Range(gt=0)],
          lb: Annotated[float | None, kc.Range(lt=0)] = None) -> None: ...

    f(t(1), 0.5)
    f(t(1), 1)  # an int is a float here (PEP 484 numeric tower)
    with pytest.raises(kc.ValueRangeError, match=r"scale: ValueRangeError\n +expected > 0\n +got +0.0"):
        f(t(1), 0.0)
    with pytest.raises(kc.ValueRangeError, match=r"got +nan"):
        f(t(1), float("nan"))
    with pytest.raises(kc.ValueRangeError, match=r"lb: ValueRangeError\n +expected < 0"):
        f(t(1), 1.0, 2.0)


def test_non_tensor_arguments_are_type_checked_by_beartype():
    @kc.contract
    def f(x: Float[Tensor, "B"], flag: bool = False) -> None: ...

    with pytest.raises(kc.ArgumentTypeError, match=r"flag: ArgumentTypeError\n +expected bool\n +got +str"):
        f(t(1), "yes")
    with pytest.raises(TypeError):
        f([1.0], False)


def test_optional_tensor_may_be_none_but_is_checked_when_given():
    @kc.contract
    def f(x: Float[Tensor, "B D"], bias: Float[Tensor, "D"] | None = None) -> None: ...

    f(t(2, 3))
    f(t(2, 3), t(3))
    with pytest.raises(kc.ShapeError, match=r"bias: ShapeError"):
        f(t(2, 3), t(4))


def test_the_return_value_is_checked_against_the_bound_dims():
    @kc.contract
    def f(x: Float[Tensor, "B D"], wrong: bool = False) -> Float[Tensor, "B 2*D"]:
        return t(x.shape[0], 2 * x.shape[1] + int(wrong))

    assert f(t(2, 3)).shape == (2, 6)
    with pytest.raises(kc.ShapeError, match=r"return: ShapeError\n +expected \[B, 2\*D\] = \[2, 6\]\n +got +\[2, 7\]"):
        f(t(2, 3), True)


def test_all_violations_are_reported_together_and_caught_by_each_kind():
    @kc.contract
    def f(x: Float[Tensor, "B D"], y: Annotated[Float[Tensor, "B"], kc.Spec(dtypes=(torch.float32,))]) -> None: ...

    with pytest.raises(kc.ContractError) as info:
        f(t(2, 3), t(3, dtype=torch.float16))
    err = info.value
    assert isinstance(err, kc.ShapeError) and isinstance(err, kc.DtypeError) and isinstance(err, ValueError)
    assert [v.kind for v in err.violations] == [kc.ShapeError, kc.DtypeError]
    assert str(err).startswith("test_all_violations_are_reported_together_and_caught_by_each_kind.<locals>.f(): "
                               "2 contract violations")


def test_contract_errors_survive_pickling():
    with pytest.raises(kc.ContractError) as info:
        gated(t(2, 13), t(5, 3, 6, 4))
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is type(info.value) and str(back) == str(info.value)
    assert back.violations == info.value.violations


def test_messages_never_print_tensor_values():
    x = torch.full((2, 13), 123456.0)
    with pytest.raises(kc.ContractError) as info:
        gated(x, t(5, 3, 6, 4))
    assert "123456" not in str(info.value)


# -- wrapper mechanics ------------------------------------------------------------------------------
def test_the_wrapper_keeps_name_signature_defaults_and_keyword_only_args():
    @kc.contract
    def f(x: Float[Tensor, "B"], /, y: Float[Tensor, "B"], *rest, scale: float = 2.0, **kw) -> float:
        return scale + len(rest) + len(kw)

    assert f.__name__ == "f" and f.__wrapped__ is not None
    assert f(t(1), t(1), 1, 2, scale=1.0, z=3) == 4.0
    assert f(t(1), y=t(1)) == 2.0


def test_methods_can_be_decorated():
    class Layer:
        @kc.contract
        def forward(self, x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
            return x

    Layer().forward(t(2, 3))
    with pytest.raises(kc.ShapeError):
        Layer().forward(t(2))


# -- modes -----------------------------------------------------------------------------------------
def test_off_at_decoration_returns_the_function_itself():
    def f(x: Float[Tensor, "B"]) -> None: ...

    with kc.mode("off"):
        assert kc.contract(f) is f
    assert kc.contract(mode="off")(f) is f


def test_off_at_call_time_skips_checks_and_check_mode_restores_them():
    with kc.mode("off"):
        gated(t(2, 13), t(5, 3, 6, 4))  # not checked
        assert kc.get_mode() == "off"
    with pytest.raises(kc.ShapeError):
        gated(t(2, 13), t(5, 3, 6, 4))


@pytest.mark.kda_contracts("check")  # the mode the decorated call must restore
def test_mode_is_a_decorator_too():
    @kc.mode("off")
    def call_unchecked():
        gated(t(2, 13), t(5, 3, 6, 4))
        return kc.get_mode()

    assert call_unchecked() == "off"
    assert kc.get_mode() == "check"


def test_unknown_mode_names_are_rejected():
    with pytest.raises(kc.AnnotationError, match="unknown mode 'loud'"):
        kc.mode("loud")


@pytest.mark.kda_contracts("check")  # the unmarked call must pass outside strict
def test_strict_mode_runs_value_checks_only_in_strict():
    def no_negatives(ctx):
        if bool((ctx.values["x"] < 0).any()):
            return [kc.Violation(kc.ValueRangeError, "x", ">= 0 everywhere", "a negative value")]
        return []

    @kc.contract(value_checks=no_negatives)
    def f(x: Float[Tensor, "B"]) -> None: ...

    f(-torch.ones(2))
    with kc.mode("strict"), pytest.raises(kc.ValueRangeError, match="a negative value"):
        f(-torch.ones(2))


# -- the generated fast path agrees with the interpreter --------------------------------------------
def test_generated_checker_and_interpreter_agree_on_mutations():
    c = packed.__kda_contract__
    g = torch.Generator().manual_seed(0)
    cases = 0
    for _ in range(300):
        dims = torch.randint(0, 4, (6,), generator=g).tolist()
        H, K, HV, V, B, N = (d + 1 for d in dims)
        x = t(B, 2 * H * K + HV * V + int(torch.randint(-1, 2, (1,), generator=g)))
        s = t(N, HV + int(torch.randint(0, 2, (1,), generator=g)), V, K)
        fast = c.check(x, s)
        _, violations = c.explain(x, s)
        assert (fast is None) == bool(violations), (x.shape, s.shape, violations)
        cases += 1
    assert cases == 300
