"""`kda-contracts docs --module pkg.mod`: docs for a user's own ops and contracts, without the
KDA sections unless `--builtin` asks for them; each op's contract(s), checks and backends table."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kda_contracts.__main__ import main
from kda_contracts._app.docs import FILES
from kda_contracts._engine.contract import decorator as enforce
from kda_contracts._engine.operation import registry as op_module
from kda_contracts._engine.tools import module_docs

BUILTIN_FILES = set(FILES)  # the shipped ops' pages and pictures (KDA's and GDN's)

USER_OPS = '''
"""A user's kernels: one op with a fast backend, one with two contract variants, one contract."""
from typing import Annotated

import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor


def finite_rows(ctx):
    """Every row of `x` is finite: one NaN row poisons the whole batch.

    Example::

        finite_rows(ctx)  # not prose: left out of the docs
    """
    return []


def out_written(ctx, backend):
    """`out` holds no NaN once the backend ran."""
    return []


@kc.op(returns="out", value_checks=finite_rows, after=out_written,
       where=[kc.Where("D % 2 == 0", hint="the kernel splits D in halves")])
def scale_rows(x: Float[Tensor, "B D"], w: Float[Tensor, "D"],
               out: Annotated[Float[Tensor, "B D"], kc.Spec(mutated=True)], eps: float = 0.0) -> None:
    """Scale each row of `x` by `w` into `out` (the PyTorch reference)."""
    torch.mul(x, w, out=out)


@scale_rows.backend("fast", devices=("cpu", "cuda"), priority=30, where=["D % 4 == 0"],
                    dtypes={"x": (torch.float32, torch.bfloat16)}, requires=("numpy",))
def _(x, w, out, eps, *, dims):
    """a vectorised kernel for D a multiple of 4"""
    torch.mul(x, w, out=out)


@scale_rows.backend("gpu-only", devices=("cuda",), priority=50, dtypes=(torch.float16,))
def _(x, w, out, eps):
    """a CUDA kernel"""


def _vk(out: Float[Tensor, "N V"], state: Float[Tensor, "N V K"], *, layout: str = "VK") -> None: ...


def _kv(out: Float[Tensor, "N V"], state: Float[Tensor, "N K V"], *, layout: str = "VK") -> None: ...


def pick_layout(layout):
    """The layout the caller declares."""
    return layout


@kc.op(variants={"VK": _vk, "KV": _kv}, variant=pick_layout)
def read_state(out, state, *, layout="VK"):
    """Sum each slot's state over K."""


@read_state.backend("vk-kernel", devices=("cpu",), priority=5, variants=("VK",))
def _(out, state, *, layout="VK", variant):
    """only the VK layout"""


@kc.contract
def rms(x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
    return x
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch, request):
    """A fresh current directory holding ``user_ops_<test>.py`` (the registries, sys.path and
    sys.modules are restored afterwards); yields the module name."""
    monkeypatch.setattr(enforce, "_REGISTRY", dict(enforce._REGISTRY))
    monkeypatch.setattr(op_module, "_OPS", dict(op_module._OPS))
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"user_ops_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_OPS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield name
    for mod in set(sys.modules) - before:
        del sys.modules[mod]


