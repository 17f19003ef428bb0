"""An op's user code, held to the engine's promise: a backend declaration dispatch could not use
is refused at registration (AnnotationError saying what the field takes); a backend ``where=``
that cannot be evaluated for a call leaves that backend out, with the reason; and a user hook
that raises during a call (``value_checks=``, ``variant=``, ``written=``, ``explicit_devices``)
is a BackendError naming the hook and the op, its exception chained, with no tensor changed."""

from typing import Annotated

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.operation.backends import BackendError


def make_op(name, **options):
    @kc.op(name=name, returns="out", **options)
    def f(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)]) -> None:
        out.copy_(x * 2)

    return f


def make_pool_op(name, **options):
    @kc.op(name=name, returns="pool", **options)
    def f(x: Float[Tensor, "B D"], pool: Annotated[Float[Tensor, "N D"], kc.Spec(mutated=True)],
          idx: Int[Tensor, "B"]) -> None:
        keep = (idx >= 0) & (idx < pool.shape[0])
        pool[idx[keep]] = x[keep]

    return f


def recording_kernel(ran):
    def kernel(x, out):
        ran.append(1)
        out.fill_(7)

    return kernel


# -- a backend's where= that cannot be evaluated for a call ---------------------------------------
def test_a_backend_whose_where_divides_by_zero_is_not_applicable_and_auto_runs_the_next_one():
    op = make_op("where_div0_auto_op")
    ran = []
    op.backend("fast", devices=("cpu",), priority=5, where=["B % (D - 8) == 0"])(recording_kernel(ran))
    x, out = torch.ones(2, 8), torch.zeros(2, 8)
    for _ in range(3):  # the choice is cached per call signature: every call takes the same path
        assert op(x, out) is out
    assert ran == [] and torch.equal(out, x * 2)
    assert op.explain_backends(x, out).splitlines()[0] == \
        "    fast: not chosen: where B % (D - 8) == 0: division by zero (got B=2, D=8)"
    op(torch.ones(2, 4), torch.zeros(2, 4))  # D - 8 = -4 divides 2? no: a plain refusal
    op(torch.ones(4, 4), torch.zeros(4, 4))  # 4 % -4 == 0: the backend applies
    assert ran == [1]


def test_a_forced_backend_whose_where_divides_by_zero_is_refused_naming_the_condition():
    op = make_op("where_div0_forced_op")
    ran = []
    op.backend("fast", devices=("cpu",), priority=5, where=["B % (D - 8) == 0"])(recording_kernel(ran))
    x, out = torch.ones(2, 8), torch.zeros(2, 8)
    with pytest.raises(BackendError, match=r"got      'fast': where B % \(D - 8\) == 0: division by zero "
                                           r"\(got B=2, D=8\)"):
        op(x, out, backend="fast")
    assert ran == [] and torch.equal(out, torch.zeros(2, 8))


