"""What every packed-decode backend repeats, written once: the interface of ``kernels/INTERFACE.md``.

- :class:`DecodeBackend` holds the interface signature. A backend writes ``run(call, **options)``
  and decorates it; the decorator checks the layout, reads the dims once (:class:`DecodeDims`)
  and makes ``B == 0`` a no-op, then hands ``run`` one :class:`DecodeArgs`, with the pool's GPU as
  the current CUDA device.
- :func:`check_layout`, :func:`state_kv` and :func:`state_as_vk`: the pool's two layouts.
- :func:`split_qkv`: per-head q, k and v views of the packed activations.
- :func:`valid_rows`, :func:`row_slots` and :func:`scatter_rows`: which rows may touch the pool,
  and a row scatter that skips padding and out-of-range indices without a host sync.

Plain torch only: this module never imports triton, helion or fla (``kda_kernels.reference``,
which ``import kda_contracts`` loads, is built on it).

Example:
    >>> state = torch.zeros(8, 4, 3, 16)  # [N, HV, V, K]
    >>> state_kv(state, "VK")
    (16, 3)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "STATE_LAYOUTS",
    "WATCH_CHECKS",
    "DecodeArgs",
    "DecodeBackend",
    "DecodeDims",
    "RowSlots",
    "WatchArgs",
    "check_layout",
    "decode_dims",
    "row_slots",
    "scatter_rows",
    "split_qkv",
    "state_as_vk",
    "state_kv",
    "valid_rows",
]

STATE_LAYOUTS = ("VK", "KV")
"""The pool layouts: ``"VK"`` is ``[N, HV, V, K]``, ``"KV"`` is ``[N, HV, K, V]``."""


# --- layouts and shapes ---------------------------------------------------------------------------
def check_layout(state_layout: str) -> str:
    """Return ``state_layout`` if it is ``"VK"`` or ``"KV"``; raise ValueError otherwise.

    Example:
        >>> check_layout("KV")
        'KV'
    """
    if state_layout not in STATE_LAYOUTS:
        raise ValueError(f"state_layout must be 'VK' or 'KV', got {state_layout!r}")
    return state_layout


def state_kv(initial_state: Tensor, state_layout: str) -> tuple[int, int]:
    """The head dims ``(K, V)`` of a ``[N, HV, V, K]`` ("VK") or ``[N, HV, K, V]`` ("KV") pool.

    Example:
        >>> state_kv(torch.zeros(2, 4, 8, 16), "KV")
        (8, 16)
    """
    inner = initial_state.shape[2], initial_state.shape[3]
    return (inner[1], inner[0]) if check_layout(state_layout) == "VK" else inner


def state_as_vk(initial_state: Tensor, state_layout: str) -> Tensor:
    """The pool as ``[N, HV, V, K]``: itself for "VK", its ``transpose(2, 3)`` view for "KV".

    A view, so writes through it land in the pool.

    Example:
        >>> state_as_vk(torch.zeros(2, 4, 8, 16), "KV").shape
        torch.Size([2, 4, 16, 8])
    """
    return initial_state if check_layout(state_layout) == "VK" else initial_state.transpose(2, 3)


def split_qkv(mixed_qkv: Tensor, num_heads: int, num_v_heads: int, K: int, V: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split the packed activations ``[..., 2*H*K + HV*V]`` into per-head q, k and v views (no copy).

    The row holds the q heads, then the k heads, then the v heads, each head-major (``h*K + d``).
    Returns views shaped ``[..., H, K]``, ``[..., H, K]`` and ``[..., HV, V]`` in the input dtype;
    the row stride of the input may be arbitrary.

    Example:
        >>> x = torch.arange(2 * (2 * 2 * 4 + 4 * 3), dtype=torch.float32).view(2, -1)
        >>> q, k, v = split_qkv(x, num_heads=2, num_v_heads=4, K=4, V=3)
        >>> q.shape, k.shape, v.shape
        (torch.Size([2, 2, 4]), torch.Size([2, 2, 4]), torch.Size([2, 4, 3]))
        >>> k[0, 0, 0].item()  # k starts right after the H*K q channels
        8.0
    """
    qk_width = num_heads * K
    q = mixed_qkv[..., :qk_width].unflatten(-1, (num_heads, K))
    k = mixed_qkv[..., qk_width : 2 * qk_width].unflatten(-1, (num_heads, K))
    v = mixed_qkv[..., 2 * qk_width : 2 * qk_width + num_v_heads * V].unflatten(-1, (num_v_heads, V))
    return q, k, v


