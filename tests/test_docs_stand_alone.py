"""The repository stands alone: no file cites a document that lives outside it.

The semantics of the shipped ops are in ``docs/semantics.md``; the project's working specs (the
KDA and GDN decode specs one directory up, in a shared folder) are not part of the repository, so
nothing here may point a reader at them. Every file git tracks (and every new file it does not
ignore) is searched for those references.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not match itself.
FORBIDDEN = (
    b"../" + b"shared/",
    b"/work/" + b"shared",
    b"SPEC-" + b"kda-decode",
    b"SPEC-" + b"gdn-decode",
)


def repository_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist or an installed copy)")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def offending_lines(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line: text`` (relative to ``root``) for each line of ``path`` naming a forbidden reference."""
    data = path.read_bytes()
    if not any(pattern in data for pattern in FORBIDDEN):
        return []
    return [f"{path.relative_to(root)}:{i}: {line.decode(errors='replace').strip()}"
            for i, line in enumerate(data.splitlines(), 1) if any(pattern in line for pattern in FORBIDDEN)]


def test_no_file_cites_a_spec_outside_the_repository():
    files = [p for p in repository_files() if p.is_file()]
    assert len(files) > 50  # so a listing that silently finds nothing fails
    found = [hit for p in files for hit in offending_lines(p)]
    assert not found, "files citing documents outside the repository (cite docs/semantics.md):\n" + "\n".join(found)


def test_the_semantics_page_exists_and_covers_both_ops():
    text = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    for needle in ("KDA", "GDN", "[N, HV, V, K]", "[N, HV, K, V]", "lower_bound", "padding"):
        assert needle in text, f"docs/semantics.md does not mention {needle!r}"


def test_the_check_finds_a_citation(tmp_path):
    cited = tmp_path / "x.md"
    cited.write_bytes(b"fine\nsee " + FORBIDDEN[0] + b"SPEC.md\n")
    assert offending_lines(cited, tmp_path) == [f"x.md:2: see {FORBIDDEN[0].decode()}SPEC.md"]
    (tmp_path / "y.md").write_text("fine\n", encoding="utf-8")
    assert offending_lines(tmp_path / "y.md", tmp_path) == []
