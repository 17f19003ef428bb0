"""Check the built sdist and wheel in DIST against the source tree (run by .ci/run).

The wheel must hold every module and ``py.typed`` of the source packages (so a subpackage
missing from ``[tool.setuptools] packages`` fails CI), the LICENSE, the SPDX license metadata and
both entry points; the sdist must hold the LICENSE. Usage: ``python .ci/check_dist.py DIST``.
"""

from __future__ import annotations

import configparser
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Import name -> source folder, as in pyproject's [tool.setuptools.package-dir].
SOURCE_DIRS = {"kda_contracts": "kda_contracts", "kda_kernels": "kernels"}
ENTRY_POINTS = {"console_scripts": {"kda-contracts": "kda_contracts.__main__:main"},
                "pytest11": {"kda_contracts": "kda_contracts._engine.tools.pytest_plugin"}}


def source_files() -> set[str]:
    """Every module and py.typed of the source packages, named as they are installed."""
    files = set()
    for name, folder in SOURCE_DIRS.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and (path.suffix == ".py" or path.name == "py.typed") and "__pycache__" not in path.parts:
                files.add(f"{name}/{path.relative_to(ROOT / folder).as_posix()}")
    return files


def check_wheel(wheel: Path) -> list[str]:
    """Problems with the wheel (an empty list when it is right)."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
        license_text = zf.read(f"{dist_info}/licenses/LICENSE") if f"{dist_info}/licenses/LICENSE" in names else b""
    shipped = {n for n in names if not n.startswith(dist_info + "/")}
    problems = [f"wheel lacks {f}" for f in sorted(source_files() - shipped)]
    problems += [f"wheel has unexpected {f}" for f in sorted(shipped - source_files())]
    if license_text != (ROOT / "LICENSE").read_bytes():
        problems.append(f"wheel lacks {dist_info}/licenses/LICENSE (or it differs from LICENSE)")
    for line in ("License-Expression: Apache-2.0", "License-File: LICENSE"):
        if line not in metadata.splitlines():
            problems.append(f"wheel METADATA lacks '{line}'")
    for group, wanted in ENTRY_POINTS.items():
        for name, target in wanted.items():
            got = entry_points.get(group, name, fallback=None)
            if got is None or got.strip() != target:
                problems.append(f"wheel entry point [{group}] {name} is {got!r}, expected {target!r}")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    """Problems with the sdist (an empty list when it is right)."""
    with tarfile.open(sdist) as tf:
        names = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    wanted = {"LICENSE", "pyproject.toml", "README.md"}
    wanted |= {f"{SOURCE_DIRS[f.split('/', 1)[0]]}/{f.split('/', 1)[1]}" for f in source_files()}
    return [f"sdist lacks {f}" for f in sorted(wanted - names)]


def main(dist: str) -> int:
    (wheel,) = Path(dist).glob("*.whl")
    (sdist,) = Path(dist).glob("*.tar.gz")
    problems = check_wheel(wheel) + check_sdist(sdist)
    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {wheel.name} and {sdist.name} hold every package, the LICENSE and the entry points")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