class DecodeDims(NamedTuple):
    """The dims of one packed-decode call, read from the tensors (and ``num_heads``) once."""

    batch: int  # B: requests (rows of indices)
    num_heads: int  # H: q/k heads
    num_v_heads: int  # HV: value heads (state.shape[1])
    head_k_dim: int  # K
    head_v_dim: int  # V
    num_slots: int  # N: slots of the pool (state.shape[0])


def decode_dims(initial_state: Tensor, indices: Tensor, num_heads: int, state_layout: str) -> DecodeDims:
    """The call's :class:`DecodeDims`; raises ValueError for an unknown ``state_layout``.

    Example:
        >>> decode_dims(torch.zeros(8, 4, 3, 16), torch.zeros(2, dtype=torch.long), 2, "VK")
        DecodeDims(batch=2, num_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=3, num_slots=8)
    """
    head_k_dim, head_v_dim = state_kv(initial_state, state_layout)
    return DecodeDims(indices.shape[0], num_heads, initial_state.shape[1], head_k_dim, head_v_dim,
                      initial_state.shape[0])


# --- rows that may touch the pool -----------------------------------------------------------------
def valid_rows(indices: Tensor, num_slots: int) -> Tensor:
    """``[B]`` bool: which rows name a slot of the pool (``0 <= index < N``); computed on the device.

    Example:
        >>> valid_rows(torch.tensor([3, -1, 8, 0]), 8).tolist()
        [True, False, False, True]
    """
    return (indices >= 0) & (indices < num_slots)


class RowSlots(NamedTuple):
    """Where each row of a batch reads and writes the pool, with no host sync (:func:`row_slots`).

    An invalid row (padding ``< 0`` or ``>= N``) is redirected to a slot that is written anyway,
    with bytes identical to that write, so the extra write is harmless whatever order the device
    applies it in: the slot of the first valid row (the donor), carrying the donor's new row.
    With no valid row at all, invalid rows rewrite slot 0 with its own unchanged bytes. Invalid
    rows thus never read or write their own index, and no slot outside the valid indices changes.
    Needs ``N > 0``.
    """

    valid: Tensor  # [B] bool: 0 <= index < N
    slots: Tensor  # [B] int64: the index for a valid row; the donor's slot (or 0) otherwise
    donor: Tensor  # [1] int64: the first valid row, else 0 (shape [1]: a 0-dim index may sync)
    any_valid: Tensor  # [1] bool

    def gather(self, pool: Tensor) -> Tensor:
        """``pool[slots]``: each valid row's slot (an invalid row reads a harmless one)."""
        return pool.index_select(0, self.slots)

    def scatter(self, pool: Tensor, rows: Tensor, old: Tensor | None = None) -> None:
        """Write ``rows[i]`` into ``pool[index i]`` for the valid rows, in place; see the class.

        ``rows`` is cast to the pool's dtype; ``old`` is :meth:`gather`'s result if the caller
        already has it (it saves a read).
        """
        rows = rows.to(pool.dtype)
        bcast = (-1,) + (1,) * (pool.dim() - 1)
        old = self.gather(pool) if old is None else old
        fallback = torch.where(self.any_valid.view(bcast), rows.index_select(0, self.donor), old)
        pool.index_copy_(0, self.slots, torch.where(self.valid.view(bcast), rows, fallback))


def row_slots(indices: Tensor, num_slots: int) -> RowSlots:
    """The :class:`RowSlots` of ``indices`` (int32 or int64, ``[B]``) for a pool of ``num_slots > 0``.

    Example:
        >>> rs = row_slots(torch.tensor([-1, 5, 9]), 8)
        >>> rs.valid.tolist(), rs.slots.tolist()  # rows 0 and 2 borrow row 1's slot
        ([False, True, False], [5, 5, 5])
    """
    idx = indices.long()
    valid = valid_rows(idx, num_slots)
    donor = torch.argmax(valid.to(torch.int32), dim=0, keepdim=True)  # first valid row, else 0
    any_valid = valid.index_select(0, donor)
    slots = torch.where(valid, idx, torch.where(any_valid, idx.index_select(0, donor), 0))
    return RowSlots(valid, slots, donor, any_valid)


