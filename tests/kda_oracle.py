"""Test-side helpers shared by every backend's packed-decode tests.

- :func:`oracle_packed_decode`: an independent, deliberately naive oracle: a Python loop
  over requests and value heads that transcribes the KDA decode step (the numbered
  steps of docs/semantics.md) line by line. It shares no code with ``kda_kernels``.
- :func:`oracle_kda_gate`: the gate alone (steps 1-2), for backends that take ``g`` directly.
- :func:`make_decode_case`: a seeded random-input factory returning a :class:`DecodeCase`
  (inputs for one call, optionally with padded row/slot strides).
- :func:`run_kernel` / :func:`run_oracle`: run a case on a fresh copy of the pool.
- :func:`assert_close_to_oracle`, :func:`assert_pool_untouched_except`: the comparisons, with
  the tolerances documented in :data:`TOLERANCES`.

Typical use in a backend test::

    case = make_decode_case(batch=3, num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4)
    out, state = run_kernel(my_backend.packed_decode, case)
    ref_out, ref_state = run_oracle(case)
    assert_close_to_oracle(out, ref_out)
    assert_close_to_oracle(state, ref_state)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# (atol, rtol) per compared dtype. fp32 is held to 1e-5. For bf16/fp16 both sides round
# fp32 values that differ in the last fp32 bits, so they may land one unit of rounding
# apart: atol is the state tolerance of docs/semantics.md (2e-3 / 5e-4), rtol is the dtype's eps (one ulp).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2e-3, torch.finfo(torch.bfloat16).eps),
    torch.float16: (5e-4, torch.finfo(torch.float16).eps),
}

_SOFTPLUS_THRESHOLD = 20.0
_L2NORM_EPS = 1e-6


@dataclass(frozen=True)
class DecodeCase:
    """Inputs of one packed-decode call (the ``out`` buffer is made fresh per run).

    ``state`` is the pristine pool; never pass it to a kernel directly, use
    :meth:`clone_state` (or :func:`run_kernel`), which keeps its strides and the bytes
    between padded slots.
    """

    mixed_qkv: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    scale: float
    state: Tensor
    indices: Tensor
    num_heads: int
    use_qk_l2norm: bool
    lower_bound: float | None
    state_layout: str

    @property
    def num_v_heads(self) -> int:
        return self.state.shape[1]

    @property
    def head_dims(self) -> tuple[int, int]:
        """``(K, V)`` read from the pool according to the declared layout."""
        d2, d3 = self.state.shape[2], self.state.shape[3]
        return (d3, d2) if self.state_layout == "VK" else (d2, d3)

    def clone_state(self) -> Tensor:
        """A copy of the pool with the same strides, storage offset and gap bytes."""
        storage = _whole_storage(self.state).clone()
        return storage.as_strided(self.state.shape, self.state.stride(), self.state.storage_offset())

    def new_out(self) -> Tensor:
        """An ``out`` buffer filled with NaN, so rows a kernel forgets to write show up."""
        batch, hv = self.mixed_qkv.shape[0], self.num_v_heads
        return torch.full(
            (batch, 1, hv, self.head_dims[1]),
            float("nan"),
            dtype=self.mixed_qkv.dtype,
            device=self.mixed_qkv.device,
        )


def make_decode_case(
    *,
    batch: int,
    num_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    num_slots: int | None = None,
    indices: Sequence[int] | None = None,
    act_dtype: torch.dtype = torch.float32,
    state_dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int64,
    state_layout: str = "VK",
    lower_bound: float | None = None,
    use_qk_l2norm: bool = True,
    a_shift: float = 0.0,
    row_pad: int = 0,
    slot_pad: int = 0,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> DecodeCase:
    """Seeded random inputs for one call.

    ``indices`` defaults to ``batch`` distinct slots drawn by random permutation from a pool
    of ``num_slots`` (default ``4 * batch + 1``), so the slots are scattered and duplicate-free.
    ``a_shift`` is added to the gate logits (e.g. 100.0 drives softplus past its linear
    threshold). ``row_pad`` extra elements per ``mixed_qkv``/``a``/``b`` row and ``slot_pad``
    extra elements per pool slot give non-packed strides (the pad bytes hold a sentinel).

    Example:
        >>> case = make_decode_case(batch=2, num_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
        >>> case.state.shape, case.indices.shape, case.new_out().shape
        (torch.Size([9, 2, 4, 4]), torch.Size([2]), torch.Size([2, 1, 2, 4]))
    """
    gen = torch.Generator().manual_seed(seed)
    H, HV, K, V = num_heads, num_v_heads, head_k_dim, head_v_dim
    N = 4 * batch + 1 if num_slots is None else num_slots

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen)

    def rows(width: int, values: Tensor) -> Tensor:
        # Allocate wider rows and slice, so the row stride is width + row_pad.
        full = torch.full((batch, width + row_pad), -7.0, dtype=act_dtype)
        full[:, :width] = values.to(act_dtype)
        return full.to(device)[:, :width]

    mixed_qkv = rows(2 * H * K + HV * V, randn(batch, 2 * H * K + HV * V))
    a = rows(HV * K, randn(batch, HV * K) + a_shift)
    b = rows(HV, randn(batch, HV))
    # Kimi-Linear initialises A uniformly in [1, 16].
    A_log = (1.0 + 15.0 * torch.rand(HV, generator=gen)).log().to(device)
    dt_bias = (0.5 * randn(HV * K)).to(device)

    inner = (V, K) if state_layout == "VK" else (K, V)
    slot_size = HV * V * K
    storage = torch.full((N * (slot_size + slot_pad),), -3.0, dtype=state_dtype)
    pool = storage.as_strided((N, HV, *inner), (slot_size + slot_pad, V * K, inner[1], 1))
    pool.copy_(randn(N, HV, *inner).to(state_dtype))

    if indices is None:
        chosen = torch.randperm(N, generator=gen)[:batch]
    else:
        chosen = torch.tensor(list(indices), dtype=torch.int64).reshape(-1)
        if chosen.numel() != batch:
            raise ValueError(f"got {chosen.numel()} indices for a batch of {batch}")
    return DecodeCase(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        scale=K**-0.5,
        state=_whole_storage(pool).to(device).as_strided(pool.shape, pool.stride(), 0),
        indices=chosen.to(dtype=index_dtype, device=device),
        num_heads=H,
        use_qk_l2norm=use_qk_l2norm,
        lower_bound=lower_bound,
        state_layout=state_layout,
    )


def oracle_packed_decode(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    scale: float,
    state: Tensor,
    indices: Tensor,
    *,
    num_heads: int,
    use_qk_l2norm: bool,
    lower_bound: float | None,
    state_layout: str,
) -> tuple[Tensor, Tensor]:
    """The math of docs/semantics.md, one request and one value head at a time; returns ``(out, new_state)``.

    Out of place: ``state`` is not modified; ``new_state`` is a dense copy with the same shape
    and dtype. ``out`` is ``[B, 1, HV, V]`` in ``mixed_qkv``'s dtype. Indices must be
    duplicate-free (with duplicates this oracle would chain the updates, which no kernel does).
    The step numbers below are those of docs/semantics.md.
    """
    batch, (N, HV) = mixed_qkv.shape[0], state.shape[:2]
    K, V = (state.shape[3], state.shape[2]) if state_layout == "VK" else (state.shape[2], state.shape[3])
    H = num_heads
    out = torch.zeros(batch, 1, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    new_state = state.clone(memory_format=torch.contiguous_format)
    for i in range(batch):
        s = int(indices[i])
        if s < 0 or s >= N:
            continue  # padding or out of range: zero output, pool untouched
        row = mixed_qkv[i].float()
        for hv in range(HV):
            i_h = hv // (HV // H)
            # 1. gate input and decay rate
            x = a[i, hv * K : (hv + 1) * K].float() + dt_bias[hv * K : (hv + 1) * K].float()
            A = math.exp(float(A_log[hv]))
            # 2. the gate
            g = torch.tensor(_gate(x.tolist(), A, lower_bound), dtype=torch.float32)
            # 3. beta
            beta = _sigmoid(float(b[i, hv]))
            # 4. the V×K state, decayed along K
            S = new_state[s, hv].float()
            if state_layout == "KV":
                S = S.T
            S = S * torch.exp(g)[None, :]
            # 5. q and k of head i_h
            q = row[i_h * K : (i_h + 1) * K]
            k = row[H * K + i_h * K : H * K + (i_h + 1) * K]
            v = row[2 * H * K + hv * V : 2 * H * K + (hv + 1) * V]
            if use_qk_l2norm:
                q = q / torch.sqrt((q * q).sum() + _L2NORM_EPS)
                k = k / torch.sqrt((k * k).sum() + _L2NORM_EPS)
            # 6.-8. delta rule and readout, all in fp32
            u = beta * (v - S @ k)
            S = S + torch.outer(u, k)
            o = S @ (scale * q)
            # 9. round on store
            out[i, 0, hv] = o.to(out.dtype)
            new_state[s, hv] = (S.T if state_layout == "KV" else S).to(state.dtype)
    return out, new_state


def oracle_kda_gate(a: Tensor, dt_bias: Tensor, A_log: Tensor, lower_bound: float | None) -> Tensor:
    """The gate of docs/semantics.md (steps 1-2) element by element: ``[B, HV*K]`` logits -> ``[B, HV, K]`` fp32."""
    HV = A_log.shape[0]
    K = dt_bias.shape[0] // HV
    x = a.float().cpu().view(-1, HV, K) + dt_bias.float().cpu().view(HV, K)
    g = [
        [_gate(x[i, hv].tolist(), math.exp(float(A_log[hv])), lower_bound) for hv in range(HV)]
        for i in range(x.shape[0])
    ]
    return torch.tensor(g, dtype=torch.float32).view(-1, HV, K)


KernelFn = Callable[..., None]


def run_kernel(kernel: KernelFn, case: DecodeCase, **overrides: object) -> tuple[Tensor, Tensor]:
    """Call ``kernel`` (a ``packed_decode``) on a fresh pool copy and NaN-filled ``out``.

    ``overrides`` replace keyword arguments of the call (``oob_counter=``, ``state_layout=``,
    ``num_heads=`` ...). Returns ``(out, state)`` after the call; ``case.state`` stays pristine.
    """
    state, out = case.clone_state(), case.new_out()
    kwargs: dict[str, object] = {
        "num_heads": case.num_heads,
        "use_qk_l2norm": case.use_qk_l2norm,
        "lower_bound": case.lower_bound,
        "state_layout": case.state_layout,
    }
    kwargs.update(overrides)
    kernel(case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.scale, state, out, case.indices,
           **kwargs)
    return out, state


def run_oracle(case: DecodeCase) -> tuple[Tensor, Tensor]:
    """:func:`oracle_packed_decode` on the case's inputs (on CPU); returns ``(out, state)``."""
    inputs = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, case.state, case.indices)
    mixed_qkv, a, b, A_log, dt_bias, state, indices = (t.cpu() for t in inputs)
    return oracle_packed_decode(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        case.scale,
        state,
        indices,
        num_heads=case.num_heads,
        use_qk_l2norm=case.use_qk_l2norm,
        lower_bound=case.lower_bound,
        state_layout=case.state_layout,
    )


