"""Property-based fuzzing of the packed-decode contract.

A strategy draws *valid* packed-decode calls across configs (H, HV a multiple of H, K and V from 1
to 16 with K != V as often as not, B 0..6, N 1..8, every dtype, both state layouts declared by a
config or the ``state_layout=`` keyword, both gates, with or without an agreeing ``KDAConfig``,
row-padded activations and strided pools). Mutations then break one or more properties: rank, a
dim, a dtype, the device, the strides, the indices (out of range, duplicated, wrong dtype), the
values (NaN/Inf), ``out`` aliasing an input or the pool, the scalars, the config, the declared
layout, the Python types. Each mutation knows what it breaks, so every case has an expected
verdict, and the tests assert, for every case:

- the verdict: a valid call is accepted with the right dims; a broken one raises exactly the
  documented ``ContractError`` kinds; value problems only in strict mode;
- no exception other than a ``ContractError`` ever escapes (validation or the torch backend);
- a rejected ``kc.packed_decode`` leaves every byte of every tensor's storage as it was;
- the generated fast checker and the slow interpreter (``ContractSpec.explain``) agree.

Budget: the ``dev`` and ``ci`` profiles (tests/conftest.py) keep this file to a few tens of seconds
on two cores; set ``HYPOTHESIS_PROFILE=long`` for a long local run. Failures print a
``@reproduce_failure`` blob.
Counters (cases, mutations, rejections, escapes) are printed at the end of the module and, with
``KDA_FUZZ_STATS=folder``, written to a JSON file there (docs/reliability.md quotes them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from fuzz_stats import report_counters
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import kda_contracts as kc
from kda_contracts._engine.explain.explainer import explain_call

# -- budget ------------------------------------------------------------------------------------------
# A share of the loaded profile's examples: "dev" or "ci" (200), or "long" (5000) for local runs:
# HYPOTHESIS_PROFILE=long pytest tests/test_fuzz_packed_decode.py. Profiles: tests/conftest.py.


def budget(fraction: float) -> settings:
    """The profile's settings with ``fraction`` of its example budget (seed blob always printed)."""
    return settings(max_examples=max(10, int(settings.default.max_examples * fraction)), deadline=None,
                    print_blob=True)


STATS: Counter[str] = Counter(escapes=0)  # escapes: exceptions other than ContractError (must stay 0)

ACT = (torch.bfloat16, torch.float16, torch.float32)
STATE = (torch.float32, torch.bfloat16, torch.float16)
INDEX = (torch.int32, torch.int64)
TENSORS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")
ALLOWED = {"mixed_qkv": ACT, "a": ACT, "b": ACT, "A_log": (torch.float32,), "dt_bias": (torch.float32,),
           "initial_state": STATE, "out": ACT, "ssm_state_indices": INDEX}
# The layout rule of each tensor, from the table in docs/packed-decode.md.
LAYOUT_RULE = {"mixed_qkv": ("inner", 1), "a": ("inner", 1), "b": ("inner", 1), "A_log": ("contiguous",),
               "dt_bias": ("contiguous",), "initial_state": ("pool",), "out": ("contiguous",),
               "ssm_state_indices": ("contiguous",)}


class PlainDims(BaseModel):
    """A config that is a plain pydantic model: its int fields bind dims by name, nothing else."""

    H: int
    HV: int
    K: int
    V: int


def _config_dims(config: kc.KDAConfig | PlainDims) -> dict[str, int]:
    if isinstance(config, PlainDims):
        return config.model_dump()
    return dict(config.contract_dims())


# -- the case model ----------------------------------------------------------------------------------
@dataclass
class Call:
    """One packed-decode call and what the contract must say about it."""

    args: dict[str, Any]  # the 11 positional arguments of sglang's signature, by name
    config: kc.KDAConfig | PlainDims | None
    state_layout: str | None  # the keyword, when the call passes it
    layout: str  # the layout the call is checked against
    dims: dict[str, int]
    meta_kinds: set[type] = field(default_factory=set)  # kinds any mode must report
    value_problem: bool = False  # something only strict mode reads
    masked_by: type | None = None  # raised alone, before the contract (layout keyword) or instead of it (types)
    touched: set[str] = field(default_factory=set)
    mutations: list[str] = field(default_factory=list)

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(self.args, config=self.config)
        if self.state_layout is not None:
            kw["state_layout"] = self.state_layout
        return kw

    def expected(self, strict: bool) -> set[type]:
        """The kinds the call must raise in this mode (empty: accepted)."""
        if self.masked_by is not None:
            return {self.masked_by}
        if self.meta_kinds:
            return set(self.meta_kinds)
        return {kc.ValueRangeError} if strict and self.value_problem else set()

    def typed(self) -> bool:
        return self.masked_by is None


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(g: torch.Generator, batch: int, width: int, pad: int, dtype: torch.dtype) -> torch.Tensor:
    full = torch.randn(batch, width + pad, generator=g).to(dtype)
    return full[:, :width]  # row stride width + pad, last dim dense: valid