def scatter_rows(pool: Tensor, indices: Tensor, rows: Tensor) -> None:
    """``pool[indices[i]] = rows[i]`` for each ``i`` with ``0 <= indices[i] < N``, in place.

    Padding (``< 0``) and out-of-range (``>= N``) indices write nothing; every other byte of the
    pool is unchanged. No host sync, any device, any pool dtype (``rows`` is cast to it). The
    valid indices must be distinct. ``pool`` is ``[N, ...]``, ``rows`` ``[B, ...]`` with the same
    trailing dims, ``indices`` ``[B]`` int32 or int64.

    Example:
        >>> pool = torch.zeros(4, 2, dtype=torch.bfloat16)
        >>> scatter_rows(pool, torch.tensor([2, -1, 7]), torch.ones(3, 2))
        >>> pool[:, 0].tolist()
        [0.0, 0.0, 1.0, 0.0]
    """
    if indices.shape[0] == 0 or pool.shape[0] == 0:
        return
    row_slots(indices, pool.shape[0]).scatter(pool, rows)


# --- watch mode in the kernel ---------------------------------------------------------------------
#: The value checks a decode kernel that takes ``watch=`` makes on the data it reads anyway, in this
#: order (a check's number is its position): ``indices < N`` (negatives are padding); no index twice
#: (negatives may repeat); the pool rows the valid indices name finite; ``mixed_qkv``, ``a``, ``b``,
#: ``A_log``, ``dt_bias`` finite. kda_contracts hands a kernel these only when an op's value rules
#: are exactly these (its packed decode ops' are).
WATCH_CHECKS = ("in_range", "distinct", "finite_rows", "finite_mixed_qkv", "finite_a", "finite_b",
                "finite_A_log", "finite_dt_bias")
#: int64 words of the scratch a kernel records what it found in (``WatchArgs.scratch``): the claim
#: (0, or the serial of the call whose findings these are: the first call that finds anything
#: claims it, others' findings are dropped until the reader clears it), a lock, then per check:
#: the first finding's key (element * 2, + 1 for a row holding Inf but no NaN; ``WATCH_BIG`` when
#: none), the count, the largest bad index (``in_range``), the first finding's value and extra
#: (float64 bits), then a bitmap of the positions a ``finite_rows`` finding counted (so a row found
#: by several programs counts once; at most ``WATCH_ROWS_MAX`` positions).
WATCH_CLAIM, WATCH_LOCK, WATCH_FIRST, WATCH_COUNT, WATCH_WORST, WATCH_VALUE, WATCH_EXTRA, WATCH_BITMAP = (
    0, 1, 2, 10, 18, 26, 34, 42)
WATCH_ROWS_MAX = 128 * 64
WATCH_WORDS = WATCH_BITMAP + WATCH_ROWS_MAX // 64
WATCH_BIG = 1 << 62


class WatchArgs(NamedTuple):
    """What a decode kernel needs to make :data:`WATCH_CHECKS` itself, for one call: the device
    scratch (int64 ``[WATCH_WORDS]``, laid out as the constants above say, made and cleared by the
    reader), a host doorbell (a float64 tensor in pinned host memory, or on the CPU: its element 0
    is set to 1.0 when something is recorded, so the reader notices without a sync) and the call's
    serial (1 to 2**31 - 1). A kernel writes nothing when the call is clean."""

    scratch: Tensor
    host: Tensor
    serial: int


# --- the backend signature ------------------------------------------------------------------------
class DecodeArgs(NamedTuple):
    """One packed-decode call as a backend's ``run`` receives it: the arguments, then the dims."""

    mixed_qkv: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    scale: float
    state: Tensor
    out: Tensor
    indices: Tensor
    num_heads: int
    use_qk_l2norm: bool
    lower_bound: float | None
    state_layout: str
    dims: DecodeDims


