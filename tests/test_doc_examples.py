"""The docs cannot rot: every ```python block of README.md and docs/*.md runs here.

Blocks of one file run in order in one namespace (later blocks use what earlier ones define),
in a temporary working directory. Markers, in an HTML comment on the line before a block:

- ``<!-- output -->`` before a ```text block: it must equal what the python block before it
  printed.
- ``<!-- pytest -->`` before a ```python block: it is a test module; it runs in a pytest session
  of its own (the plugin's strict mode), and every test in it must pass.
- ``<!-- not-run: reason -->`` before a ```python block: skipped (e.g. needs a GPU). Counted, and
  at most MAX_SKIPPED are allowed across all docs.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import kda_contracts as kc
from kda_contracts import adapters
from kda_contracts._engine.contract import decorator as enforce
from kda_contracts._engine.operation import registry

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_SKIPPED = 3
MIN_RUN = 20  # so a parser that silently finds nothing fails

_FENCE = re.compile(r"^(`{3,})([\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(output|pytest|not-run)\s*(?::\s*(.*?))?\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None
    reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the marker comment just above each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        prev = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mm = _MARKER.match(prev)
        blocks.append(Block(path, i + 1, lang, "\n".join(lines[i + 1:j]) + "\n",
                            mm.group(1) if mm else None, mm.group(2) if mm else None))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for p in DOC_FILES for b in parse_blocks(p)]
PYTHON_FILES = sorted({b.path for b in ALL_BLOCKS if b.lang == "python" and b.marker not in ("not-run", "pytest")})
PYTEST_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python" and b.marker == "pytest"]


@pytest.fixture
def isolated(monkeypatch):
    """Run doc code without leaving contracts, ops or backends registered."""
    monkeypatch.setattr(enforce, "_REGISTRY", dict(enforce._REGISTRY))
    monkeypatch.setattr(registry, "_OPS", dict(registry._OPS))
    monkeypatch.setattr(sys, "path", list(sys.path))  # `kda-contracts docs --module` adds the current directory
    monkeypatch.delenv("KDA_CONTRACTS_MODE", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    before = set(adapters.names())
    yield
    for name in set(adapters.names()) - before:
        adapters.unregister(name)


def run_markdown(path: Path) -> int:
    """Run the python blocks of ``path`` in order, checking each ``<!-- output -->`` block;
    return how many blocks ran. Raises AssertionError on a mismatch."""
    # a real (temporary) module, as user code is: torch.compile imports the module of what it inlines
    module = types.ModuleType(f"doc_{path.stem.replace('-', '_')}")
    sys.modules[module.__name__] = module
    try:
        return _run_blocks(path, module.__dict__)
    finally:
        del sys.modules[module.__name__]


def _run_blocks(path: Path, namespace: dict[str, object]) -> int:
    printed: str | None = None
    ran = 0
    for block in parse_blocks(path):
        if block.lang == "python" and block.marker not in ("not-run", "pytest"):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(block.code, block.where if path.is_relative_to(ROOT) else str(path), "exec"), namespace)
            printed = buf.getvalue()
            ran += 1
        elif block.marker == "output":
            assert printed is not None, f"{path.name}:{block.line}: an output block with no python block before it"
            want, got = block.code.rstrip(), printed.rstrip()
            if want != got:
                diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "doc", "actual",
                                                      lineterm=""))
                raise AssertionError(f"{path.name}:{block.line}: the printed output differs from the doc:\n{diff}")
            printed = None  # one output block per python block
    return ran


@pytest.mark.parametrize("path", PYTHON_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs_and_prints_what_the_doc_shows(path, isolated, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands here
    assert run_markdown(path) >= 1


def test_a_doc_whose_output_drifted_fails(tmp_path):
    doc = tmp_path / "drift.md"
    doc.write_text("```python\nprint(6 * 7)\n```\n\n<!-- output -->\n```text\n41\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match=r"differs from the doc:[\s\S]*-41[\s\S]*\+42"):
        run_markdown(doc)


def test_a_doc_block_that_raises_fails(tmp_path):
    doc = tmp_path / "broken.md"
    doc.write_text("```python\nundefined_name\n```\n", encoding="utf-8")
    with pytest.raises(NameError):
        run_markdown(doc)


@pytest.mark.parametrize("block", PYTEST_BLOCKS, ids=lambda b: b.where)
def test_every_pytest_block_passes_in_a_session_of_its_own(block, pytester, isolated):
    pytester.makepyfile(test_from_doc=block.code)
    n_tests = len(re.findall(r"^def test_", block.code, flags=re.M))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) >= n_tests, result.stdout.str()
    # the summary line is printed when a contract ran; then it must name the plugin's default mode
    result.stdout.no_fnmatch_line("kda-contracts: mode [!s]*")


def test_few_python_blocks_are_skipped_and_each_says_why():
    python = [b for b in ALL_BLOCKS if b.lang == "python"]
    skipped = [b for b in python if b.marker == "not-run"]
    assert all(b.reason for b in skipped), [b.where for b in skipped if not b.reason]
    assert len(skipped) <= MAX_SKIPPED, [b.where for b in skipped]
    assert len(python) - len(skipped) >= MIN_RUN


def test_markers_sit_on_the_kind_of_block_they_describe():
    for b in ALL_BLOCKS:
        if b.marker == "output":
            assert b.lang == "text", f"{b.where}: <!-- output --> goes before a ```text block"
        elif b.marker in ("pytest", "not-run"):
            assert b.lang == "python", f"{b.where}: <!-- {b.marker} --> goes before a ```python block"


def test_every_output_block_follows_a_python_block_that_runs():
    for path in DOC_FILES:
        last = None
        for b in parse_blocks(path):
            if b.marker == "output":
                assert last is not None and last.marker is None, f"{b.where}: nothing runs before this output"
            if b.lang == "python":
                last = b


def test_the_readme_links_every_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for p in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{p.name})" in readme, f"README.md does not link docs/{p.name}"
    for name in ("contracts.md", "errors.md"):
        assert f"](docs/generated/{name})" in readme


@pytest.mark.parametrize("path", [*DOC_FILES, *sorted((ROOT / "docs" / "generated").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(path):
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        assert (path.parent / file).exists(), f"{path.relative_to(ROOT)}: broken link {target!r}"


def test_the_adapter_guide_names_every_adapter_field():
    guide = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    fields = [f for f in kc.adapters.Adapter.__dataclass_fields__ if not f.startswith("_")]
    missing = [f for f in fields if f"| `{f}` |" not in guide]
    assert not missing, f"docs/adapters.md does not describe Adapter fields {missing}"


def test_the_block_parser_reads_markers_and_languages(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("intro\n\n<!-- not-run: needs a GPU -->\n```python\nimport torch\n```\n\n<!-- output -->\n"
                   "```text\nhello\n```\n````python\nprint('```')\n````\n", encoding="utf-8")
    blocks = parse_blocks(doc)
    assert [(b.lang, b.marker, b.reason) for b in blocks] == [
        ("python", "not-run", "needs a GPU"), ("text", "output", None), ("python", None, None)]
    assert blocks[2].code == "print('```')\n"