def _pool(g: torch.Generator, N: int, HV: int, inner: tuple[int, int], dtype: torch.dtype, style: str,
          pad: int) -> torch.Tensor:
    slot = HV * inner[0] * inner[1]
    if style == "every_other":  # a strided slice of a bigger buffer: bytes between slots exist
        big = (0.1 * torch.randn(2 * N, HV, *inner, generator=g)).to(dtype)
        return big[::2]
    storage = (0.1 * torch.randn(N * (slot + pad) + 1, generator=g)).to(dtype)
    return storage.as_strided((N, HV, *inner), (slot + pad, inner[0] * inner[1], inner[1], 1), 1)


@st.composite
def valid_calls(draw: st.DrawFn) -> Call:
    H = draw(st.integers(1, 3))
    HV = H * draw(st.integers(1, 3))
    K = draw(st.integers(1, 16))
    V = K if draw(st.booleans()) else draw(st.integers(1, 16))
    B = draw(st.integers(0, 6))
    N = draw(st.integers(1, 8))
    act, sdt, idt = draw(st.sampled_from(ACT)), draw(st.sampled_from(STATE)), draw(st.sampled_from(INDEX))
    layout = draw(st.sampled_from(("VK", "KV")))
    lower_bound = -draw(st.sampled_from((5.0, 0.5, 1e-3))) if draw(st.booleans()) else None
    l2norm = draw(st.booleans())
    config: kc.KDAConfig | PlainDims | None = None
    keyword: str | None
    kind = draw(st.sampled_from(("none", "KDAConfig", "plain pydantic")))
    if kind == "plain pydantic":
        config = PlainDims(H=H, HV=HV, K=K, V=V)
        scale = draw(st.sampled_from((K ** -0.5, 2.0)))
        keyword = layout if layout == "KV" else draw(st.sampled_from((None, "VK")))
    elif kind == "KDAConfig":
        tp = draw(st.sampled_from((1, 2, 4)))
        pins = {role: (dt if draw(st.booleans()) else None) for role, dt in
                (("state_dtype", sdt), ("activation_dtype", act), ("index_dtype", idt))}
        config = kc.KDAConfig(
            num_heads=H * tp, num_v_heads=HV * tp, head_k_dim=K, head_v_dim=V, tp_size=tp,
            gate="softplus" if lower_bound is None else "bounded", lower_bound=lower_bound,
            state_layout=layout, use_qk_l2norm=l2norm,
            scale=draw(st.sampled_from((None, 0.25, 3.0))),
            **{k: (str(v).removeprefix("torch.") if v is not None else None) for k, v in pins.items()},
        )
        scale = config.scale * (1 + draw(st.sampled_from((0.0, 1e-8))))  # within MatchConfig's rel_tol
        keyword = draw(st.sampled_from((None, layout)))
    else:
        scale = draw(st.sampled_from((K ** -0.5, 1.0, 1e-3, 12.5)))
        keyword = layout if layout == "KV" else draw(st.sampled_from((None, "VK")))
    seed = draw(st.integers(0, 2 ** 16))
    g = _gen(seed)
    pad = draw(st.sampled_from((0, 0, 3)))
    inner = (V, K) if layout == "VK" else (K, V)
    pool = _pool(g, N, HV, inner, sdt, draw(st.sampled_from(("dense", "slot_pad", "every_other"))),
                 draw(st.sampled_from((0, 5))))
    # Indices: distinct slots, or padding (any negative number, including huge ones).
    perm = draw(st.permutations(range(N)))
    low = -(2 ** 31) if idt == torch.int32 else -(2 ** 62)
    idx = []
    for i in range(B):
        if i < N and draw(st.integers(0, 3)):
            idx.append(perm[i])
        else:
            idx.append(draw(st.sampled_from((-1, -2, low))))
    out_fill = draw(st.sampled_from((0.0, float("nan"))))  # out is write-only: garbage in it is fine
    args = {
        "mixed_qkv": _rows(g, B, 2 * H * K + HV * V, pad, act),
        "a": _rows(g, B, HV * K, pad, act),
        "b": _rows(g, B, HV, pad, act),
        "A_log": torch.rand(HV, generator=g).mul(2.7).add(0.1).log(),
        "dt_bias": 0.5 * torch.randn(HV * K, generator=g),
        "scale": scale,
        "initial_state": pool,
        "out": torch.full((B, 1, HV, V), out_fill, dtype=act),
        "ssm_state_indices": torch.tensor(idx, dtype=idt),
        "use_qk_l2norm_in_kernel": l2norm,
        "lower_bound": lower_bound,
    }
    return Call(args, config, keyword, layout, dict(B=B, H=H, HV=HV, K=K, V=V, N=N))


