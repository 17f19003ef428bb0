"""The backend registry: availability with reasons, declarative support, auto selection,
entry-point plug-ins, and our kernels reached through kc.packed_decode."""

import sys
import textwrap

import pytest
import torch

import kda_contracts as kc
from kda_contracts import adapters
from kda_contracts.ops.packed_decode.adapters import Adapter, BackendError
from kda_contracts.testing import make_decode_call

CFG = kc.KDAConfig(num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)


@pytest.fixture
def registry():
    """Restore the registry after a test that adds adapters."""
    saved = dict(adapters._REGISTRY)
    yield
    adapters._REGISTRY.clear()
    adapters._REGISTRY.update(saved)
    adapters.refresh()


def calls_of(kernel_log):
    def kernel(*args, **kwargs):
        kernel_log.append(kwargs)

    return kernel


def test_builtin_backends_are_registered_highest_priority_first():
    assert adapters.names()[:4] == ["triton", "helion", "fla", "torch"]


def test_a_backend_whose_module_is_missing_says_so(registry):
    adapters.register(Adapter(name="ghost", kernel="nope:run", devices=("cpu",), requires=("not_a_module_xyz",)))
    assert adapters.available()["ghost"] == (False, "not_a_module_xyz is not installed")


def test_a_probe_that_raises_makes_the_backend_unavailable_not_the_call_fail(registry):
    def probe():
        raise OSError("driver exploded")

    adapters.register(Adapter(name="flaky", kernel="nope:run", devices=("cpu",), priority=99, availability=probe))
    ok, why = adapters.available()["flaky"]
    assert not ok and "driver exploded" in why
    kc.packed_decode(**make_decode_call(CFG, 2, 4))  # auto falls through to the reference


def test_auto_picks_the_highest_priority_backend_that_supports_the_call(registry):
    log: list = []
    adapters.register(Adapter(name="pow2-only", kernel=calls_of(log), devices=("cpu",), priority=50,
                              where=("pow2(V)", "K <= 64")))
    kc.packed_decode(**make_decode_call(CFG, 2, 4))
    assert log and log[0]["num_heads"] == 2 and log[0]["state_layout"] == "VK"
    odd = kc.KDAConfig(num_heads=2, head_k_dim=8, head_v_dim=12)
    log.clear()
    kc.packed_decode(**make_decode_call(odd, 2, 4))
    assert not log  # V=12 is not a power of two: the reference ran instead
    text = kc.explain_backends(**make_decode_call(odd, 2, 4))
    assert "pow2-only: not chosen: needs pow2(V) (got V=12)" in text
    assert "torch: chosen" in text


def test_declared_dtype_layout_and_gate_support_are_enforced(registry):
    adapters.register(Adapter(name="narrow", kernel=calls_of([]), devices=("cpu",), priority=50,
                              state_dtypes=frozenset({torch.bfloat16}), layouts=frozenset({"VK"}),
                              gates=frozenset({"softplus"})))
    call = make_decode_call(CFG.model_copy(update={"gate": "bounded", "lower_bound": -5.0}).revalidate(), 2, 4)
    with pytest.raises(BackendError) as info:
        kc.packed_decode(**call, backend="narrow")
    text = str(info.value)
    assert "[1] backend: BackendError" in text
    assert "'narrow': state dtype float32 not supported; bounded gate not supported" in text
    assert "fix: pass backend='auto' to let kda_contracts pick, or see packed_decode.explain_backends(...)" in text
    assert isinstance(info.value, kc.ContractError)


def test_a_backend_for_another_device_is_refused_by_name():
    with pytest.raises(BackendError, match=r"'fla': .*runs on cuda, not cpu"):
        kc.packed_decode(**make_decode_call(CFG, 2, 4), backend="fla")


def test_a_refused_backend_leaves_every_tensor_untouched():
    call = make_decode_call(CFG, 2, 4)
    before = call["initial_state"].clone(), call["out"].clone()
    with pytest.raises(BackendError):
        kc.packed_decode(**call, backend="fla")
    assert torch.equal(call["initial_state"], before[0]) and torch.equal(call["out"], before[1])


def test_register_refuses_a_duplicate_name_unless_replacing(registry):
    with pytest.raises(kc.AnnotationError, match="already registered"):
        adapters.register(Adapter(name="torch", kernel=calls_of([]), devices=("cpu",)))


def test_a_bad_adapter_constraint_is_an_annotation_error():
    with pytest.raises(kc.AnnotationError, match="adapter 'bad'"):
        Adapter(name="bad", kernel="x:y", devices=("cpu",), where=("K <=",))


def test_a_third_party_backend_plugs_in_through_its_entry_point(tmp_path, registry, monkeypatch):
    """A real distribution on sys.path (dist-info with entry_points.txt), as pip would install it."""
    (tmp_path / "my_kda_plugin.py").write_text(textwrap.dedent("""
        from kda_contracts.ops.packed_decode.adapters import Adapter

        CALLS = []

        def kernel(*args, **kwargs):
            CALLS.append(kwargs["num_heads"])

        def adapters():
            return [Adapter(name="plugin", kernel=kernel, devices=("cpu",), priority=77)]
    """))
    dist = tmp_path / "my_kda_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-kda-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kda_contracts.adapters]\nplugin = my_kda_plugin:adapters\n"
                                           "broken = my_kda_plugin:does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors = adapters.load_plugins(force=True)
    assert "plugin" in adapters.names() and adapters.names()[0] == "plugin"
    assert "broken" in errors and "does_not_exist" in errors["broken"]
    kc.packed_decode(**make_decode_call(CFG, 2, 4))
    assert sys.modules["my_kda_plugin"].CALLS == [2]


# -- our kernels through kc.packed_decode, on the CPU interpreter ------------------------------------
@pytest.mark.parametrize("backend", ["triton", "helion"])
@pytest.mark.parametrize("layout", ["VK", "KV"])
def test_our_kernels_run_by_name_and_match_the_reference(backend, layout):
    ok, why = adapters.get(backend).available()
    if not ok:
        pytest.skip(why)
    cfg = CFG.model_copy(update={"state_layout": layout}).revalidate()
    call = make_decode_call(cfg, 3, 6, activation_dtype=torch.float32)
    call["ssm_state_indices"][1] = -1
    ref = dict(call, initial_state=call["initial_state"].clone(), out=call["out"].clone())
    kc.packed_decode(**ref, config=cfg, backend="torch")
    kc.packed_decode(**call, config=cfg, backend=backend)
    torch.testing.assert_close(call["out"], ref["out"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(call["initial_state"], ref["initial_state"], atol=1e-5, rtol=1e-5)
    assert torch.equal(call["out"][1], torch.zeros_like(call["out"][1]))


def test_auto_never_picks_an_interpreted_kernel_on_the_cpu():
    text = kc.explain_backends(**make_decode_call(CFG, 2, 4))
    assert "triton: not chosen: runs on cuda, not cpu" in text and "torch: chosen" in text
