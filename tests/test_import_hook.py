"""``kc.install_import_hook``: every function and method with a tensor annotation in the modules of
the named packages imported afterwards gets ``kc.contract``; refusals fail the import; modules
imported before are named in a warning; the hook uninstalls as a context manager.

Each test writes a small package under ``tmp_path`` with a name of its own (so no test sees
another's modules) and drops its modules and hooks afterwards.
"""

import importlib
import inspect
import itertools
import sys
import textwrap
import warnings

import pytest
import torch

import kda_contracts as kc
from kda_contracts._engine.contract import decorator as enforce
from kda_contracts._engine.tools.import_hook import ImportHook

_ids = itertools.count()

HEADER = """
import dataclasses, functools, typing
from typing import Annotated
import torch
import kda_contracts as kc
from kda_contracts import Float, Int, Tensor
"""

LAYERS = HEADER + '''
def rmsnorm(x: Float[Tensor, "B D"], weight: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
    """RMS norm."""
    return x * weight

norm = rmsnorm                      # a second name of the same function

def plain(n: int) -> int:           # nothing to check
    return n + 1

@kc.contract(where=["D % 2 == 0"])  # a contract by hand keeps its own options
def even(x: Float[Tensor, "B D"]) -> None: ...

@typing.no_type_check
def unchecked(x: Float[Tensor, "B D"]) -> None: ...

class Linear(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d, e))

    def forward(self, x: Float[Tensor, "*batch D"]) -> Float[Tensor, "*batch _"]:
        return x @ self.w

    @staticmethod
    def pad(x: Float[Tensor, "N"]) -> Float[Tensor, "N+1"]:
        return torch.cat([x, x[:1]])

    @property
    def weight(self) -> Float[Tensor, "_ _"]:
        return self.w

    class Inner:
        def step(self, x: Int[Tensor, "B"]) -> None: ...

@dataclasses.dataclass
class Batch:
    x: Float[Tensor, "B D"]
    lengths: Int[Tensor, "B"]

@typing.no_type_check
class Legacy:
    def run(self, x: Float[Tensor, "B D"]) -> None: ...
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``make(files)`` writes a fresh package (``{relative path: source}``, ``PKG`` standing for its
    name) and returns its name."""
    names = []

    def make(files):
        name = f"hooked_pkg_{next(_ids)}"
        for rel, source in {"__init__.py": "", **files}.items():
            path = tmp_path / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source).replace("PKG", name))
        names.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(enforce, "_REGISTRY", {})
    before = list(sys.meta_path)
    yield make
    sys.meta_path[:] = before
    for mod in [m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in names)]:
        del sys.modules[mod]


@pytest.fixture
def layers(package):
    name = package({"layers.py": LAYERS})
    with kc.install_import_hook(name) as hook:
        mod = importlib.import_module(f"{name}.layers")
    return name, mod, hook


# -- what is contracted ------------------------------------------------------------------------------
def test_module_functions_and_methods_with_tensor_annotations_are_contracted(layers):
    name, mod, hook = layers
    assert hook.contracted[f"{name}.layers"] == (
        "rmsnorm", "Linear.forward", "Linear.pad", "Linear.weight", "Linear.Inner.step", "Batch.__init__")
    for b in range(1, 30):  # a realistic volume of calls
        assert mod.rmsnorm(torch.ones(b, 4), torch.ones(4)).shape == (b, 4)
        assert mod.Linear(4, 3)(torch.ones(b, 2, 4)).shape == (b, 2, 3)
    with pytest.raises(kc.ShapeError, match=r"rmsnorm\(\): 1 contract violation\n  \[1\] weight: ShapeError"):
        mod.rmsnorm(torch.ones(2, 4), torch.ones(5))
    with pytest.raises(kc.ShapeError, match=r"Linear\.pad"):
        mod.Linear.pad(torch.ones(2, 2))
    with pytest.raises(kc.ShapeError, match=r"Linear\.Inner\.step"):
        mod.Linear.Inner().step(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(kc.ShapeError, match=r"Batch\.__init__"):
        mod.Batch(torch.ones(2, 3), torch.ones(3, dtype=torch.int64))
    assert mod.Linear(2, 2).weight.shape == (2, 2)


def test_its_contracts_are_registered_under_module_and_name(layers):
    name, mod, _ = layers
    registered = kc.registered_contracts()
    assert registered[f"{name}.layers:rmsnorm"] is mod.rmsnorm.__kda_contract__
    assert registered[f"{name}.layers:Linear.forward"].name == "Linear.forward"


def test_a_second_name_of_a_function_is_the_same_wrapper(layers):
    _, mod, _ = layers
    assert mod.norm is mod.rmsnorm and hasattr(mod.norm, "__kda_contract__")


def test_functions_without_tensor_annotations_are_left_as_they_are(layers):
    _, mod, _ = layers
    assert not hasattr(mod.plain, "__kda_contract__") and mod.plain(1) == 2
    assert not hasattr(mod.Linear.__init__, "__kda_contract__")


def test_a_contract_written_by_hand_is_kept_not_wrapped_twice(layers):
    _, mod, _ = layers
    assert mod.even.__wrapped__.__name__ == "even" and not hasattr(mod.even.__wrapped__, "__kda_contract__")
    with pytest.raises(kc.ShapeError, match=r"D % 2 == 0"):
        mod.even(torch.ones(2, 3))


def test_no_type_check_leaves_a_function_or_a_whole_class_unchecked(layers):
    _, mod, _ = layers
    assert not hasattr(mod.unchecked, "__kda_contract__")
    assert not hasattr(mod.Legacy.run, "__kda_contract__")


def test_submodules_imported_later_are_contracted_and_other_packages_are_not(package):
    name = package({"sub/__init__.py": "", "sub/ops.py": HEADER + '''