# -- mutations ---------------------------------------------------------------------------------------
def _other_layout(layout: str) -> str:
    return "KV" if layout == "VK" else "VK"


def _fresh(shape: tuple[int, ...], like: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed)).to(like.dtype)


def _layout_ok(name: str, t: torch.Tensor) -> bool:
    """The layout rule of docs/packed-decode.md, written independently of the library."""
    rule = LAYOUT_RULE[name]
    if rule[0] == "contiguous":
        return t.is_contiguous()
    n = 3 if rule[0] == "pool" else rule[1]
    shape, stride, block = t.shape, t.stride(), 1
    for ax in range(t.dim() - 1, t.dim() - 1 - n, -1):
        if shape[ax] != 1 and stride[ax] != block:
            return False
        block *= max(shape[ax], 1)
    # A pool is written in place: its slots may be anywhere, but must not overlap.
    return not (rule[0] == "pool" and shape[0] > 1 and stride[0] < block)


def _width_ok(width: int, call: Call) -> int | None:
    """The H a mixed_qkv width implies, when the call stays valid with it (else None)."""
    d = call.dims
    rest = width - d["HV"] * d["V"]
    if rest <= 0 or rest % (2 * d["K"]):
        return None
    h = rest // (2 * d["K"])
    if d["HV"] % h or (call.config is not None and h != _config_dims(call.config)["H"]):
        return None
    return h


def _untouched_tensors(call: Call, *, numel: bool = False, floating: bool = False) -> list[str]:
    names = []
    for n in TENSORS:
        t = call.args[n]
        if n in call.touched or not isinstance(t, torch.Tensor):
            continue
        if numel and t.numel() == 0:
            continue
        if floating and not t.is_floating_point():
            continue
        names.append(n)
    return names


@dataclass(frozen=True)
class Mutation:
    name: str
    applies: Callable[[Call], bool]
    apply: Callable[[Call, st.DrawFn], None]

    def __repr__(self) -> str:
        return self.name


def _rank(call: Call, draw: st.DrawFn) -> None:
    n = draw(st.sampled_from(_untouched_tensors(call)))
    t = call.args[n]
    how = draw(st.sampled_from(["unsqueeze", "flatten", "drop"] if t.dim() >= 2 and t.shape[0] else ["unsqueeze"]))
    if how == "unsqueeze":
        t = t.unsqueeze(draw(st.integers(0, t.dim())))
    elif how == "flatten":
        t = t.flatten(-2)
    else:
        t = t[0]
    call.args[n] = t
    call.touched.add(n)
    call.meta_kinds.add(kc.ShapeError)
    call.mutations.append(f"rank:{n}:{how}")


def _dim(call: Call, draw: st.DrawFn) -> None:
    n = draw(st.sampled_from(_untouched_tensors(call)))
    t = call.args[n]
    axis = draw(st.integers(0, t.dim() - 1))
    old = t.shape[axis]
    new = draw(st.integers(0, old + 3).filter(lambda s: s != old))
    if n == "initial_state" and axis == 0:  # the pool size is free; an empty pool is not
        new = 0
    shape = list(t.shape)
    shape[axis] = new
    call.args[n] = _fresh(tuple(shape), t, new) if t.is_floating_point() else torch.zeros(shape, dtype=t.dtype)
    call.touched.add(n)
    call.mutations.append(f"dim:{n}[{axis}]:{old}->{new}")
    if n == "mixed_qkv" and axis == 1 and (h := _width_ok(new, call)) is not None:
        call.dims["H"] = h  # another H fits that width: still a valid call
        return
    call.meta_kinds.add(kc.ShapeError)