# -- backend declarations refused at registration -----------------------------------------------
@pytest.mark.parametrize(("declaration", "message"), [
    (dict(devices=(torch.device("cpu"),)), r"devices= takes a sequence of device types such as \('cpu', 'cuda'\) "
                                           r"\('\*': any device\), got \(device\(type='cpu'\),\): device\(type='cpu'\) "
                                           r"is a torch.device, not a device type \(write 'cpu'\)"),
    (dict(devices=None), r"backend 'k': devices= takes a sequence of device types such as \('cpu', 'cuda'\) "
                         r"\('\*': any device\), got None$"),
    (dict(devices=("CPU",)), r"got \('CPU',\): 'CPU' is not a device type \(they are lowercase names: 'cpu', "
                             r"'cuda', 'mps', \.\.\.\)"),
    (dict(devices=("cpu:0",)), r"got \('cpu:0',\): 'cpu:0' is a device, not a device type \(write 'cpu': a backend "
                               r"runs on every index\)"),
    (dict(devices=("cuda",), explicit_devices=("cuda:1",)), r"explicit_devices= takes a sequence of device types .*"
                                                            r"'cuda:1' is a device, not a device type"),
    (dict(priority="high"), r"priority= takes an int \(backend='auto' tries the highest first\), got 'high'"),
    (dict(priority=None), r"priority= takes an int \(backend='auto' tries the highest first\), got None"),
    (dict(priority=True), r"priority= takes an int .*, got True"),
    (dict(dtypes={"x": "float32"}), r"dtypes= takes \{'arg': \(torch.float16, \.\.\.\)\}, or a sequence of torch "
                                    r"dtypes for every floating tensor argument, got \{'x': 'float32'\}: "
                                    r"'x': 'float32' is not a sequence of torch dtypes \(write \(torch.float32,\)\)"),
    (dict(dtypes=("float32",)), r"got \('float32',\): 'float32' is not a torch.dtype \(write torch.float32\)"),
    (dict(dtypes={"x": torch.float32}), r"'x': torch.float32 alone is not a sequence \(write \(torch.float32,\)\)"),
    (dict(dtypes={"x": ()}), r"'x': no dtype is listed \(the backend would never run\)"),
    (dict(where=None), r"where= takes a sequence of strings, got None"),
    (dict(requires=("triton", None)), r"requires= takes a sequence of strings, got \('triton', None\): None is not a "
                                      r"str"),
    (dict(availability=True), r"availability= takes a probe \(\) -> \(ok, why\), or None, got True"),
])
def test_a_backend_declaration_dispatch_cannot_use_is_refused_at_registration(declaration, message):
    op = make_op("bad_declaration_op")
    ran = []
    with pytest.raises(kc.AnnotationError, match=message) as info:
        op.backend("k", **{"devices": ("cpu",), "priority": 50, **declaration})(recording_kernel(ran))
    assert str(info.value).startswith("bad_declaration_op: backend 'k': ")
    assert [b.name for b in op.backends()] == ["torch"]
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    assert op(x, out) is out and ran == [] and torch.equal(out, x * 2)


@pytest.mark.parametrize("kernel", [42, None, "no_colon_module", "module:", ":function"])
def test_a_kernel_that_is_neither_callable_nor_module_function_is_refused(kernel):
    op = make_op("bad_kernel_op")
    with pytest.raises(kc.AnnotationError, match=r"^bad_kernel_op: backend 'k': kernel= takes the kernel \(a "
                                                 r"callable\) or 'module:function' \(imported on first use\), got "):
        op.backend("k", devices=("cpu",), priority=50)(kernel)
    with pytest.raises(kc.AnnotationError, match=r"^backend 'k': kernel= takes the kernel"):
        kc.Backend(name="k", kernel=kernel, devices=("cpu",))
    assert [b.name for b in op.backends()] == ["torch"]


def test_a_backend_declared_with_lists_and_generators_is_stored_as_tuples_and_runs():
    op = make_op("list_declaration_op")
    ran = []
    b = op.register_backend(kc.Backend(name="k", kernel=recording_kernel(ran), devices=["cpu"], priority=50,
                                       dtypes={"x": (d for d in (torch.float32,))}, explicit_devices=["meta"]))
    assert b.devices == ("cpu",) and b.dtypes == {"x": (torch.float32,)} and b.explicit_devices == ("meta",)
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    op(x, out)
    op(x, out, backend="k")
    assert ran == [1, 1] and torch.equal(out, torch.full((2, 3), 7.0))


def test_a_kernel_with_the_wrong_signature_is_an_annotation_error_and_still_a_type_error():
    op = make_op("wrong_signature_op")
    with pytest.raises(kc.AnnotationError, match=r"the kernel '.*<lambda>' does not take the op's parameters") as info:
        op.backend("k", devices=("cpu",))(lambda x: None)
    assert isinstance(info.value, TypeError)


# -- explicit_devices, asked per call -----------------------------------------------------------
def test_an_explicit_devices_callable_that_raises_is_a_backend_error_when_the_backend_is_asked_for():
    def broken():
        raise RuntimeError("probe bug")

    op = make_op("explicit_raise_op")
    ran = []
    op.backend("k", devices=("cuda",), priority=50, explicit_devices=broken)(recording_kernel(ran))
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.raises(BackendError, match=r"expected the explicit_devices\(\) of backend 'k' to name the device "
                                           r"types it runs on when asked by name\n\s+got      it raised RuntimeError: "
                                           r"probe bug") as info:
        op(x, out, backend="k")
    assert isinstance(info.value.__cause__, RuntimeError) and ran == [] and torch.equal(out, torch.zeros(2, 3))
    assert op(x, out) is out and torch.equal(out, x * 2)  # auto never asks it (a CPU call, a CUDA backend)


