"""What a new user meets first, pinned (issue 29): the package's description and docstring, the
public names, the repository root, the README's figures, the docs' shape (no table row that is a
paragraph, the benchmarks page for readers, the history in lab notes), the generated docs of a
result, and the dump command's exit code for a dump that no longer fits."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Annotated

import jaxtyping
import pytest
import tomllib
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def test_the_package_says_what_it_is():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["description"].startswith("Runtime shape, dtype, device and layout contracts for any PyTorch kernel "
                                          "or model function")
    assert "KDA (Kimi-Linear) and GDN (Qwen3-Next)" in meta["description"]  # shipped as ops, not the whole story
    assert kc.__doc__ is not None
    assert kc.__doc__.splitlines()[0] == "kda-contracts: runtime contracts for any PyTorch kernel or model function."
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**Kernel authors**" in readme and "**Model authors**" in readme  # a paragraph per audience


def test_bool_is_public_and_checks_a_mask():
    assert kc.Bool is jaxtyping.Bool and "Bool" in kc.__all__

    @kc.contract(register=False, mode="check")
    def masked(x: Float[Tensor, "B"], keep: kc.Bool[Tensor, "B"]) -> None: ...

    masked(torch.zeros(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(kc.DtypeError):
        masked(torch.zeros(3), torch.ones(3))


def test_the_repository_root_holds_no_stray_output():
    """An interpreter run's output (a `tune.json`) once sat at the root; the root holds the project's files."""
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    at_root = {p for p in tracked.splitlines() if "/" not in p}
    assert at_root <= {".gitignore", "CHANGELOG.md", "LICENSE", "MANIFEST.in", "README.md", "pyproject.toml"}, at_root


def _cells(path: Path) -> list[tuple[int, int, str]]:
    """(line, words, text) of every cell of every Markdown table outside code blocks."""
    out, fenced = [], False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|") or set(line.strip()) <= set("|-: "):
            continue
        out += [(i, len(c.split()), c.strip()) for c in line.strip().strip("|").split("|")]
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_table_cell_is_a_paragraph(path):
    """Dense rows became a short entry and prose below (the grammar table's `config=` row was ~120 words)."""
    long = [f"{path.name}:{line}: {words} words: {text[:60]}..." for line, words, text in _cells(path) if words > 50]
    assert not long, "say it in a paragraph below the table:\n" + "\n".join(long)


def test_the_benchmarks_page_is_for_readers_and_the_history_is_in_lab_notes():
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", page, flags=re.M)
    assert sections[:5] == ["KDA against the peers (H200)", "GDN against the peers (H200)", "KDA against sglang (H100)",
                            "GDN against sglang (H100)", "Validation overhead"]  # the headline results first
    assert "](lab-notes.md" in page and (ROOT / "docs" / "lab-notes.md").exists()


def test_the_readmes_validation_cost_is_the_one_the_benchmarks_page_measured():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    said = re.search(r"`kc\.validate_packed_decode`\s+costs ([\d.]+) µs", readme)
    measured = re.search(r"^\| `kc\.validate_packed_decode\(\.\.\.\)`, check mode, a repeated call \| \*\*([\d.]+)\*\*",
                         page, flags=re.M)
    assert said and measured
    assert round(float(measured.group(1)), 1) == float(said.group(1))


def test_the_generated_docs_show_a_results_dtype_rule():
    @kc.contract(doc=True, register=False)
    def double(x: Float[Tensor, "B D"]) -> Annotated[Float[Tensor, "B D"], kc.Spec(same_dtype_as="x")]:
        """Double x."""
        return x * 2

    assert double.__doc__ is not None
    assert "Returns: `return` `[B, D]` (bfloat16, float16, float32, float64, any float8; same dtype as `x`)" in \
        double.__doc__


@kc.contract(register=False)
def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> None: ...


def test_a_dump_that_no_longer_fits_the_signature_exits_2_not_1(tmp_path, capsys):
    """Exit 1 says "the call broke its contract"; a dump the function cannot take is unusable: 2."""
    path = tmp_path / "call.pt"
    kc.save_call(scale_rows, path, torch.zeros(2, 3), torch.zeros(3))
    raw = torch.load(path, weights_only=True)
    raw["arguments"]["weight"] = raw["arguments"].pop("w")  # saved before the parameter was renamed
    torch.save(raw, path)
    assert main(["validate", str(path)]) == 2
    assert "no longer match" in capsys.readouterr().err