BAD_DTYPES = {
    "float": (torch.float64, torch.int32, torch.int8, torch.bool, torch.uint8, torch.float8_e4m3fn),
    "fp32only": (torch.bfloat16, torch.float16, torch.float64, torch.int32),
    "index": (torch.int16, torch.int8, torch.uint8, torch.float32, torch.bool),
}


def _dtype(call: Call, draw: st.DrawFn) -> None:
    n = draw(st.sampled_from(_untouched_tensors(call)))
    group = "index" if n == "ssm_state_indices" else "fp32only" if n in ("A_log", "dt_bias") else "float"
    dt = draw(st.sampled_from(BAD_DTYPES[group]))
    call.args[n] = call.args[n].to(dt)
    call.touched.add(n)
    call.meta_kinds.add(kc.DtypeError)
    call.mutations.append(f"dtype:{n}:{dt}")


def _out_dtype(call: Call, draw: st.DrawFn) -> None:
    want = call.args["mixed_qkv"].dtype
    dt = draw(st.sampled_from([d for d in ACT if d != want]))
    call.args["out"] = call.args["out"].to(dt)
    call.touched.add("out")
    call.meta_kinds.add(kc.DtypeError)
    call.mutations.append(f"out-dtype:{dt}")


def _device(call: Call, draw: st.DrawFn) -> None:
    n = draw(st.sampled_from(_untouched_tensors(call)))
    call.args[n] = call.args[n].to("meta")
    call.touched.add(n)
    call.meta_kinds.add(kc.DeviceError)
    call.mutations.append(f"device:{n}:meta")


def _strides(call: Call, draw: st.DrawFn) -> None:
    """Same shape and dtype, other strides: a permuted copy, a step along the last dim, an expand."""
    n = draw(st.sampled_from(_untouched_tensors(call)))
    t = call.args[n]
    styles = ["step"]
    big_axes = [ax for ax in range(t.dim()) if t.shape[ax] > 1]
    if len(big_axes) >= 2:
        styles.append("permute")
    if big_axes and n != "ssm_state_indices":  # expanding the indices would change their values
        styles.append("expand")
    style = draw(st.sampled_from(styles))
    if style == "step":
        axis = draw(st.integers(0, t.dim() - 1))
        shape = list(t.shape)
        shape[axis] *= 2
        new = torch.zeros(shape, dtype=t.dtype)[(slice(None),) * axis + (slice(None, None, 2),)]
        new.copy_(t)
    elif style == "permute":
        i, j = draw(st.lists(st.sampled_from(big_axes), min_size=2, max_size=2, unique=True))
        new = t.transpose(i, j).contiguous().transpose(i, j)
    else:
        axis = draw(st.sampled_from(big_axes))
        new = t.narrow(axis, 0, 1).expand(t.shape)
    assert new.shape == t.shape
    call.args[n] = new
    call.touched.add(n)
    call.mutations.append(f"strides:{n}:{style}:{tuple(new.stride())}")
    if not _layout_ok(n, new):
        call.meta_kinds.add(kc.LayoutError)


def _index_range(call: Call, draw: st.DrawFn) -> None:
    idx = call.args["ssm_state_indices"]
    i = draw(st.integers(0, idx.numel() - 1))
    top = 2 ** 31 - 1 if idx.dtype == torch.int32 else 2 ** 62
    idx = idx.clone()
    idx[i] = draw(st.sampled_from((call.dims["N"], call.dims["N"] + 5, top)))
    call.args["ssm_state_indices"] = idx
    call.touched.add("ssm_state_indices")
    call.value_problem = True
    call.mutations.append(f"index>=N:row{i}={int(idx[i])}")


def _index_dup(call: Call, draw: st.DrawFn) -> None:
    idx = call.args["ssm_state_indices"].clone()
    i, j = draw(st.lists(st.integers(0, idx.numel() - 1), min_size=2, max_size=2, unique=True))
    slot = int(idx[i]) if 0 <= int(idx[i]) < call.dims["N"] else draw(st.integers(0, call.dims["N"] - 1))
    idx[i] = idx[j] = slot
    call.args["ssm_state_indices"] = idx
    call.touched.add("ssm_state_indices")
    call.value_problem = True
    call.mutations.append(f"index-duplicate:rows{i},{j}={slot}")