def scale(x: Float[Tensor, "B"], s: float) -> Float[Tensor, "B"]:
    return x * s
'''})
    other = package({"ops.py": HEADER + 'def f(x: Float[Tensor, "B"]) -> None: ...\n'})
    with kc.install_import_hook(name) as hook:
        ops = importlib.import_module(f"{name}.sub.ops")
        untouched = importlib.import_module(f"{other}.ops")
    assert hook.contracted == {name: (), f"{name}.sub": (), f"{name}.sub.ops": ("scale",)}
    assert hasattr(ops.scale, "__kda_contract__") and not hasattr(untouched.f, "__kda_contract__")
    with pytest.raises(kc.ShapeError):
        ops.scale(torch.ones(2, 2), 2.0)


def test_a_package_name_covers_that_package_not_one_that_starts_with_its_name(package):
    name = package({})
    hook = ImportHook((name,), None, None)
    assert hook.covers(name) and hook.covers(f"{name}.a.b")
    assert not hook.covers(f"{name}_extra") and not hook.covers("kda_contracts.ops")


def test_several_packages_at_once(package):
    first, second = package({"a.py": LAYERS}), package({"b.py": LAYERS})
    with kc.install_import_hook([first, second]) as hook:
        a = importlib.import_module(f"{first}.a")
        b = importlib.import_module(f"{second}.b")
    assert hook.packages == (first, second)
    assert hasattr(a.rmsnorm, "__kda_contract__") and hasattr(b.rmsnorm, "__kda_contract__")


def test_an_imported_name_is_contracted_by_the_module_that_defines_it(package):
    name = package({"base.py": LAYERS, "user.py": "from PKG.base import rmsnorm\n"})
    with kc.install_import_hook(name) as hook:
        user = importlib.import_module(f"{name}.user")
    base = sys.modules[f"{name}.base"]
    assert user.rmsnorm is base.rmsnorm and hasattr(user.rmsnorm, "__kda_contract__")
    assert hook.contracted[f"{name}.user"] == ()


def test_forward_references_resolve_after_the_module_ran(package):
    name = package({"fwd.py": '''
from __future__ import annotations
import torch
from kda_contracts import Float, Tensor

def make(cfg: Config, x: Float[Tensor, "B D"]) -> None: ...

class Config:
    pass
'''})
    with kc.install_import_hook(name) as hook:
        fwd = importlib.import_module(f"{name}.fwd")
    assert hook.contracted[f"{name}.fwd"] == ("make",)
    with pytest.raises(kc.ShapeError):
        fwd.make(fwd.Config(), torch.ones(3))


# -- modes ---------------------------------------------------------------------------------------------
def test_without_a_mode_the_contracts_follow_the_mode_in_force(layers):
    _, mod, hook = layers
    assert hook.mode is None
    with kc.mode("off"):
        mod.rmsnorm(torch.ones(2, 4), torch.ones(1))  # not checked (the body broadcasts)
    with pytest.raises(kc.ShapeError):
        mod.rmsnorm(torch.ones(2, 4), torch.ones(1))


def test_a_pinned_mode_holds_whatever_mode_is_in_force(package):
    name = package({"layers.py": LAYERS})
    with kc.install_import_hook(name, mode="check"):
        mod = importlib.import_module(f"{name}.layers")
    with kc.mode("off"), pytest.raises(kc.ShapeError):
        mod.rmsnorm(torch.ones(2, 4), torch.ones(5))


def test_imported_while_off_the_functions_are_themselves_and_nothing_is_registered(package):
    name = package({"layers.py": LAYERS})
    with kc.mode("off"), kc.install_import_hook(name) as hook:
        mod = importlib.import_module(f"{name}.layers")
    assert not hasattr(mod.rmsnorm, "__kda_contract__") and hook.contracted[f"{name}.layers"] == ()
    assert kc.registered_contracts() == {}


def test_doc_puts_the_shape_table_in_each_docstring(package):
    name = package({"layers.py": LAYERS})
    with kc.install_import_hook(name, doc=True):
        mod = importlib.import_module(f"{name}.layers")
    assert mod.rmsnorm.__doc__.startswith("RMS norm.\n\nContract (kda-contracts)::\n")


# -- never silent --------------------------------------------------------------------------------------
REFUSED = HEADER + '''
def mask(lengths: Int[Tensor, "B"]) -> Float[Tensor, "B T"]: ...

