"""Watch mode and declared value rules (``value_rules=``, ``kc.mode("watch")``, ``kc.raise_pending``),
on the CPU: each rule's violation names the argument and the element, in eager and compiled code;
valid calls never report; strict and watch word a violation alike; and the CUDA schedule (fold
into a flag, a copy that arrives later, the report at a later call) run on CPU tensors through a
stand-in channel (tests/test_watch_cuda.py runs the real one on a GPU)."""

from __future__ import annotations

import re
import warnings
from typing import Annotated

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
from kda_contracts._engine.contract import watch
from kda_contracts._engine.rules.memory import ValueChecksSkipped

RULES = [kc.InRange("idx", high="N", ignore_negative=True), kc.Distinct("idx"), kc.Finite("x"),
         kc.FiniteRows("pool", "idx"), kc.NonDecreasing("offsets"), kc.StartsAt("offsets", 0),
         kc.EndsAt("offsets", "B")]
RAN: list[int] = []


@kc.contract(value_rules=RULES)
def gather(x: Float[Tensor, "B D"], pool: Annotated[Float[Tensor, "N D"], kc.Spec(mutated=True)],
           idx: Int[Tensor, "B"], offsets: Int[Tensor, "C"]) -> Float[Tensor, "B D"]:
    if not torch.compiler.is_compiling():  # (a list dynamo would guard on)
        RAN.append(1)
    return pool.index_select(0, idx.clamp(0, pool.shape[0] - 1)) + x


def good(b: int = 3) -> dict[str, Tensor]:
    return {"x": torch.zeros(b, 4), "pool": torch.zeros(8, 4), "idx": torch.arange(b),
            "offsets": torch.tensor([0, 1, b])}


def broken(which: str) -> tuple[dict[str, Tensor], str, str]:
    """A call breaking one rule; the argument and the element its report must name."""
    call = good()
    if which == "InRange":
        call["idx"] = torch.tensor([0, 9, -1])
        return call, "idx", "idx[1] = 9"
    if which == "Distinct":
        call["idx"] = torch.tensor([2, 5, 2])
        return call, "idx", "idx[2] = 2, also at idx[0]"
    if which == "Finite":
        call["x"][2, 1] = float("nan")
        return call, "x", "x[2, 1] = nan"
    if which == "FiniteRows":
        call["pool"][1, 3] = float("inf")
        return call, "pool", "pool[1] holds inf (idx[1] = 1)"
    if which == "NonDecreasing":
        call["offsets"] = torch.tensor([0, 2, 1, 3])
        return call, "offsets", "offsets[2] = 1 after 2"
    if which == "StartsAt":
        call["offsets"] = torch.tensor([1, 2, 3])
        return call, "offsets", "offsets[0] = 1"
    call["offsets"] = torch.tensor([0, 1, 2])
    return call, "offsets", "offsets[2] = 2"


KINDS = ("InRange", "Distinct", "Finite", "FiniteRows", "NonDecreasing", "StartsAt", "EndsAt")


@pytest.fixture(autouse=True)
def _clean():
    watch.WATCHERS.clear()
    yield
    watch.WATCHERS.clear()


@pytest.mark.parametrize("which", KINDS)
def test_watch_mode_on_the_cpu_raises_a_broken_rule_before_the_function_runs(which):
    call, arg, where = broken(which)
    RAN.clear()
    with kc.mode("watch"), pytest.raises(kc.ValueRangeError) as info:
        gather(**call)
    assert not RAN
    (v,) = info.value.violations
    assert v.argument == arg and where in v.got and v.hint


@pytest.mark.parametrize("which", KINDS)
def test_strict_and_watch_word_a_broken_rule_alike(which):
    call, _, _ = broken(which)
    reports = []
    for mode in ("strict", "watch"):
        with kc.mode(mode), pytest.raises(kc.ValueRangeError) as info:
            gather(**call)
        reports.append(info.value.violations)
    assert reports[0] == reports[1]


def test_valid_calls_never_report_and_raise_pending_with_nothing_pending_is_a_no_op():
    with kc.mode("watch"):
        for b in (1, 2, 5):
            gather(**good(b))
        call = good()
        call["idx"] = torch.tensor([-1, 3, -1])  # padding repeats and is out of no range
        gather(**call)
        kc.raise_pending()
    kc.raise_pending()


def test_a_rule_naming_no_argument_or_dim_is_refused_at_decoration():
    with pytest.raises(kc.AnnotationError, match="names 'y', not a tensor argument"):
        @kc.contract(value_rules=[kc.Finite("y")])
        def f(x: Float[Tensor, "B"]) -> None: ...
    with pytest.raises(kc.AnnotationError, match="names the dim 'M'"):
        @kc.contract(value_rules=[kc.InRange("x", high="M")])
        def g(x: Float[Tensor, "B"]) -> None: ...


def test_tensors_without_data_skip_the_rules_with_a_warning():
    call = {k: v.to("meta") for k, v in good().items()}
    with kc.mode("watch"), pytest.warns(ValueChecksSkipped, match="no data in"):
        gather(**call)