def _nonfinite(call: Call, draw: st.DrawFn) -> None:
    names = [n for n in _untouched_tensors(call, numel=True, floating=True)
             if n in ("mixed_qkv", "a", "b", "A_log", "dt_bias")]
    n = draw(st.sampled_from(names))
    t = call.args[n].clone(memory_format=torch.contiguous_format)
    value = draw(st.sampled_from((float("nan"), float("inf"), float("-inf"))))
    t.view(-1)[draw(st.integers(0, t.numel() - 1))] = value
    call.args[n] = t
    call.touched.add(n)
    call.value_problem = True
    call.mutations.append(f"nonfinite:{n}:{value}")


def _alias_targets(call: Call) -> list[str]:
    if {"out"} & call.touched or call.dims["B"] == 0:
        return []
    out = call.args["out"]
    targets = []
    for n in ("mixed_qkv", "initial_state"):
        t = call.args[n]
        if n in call.touched or t.dtype != out.dtype:
            continue
        if t.untyped_storage().nbytes() - t.storage_offset() * t.element_size() >= out.numel() * out.element_size():
            targets.append(n)
    return targets


def _alias(call: Call, draw: st.DrawFn) -> None:
    n = draw(st.sampled_from(_alias_targets(call)))
    t, out = call.args[n], call.args["out"]
    call.args["out"] = torch.empty(0, dtype=out.dtype).set_(t.untyped_storage(), t.storage_offset(), out.shape)
    call.touched |= {"out", n}
    call.value_problem = True
    call.mutations.append(f"out-aliases:{n}")


def _scale(call: Call, draw: st.DrawFn) -> None:
    value = draw(st.sampled_from((0.0, -0.0, -1.0, -1e-30, float("nan"), float("-inf"))))
    call.args["scale"] = value
    call.touched.add("scale")
    call.meta_kinds.add(kc.ValueRangeError)
    call.mutations.append(f"scale={value}")


def _lower_bound(call: Call, draw: st.DrawFn) -> None:
    value = draw(st.sampled_from((0.0, 1.0, float("nan"), float("inf"))))
    call.args["lower_bound"] = value
    call.touched.add("lower_bound")
    call.meta_kinds.add(kc.ValueRangeError)
    call.mutations.append(f"lower_bound={value}")


def _config(call: Call, draw: st.DrawFn) -> None:
    cfg = call.config
    assert cfg is not None
    if isinstance(cfg, PlainDims):  # it fixes dims only
        field_, step = draw(st.sampled_from((("H", 1), ("K", 1), ("V", 1), ("HV", cfg.H))))
        call.config = cfg.model_copy(update={field_: getattr(cfg, field_) + step})
        call.touched.add("config")
        call.meta_kinds.add(kc.ShapeError)
        call.mutations.append(f"plain config:{field_}+{step}")
        return
    how = draw(st.sampled_from(("head_k_dim", "head_v_dim", "num_v_heads", "scale", "l2norm", "gate", "dtype",
                                "layout_keyword")))
    upd: dict[str, Any] = {}
    kind: type = kc.ShapeError
    if how in ("head_k_dim", "head_v_dim"):
        upd[how] = getattr(cfg, how) + 1
    elif how == "num_v_heads":
        upd[how] = (call.dims["HV"] + call.dims["H"]) * cfg.tp_size
    elif how == "scale":
        upd["scale"], kind = cfg.scale * 2, kc.ValueRangeError
    elif how == "l2norm":
        upd["use_qk_l2norm"], kind = not cfg.use_qk_l2norm, kc.ValueRangeError
    elif how == "gate":
        upd = dict(gate="softplus", lower_bound=None) if cfg.gate == "bounded" else dict(gate="bounded",
                                                                                          lower_bound=-5.0)
        kind = kc.ValueRangeError
    elif how == "dtype":
        role, arg = draw(st.sampled_from((("state_dtype", "initial_state"), ("activation_dtype", "mixed_qkv"),
                                          ("index_dtype", "ssm_state_indices"))))
        allowed = ALLOWED[arg]
        upd[role] = str(draw(st.sampled_from([d for d in allowed if d != call.args[arg].dtype]))).removeprefix(
            "torch.")
        kind = kc.DtypeError
    else:  # the keyword contradicts the config: refused before the contract runs
        call.state_layout = _other_layout(cfg.state_layout)
        call.masked_by = kc.LayoutError
        call.touched.add("config")
        call.mutations.append("config:layout_keyword")
        return
    call.config = type(cfg).model_validate(dict(cfg.model_dump(), **upd))
    call.touched.add("config")
    call.meta_kinds.add(kind)
    call.mutations.append(f"config:{how}")


