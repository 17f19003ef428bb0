"""The library's own entry points given values of the wrong kind, from a third adversarial review
(2026-12-06): each is an AnnotationError naming the entry point, never a raw ValueError, TypeError,
KeyError or torch's RuntimeError, and never taken and ignored. Messages pinned."""

from typing import Any

import numpy as np
import pytest
import torch
from jaxtyping import Float

import kda_contracts as kc
from kda_contracts import Tensor


def _kernel(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, *,  # type: ignore[no-untyped-def]
            num_heads, use_qk_l2norm, lower_bound, state_layout):
    ...


@pytest.mark.parametrize(("call", "message"), [
    (lambda: kc.mode("loud"), "mode: unknown mode 'loud'; expected one of 'off', 'check', 'strict', 'watch'"),
    (lambda: kc.mode(5), "mode: unknown mode 5; expected one of"),
    (lambda: kc.set_default_mode("loud"), "mode: unknown mode 'loud'"),
    (lambda: kc.mode("off")(5), "@kc.mode('off') takes a function (a coroutine or generator function too), got 5"),
    (lambda: kc.mode("off")(type("C", (), {})), "@kc.mode('off') takes a function (a coroutine or generator "
                                               "function too), got <class"),
    (lambda: kc.set_contract_docs("yes"), "kc.set_contract_docs: expected True or False, got 'yes'"),
    (lambda: kc.install_import_hook(b"pkg"), "kc.install_import_hook: expected a package name or several, got b'pkg'"),
    (lambda: kc.install_import_hook("my_pkg", doc="yes"), "kc.install_import_hook: doc= takes True, False or None, "
                                                         "got 'yes'"),
    (lambda: kc.check(torch.zeros(2, 3), Float[np.ndarray, "B D"]),
     "kc.check: only torch.Tensor arrays are supported, got <class 'numpy.ndarray'>"),
    (lambda: kc.packed_decode_contract("vk"), "packed_decode_contract: state_layout is 'VK' or 'KV', got 'vk'"),
    (lambda: kc.adapters.register(5), "register() takes a kda_contracts.adapters.Adapter, got int"),
    (lambda: kc.adapters.describe(5), "describe() takes a backend (kc.Backend or an Adapter), got 5"),
], ids=["mode", "mode-int", "default-mode", "mode-decorates-int", "mode-decorates-class", "contract-docs",
        "hook-bytes", "hook-doc", "check-numpy-type", "contract-layout", "adapters-register", "adapters-describe"])
def test_an_entry_point_given_the_wrong_kind_is_an_annotation_error(call: Any, message: str) -> None:
    with pytest.raises(kc.AnnotationError) as err:
        call()
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(layouts=("vk",)), "layouts= takes a collection of state layouts among 'VK' and 'KV', got ('vk',) ('vk' is "
                            "not one)"),
    (dict(layouts="VK"), "layouts= takes a collection of state layouts among 'VK' and 'KV', got 'VK'"),
    (dict(layouts=5), "layouts= takes a collection of state layouts among 'VK' and 'KV', got 5"),
    (dict(state_dtypes=("float32",)), "state_dtypes= takes a collection of torch dtypes, e.g. (torch.float32,), or "
                                      "None for all, got ('float32',) ('float32' is not one)"),
    (dict(state_dtypes=torch.float32), "state_dtypes= takes a collection of torch dtypes"),
    (dict(state_dtypes=frozenset()), "state_dtypes= takes a collection of torch dtypes, e.g. (torch.float32,), or "
                                     "None for all, got frozenset() (none: the backend would never run)"),
    (dict(gates=None), "gates= takes a collection of gates among 'softplus' and 'bounded', got None"),
    (dict(gates=("softmax",)), "gates= takes a collection of gates among 'softplus' and 'bounded', got ('softmax',) "
                               "('softmax' is not one)"),
], ids=["layout-case", "layout-str", "layout-int", "dtype-name", "dtype-bare", "dtypes-empty", "gates-none",
        "gate-unknown"])
