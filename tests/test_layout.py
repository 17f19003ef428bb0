"""The tree shows the two layers: the engine (every module directly in kda_contracts/) never
imports the ops it ships (kda_contracts.ops) or the model layers (kda_contracts.models).

Exempt: ``__init__.py`` (the public API re-exports the flagship op) and ``testing.py`` (helpers
that build calls of the shipped ops). One import is allowed by name: ``cli.py`` reads the shipped
ops' commands through ``kda_contracts.ops.cli_commands``, imported inside ``_shipped_commands``
when the command line runs, never at module level.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kda_contracts"
EXEMPT = ("__init__.py", "testing.py")
ENGINE = sorted(p for p in PACKAGE.glob("*.py") if p.name not in EXEMPT)
LAYERS_ABOVE = ("ops", "models")
ALLOWED = {("cli.py", "_shipped_commands", "ops")}  # (module, enclosing function, layer)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The layers above the engine that ``node`` imports (``ops``, ``models``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level == 0:
        names = [node.module or ""]
    elif node.level == 1:  # from .ops import x / from . import ops
        names = [node.module] if node.module else [a.name for a in node.names]
    else:
        return []
    found = []
    for name in names:
        parts = name.split(".")
        if parts[0] == "kda_contracts":
            parts = parts[1:]
        if parts and parts[0] in LAYERS_ABOVE:
            found.append(parts[0])
    return found


def _imports_of_layers_above(path: Path) -> list[tuple[str | None, str, int]]:
    """``(enclosing function or None, layer, line)`` for each import of an op or model."""
    out: list[tuple[str | None, str, int]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.extend((function, layer, child.lineno) for layer in _imported(child))
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), None)
    return out


def test_the_engine_modules_are_found():
    names = {p.name for p in ENGINE}
    assert {"spec.py", "codegen.py", "explain.py", "decorator.py", "docs.py", "cli.py"} <= names


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_no_engine_module_imports_an_op_or_a_model(path):
    bad = [(fn, layer, line) for fn, layer, line in _imports_of_layers_above(path)
           if (path.name, fn, layer) not in ALLOWED]
    assert not bad, f"{path.name} imports kda_contracts.{bad[0][1]} (line {bad[0][2]}): the engine must not"


def test_the_cli_reads_the_shipped_commands_lazily_and_only_there():
    found = _imports_of_layers_above(PACKAGE / "cli.py")
    assert found and all((fn, layer) == ("_shipped_commands", "ops") for fn, layer, _ in found)


def test_the_checker_sees_both_import_forms(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from .ops.packed_decode import x\nimport kda_contracts.models.kimi_linear\n"
                   "def f():\n    from . import ops\n", encoding="utf-8")
    assert [(fn, layer) for fn, layer, _ in _imports_of_layers_above(src)] == [
        (None, "ops"), (None, "models"), ("f", "ops")]