def _declared_layout(call: Call, draw: st.DrawFn) -> None:
    """Declare the other layout than the pool was built in (config and keyword alike)."""
    other = _other_layout(call.layout)
    is_kda = isinstance(call.config, kc.KDAConfig)
    if is_kda:
        call.config = type(call.config).model_validate(dict(call.config.model_dump(), state_layout=other))
    if call.state_layout is not None or not is_kda:
        call.state_layout = other
    call.layout = other
    call.touched |= {"config", "layout"}
    K, V = call.dims["K"], call.dims["V"]
    call.mutations.append(f"declared-layout:{other}")
    if K != V:
        call.meta_kinds.add(kc.ShapeError)
    # K == V: shapes cannot tell the layouts apart, which is why the layout is declared.


def _python_type(call: Call, draw: st.DrawFn) -> None:
    n, value = draw(st.sampled_from((("scale", "0.1"), ("scale", None), ("use_qk_l2norm_in_kernel", 1),
                                     ("lower_bound", "-5"), ("b", None), ("A_log", "list"))))
    if n in call.touched:
        n, value = "use_qk_l2norm_in_kernel", None
    call.args[n] = call.args[n].tolist() if value == "list" else value
    call.touched.add(n)
    # Beartype's verdict comes first and alone (except a refused layout keyword, earlier still).
    call.masked_by = call.masked_by or kc.ArgumentTypeError
    call.mutations.append(f"type:{n}={value!r}")


MUTATIONS = (
    Mutation("rank", lambda c: bool(_untouched_tensors(c)), _rank),
    Mutation("dim", lambda c: bool(_untouched_tensors(c)), _dim),
    Mutation("dtype", lambda c: bool(_untouched_tensors(c)), _dtype),
    Mutation("out-dtype", lambda c: "out" not in c.touched and "mixed_qkv" not in c.touched, _out_dtype),
    Mutation("device", lambda c: bool(_untouched_tensors(c)), _device),
    Mutation("strides", lambda c: bool(_untouched_tensors(c)), _strides),
    Mutation("index-range", lambda c: "ssm_state_indices" not in c.touched and c.dims["B"] >= 1, _index_range),
    Mutation("index-duplicate", lambda c: "ssm_state_indices" not in c.touched and c.dims["B"] >= 2, _index_dup),
    Mutation("nonfinite", lambda c: any(n in ("mixed_qkv", "a", "b", "A_log", "dt_bias")
                                        for n in _untouched_tensors(c, numel=True, floating=True)), _nonfinite),
    Mutation("alias", lambda c: bool(_alias_targets(c)), _alias),
    Mutation("scale", lambda c: "scale" not in c.touched, _scale),
    Mutation("lower_bound", lambda c: "lower_bound" not in c.touched, _lower_bound),
    Mutation("config", lambda c: c.config is not None and "config" not in c.touched, _config),
    Mutation("declared-layout", lambda c: not {"config", "layout"} & c.touched, _declared_layout),
    Mutation("type", lambda c: c.masked_by is None, _python_type),
)


MUTATION_NAMES = [m.name for m in MUTATIONS]


@st.composite
def mutated_calls(draw: st.DrawFn, first: str | None = None, max_mutations: int = 3) -> Call:
    """A valid call with 1..max_mutations mutations (``first``, when given, is applied first)."""
    call = draw(valid_calls())
    for i in range(draw(st.integers(1, max_mutations))):
        options = [m for m in MUTATIONS if m.applies(call) and (first is None or i or m.name == first)]
        if not options:
            assume(i > 0)  # the first mutation does not apply to this call: draw another
            break
        m = draw(st.sampled_from(options))
        m.apply(call, draw)
        STATS[f"mutation:{m.name}"] += 1
    STATS["mutated cases"] += 1
    return call