class DecodeBackend:
    """A backend's ``packed_decode``: the interface signature in front of ``run(call, **options)``.

    Calling it checks the layout, reads the dims, returns at once when ``B == 0`` and otherwise
    calls ``run`` with a :class:`DecodeArgs` and the backend's own keyword ``options`` (e.g. the
    Triton launch config), on the pool's GPU (made the current CUDA device for the call when it is
    another). ``run``'s name and docstring become the backend's.

    Example:
        >>> @DecodeBackend
        ... def packed_decode(call: DecodeArgs) -> None:
        ...     "Says what it was given."
        ...     print(call.dims)
        >>> packed_decode(torch.zeros(1, 2 * 4 + 3), torch.zeros(1, 4), torch.zeros(1, 1), torch.zeros(1),
        ...               torch.zeros(4), 0.5, torch.zeros(8, 1, 3, 4), torch.zeros(1, 1, 1, 3),
        ...               torch.tensor([0]), num_heads=1, use_qk_l2norm=True, lower_bound=None)
        DecodeDims(batch=1, num_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=3, num_slots=8)
    """

    def __init__(self, run: Callable[..., None]) -> None:
        self.run = run
        self.__name__ = self.__qualname__ = run.__name__
        self.__module__ = run.__module__
        self.__doc__ = run.__doc__
        #: the name compiled code calls it by (through the ``kda_kernels::packed_decode`` custom op):
        #: ``module.qualname``, numbered when another backend's ``run`` has that name already
        #: (backends made by a factory)
        base = key = f"{run.__module__}.{run.__qualname__}"
        n = 1
        while key in _BACKENDS and _BACKENDS[key].run is not run:
            n += 1
            key = f"{base}#{n}"
        self.key = key
        _BACKENDS[key] = self

    def __repr__(self) -> str:
        return f"<packed-decode backend {self.__module__}.{self.__name__}>"

    def __call__(
        self,
        mixed_qkv: Tensor,  # [B, 2*H*K + HV*V]
        a: Tensor,  # [B, HV*K]
        b: Tensor,  # [B, HV]
        A_log: Tensor,  # [HV]
        dt_bias: Tensor,  # [HV*K]
        scale: float,
        state: Tensor,  # [N, HV, V, K] ("VK") or [N, HV, K, V] ("KV")
        out: Tensor,  # [B, 1, HV, V]
        indices: Tensor,  # [B]
        *,
        num_heads: int,
        use_qk_l2norm: bool,
        lower_bound: float | None,
        state_layout: str = "VK",
        **options: Any,
    ) -> None:
        dims = decode_dims(state, indices, num_heads, state_layout)
        if dims.batch == 0:
            return
        call = DecodeArgs(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, num_heads,
                          use_qk_l2norm, lower_bound, state_layout, dims)
        if _elsewhere(state):
            _run_on(state.device, self.run, call, options)
        else:
            self.run(call, **options)

    def launch(self, dims: tuple[int, ...], mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
               scale: float, state: Tensor, out: Tensor, indices: Tensor, use_qk_l2norm: bool,
               lower_bound: float | None, state_layout: str, **options: Any) -> None:
        """The call with its dims already read, ``(B, H, HV, K, V, N)`` as :class:`DecodeDims` orders
        them (and ``state_layout`` known to be "VK" or "KV"): for a caller that validated the call
        and bound those dims (kda_contracts' ops), so they are not read again.

        Example:
            >>> @DecodeBackend
            ... def packed_decode(call: DecodeArgs) -> None:
            ...     print(call.dims.num_heads)
            >>> packed_decode.launch((1, 1, 1, 4, 3, 8), torch.zeros(1, 2 * 4 + 3), torch.zeros(1, 4),
            ...     torch.zeros(1, 1), torch.zeros(1), torch.zeros(4), 0.5, torch.zeros(8, 1, 3, 4),
            ...     torch.zeros(1, 1, 1, 3), torch.tensor([0]), True, None, "VK")
            1
        """
        if dims[0] == 0:
            return
        call = DecodeArgs(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, dims[1], use_qk_l2norm,
                          lower_bound, state_layout, tuple.__new__(DecodeDims, dims))
        if _elsewhere(state):
            _run_on(state.device, self.run, call, options)
        else:
            self.run(call, **options)


_SEVERAL_GPUS: list[bool] = []  # whether this process sees more than one CUDA device (read at the first CUDA call)


def _elsewhere(state: Tensor) -> bool:
    """Whether ``state`` is a CUDA tensor on a device other than the current one. With one visible
    GPU it cannot be, and the current device is not asked for (asking took 0.5-0.9 µs of host time
    on the H200's host)."""
    if not state.is_cuda:
        return False
    if not _SEVERAL_GPUS:
        _SEVERAL_GPUS.append(torch.cuda.device_count() > 1)
    return _SEVERAL_GPUS[0] and state.get_device() != torch.cuda.current_device()


def _run_on(device: torch.device, run: Callable[..., None], call: DecodeArgs, options: dict[str, Any]) -> None:
    """Run a backend with ``device`` (the pool's) as the current CUDA device: Triton and Helion launch
    on the current device, so a call whose tensors sit on another GPU would otherwise hand that GPU's
    addresses to a kernel running on this one (an illegal memory access, or another GPU's memory
    read through peer access). Torch's own ops do the same for their tensors."""
    with torch.cuda.device(device):
        run(call, **options)