def _docs(argv, capsys):
    code = main(["docs", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _render(name, capsys, *extra):
    code, out, err = _docs(["--module", name, "--out", "api", *extra], capsys)
    assert code == 0, out + err
    return (Path("api") / "contracts.md").read_text(encoding="utf-8")


# -- what a module page holds --------------------------------------------------------------------
def test_a_module_in_the_current_directory_is_rendered_alone(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert sorted(p.name for p in Path("api").iterdir()) == ["contracts.json", "contracts.md"]
    assert "- [scale_rows](#scale_rows)\n- [read_state](#read_state)\n- [rms](#rms)" in md
    for kda in ("packed_decode", "Packed decode layouts", "errors.md", "svg", "KDAConfig", "kimi"):
        assert kda not in md, kda


def test_each_op_gets_its_signature_docstring_and_what_it_returns(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert (f"`scale_rows(x, w, out, eps=0.0, *, backend='auto')`, defined in `{user_dir}`. Call it like the "
            "function") in md
    assert "Scale each row of `x` by `w` into `out` (the PyTorch reference)." in md
    assert "Returns `out` (the arguments it writes)." in md


def test_the_backends_table_lists_every_backend_highest_priority_first(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert ("| backend | priority | devices | dtypes | where | requires | description |\n"
            "|---|---|---|---|---|---|---|\n"
            "| `gpu-only` | 50 | cuda | floating tensors: float16 | — | — | a CUDA kernel |\n"
            "| `fast` | 30 | cpu, cuda | `x`: bfloat16/float32 | `D % 4 == 0` | numpy | a vectorised kernel "
            "for D a multiple of 4 |\n"
            "| `torch` | 0 | any | any | — | — | Scale each row of `x` by `w` into `out` (the PyTorch "
            "reference). |\n") in md


def test_the_users_own_checks_are_rendered_with_their_docstrings(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert ("Value checks:\n\n- `finite_rows` (strict mode, on the arguments, before the kernel runs): Every row "
            "of `x` is finite: one NaN row poisons the whole batch.\n") in md
    assert "not prose" not in md  # the docstring's Example:: section is code, left out
    assert "After the backend ran:\n\n- `out_written` (strict mode, after the backend ran): `out` holds no NaN " \
           "once the backend ran." in md
    assert "- `D % 2 == 0` (ShapeError; checked per call): the kernel splits D in halves" in md


def test_an_ops_contract_is_rendered_once_inside_its_section(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert md.count("## scale_rows") == 1 and "### Contract\n\n`scale_rows(x, w, out, eps)`" in md
    assert md.count("## read_state") == 1  # its variants are registered as read_state[VK], read_state[KV]
    assert "## read_state[" not in md and "- [read_state[" not in md


def test_each_variant_of_an_op_gets_its_contract_and_the_table_says_which_backends_take_it(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert "Contract variants `VK`, `KV`: `pick_layout` names the variant of each call: The layout the caller " \
           "declares." in md
    assert "### Variant VK: `read_state[VK]`" in md and "### Variant KV: `read_state[KV]`" in md
    assert "| `state` | `[N, V, K]` |" in md and "| `state` | `[N, K, V]` |" in md
    assert "| `vk-kernel` | 5 | cpu | any | — | — | only the VK layout | VK |" in md
    assert "| `torch` | 0 | any | any | — | — | Sum each slot's state over K. | all |" in md


def test_a_contract_of_no_op_gets_its_own_section(user_dir, capsys):
    md = _render(user_dir, capsys)
    assert "## rms\n\n`rms(x)`" in md and "Returns: `return` `[B, D]`" in md


def test_the_json_holds_the_same_ops_contracts_and_backends(user_dir, capsys):
    _render(user_dir, capsys)
    doc = json.loads((Path("api") / "contracts.json").read_text(encoding="utf-8"))
    assert doc["modules"] == [user_dir] and doc["config"] is None and not doc["availability_listed"]
    ops = {o["name"]: o for o in doc["ops"]}
    assert list(ops) == ["scale_rows", "read_state"] and [c["key"] for c in doc["contracts"]] == ["rms"]
    fast = next(b for b in ops["scale_rows"]["backends"] if b["name"] == "fast")
    assert fast["dtypes"] == {"x": ["bfloat16", "float32"]} and fast["kernel"] == f"{user_dir}._"
    assert "available" not in fast
    assert ops["scale_rows"]["contracts"][0]["value_checks"][0]["name"] == "finite_rows"
    assert [c["key"] for c in ops["read_state"]["contracts"]] == ["read_state[VK]", "read_state[KV]"]


def test_the_module_page_does_not_depend_on_the_machine(user_dir, capsys, monkeypatch):
    first = _render(user_dir, capsys)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _render(user_dir, capsys) == first
    assert "available here" not in first


def test_availability_on_this_machine_is_listed_only_when_asked(user_dir, capsys):
    md = _render(user_dir, capsys, "--availability")
    assert "| backend | priority | devices | dtypes | where | requires | description | available here |" in md
    assert "| Scale each row of `x` by `w` into `out` (the PyTorch reference). | yes |" in md
    assert "Backend availability is this machine's (`--availability`)." in md


def test_a_package_is_rendered_with_its_submodules(tmp_path, monkeypatch, capsys, user_dir):
    pkg = tmp_path / "userpkg_docs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import kernels\n", encoding="utf-8")
    (pkg / "kernels.py").write_text(USER_OPS, encoding="utf-8")
    md = _render("userpkg_docs", capsys)
    assert "defined in `userpkg_docs.kernels`" in md and "## rms" in md


def test_the_shipped_op_renders_through_the_same_generic_path(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    md = _render("kda_contracts.ops.packed_decode", capsys)
    assert "- [packed_decode](#packed_decode)\n" in md and "Packed decode layouts" not in md
    assert "### Variant VK: `packed_decode[VK]`" in md and "### Variant KV: `packed_decode[KV]`" in md
    assert "| `triton` | 30 | cuda | any | — | triton | our Triton kernel" in md
    # an Adapter's own fields show where they restrict more than their defaults; the shipped ones do not
    assert "also restricts" not in md


# -- --builtin and --check ---------------------------------------------------------------------------
def test_builtin_adds_the_kda_sections_and_keeps_the_users_ops(user_dir, capsys):
    md = _render(user_dir, capsys, "--builtin")
    assert {p.name for p in Path("api").iterdir()} == BUILTIN_FILES
    assert "## Packed decode layouts" in md and "## packed_decode[VK]" in md and "## Backends" in md
    assert "## scale_rows" in md and "| `fast` | 30 |" in md and md.count("## rms") == 1
    assert "## read_state[VK]" not in md  # an op's contracts stay in its section
    doc = json.loads((Path("api") / "contracts.json").read_text(encoding="utf-8"))
    assert [o["name"] for o in doc["modules"]["ops"]] == ["scale_rows", "read_state"]


def test_check_compares_the_module_page_with_the_folder(user_dir, capsys):
    _render(user_dir, capsys)
    assert _docs(["--module", user_dir, "--out", "api", "--check"], capsys)[0] == 0
    code, out, _ = _docs(["--module", user_dir, "--out", "api", "--check", "--builtin"], capsys)
    assert code == 1  # the builtin files are missing there
    assert "errors.md: missing" in out
    assert f"regenerate with: kda-contracts docs --out api --module {user_dir} --builtin" in out


def test_check_fails_when_an_op_gains_a_backend(user_dir, capsys):
    _render(user_dir, capsys)
    ops = op_module.ops()
    ops["scale_rows"].backend("extra", devices=("cpu",), priority=1)(lambda x, w, out, eps: None)
    code, out, _ = _docs(["--module", user_dir, "--out", "api", "--check"], capsys)
    assert code == 1 and "contracts.md: differs" in out


# -- bad command lines: exit 2, a message, no traceback ----------------------------------------------
@pytest.mark.parametrize(("source", "argv", "message"), [
    ("raise RuntimeError('no GPU here')\n", ["--module", "{name}"],
     "--module '{name}': cannot import it (RuntimeError: no GPU here)"),
    ("import not_installed_dep_x\n", ["--module", "{name}"],
     "--module '{name}': cannot import it (ModuleNotFoundError: No module named 'not_installed_dep_x')"),
    ("x = 1\n", ["--module", "{name}"],
     "--module '{name}': defines no contracts or ops (nothing in it or its submodules is decorated with "
     "@kc.contract or @kc.op)"),
    ("x = 1\n", ["--module", "no_such_module_for_docs"],
     "--module 'no_such_module_for_docs': no such module in the current directory or on sys.path"),
    ("x = 1\n", ["--availability"], "--availability lists the backends of the --module ops; give --module"),
], ids=["raises", "missing-dependency", "nothing-decorated", "no-such-module", "availability-alone"])
def test_a_bad_module_exits_2_with_a_clear_message(source, argv, message, user_dir, capsys, tmp_path):
    name = f"{user_dir}_bad"
    (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    code, _, err = _docs([a.format(name=name) for a in argv] + ["--out", "api"], capsys)
    assert code == 2
    assert err == f"kda-contracts docs: {message.format(name=name)}\n"
    assert not Path("api").exists()


def test_the_console_script_finds_modules_in_the_current_directory(tmp_path):
    script = Path(sys.executable).with_name("kda-contracts")
    if not script.exists():
        pytest.skip("the kda-contracts script is not installed beside this python")
    (tmp_path / "cwd_ops_for_docs.py").write_text(USER_OPS, encoding="utf-8")
    ok = subprocess.run([str(script), "docs", "--module", "cwd_ops_for_docs", "--out", "api"], cwd=tmp_path,
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "## scale_rows" in (tmp_path / "api" / "contracts.md").read_text(encoding="utf-8")
    (tmp_path / "broken_for_docs.py").write_text("1/0\n", encoding="utf-8")
    bad = subprocess.run([str(script), "docs", "--module", "broken_for_docs"], cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--module 'broken_for_docs': cannot import it (ZeroDivisionError: division by zero)" in bad.stderr


# -- the engine API ------------------------------------------------------------------------------
def _import(name):
    sys.path.insert(0, str(Path.cwd()))  # sys.path is restored by the fixture
    return importlib.import_module(name)


def test_select_finds_ops_and_contracts_by_the_module_they_were_defined_in(user_dir):
    _import(user_dir)
    ops, contracts = module_docs.select([user_dir])
    assert [o.name for o in ops] == ["scale_rows", "read_state"] and list(contracts) == ["rms"]
    assert module_docs.empty_modules([user_dir, "json"]) == ["json"]
    assert module_docs.in_modules("a.b.c", ["a.b"]) and not module_docs.in_modules("a.bc", ["a.b"])


def test_a_page_renders_the_same_files_twice(user_dir):
    _import(user_dir)
    page = module_docs.describe_modules([user_dir])
    assert module_docs.generate(page) == module_docs.generate(module_docs.describe_modules([user_dir]))
    assert page.keys == {"scale_rows", "read_state[VK]", "read_state[KV]", "rms"}
    assert module_docs.op_section(page.ops[0]).title == "scale_rows"


def test_a_module_that_cannot_be_documented_exits_2_with_the_traceback(user_dir, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(module_docs, "describe_op", broken)
    code, _, err = _docs(["--module", user_dir, "--out", "api"], capsys)
    assert code == 2 and "Traceback" in err and "RuntimeError: a bug" in err
    assert err.endswith(f"kda-contracts docs: --module {user_dir}: documenting it failed (RuntimeError: a bug; "
                        "traceback above)\n")


CONFIG_OPS = '''
import kda_contracts as kc
from kda_contracts import Float, Tensor


@kc.contract(config_arg="config")
def read_pool(state: Float[Tensor, "N HV V K"], config=None) -> None: ...
'''


def test_config_options_give_a_modules_contracts_concrete_shapes(user_dir, capsys, tmp_path):
    (tmp_path / f"{user_dir}_cfg.py").write_text(CONFIG_OPS, encoding="utf-8")
    md = _render(f"{user_dir}_cfg", capsys)
    assert "No config: dims are bound per call." in md
    assert "| `state` | `[N, HV, V, K]` | bfloat16, float16, float32, float64, any float8 |" in md
    md = _render(f"{user_dir}_cfg", capsys, "--config", "kimi-linear-48b-a3b", "--tp", "2")
    assert "Concrete shapes are for the config **kimi-linear-48b-a3b, tp_size=2**." in md
    assert "| `state` | `[N, HV, V, K]` | `[N, 16, 128, 128]` |" in md