# -- running a case ----------------------------------------------------------------------------------
def _storages(call: Call) -> list[torch.Tensor]:
    """A uint8 view of the whole storage of every tensor argument (each storage once)."""
    seen, views = set(), []
    for n in TENSORS:
        t = call.args[n]
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        s = t.untyped_storage()
        if s.data_ptr() in seen and s.nbytes():
            continue
        seen.add(s.data_ptr())
        views.append(torch.empty(0, dtype=torch.uint8).set_(s, 0, (s.nbytes(),)))
    return views


def _kinds(err: kc.ContractError) -> set[type]:
    return {v.kind for v in err.violations} or {type(err)}


def _verdict(fn: Callable[[], object], call: Call, where: str) -> kc.ContractError | None:
    """Run ``fn``; return its ContractError (None if it passed); fail on any other exception."""
    try:
        fn()
    except kc.ContractError as err:
        return err
    except Exception as exc:  # the property under test: nothing else escapes
        STATS["escapes"] += 1
        pytest.fail(f"{where}: {type(exc).__name__} escaped (not a ContractError): {exc}\n"
                    f"mutations: {call.mutations}")
    return None


def _assert_verdict(err: kc.ContractError | None, expected: set[type], call: Call, where: str) -> None:
    if not expected:
        assert err is None, f"{where}: a valid call was rejected ({call.mutations}):\n{err}"
        return
    assert err is not None, f"{where}: accepted, expected {sorted(k.__name__ for k in expected)}: {call.mutations}"
    assert _kinds(err) == expected, (f"{where}: raised {sorted(k.__name__ for k in _kinds(err))}, expected "
                                     f"{sorted(k.__name__ for k in expected)}: {call.mutations}\n{err}")
    for k in expected:
        assert isinstance(err, k)


def _check_case(call: Call, strict: bool) -> None:
    STATS["cases"] += 1
    expected = call.expected(strict)
    mode = "strict" if strict else "check"
    # 1. validate_packed_decode with strict=..., whatever the ambient mode
    err = _verdict(lambda: kc.validate_packed_decode(**call.kwargs(), strict=strict), call, f"validate[{mode}]")
    _assert_verdict(err, expected, call, f"validate[{mode}]")
    if expected:
        STATS["rejections"] += 1
        for k in expected:
            STATS[f"rejected:{k.__name__}"] += 1
    else:
        STATS["accepted"] += 1
    # 2. packed_decode on the torch backend in that mode: same verdict; rejected => nothing written
    before = [v.clone() for v in _storages(call)]
    with kc.mode(mode):
        err = _verdict(lambda: kc.packed_decode(**call.kwargs(), backend="torch"), call, f"packed_decode[{mode}]")
    _assert_verdict(err, expected, call, f"packed_decode[{mode}]")
    after = _storages(call)
    if expected:
        assert len(before) == len(after) and all(torch.equal(x, y) for x, y in zip(before, after, strict=True)), \
            f"a rejected call changed a tensor: {call.mutations}"
        STATS["rejected calls checked bit-identical"] += 1
    # 3. the generated checker and the interpreter agree (on calls that reach the contract)
    if call.typed():
        c = kc.packed_decode_contract(call.layout)
        values = dict(call.args, config=call.config, state_layout=call.state_layout)
        vals = [values[n] for n in c._param_names]
        fast = c.check(*vals, _cfg=call.config)
        dims, _, violations = explain_call(c.spec, values, call.config)
        assert (fast is None) == bool(violations), \
            f"fast checker {'rejects' if fast is None else 'accepts'}, interpreter finds {violations}: {call.mutations}"
        if fast is not None:
            assert dict(zip(c.spec.symbols, fast, strict=True)) == dims
        STATS["checker/interpreter agreements"] += 1


# -- the properties ----------------------------------------------------------------------------------
@budget(1.0)
@given(call=valid_calls(), strict=st.booleans())
def test_every_valid_call_is_accepted_with_its_dims_and_runs(call: Call, strict: bool) -> None:
    _check_case(call, strict)
    dims = kc.validate_packed_decode(**call.kwargs(), strict=strict)
    assert dict(dims) == call.dims


@budget(1.5)
@given(call=mutated_calls(), strict=st.booleans())
def test_every_mutated_call_gets_its_documented_verdict_and_a_rejection_writes_nothing(call: Call,
                                                                                      strict: bool) -> None:
    _check_case(call, strict)