def assert_close_to_oracle(actual: Tensor, expected: Tensor) -> None:
    """Same dtype and shape, and values within :data:`TOLERANCES` for that dtype."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    atol, rtol = TOLERANCES[expected.dtype]
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol)


def valid_slots(indices: Tensor, num_slots: int) -> list[int]:
    """The slots a call may write: indices in ``[0, num_slots)``."""
    return [s for s in indices.tolist() if 0 <= s < num_slots]


def assert_pool_untouched_except(before: Tensor, after: Tensor, slots: Iterable[int]) -> None:
    """Every element of the pool's storage outside ``slots`` is bit-identical.

    ``before`` and ``after`` must share a storage layout (``after`` from
    :meth:`DecodeCase.clone_state`). The whole storage is compared, so bytes between padded
    slots and slots beyond the view count too. Bits are compared, so NaN payloads and -0.0
    must survive as well.
    """
    assert before.stride() == after.stride() and before.shape == after.shape
    keep = torch.ones(_whole_storage(before).numel(), dtype=torch.bool)
    slot_size = math.prod(before.shape[1:])  # the inner dims of a slot are contiguous
    for s in set(slots):
        start = before.storage_offset() + s * before.stride(0)
        keep[start : start + slot_size] = False
    old, new = _bits(_whole_storage(before).cpu()), _bits(_whole_storage(after).cpu())
    changed = (old != new) & keep
    assert not changed.any(), f"{int(changed.sum())} pool elements outside the used slots changed"


def _gate(x: list[float], A: float, lower_bound: float | None) -> list[float]:
    # Computed in Python floats (float64): an implementation independent of torch's softplus.
    if lower_bound is None:
        return [-A * (xi if xi > _SOFTPLUS_THRESHOLD else math.log1p(math.exp(xi))) for xi in x]
    return [lower_bound * _sigmoid(A * xi) for xi in x]


def _sigmoid(z: float) -> float:
    # Two forms so that math.exp never overflows.
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _whole_storage(t: Tensor) -> Tensor:
    """A 1-D tensor over all of ``t``'s storage (not just the elements the view covers)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (storage.nbytes() // t.element_size(),))


def _bits(t: Tensor) -> Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