def test_an_explicit_devices_callable_returning_no_device_types_says_what_it_must_return():
    op = make_op("explicit_str_op")
    op.backend("k", devices=("cuda",), priority=50, explicit_devices=lambda: "cpu")(recording_kernel([]))
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.raises(kc.AnnotationError, match=r"^explicit_str_op: backend 'k': explicit_devices\(\) returned 'cpu'; "
                                                 r"it must return a sequence of device types such as \('cpu', "
                                                 r"'cuda'\) \('\*': any device\) \(write \('cpu',\)\)$"):
        op(x, out, backend="k")
    assert torch.equal(out, torch.zeros(2, 3))


# -- value_checks= and variant= that raise -------------------------------------------------------
def test_value_checks_that_raise_are_a_backend_error_naming_the_hook_and_run_no_backend():
    def value_checks(ctx):
        raise RuntimeError("value check bug")

    op = make_op("raising_checks_op", value_checks=value_checks)
    ran = []
    op.backend("k", devices=("cpu",), priority=50)(recording_kernel(ran))
    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with kc.mode("strict"):
        for call in (lambda: op(x, out), lambda: op.validate_values({"x": x, "out": out}, strict=True)):
            with pytest.raises(BackendError, match=r"^raising_checks_op\(\): 1 contract violation\n"
                                                   r"  \[1\] value_checks: BackendError\n"
                                                   r"      expected the op's value checks to run on the arguments\n"
                                                   r"      got      they raised RuntimeError: value check bug\n"
                                                   r"      fix: no backend ran: the call changed no tensor") as info:
                call()
            assert isinstance(info.value.__cause__, RuntimeError)
    assert ran == [] and torch.equal(out, torch.zeros(2, 3))
    with kc.mode("check"):
        assert op(x, out) is out and ran == [1]  # check mode runs no value checks


def _rows(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)],
          layout: str) -> None: ...


def _cols(x: Float[Tensor, "D B"], out: Annotated[Float[Tensor, "D B"], kc.Spec(mutated=True)],
          layout: str) -> None: ...


def test_a_variants_own_value_checks_that_raise_are_a_backend_error_too():
    def value_checks(ctx):
        raise KeyError("oops")

    @kc.op(name="variant_checks_op", returns="out", variants={"rows": (_rows, {"value_checks": value_checks}),
                                                              "cols": _cols}, variant=lambda layout: layout)
    def op(x, out, layout: str) -> None:
        out.copy_(x)

    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    with kc.mode("strict"):
        with pytest.raises(BackendError, match=r"value_checks: BackendError\n.*\n.*they raised KeyError: 'oops'"):
            op(x, out, "rows")
        assert torch.equal(out, torch.zeros(2, 3))
        op(x, out, "cols")  # the other variant has no value checks
    assert torch.equal(out, x)


def test_a_variant_selector_that_raises_is_a_backend_error_naming_it_on_every_path():
    def layout_of(layout):
        raise RuntimeError("variant bug")

    @kc.op(name="raising_variant_op", returns="out", variants={"rows": _rows, "cols": _cols}, variant=layout_of)
    def op(x, out, layout: str) -> None:
        out.copy_(x)

    x, out = torch.ones(2, 3), torch.zeros(2, 3)
    message = (r"^raising_variant_op\(\): 1 contract violation\n  \[1\] variant: BackendError\n"
               r"      expected the op's variant= to name the variant of the call \(one of 'rows', 'cols'\)\n"
               r"      got      it raised RuntimeError: variant bug\n")
    for mode in ("check", "strict", "off"):
        with kc.mode(mode), pytest.raises(BackendError, match=message) as info:
            op(x, out, "rows")
        assert isinstance(info.value.__cause__, RuntimeError)
    for call in (op.validate, op.explain_backends):
        with pytest.raises(BackendError, match=message):
            call(x, out, "rows")
    assert torch.equal(out, torch.zeros(2, 3))
    assert op.variant_of.__name__ == "layout_of"  # what the docs show of the selector


