"""The one place generated source becomes code. Every checker, wrapper, dispatcher, backend
runner, rule test, dim expression and torch.compile stand-in the engine generates is compiled and
run here. It is always the engine's own source, assembled from parsed annotations, never user text.

Example::

    check = define("def check(x):\\n    return x > 0\\n", "<kda_contracts example>", "check")
"""

from __future__ import annotations

from types import CodeType
from typing import Any


def define(source: str | CodeType, filename: str, name: str, namespace: dict[str, Any] | None = None) -> Any:
    """Run ``source`` (or code compiled from it once, as a module does) in ``namespace`` (a fresh
    one by default: the names the code refers to) and return what it defines as ``name``.
    ``filename`` (``<kda_contracts ...>``) is what tracebacks and profilers show."""
    code = source if isinstance(source, CodeType) else compile(source, filename, "exec")
    ns = {} if namespace is None else namespace
    exec(code, ns)  # the engine's own generated source (see the module docstring)
    return ns[name]


def precompiled(source: str, filename: str) -> CodeType:
    """``source`` compiled once, for stand-ins :func:`define` runs in many namespaces."""
    return compile(source, filename, "exec")