def test_an_adapter_field_of_the_wrong_kind_is_refused_when_made(fields: dict[str, Any], message: str) -> None:
    # before: a typo left the backend never chosen (auto took the next one silently), and a field of
    # the wrong kind broke every kc.packed_decode call with a raw TypeError once registered
    with pytest.raises(kc.AnnotationError) as err:
        kc.adapters.Adapter(name="mine", kernel=_kernel, devices=("cpu",), **fields)
    assert str(err.value) == f"adapter 'mine': {message}" or str(err.value).startswith(f"adapter 'mine': {message}")


def test_an_adapter_field_given_as_a_list_is_kept_as_a_set() -> None:
    ad = kc.adapters.Adapter(name="mine", kernel=_kernel, devices=("cpu",), layouts=["VK"],
                             state_dtypes=[torch.float32])
    assert ad.layouts == frozenset({"VK"}) and ad.state_dtypes == frozenset({torch.float32})


def test_save_call_refuses_a_path_it_cannot_write_before_and_says_why(tmp_path: Any) -> None:
    @kc.contract(register=False)
    def f(x: Float[Tensor, "b"]) -> None: ...

    with pytest.raises(kc.AnnotationError, match=r"^kc.save_call: the path is a str or os.PathLike, got 5$"):
        kc.save_call(f, 5, torch.zeros(2))  # type: ignore[arg-type]
    missing = tmp_path / "no" / "such" / "folder" / "call.pt"
    with pytest.raises(kc.AnnotationError, match=r"^kc.save_call: cannot write '.*call.pt': ") as err:
        kc.save_call(f, missing, torch.zeros(2))
    assert err.value.__cause__ is not None  # torch's own error, kept as the cause
    assert kc.save_call(f, tmp_path / "call.pt", torch.zeros(2)).exists()


def test_save_call_refuses_a_backend_that_is_not_a_name(tmp_path: Any) -> None:
    @kc.op(name="edge_save_backend")
    def double(x: Float[Tensor, "b"]) -> Float[Tensor, "b"]:
        return 2 * x

    with pytest.raises(kc.AnnotationError, match=r"^kc.save_call: backend= takes a backend's name or 'auto', got 5$"):
        kc.save_call(double, tmp_path / "call.pt", torch.zeros(2), backend=5)


def test_kc_check_of_a_nested_tensor_is_a_shape_error() -> None:
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(kc.ShapeError, match=r"expected a tensor \[B D\]\n      got      a nested tensor \(no single "
                                            r"shape\)"):
        kc.check(nested, "B D")


def test_what_the_third_review_wrongly_refused_is_taken() -> None:
    # from the review of this session's change: each of these worked before the checks were added
    assert kc.InRange("i", low=np.int64(0)).bounds() == (0,)
    assert kc.StartsAt("cu", np.int64(0)).bounds() == (0,)
    assert kc.Spec(dtypes={torch.float16, torch.bfloat16}).dtypes == (torch.bfloat16, torch.float16)
    assert kc.Spec(dtypes=frozenset({torch.float32})).dtypes == (torch.float32,)
    ad = kc.adapters.Adapter(name="mine", kernel=_kernel, devices=("cpu",),
                             state_dtypes={"state": torch.float32}.values())
    assert ad.state_dtypes == frozenset({torch.float32})
    cfg = kc.KDAConfig.model_validate_strings({"num_heads": "4", "head_k_dim": "8", "use_qk_l2norm": "false",
                                               "scale": "0.25", "kda_layers": ["1", "3"]})
    assert (cfg.contract_dims(), cfg.use_qk_l2norm, cfg.scale, cfg.kda_layers) == \
        ({"H": 4, "HV": 4, "K": 8, "V": 8}, False, 0.25, (1, 3))
    with pytest.raises(kc.ConfigError, match=r"^invalid KDAConfig: num_heads: Input should be a valid integer "
                                             r"\(got 'four'\)$"):
        kc.KDAConfig.model_validate_strings({"num_heads": "four", "head_k_dim": "8"})