# -- written= --------------------------------------------------------------------------------------
def test_written_rows_with_padding_are_a_contract_error_saying_negative_ids_are_not_rows():
    op = make_pool_op("padded_written_op", written=lambda ctx: {"pool": ctx.values["idx"]})
    x, pool = torch.ones(2, 4), torch.zeros(3, 4)
    with kc.mode("strict"), pytest.raises(BackendError, match=(
            r"^padded_written_op\(\): 1 contract violation\n  \[1\] written: BackendError\n"
            r"      expected the op's written= to give row ids of pool in 0..2 \(a negative id, padding, is not a "
            r"row\)\n      got      row ids from -1 to 0\n"
            r"      fix: leave padding and out-of-range ids out: rows\[\(rows >= 0\) & \(rows < pool.shape\[0\]\)\]")):
        op(x, pool, torch.tensor([0, -1]))
    assert torch.equal(pool, torch.zeros(3, 4))


def test_written_rows_past_the_end_are_refused_too_and_rows_inside_still_roll_back():
    def never(ctx, backend):
        return [kc.Violation(kc.ValueRangeError, "pool", "something", "else")]

    op = make_pool_op("ranged_written_op", after=never, written=lambda ctx: {"pool": ctx.values["idx"]})
    x, pool = torch.ones(2, 4), torch.zeros(3, 4)
    with kc.mode("strict"):
        with pytest.raises(BackendError, match=r"got      row ids from 1 to 3\n"):
            op(x, pool, torch.tensor([1, 3]))
        assert torch.equal(pool, torch.zeros(3, 4))
        with pytest.raises(kc.ValueRangeError, match="strict mode rolled the call back"):
            op(x, pool, torch.tensor([2, 0]))  # valid rows: the backend ran, the after check rejected it
    assert torch.equal(pool, torch.zeros(3, 4))


@pytest.mark.parametrize(("returned", "said"), [
    ({"pool": "all"}, "a str for 'pool'"),
    ({"pool": [0, 1]}, "a list for 'pool'"),
    ({"pool": torch.tensor([0.0, 1.0])}, "a Tensor for 'pool'"),
    ({"pool": torch.tensor([[0, 1]])}, "a Tensor for 'pool'"),
    ("pool", "str"),
    (None, "NoneType"),
])
def test_written_returning_the_wrong_kind_says_what_it_must_return(returned, said):
    op = make_pool_op(f"wrong_written_op_{len(said)}_{type(returned).__name__}", written=lambda ctx: returned)
    x, pool = torch.ones(2, 4), torch.zeros(3, 4)
    with kc.mode("strict"), pytest.raises(kc.AnnotationError, match=(
            rf": written= returned {said}; it must return \{{arg: None \(all of it\) \| the rows of its dim 0 the "
            r"call writes, a 1-D integer tensor of row ids\}$")):
        op(x, pool, torch.tensor([0, 1]))
    assert torch.equal(pool, torch.zeros(3, 4))


def test_written_that_raises_is_a_backend_error_naming_the_hook():
    def written(ctx):
        raise IndexError("written bug")

    op = make_pool_op("raising_written_op", written=written)
    x, pool = torch.ones(2, 4), torch.zeros(3, 4)
    with kc.mode("strict"), pytest.raises(BackendError, match=(
            r"\[1\] written: BackendError\n      expected the op's written= to say what the call writes\n"
            r"      got      it raised IndexError: written bug\n")) as info:
        op(x, pool, torch.tensor([0, 1]))
    assert isinstance(info.value.__cause__, IndexError) and torch.equal(pool, torch.zeros(3, 4))
    with kc.mode("check"):
        assert op(x, pool, torch.tensor([0, 1])) is pool  # check mode never asks written=


def test_a_device_type_torch_does_not_know_yet_is_accepted() -> None:
    # a plug-in's device type (its torch extension imported later) is a lowercase name like the others
    b = kc.Backend(name="k", kernel=lambda x: None, devices=("npu", "privateuseone"))
    assert b.devices == ("npu", "privateuseone")