class Model:
    def ok(self, x: Float[Tensor, "B"]) -> None: ...
    def grid(self, x: Float[Tensor, "B"]) -> Float[Tensor, "B 2*T"]: ...
'''


def test_a_contract_the_engine_refuses_fails_the_import_naming_every_such_function(package):
    name = package({"bad.py": REFUSED})
    with kc.install_import_hook(name), pytest.raises(kc.AnnotationError) as info:
        importlib.import_module(f"{name}.bad")
    message = str(info.value)
    assert message.startswith(
        f"kc.install_import_hook: cannot contract 2 functions of {name}.bad (fix the annotations, or mark a "
        "function or class @typing.no_type_check to leave it unchecked):\n  mask: cannot bind dim 'T' (in a "
        "constraint or the return)")
    assert "\n  Model.grid: cannot bind dim 'T'" in message
    assert f"{name}.bad" not in sys.modules  # no half-contracted module is left behind


def test_annotations_that_cannot_be_read_fail_the_import_too(package):
    name = package({"hidden.py": '''
from __future__ import annotations
from typing import TYPE_CHECKING
from kda_contracts import Float, Tensor
if TYPE_CHECKING:
    from somewhere import Config

def run(x: Float[Tensor, "B"], cfg: Config) -> None: ...
'''})
    with kc.install_import_hook(name), pytest.raises(kc.AnnotationError) as info:
        importlib.import_module(f"{name}.hidden")
    assert str(info.value) == (
        f"kc.install_import_hook: cannot contract a function of {name}.hidden (fix the annotations, or mark a "
        "function or class @typing.no_type_check to leave it unchecked):\n"
        "  run: cannot read the annotations: name 'Config' is not defined")


def test_modules_imported_before_the_hook_are_named_in_a_warning(package):
    name = package({"layers.py": LAYERS})
    early = importlib.import_module(f"{name}.layers")
    with pytest.warns(kc.ImportHookWarning) as record, kc.install_import_hook(name) as hook:
        pass
    assert str(record[0].message) == (
        f"kc.install_import_hook: {name}, {name}.layers imported before the hook was installed, not contracted; "
        f"modules of {name} imported from now on are. Install the hook before the first import (under pytest: "
        "--kda-contracts-packages)")
    assert hook.already_imported == (name, f"{name}.layers")
    assert not hasattr(early.rmsnorm, "__kda_contract__")


def test_a_hook_on_packages_not_imported_yet_warns_nothing(package):
    name = package({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kc.install_import_hook(name).uninstall()


# -- installing and uninstalling -------------------------------------------------------------------------
def test_the_context_manager_uninstalls_the_hook(package):
    name = package({"late.py": LAYERS})
    with kc.install_import_hook(name) as hook:
        assert hook.installed and sys.meta_path[0] is hook
        assert repr(hook) == f"<kda_contracts import hook for {name} (mode in force, installed)>"
    assert not hook.installed and hook not in sys.meta_path
    late = importlib.import_module(f"{name}.late")
    assert not hasattr(late.rmsnorm, "__kda_contract__")
    hook.uninstall()  # again: nothing to do


def test_the_hooked_modules_loader_still_answers_for_the_source_and_reload_contracts_again(layers):
    _, mod, _ = layers
    assert "def rmsnorm" in inspect.getsource(mod)
    with pytest.warns(kc.ImportHookWarning):
        hook_again = kc.install_import_hook(mod.__name__.rsplit(".", 1)[0])
    fresh = importlib.reload(mod)
    hook_again.uninstall()
    assert hasattr(fresh.rmsnorm, "__kda_contract__")


@pytest.mark.parametrize(("packages", "kind", "message"), [
    ("kda_contracts", kc.AnnotationError, "'kda_contracts': kda_contracts is never hooked"),
    (["ok", "kda_contracts.ops"], kc.AnnotationError, "'kda_contracts.ops': kda_contracts is never hooked"),
    ("my model", kc.AnnotationError, "'my model' is not a module name"),
    ([], kc.AnnotationError, "no package named"),
    (3, kc.AnnotationError, "expected a package name or several, got 3"),
])
def test_bad_package_names_are_refused(packages, kind, message):
    with pytest.raises(kind, match="^kc.install_import_hook: " + message.replace(".", r"\.")):
        kc.install_import_hook(packages)


def test_a_bad_mode_is_refused():
    with pytest.raises(kc.AnnotationError, match=r"kc.install_import_hook\(mode='loud'\): unknown mode 'loud'"):
        kc.install_import_hook("anything", mode="loud")