# --- in compiled code -----------------------------------------------------------------------------
# torch.compile cannot trace a kernel launch (Triton's launch planning, Helion's and fla's
# wrappers); in compiled code a backend runs through one custom op instead
# (``torch.ops.kda_kernels.packed_decode``), opaque to dynamo and
# declared to write ``state``, ``out`` and the optional ``oob_counter``; the op calls the backend
# (by its key) on the real tensors. Eager calls never go through it: dynamo traces the stand-ins
# below in place of ``DecodeBackend.__call__``/``launch`` (``_torchdynamo_inline``), an attribute
# eager Python does not read.
_BACKENDS: dict[str, DecodeBackend] = {}


def _decode_op(backend: str, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
               scale: float, state: Tensor, out: Tensor, indices: Tensor, num_heads: int, use_qk_l2norm: bool,
               lower_bound: float | None, state_layout: str, oob_counter: Tensor | None) -> None:
    options = {} if oob_counter is None else {"oob_counter": oob_counter}
    _BACKENDS[backend](mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices, num_heads=num_heads,
                       use_qk_l2norm=use_qk_l2norm, lower_bound=lower_bound, state_layout=state_layout, **options)


def _decode_op_fake(backend: str, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                    scale: float, state: Tensor, out: Tensor, indices: Tensor, num_heads: int, use_qk_l2norm: bool,
                    lower_bound: float | None, state_layout: str, oob_counter: Tensor | None) -> None:
    return None


# Registered with the plain library API: ``torch.library.custom_op``'s Python autograd and
# version-counter wrappers cost 17-40 µs per call on the host against ~5 µs (measured on the CPU,
# torch 2.11 and 2.13); decode runs without autograd.
_LIB = torch.library.Library("kda_kernels", "FRAGMENT")
if hasattr(torch.ops.kda_kernels, "packed_decode"):  # this file imported a second time, under another name
    raise ImportError("kda_kernels.interface is already imported (its custom op kda_kernels::packed_decode is "
                      "registered): import it once, as kda_kernels")
_LIB.define("packed_decode(str backend, Tensor mixed_qkv, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "
            "float scale, Tensor(a!) state, Tensor(b!) out, Tensor indices, SymInt num_heads, bool use_qk_l2norm, "
            "float? lower_bound, str state_layout, Tensor(c!)? oob_counter) -> ()")
_LIB.impl("packed_decode", _decode_op, "CompositeExplicitAutograd")
torch.library.register_fake("kda_kernels::packed_decode", _decode_op_fake, lib=_LIB)


def _compiled_options(options: dict[str, Any]) -> Tensor | None:
    unknown = sorted(set(options) - {"oob_counter"})
    if unknown:
        raise TypeError(f"under torch.compile a packed-decode backend takes no option but oob_counter= (got "
                        f"{', '.join(unknown)}): tune launch shapes in eager code")
    return options.get("oob_counter")


def _call_compiled(self: DecodeBackend, mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                   scale: float, state: Tensor, out: Tensor, indices: Tensor, *, num_heads: int,
                   use_qk_l2norm: bool, lower_bound: float | None, state_layout: str = "VK", **options: Any) -> None:
    torch.ops.kda_kernels.packed_decode(self.key, mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices,
                                        num_heads, use_qk_l2norm, lower_bound, state_layout,
                                        _compiled_options(options))


def _launch_compiled(self: DecodeBackend, dims: tuple[int, ...], mixed_qkv: Tensor, a: Tensor, b: Tensor,
                     A_log: Tensor, dt_bias: Tensor, scale: float, state: Tensor, out: Tensor, indices: Tensor,
                     use_qk_l2norm: bool, lower_bound: float | None, state_layout: str, **options: Any) -> None:
    torch.ops.kda_kernels.packed_decode(self.key, mixed_qkv, a, b, A_log, dt_bias, scale, state, out, indices,
                                        dims[1], use_qk_l2norm, lower_bound, state_layout,
                                        _compiled_options(options))


DecodeBackend.__call__._torchdynamo_inline = _call_compiled  # type: ignore[attr-defined]
DecodeBackend.launch._torchdynamo_inline = _launch_compiled  # type: ignore[attr-defined]
