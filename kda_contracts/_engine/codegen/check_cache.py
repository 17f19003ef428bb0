"""A cache in front of a contract's generated checker, for the eager path.

The checker's verdict is a function of what it reads: each tensor's metadata (type, dtype, device,
sizes, strides, requires_grad, inference-ness), the values of the scalar arguments, the config and
whether inference mode is on. A call that repeats exactly the metadata of a call the checker
accepted (a decode loop, step after step) gets that call's dims back without running the checker:
its tensors are compared against the accepted call's in one C++ call (torch's ``TensorGuards``,
which compares exact type, dispatch keys, dtype, device, sizes, strides and requires_grad; it
holds no reference to a tensor), its scalar values by type and value, its config by identity (a
frozen config only), and whether each tensor the checker asks about is an inference tensor is
part of the key (the dispatch keys cannot tell inside a custom op's kernel, where the autograd
keys are excluded). A contract whose checker runs user code (an ``annotated_types.Predicate``,
which may read anything) is never cached. Anything else goes through the checker, as without the
cache:

- a tensor subclass, a tensor inside a container, a scalar that is not of a plain immutable type
  (exactly int, float, bool, str, bytes, complex, None or a dtype), a mutable config, a call under
  a functorch transform: the checker runs on every such call, and nothing is remembered (not even
  counted);
- only accepted calls are remembered, so a rejected call is always reported by the checker and its
  slow path, never answered from the cache; and only from the second time the same key (the
  first tensor's shape, the scalar values, the config) is accepted, so a run of calls that never
  repeat costs a count each, not a guard built for nothing (nor, for a key whose other tensors
  keep changing, a guard rebuilt on every call: after 2 builds its entry stays); and after 64
  accepted calls in a row that it did not answer, the cache stands aside for 1024 calls (the
  checker alone) before it tries again;
- under torch.compile dynamo traces the checker itself (``_torchdynamo_inline``): the cache is an
  eager-only shortcut and never part of a graph.

``TensorGuards`` is torch's own (``torch._C._dynamo.guards``), not a public API: it is probed once
(right answers on a dozen cases) and, if missing or wrong in the installed torch, the cache is off
and every call runs the checker. ``KDA_CONTRACTS_CHECK_CACHE=0`` turns it off too.

Example::

    check = cached_checker(spec, raw_check, source, consts)   # same signature and answers as raw_check
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..model.markers import config_is_frozen
from ..rules.tensor import _inference_outside_mode
from ..source import define
from .checker import checked_parameters
from .config_views import config_ref
from .snippets import Names

#: entries kept per contract (one per distinct call metadata: B changes under continuous batching)
MAX_ENTRIES = 256
#: keys counted (a key is remembered from its second accepted call), per contract
MAX_SEEN = 4096
#: times a key's entry is built (the key repeats with other tensors' metadata changing) before it is
#: left as it is: those calls then run the checker without building a guard each time
MAX_REBUILDS = 2
#: accepted calls in a row the cache did not answer after which it stands aside (the checker alone,
#: no key built, nothing remembered) for BYPASS_FOR calls, then tries again: calls whose metadata
#: never repeats then cost the checker and a counter, not the cache's bookkeeping on top
BYPASS_AFTER = 64
BYPASS_FOR = 1024

_LOCK = threading.Lock()  # entries are added (and the oldest dropped) by one thread at a time

# The exact types of the scalar values a remembered call may hold: immutable, compared by type and
# value (the checker's own rules cannot tell -0.0 from 0.0 or one NaN object from another NaN).
_PLAIN = frozenset({int, float, bool, str, bytes, complex, type(None), torch.dtype})


def _probe() -> Any:
    """torch's TensorGuards class when it answers a dozen metadata comparisons right, else None."""
    if os.environ.get("KDA_CONTRACTS_CHECK_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        # on the CPU and outside inference mode whatever the caller's defaults (same answers)
        with torch.inference_mode(False), torch.device("cpu"):
            return _probe_cpu()
    except Exception:  # another torch: no cache, the checker runs on every call
        return None


def _probe_cpu() -> Any:
    from torch._C._dynamo import guards

    TensorGuards: Any = guards.TensorGuards  # (its type stub does not list the tensors it takes)
    a = torch.zeros(2, 3)
    g = TensorGuards(a, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    class _Sub(torch.Tensor):
        pass

    with torch.inference_mode():
        inference = torch.zeros(2, 3)
    same = [torch.ones(2, 3), torch.empty(2, 3)]
    different = [torch.zeros(3, 2), torch.zeros(2, 4), torch.zeros(3, 2).t(),
                 torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, requires_grad=True),
                 torch.zeros(2, 3).as_subclass(_Sub), torch.zeros(1, 3).expand(2, 3),
                 torch.zeros(2, 3, device="meta"), inference, 3.0, None]
    if all(g.check(t) for t in same) and not any(g.check(t) for t in different):
        return TensorGuards
    return None


@functools.cache
def guards_available() -> bool:
    """Whether the cache can be used with the installed torch (probed once)."""
    return _guards() is not None


@functools.cache
def _guards() -> Any:
    return _probe()


class CachedDims(tuple):  # type: ignore[type-arg]
    """The dims of a remembered call as the cache answers them: a tuple of that entry's own (never
    the checker's result, which may be a shared constant), so that holding the same object again
    means a call that matched the entry: the metadata of every argument the cache compares
    (:func:`compared_arguments`). An op's dispatcher keys its last backend choice on it. Eager only:
    under torch.compile the checker itself is traced and returns plain tuples."""

    __slots__ = ()


def compared_arguments(check: Callable[..., Any]) -> frozenset[str]:
    """The arguments whose metadata (tensors) or value (other arguments) a call answered by
    ``check``'s cache (a :class:`CachedDims`) is known to share with the call it remembered; none
    when ``check`` has no cache."""
    return getattr(check, "__kda_compared__", frozenset())


def _no_config() -> None:
    return None


def _remember(entries: dict[Any, tuple[Any, ...]], seen: dict[Any, int], key: Any, dims: tuple[int, ...],
              tensors: tuple[Any, ...], optional: tuple[bool, ...], values: tuple[Any, ...], cfg: Any) -> None:
    """Keep an accepted call's answer under ``key`` when every part of it can be compared later,
    the key was accepted before, and its entry has not been replaced too often (``seen``: how many
    accepted calls of each key the cache did not answer). Never raises: the call was accepted."""
    try:
        _remember_or_raise(entries, seen, key, dims, tensors, optional, values, cfg)
    except Exception:  # whatever an odd argument does, the checker's answer stands
        pass


def _remember_or_raise(entries: dict[Any, tuple[Any, ...]], seen: dict[Any, int], key: Any, dims: tuple[int, ...],
                       tensors: tuple[Any, ...], optional: tuple[bool, ...], values: tuple[Any, ...],
                       cfg: Any) -> None:
    make = _guards()
    if make is None or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return
    for v in values:  # first, so that no other value is hashed, compared or kept in ``seen``
        if type(v) not in _PLAIN:
            return
    for t, opt in zip(tensors, optional, strict=True):
        if t is None and opt:
            continue
        # (a guard reads strides: a sparse compressed tensor has none, and asking aborts the process)
        if type(t) is not torch.Tensor or t.layout is not torch.strided:
            return
    if cfg is None:
        ref: Callable[[], Any] = _no_config
    elif not config_is_frozen(cfg):
        return  # a mutable config is read afresh by the checker on every call
    else:
        ref = config_ref(cfg)  # strong for objects without __weakref__ (the entries are bounded)
    with _LOCK:
        if len(seen) >= MAX_SEEN:
            seen.clear()
        misses = seen[key] = seen.get(key, 0) + 1
    if misses < 2 or (misses > MAX_REBUILDS + 1 and key in entries):
        return  # seen once; or a key whose other tensors keep changing: its entry stays as it is
    guard = make(*(_NONE if t is None else t for t in tensors), dynamic_dims_sizes=None, dynamic_dims_strides=None)
    with _LOCK:  # the lookups need none: a dict read is atomic
        while len(entries) >= MAX_ENTRIES:
            del entries[next(iter(entries))]
        entries[key] = (guard, ref, CachedDims(dims))  # (the entry's own tuple: see CachedDims)


# stands in for an optional tensor passed as None (the key tells None from a tensor)
_NONE = torch.empty(0)


def cached_checker(spec: Any, check: Callable[..., Any], source: str, consts: Mapping[str, Any]) -> Callable[..., Any]:
    """``check`` (the generated checker, whose source is ``source`` and whose constants are
    ``consts``) behind the cache, or ``check`` itself when the contract has arguments the cache
    cannot compare (tensors inside containers) or runs user predicates (they may read anything)."""
    params = checked_parameters(spec)
    n = Names(params)
    body = source.split("\n", 1)[1]  # after the def line, which names every parameter
    used = {int(m) for m in re.findall(rf"\b{re.escape(n('a'))}(\d+)\b", body)}
    if spec.nested and any(params.index(p) in used for p in spec.nested if p in params):
        return check
    if any(not (rule.cacheable or getattr(rule, "pure", False)) for sp in spec.scalars.values() for rule in sp.rules):
        return check
    # the tensors the checker asks whether they are inference tensors (a write into one is refused)
    asks = [name for name, obj in consts.items() if obj is _inference_outside_mode]
    inference_args = sorted({int(m) for name in asks
                             for m in re.findall(rf"\b{re.escape(name)}\({re.escape(n('a'))}(\d+)\)", body)})
    tensors = [i for i in sorted(used) if params[i] in spec.tensors]
    required = [i for i in tensors if not spec.tensors[params[i]].optional]
    values = [i for i in sorted(used) if params[i] not in spec.tensors]
    if not required or not guards_available():
        return check
    a = [n("a", i) for i in range(len(params))]
    cfg, e, key, r = n("cfg"), n("e"), n("key"), n("r")
    optional = [i for i in tensors if spec.tensors[params[i]].optional]
    key_parts = [f"{a[required[0]]}.shape"]
    key_parts += [f"{a[i]}.__class__, {a[i]}" for i in values]
    key_parts += [f"{a[i]} is None" for i in optional]
    key_parts += [f"({a[i]} is not None and {a[i]}.is_inference())" if i in optional else f"{a[i]}.is_inference()"
                  for i in inference_args]
    key_parts += [f"{n('id')}({cfg})", f"{n('inference')}()"]  # (the entry's reference tells a recycled id)
    guard_args = [a[i] if i not in optional else f"({a[i]} if {a[i]} is not None else {n('none')})" for i in tensors]
    signature = ", ".join([*a, f"{cfg}=None"])
    tensor_tuple = "".join(f"{a[i]}, " for i in tensors)
    value_tuple = "".join(f"{a[i]}, " for i in values)
    st = n("state")  # [accepted calls in a row the cache did not answer, or the bypass countdown]
    src = "\n".join([
        f"def check({signature}):",
        f"    if {st}[0] >= {BYPASS_AFTER}:  # standing aside for a while",
        f"        {st}[0] = 0 if {st}[0] >= {BYPASS_AFTER + BYPASS_FOR} else {st}[0] + 1",
        f"        return {n('check')}({', '.join([*a, cfg])})",
        "    try:",
        f"        {key} = ({', '.join(key_parts)},)",
        f"        {e} = {n('entries')}.get({key})",
        f"        if {e} is not None and {e}[1]() is {cfg} and {e}[0].check({', '.join(guard_args)}):",
        f"            if {st}[0]:",
        f"                {st}[0] = 0",
        f"            return {e}[2]",
        "    except Exception:  # unhashable or odd arguments: the checker decides",
        f"        {key} = None",
        f"    {r} = {n('check')}({', '.join([*a, cfg])})",
        f"    if {r} is not None and {key} is not None:",
        f"        {st}[0] += 1",
        f"        {n('remember')}({n('entries')}, {n('seen')}, {key}, {r}, ({tensor_tuple}), {n('optional')}, "
        f"({value_tuple}), {cfg})",
        f"    return {r}",
        "",
    ])
    entries: dict[Any, tuple[Any, ...]] = {}  # key -> (guard, config reference, dims)
    ns: dict[str, Any] = {
        n("entries"): entries, n("seen"): {}, n("check"): check, n("state"): [0], n("remember"): _remember,
        n("none"): _NONE,
        n("inference"): torch.is_inference_mode_enabled, n("id"): id,
        n("optional"): tuple(i in optional for i in tensors),
    }
    fn = define(src, f"<kda_contracts cached checker for {spec.name}>", "check", ns)
    fn._torchdynamo_inline = check  # torch.compile traces the checker itself, never the cache
    fn.__kda_source__ = src
    fn.__kda_entries__ = entries
    fn.__kda_compared__ = frozenset(params[i] for i in (*tensors, *values))
    fn.__kda_state__ = ns[n("state")]
    return fn  # type: ignore[no-any-return]