@pytest.mark.parametrize("first", MUTATION_NAMES)
@budget(0.1)
@given(data=st.data(), strict=st.booleans())
def test_each_kind_of_mutation_gets_its_documented_verdict(first: str, data: st.DataObject, strict: bool) -> None:
    # the same property, with every kind of mutation guaranteed its share of the budget
    _check_case(data.draw(mutated_calls(first=first), label="call"), strict)


@budget(0.1)
@given(call=valid_calls())
def test_a_valid_call_on_the_meta_device_is_accepted_in_check_and_strict_mode(call: Call) -> None:
    # meta tensors have shapes but no data: strict mode has no values to read, and skips them
    meta = dict(call.kwargs())
    for n in TENSORS:
        meta[n] = meta[n].to("meta")
    STATS["cases"] += 2
    for strict in (False, True):
        err = _verdict(lambda s=strict: kc.validate_packed_decode(**meta, strict=s), call, "validate[meta]")
        assert err is None, str(err)
    STATS["accepted"] += 2


@pytest.fixture(scope="module", autouse=True)
def _report_counters(request: pytest.FixtureRequest):
    yield
    report_counters(request, STATS, "packed_decode")


# -- what the fuzzer found, pinned as plain tests ----------------------------------------------------
def _small_call() -> dict[str, Any]:
    from kda_contracts.testing import make_decode_call

    return make_decode_call(kc.KDAConfig(num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4), 2, 4)


def test_a_pool_whose_slots_overlap_is_refused_before_the_kernel_runs() -> None:
    # An .expand()ed pool passed the contract and the torch backend then raised a RuntimeError from
    # index_copy_ (the Triton kernel would have raced on the shared slot).
    call = _small_call()
    call["initial_state"] = call["initial_state"][:1].expand(4, -1, -1, -1)
    with kc.mode("check"), pytest.raises(kc.LayoutError, match=(
            r"initial_state: LayoutError\n +expected blocks of the last 3 dims that do not overlap "
            r"\(stride\[0\] >= 32\)\n +got +strides \[0, 16, 4, 1\]\n +fix: the pool's slots overlap")):
        kc.packed_decode(**call, backend="torch")


def test_a_strided_view_of_the_indices_is_refused() -> None:
    # The Triton kernel reads the indices with stride 1: a strided view gave it the wrong slots.
    call = _small_call()
    call["ssm_state_indices"] = torch.tensor([3, 0, 1, 0], dtype=torch.int32)[::2]
    with pytest.raises(kc.LayoutError, match=r"ssm_state_indices: LayoutError\n +expected contiguous"):
        kc.validate_packed_decode(**call)
    kc.validate_packed_decode(**dict(call, ssm_state_indices=call["ssm_state_indices"].contiguous()))


def test_strict_mode_on_meta_tensors_checks_the_shapes_and_reads_no_values() -> None:
    # Strict mode used to call .item() on a meta tensor (a RuntimeError escaped).
    call = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _small_call().items()}
    kc.validate_packed_decode(**call, strict=True)
    with pytest.raises(kc.ShapeError):
        kc.validate_packed_decode(**dict(call, a=call["a"][:, :-1]), strict=True)


@pytest.mark.parametrize("broken", ["mixed_qkv flattened to rank 1", "state with K == 0"])
def test_the_layout_hint_survives_calls_it_cannot_reason_about(broken: str) -> None:
    # The KV-vs-VK hint indexed mixed_qkv.shape[1] of a rank-1 tensor (IndexError) and divided by
    # a zero K (ZeroDivisionError): both escaped from validation instead of the ShapeError.
    from kda_contracts.testing import make_decode_call

    cfg = kc.KDAConfig(num_heads=1, num_v_heads=1, head_k_dim=1, head_v_dim=2, state_layout="KV")
    call = make_decode_call(cfg, 2, 1)
    if broken.startswith("mixed_qkv"):
        call["mixed_qkv"] = call["mixed_qkv"].flatten()
        layout = "VK"  # the pool was built KV: the hint would like to say so
    else:
        call["initial_state"] = torch.zeros(1, 1, 2, 0)  # [N, HV, V, K] with K == 0, read as KV
        call["a"] = torch.zeros(2, 0, dtype=call["a"].dtype)  # HV*K == 0 too: the hint reached 2*K
        layout = "KV"
    with pytest.raises(kc.ShapeError):
        kc.validate_packed_decode(**call, state_layout=layout)
