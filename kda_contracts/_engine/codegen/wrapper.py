"""The wrapper ``@kc.contract`` returns: a function with the contracted function's exact signature
(so Python binds the arguments) that reads the mode, runs the generated checker and the function.

Example::

    src = wrapper_source(spec, "forward", names, has_return=True, value_checks=False, beartype_first=False)
"""

from __future__ import annotations

import inspect

from ..model.spec import ContractSpec
from .checker import checked_parameters
from .snippets import Names


def formal_parameters(signature: inspect.Signature, names: Names,
                      extra_kwonly: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """``(parameters, call)``: a signature rendered as source (defaults as ``names("default", i)``)
    and the arguments that pass every parameter on in kind; ``extra_kwonly`` are keyword-only
    parameters appended (rendered as given, e.g. ``"backend=_kc_default_b"``), before ``**kwargs``."""
    n = names
    parts: list[str] = []
    call: list[str] = []
    seen_kwonly = False
    seen_posonly = False
    var_kw: str | None = None
    for i, p in enumerate(signature.parameters.values()):
        default = f"={n('default', i)}" if p.default is not inspect.Parameter.empty else ""
        if p.kind is p.POSITIONAL_ONLY:
            seen_posonly = True
            parts.append(f"{p.name}{default}")
            call.append(p.name)
            continue
        if seen_posonly:
            parts.append("/")
            seen_posonly = False
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            parts.append(f"{p.name}{default}")
            call.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            call.append(f"*{p.name}")
            seen_kwonly = True
        elif p.kind is p.KEYWORD_ONLY:
            if not seen_kwonly:
                parts.append("*")
                seen_kwonly = True
            parts.append(f"{p.name}{default}")
            call.append(f"{p.name}={p.name}")
        elif p.kind is p.VAR_KEYWORD:
            var_kw = p.name
            call.append(f"**{p.name}")
    if seen_posonly:
        parts.append("/")
    if extra_kwonly:
        if not seen_kwonly:
            parts.append("*")
        parts.extend(extra_kwonly)
    if var_kw is not None:
        parts.append(f"**{var_kw}")
    return parts, call


def wrapper_source(spec: ContractSpec, fn_name: str, names: Names, *, has_return: bool, value_checks: bool,
                   beartype_first: bool, body: bool = False, is_async: bool = False, saves: bool = False,
                   watch: bool = False) -> str:
    """Source of a wrapper with ``fn``'s exact signature (so Python binds the arguments); every
    other name it uses comes from ``names`` (see ``wrapper_namespace`` for what each is)."""
    parts, call = formal_parameters(spec.signature, names)
    n = names
    plain = ", ".join(checked_parameters(spec))
    cfg = spec.config_arg if spec.config_arg is not None else n("static_cfg")
    mode, dims, res = n("mode"), n("dims"), n("res")
    lines = [
        f"def {fn_name}({', '.join(parts)}):",
        # the mode (and the call count): read once per trace under torch.compile, never guarded on
        f"    {mode} = {n('enter')}()",
        f"    if {mode}:",
    ]
    if beartype_first:  # hints the generated checker cannot decide with isinstance
        lines += [
            "        try:",
            f"            {n('types')}({plain})",
            f"        except {n('TypeViolation')}:",
            f"            {n('fail_types')}({plain})",
        ]
    lines += [
        f"        {dims} = {n('check')}({plain}{', ' if plain else ''}{cfg})",
        f"        if {dims} is None:",
        f"            {n('fail')}({plain})",
    ]
    if value_checks:
        lines += [
            f"        if {mode} == 2:",
            f"            {n('strict')}({dims}, {plain})",
        ]
    if watch:  # watch mode: the value rules, on the device (no sync)
        lines += [f"        if {mode} == 3:", f"            {n('watch')}({dims}{', ' if plain else ''}{plain})"]
    aw = "await " if is_async else ""
    saved = n("saved")
    if saves:  # strict mode: what the function writes, put back if the call does not return or is rejected
        lines.append(f"        {saved} = {n('snap')}({plain}) if {mode} == 2 else None")
    if saves:  # a strict call that does not return rolls back; check mode and compiled code call directly
        run, args = ("body", ", ".join([dims, *call])) if body else ("fn", ", ".join(call))
        lines += [f"        if {saved}:", f"            {res} = {aw}{n('guarded_' + run)}({saved}, {args})",
                  "        else:", f"            {res} = {aw}{n(run)}({args})"]
    elif body:  # the body runs with the call's dims in context (kc.check, kc.dims, isinstance)
        lines.append(f"        {res} = {aw}{n('body')}({dims}, {', '.join(call)})")
    elif has_return:
        lines.append(f"        {res} = {aw}{n('fn')}({', '.join(call)})")
    if has_return:
        lines += [
            f"        if not {n('check_return')}({res}, {dims}{', ' if plain else ''}{plain}):",
            f"            {n('fail_return')}({res}, {saved if saves else 'None'}{', ' if plain else ''}{plain})",
        ]
    if body or has_return or saves:
        lines.append(f"        return {res}")
    lines.append(f"    return {aw}{n('fn')}({', '.join(call)})")
    if is_async:
        lines[0] = "async " + lines[0]
    return "\n".join(lines) + "\n"
