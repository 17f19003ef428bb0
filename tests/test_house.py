"""The house: the tree shows the data path and stays within its limits.

- The engine (``kda_contracts/_engine/``) never imports the ops we ship (``kda_contracts.ops``),
  the model layers (``kda_contracts.models``) or anything else above it (``testing``, the command
  line's app module).
- No import cycle between modules, counting imports inside functions and under ``TYPE_CHECKING``.
- No module over 500 lines, no function over 80.
- The public API is ``kda_contracts/__init__.py``'s ``__all__``; every other module of the engine
  is private (inside ``_engine``).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kda_contracts"
MODULE_LINES, FUNCTION_LINES = 500, 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, int]]:
    """Every module of kda_contracts that ``path`` imports (anywhere in it), with the line."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != me:
                out.append((t, node.lineno))
    return out


GRAPH = {m: imports(p) for m, p in MODULES.items()}


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_the_modules_are_found():
    assert {"kda_contracts._engine.contract.decorator", "kda_contracts.ops.packed_decode"} <= set(MODULES)


def test_the_engine_imports_nothing_above_it():
    bad = [(m, t, line) for m, edges in GRAPH.items() if m.startswith("kda_contracts._engine")
           for t, line in edges if not t.startswith("kda_contracts._engine")]
    assert not bad, "the engine imports what stands above it: " + "; ".join(f"{m}:{ln} -> {t}" for m, t, ln in bad)


def _op_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "ops" and parts[2] != "_packed" else None


def test_an_op_never_imports_another_op():
    bad = [(m, t, line) for m, edges in GRAPH.items() if _op_folder(m) for t, line in edges
           if _op_folder(t) and _op_folder(t) != _op_folder(m)]
    assert not bad, "; ".join(f"{m}:{ln} -> {t}" for m, t, ln in bad)


def test_the_ops_use_the_engine_through_its_api_only():
    # kda_contracts._engine (its __init__: the API) and kc.facts (a public module); nothing deeper,
    # and nothing above the ops (kda_contracts itself, the app layer, testing)
    allowed = {"kda_contracts._engine", "kda_contracts._engine.facts"}
    bad = [(m, t, line) for m, edges in GRAPH.items() if m.startswith("kda_contracts.ops") for t, line in edges
           if (t.startswith("kda_contracts._engine") and t not in allowed)
           or t in ("kda_contracts", "kda_contracts.testing") or t.startswith(("kda_contracts._app",
                                                                               "kda_contracts.models"))]
    assert not bad, "; ".join(f"{m}:{ln} -> {t}" for m, t, ln in bad)


# The engine's floors, bottom first: each imports only what stands below it (or beside it in its
# own folder). The data path reads upward: grammar, rules and the model's types, the readers that
# build a spec, the code generated from it, the explainer, the contract, the op, and the tools.
FLOORS = ("errors", "facts", "source", "version", "hooks", "compile", "modes", "grammar", "rules", "model", "reading",
          "codegen", "explain", "contract", "operation", "tools")


def test_the_engine_imports_downward_only():
    def floor(module: str) -> int | None:
        parts = module.split(".")
        return FLOORS.index(parts[2]) if parts[:2] == ["kda_contracts", "_engine"] and len(parts) > 2 else None

    assert {p.name.removesuffix(".py") for p in (PACKAGE / "_engine").iterdir()
            if p.name != "__init__.py" and not p.name.startswith("__")} == set(FLOORS)
    bad = [(m, t, line) for m, edges in GRAPH.items() if floor(m) is not None for t, line in edges
           if floor(t) is not None and floor(t) > floor(m)]  # type: ignore[operator]
    assert not bad, "; ".join(f"{m}:{ln} -> {t}" for m, t, ln in bad)


def test_no_import_cycle():
    assert cycles() == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_500_lines(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MODULE_LINES, f"{name}: {lines} lines"


def test_no_function_over_80_lines():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {n} lines")
    assert not long, long


def test_the_public_api_is_init_all():
    import kda_contracts as kc

    assert kc.__all__ and len(set(kc.__all__)) == len(kc.__all__)
    assert all(hasattr(kc, n) for n in kc.__all__)
    # no internal module leaks as a public name (kc.codegen, kc.snippets, ...): the public modules
    # are kc.facts (typed facts for hints), kc.adapters (packed decode's backends) and the packages
    # of the ops and model layers
    modules = {n for n, v in vars(kc).items() if isinstance(v, types.ModuleType) and n.isidentifier()
               and not n.startswith("_")}
    assert modules <= {"facts", "adapters", "ops", "models", "testing"}, modules


def test_every_engine_module_is_private():
    public = [m for m in MODULES if m.startswith("kda_contracts.") and not m.startswith("kda_contracts._")
              and not m.startswith(("kda_contracts.ops", "kda_contracts.models", "kda_contracts.testing"))]
    assert public == [], public


def test_the_checker_sees_every_import_form(tmp_path, monkeypatch):
    assert ("kda_contracts.ops", 1) in imports_text(tmp_path, "from kda_contracts import ops\n")
    assert [t for t, _ in imports_text(tmp_path, "def f():\n    from ..ops import packed_decode\n", "_engine")] == [
        "kda_contracts.ops.packed_decode"]


def imports_text(tmp_path: Path, text: str, sub: str = "") -> list[tuple[str, int]]:
    """What :func:`imports` finds in ``text`` as a module of kda_contracts (``sub``: a subpackage)."""
    path = PACKAGE / sub / "_house_probe.py" if sub else PACKAGE / "_house_probe.py"
    path.write_text(text, encoding="utf-8")
    try:
        MODULES[module_name(path)] = path
        return imports(path)
    finally:
        path.unlink()
        MODULES.pop(module_name(path), None)


def test_every_package_is_listed_in_pyproject():
    """A new folder that pyproject does not list is left out of the wheel (CI's check_dist fails late)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    on_disk |= {"kda_kernels" + module_name(p)[len("kernels"):] for p in (ROOT / "kernels").rglob("__init__.py")}
    assert on_disk == listed, f"missing from pyproject: {sorted(on_disk - listed)}; stale: {sorted(listed - on_disk)}"