def compiled(counter):
    def step(x, pool, idx, offsets):
        return gather(x, pool, idx, offsets) * 2
    return torch.compile(step, backend=counter, fullgraph=True)


@pytest.mark.parametrize("which", KINDS)
def test_a_compiled_function_in_watch_mode_records_a_broken_rule_for_raise_pending(which):
    torch._dynamo.reset()
    cf = compiled(CompileCounter())
    call, arg, where = broken(which)
    with kc.mode("watch"):
        cf(**call)  # no graph break, no read: the probes are in the graph
        with pytest.raises(kc.ValueRangeError) as info:
            kc.raise_pending()
    (v,) = info.value.violations
    assert v.argument == arg and "found by watch mode in call #" in "\n".join(v.details)
    assert where.split(" = ")[1] in v.got  # (the element by its flat index: compiled code records no shape)
    kc.raise_pending()  # reported once


def test_a_compiled_function_in_watch_mode_compiles_once_per_shape_class_and_the_block_exit_reports():
    torch._dynamo.reset()
    counter = CompileCounter()
    cf = compiled(counter)
    with kc.mode("watch"):
        for b in (2, 3, 4, 5, 6, 7):
            cf(**good(b))
    assert counter.frame_count == 2  # static, then one dynamic batch (as tests/test_compile.py counts)
    call, _, _ = broken("InRange")
    with pytest.raises(kc.ValueRangeError, match=r"call #\d+"), kc.mode("watch"):
        cf(**call)
    assert counter.frame_count == 2


class SlowChannel:
    """A stand-in for CudaChannel on CPU tensors: a copy arrives only when the test says so."""

    def __init__(self):
        self.sent: list[list[float]] = []
        self.delivered = 0

    def send(self, flag):
        self.sent.append(flag.tolist())

    def arrived(self, flag):
        return self.sent[self.delivered - 1] if self.delivered else None

    def wait(self, flag):
        return flag.tolist()

    def reset(self):
        self.sent, self.delivered = [], 0


@pytest.fixture
def deferred(monkeypatch):
    """Watch mode's CUDA schedule on the CPU: every tensor treated as a CUDA one, one SlowChannel."""
    channel = SlowChannel()
    monkeypatch.setattr(watch, "_on_cuda", lambda values, rule: True)
    monkeypatch.setattr(watch, "channel_for", lambda device: channel)
    return channel


def test_the_device_schedule_reports_at_the_first_call_whose_copy_arrived(deferred):
    call, _, _ = broken("Distinct")
    with kc.mode("watch"):
        RAN.clear()
        gather(**call)  # recorded, not raised: the kernel runs
        assert RAN
        gather(**good())
        gather(**call)  # a second violation: the flag keeps the first
        deferred.delivered = len(deferred.sent)
        with pytest.raises(kc.ValueRangeError) as info:
            gather(**good())
        text = str(info.value)
        assert "gather (watch, call #" in text and "idx[2] = 2, also at idx[0]" in text
        assert "that call may have written pool: do not trust them" in text
        gather(**good())  # reported once: the flag was cleared
        kc.raise_pending()


def test_the_device_schedule_reports_at_raise_pending_and_at_the_block_exit(deferred):
    call, _, _ = broken("Finite")
    with kc.mode("watch"):
        gather(**call)
        with pytest.raises(kc.ValueRangeError, match=r"x\[2, 1\] = nan"):
            kc.raise_pending()
    with pytest.raises(kc.ValueRangeError, match=r"x\[2, 1\] = nan"), kc.mode("watch"):
        gather(**call)
    with pytest.raises(ZeroDivisionError), kc.mode("watch"):  # an exception leaving the block wins
        gather(**call)
        raise ZeroDivisionError
    watch.WATCHERS.clear()


def test_fold_records_the_first_violation_only():
    flag = torch.zeros(watch.FLAG, dtype=torch.float64)
    ok = torch.tensor([[-1.0, 0, 0, 0]], dtype=torch.float64)
    watch.fold(flag, ok, 1)
    assert flag.tolist() == [0.0] * watch.FLAG
    watch.fold(flag, torch.tensor([[-1.0, 0, 0, 0], [4, 7.5, 2, 9]], dtype=torch.float64), 2)
    watch.fold(flag, torch.tensor([[0.0, 1, 1, 0]], dtype=torch.float64), 3)
    assert flag.tolist() == [1, 2, 1, 4, 7.5, 2, 9]


def test_an_op_declares_value_rules_and_watch_mode_checks_them():
    @kc.op(value_rules=[kc.InRange("idx", low=0, high="N")])
    def pick(pool: Float[Tensor, "N D"], idx: Int[Tensor, "B"], out: Annotated[Float[Tensor, "B D"],
                                                                              kc.Spec(mutated=True)]) -> None:
        out.copy_(pool.index_select(0, idx.clamp(0, pool.shape[0] - 1)))

    pool, out = torch.zeros(4, 2), torch.zeros(2, 2)
    with kc.mode("watch"):
        pick(pool, torch.tensor([0, 3]), out)
        with pytest.raises(kc.ValueRangeError, match=r"1 value\(s\) out of range; the first: idx\[0\] = -2"):
            pick(pool, torch.tensor([-2, 3]), out)
    with warnings.catch_warnings(), kc.mode("check"):
        warnings.simplefilter("error")
        pick(pool, torch.tensor([-2, 3]), out)  # check mode reads no values


def test_call_records_are_kept_safely_by_many_threads(monkeypatch):
    """Serials are unique and the oldest records are dropped without a race (a KeyError, or a dict
    changed during iteration) when several threads make watched calls at once."""
    import threading

    from kda_contracts._engine.contract import watch

    monkeypatch.setattr(watch, "RECORDS_MAX", 16)
    serials: list[int] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            for _ in range(2000):
                serials.append(watch._record(("f", (), (), {}, None, ())))
        except BaseException as exc:  # (what the race would raise)
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(serials)) == len(serials) == 16000 and len(watch.RECORDS) <= 16


def _check_kernel_runs_here() -> bool:
    """Whether the fused check kernel runs in this process on CPU tensors (Triton's interpreter):
    Triton 3.6's interpreter cannot (with NumPy 2.4 its loop bounds are 1-element arrays, which NumPy
    no longer turns into ints); Triton 3.9's can, and a GPU runs it compiled."""
    from kda_contracts._engine.rules import fused

    try:
        import triton  # noqa: F401

        flag = torch.zeros(watch.FLAG, dtype=torch.float64)
        fused.launch(fused.FusedState(torch.device("cpu"), flag, None),
                     [fused.slot_of(kc.InRange("i", high=2), {"i": torch.tensor([0, 5])}, {})], 1)
        return bool(flag[0])
    except Exception:
        return False


@pytest.mark.skipif(not _check_kernel_runs_here(), reason="the fused check kernel does not run in this Triton's "
                    "interpreter (Triton 3.6 with NumPy 2.4); tests/test_watch_fused.py has the kernel's own tests")
@pytest.mark.parametrize("which", KINDS)
def test_a_call_the_check_cache_answers_repeats_the_last_calls_slots_and_still_finds_its_violation(
        deferred, monkeypatch, which):
    """A call with the metadata of the last one (the check cache's same entry) reuses its kernel
    slots with the new tensors; a bad value in it is found as in a first call."""
    repeats: list[int] = []
    real = watch.ContractWatch.repeat
    monkeypatch.setattr(watch.ContractWatch, "repeat", lambda self, values: (repeats.append(1), real(self, values))[1])

    @kc.contract(value_rules=RULES, register=False)  # (its own check cache: other tests' calls leave it alone)
    def fresh(x: Float[Tensor, "B D"], pool: Annotated[Float[Tensor, "N D"], kc.Spec(mutated=True)],
              idx: Int[Tensor, "B"], offsets: Int[Tensor, "C"]) -> None:
        pass

    call, _, element = broken(which)
    same_shapes = all(call[k].shape == v.shape for k, v in good().items())
    with kc.mode("watch"):
        for _ in range(4):
            fresh(**good())
        primed = len(repeats)
        fresh(**call)
        with pytest.raises(kc.ValueRangeError, match=re.escape(element)):
            kc.raise_pending()
        fresh(**good())
        kc.raise_pending()
    assert primed >= 1  # the cache answered the third and fourth calls: the slots were repeated
    assert len(repeats) > primed or not same_shapes  # (and the bad call's too, when its metadata is the same)


def test_a_check_kernel_that_fails_to_launch_says_so_and_the_torch_probes_check_the_call(deferred, monkeypatch):
    from kda_contracts._engine.rules import fused

    def broken_launch(*args, **kwargs):
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(fused, "launch", broken_launch)
    monkeypatch.setitem(fused._usable, "ok", True)
    call, _, element = broken("Distinct")
    with kc.mode("watch"):
        with pytest.warns(RuntimeWarning, match="fused check kernel is off, value rules run as torch probes"):
            gather(**call)
        with pytest.raises(kc.ValueRangeError, match=re.escape(element)):
            kc.raise_pending()
        assert not fused.usable()
        gather(**call)  # (probes from now on, without another warning)
        with pytest.raises(kc.ValueRangeError, match=re.escape(element)):
            kc.raise_pending()


def test_eager_watched_calls_between_compiled_ones_cause_no_recompile(deferred):
    """The eager path's memory of the last call (the slots it repeats) is never read by traced code:
    40 compiled calls interleaved with eager ones of the same contract compile one graph."""
    torch._dynamo.reset()
    counter = CompileCounter()
    cf = compiled(counter)
    with kc.mode("watch"):
        for i in range(40):
            cf(**good())
            gather(**good(3 if i % 2 else 4))  # (the eager memory changes every call)
        kc.raise_pending()
    assert counter.frame_count == 1
    call, _, element = broken("Distinct")
    with kc.mode("watch"):
        cf(**call)
        with pytest.raises(kc.ValueRangeError, match=re.escape(element.split(", also")[0].split(" = ")[1])):
            kc.raise_pending()
    assert counter.frame_count == 1
