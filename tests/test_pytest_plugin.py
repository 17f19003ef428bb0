"""The pytest plugin: session mode (command line, environment, ini, default strict), the marker,
the fixture, the summary line, --kda-contracts-require-all, --kda-contracts-require and
--kda-contracts-packages.

Each test runs an inner pytest session in-process with pytester, except those about
$KDA_CONTRACTS_MODE in a fresh ``python -m pytest`` (the plugin imports kda_contracts there). The contract registry is
swapped for an empty one per test, so the inner session sees only the contracts it defines.
"""

import contextvars
import os
import subprocess
import sys

import pytest

import kda_contracts as kc
import kda_contracts._engine.tools.pytest_plugin
from kda_contracts import Float, Tensor
from kda_contracts._engine.contract import decorator as enforce

pytest_plugins = ["pytester"]

# An inner test module: one contract with a strict-only value check, one never called.
CONTRACTS = """
import pytest, torch
import kda_contracts as kc
from kda_contracts import Float, Tensor

def no_negatives(ctx):
    if bool((ctx.values["x"] < 0).any()):
        return [kc.Violation(kc.ValueRangeError, "x", ">= 0 everywhere", "a negative value")]
    return []

@kc.contract(value_checks=no_negatives, name="nonneg")
def nonneg(x: Float[Tensor, "B"]) -> None: ...

@kc.contract(name="unused")
def unused(x: Float[Tensor, "B"]) -> None: ...
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    monkeypatch.setattr(enforce, "_REGISTRY", {})
    monkeypatch.delenv("KDA_CONTRACTS_MODE", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    default = contextvars.Context().run(kc.get_mode)  # the process default, whatever a test does
    yield
    kc.set_default_mode(default)


def run(pytester, *args):
    # hypothesis's plugin would re-import (and assertion-rewrite) hypothesis in every inner session
    return pytester.runpytest_inprocess("-p", "no:hypothesispytest", *args)


def reports_mode(pytester, expected):
    pytester.makepyfile(test_inner=f"""
import kda_contracts as kc
def test_mode():
    assert kc.get_mode() == {expected!r}
""")


# -- the session mode -------------------------------------------------------------------------------
def test_the_plugin_is_registered_by_its_entry_point(request):
    assert request.config.pluginmanager.get_plugin("kda_contracts") is kda_contracts._engine.tools.pytest_plugin


def test_the_default_mode_under_pytest_is_strict(pytester):
    reports_mode(pytester, "strict")
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize("name", ["check", "off", "strict"])
def test_the_command_line_sets_the_session_mode(pytester, name):
    reports_mode(pytester, name)
    run(pytester, f"--kda-contracts={name}").assert_outcomes(passed=1)


def test_off_at_the_command_line_makes_contracts_decorated_at_import_the_functions_themselves(pytester):
    pytester.makepyfile(test_inner="""
import kda_contracts as kc
from kda_contracts import Float, Tensor

def f(x: Float[Tensor, "B"]) -> None: ...
g = kc.contract(f)

def test_identity():
    assert g is f
""")
    run(pytester, "--kda-contracts=off").assert_outcomes(passed=1)


def test_the_ini_option_sets_the_session_mode(pytester):
    pytester.makeini("[pytest]\nkda_contracts_mode = check\n")
    reports_mode(pytester, "check")
    run(pytester).assert_outcomes(passed=1)


def test_the_command_line_wins_over_the_environment_and_the_ini_option(pytester, monkeypatch):
    pytester.makeini("[pytest]\nkda_contracts_mode = check\n")
    monkeypatch.setenv("KDA_CONTRACTS_MODE", "off")
    reports_mode(pytester, "strict")
    run(pytester, "--kda-contracts=strict").assert_outcomes(passed=1)


def test_the_environment_wins_over_the_ini_option(pytester, monkeypatch):
    pytester.makeini("[pytest]\nkda_contracts_mode = check\n")
    monkeypatch.setenv("KDA_CONTRACTS_MODE", "off")
    reports_mode(pytester, "off")
    run(pytester).assert_outcomes(passed=1)


def test_the_previous_default_is_restored_after_the_session(pytester):
    kc.set_default_mode("check")
    reports_mode(pytester, "off")
    run(pytester, "--kda-contracts=off").assert_outcomes(passed=1)
    assert kc.get_mode() == "check"


def test_an_unknown_mode_on_the_command_line_is_a_usage_error(pytester):
    reports_mode(pytester, "strict")
    result = run(pytester, "--kda-contracts=loud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*argument --kda-contracts: invalid choice: 'loud' (choose from *strict*, *check*, *off*)*"])


def test_an_unknown_mode_in_the_ini_file_is_a_usage_error_naming_the_file(pytester):
    pytester.makeini("[pytest]\nkda_contracts_mode = loud\n")
    reports_mode(pytester, "strict")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kda_contracts_mode (in *tox.ini): unknown mode 'loud'; "
                                 "expected one of 'strict', 'check', 'off', 'watch'*"])


def test_an_unknown_mode_in_the_environment_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("KDA_CONTRACTS_MODE", "loud")
    reports_mode(pytester, "strict")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*KDA_CONTRACTS_MODE: unknown mode 'loud'; "
                                 "expected one of 'strict', 'check', 'off', 'watch'*"])


def test_an_empty_environment_value_means_unset_so_the_ini_option_applies(pytester, monkeypatch):
    pytester.makeini("[pytest]\nkda_contracts_mode = check\n")
    monkeypatch.setenv("KDA_CONTRACTS_MODE", " ")
    reports_mode(pytester, "check")
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_still_answer_with_a_bad_environment_value(pytester, monkeypatch, flag):
    monkeypatch.setenv("KDA_CONTRACTS_MODE", "loud")
    result = run(pytester, flag)
    assert result.ret == pytest.ExitCode.OK
    if flag == "--help":
        result.stdout.fnmatch_lines(["*--kda-contracts=*",
                                     "*PytestConfigWarning: KDA_CONTRACTS_MODE: unknown mode 'loud'*"])


# -- a fresh `python -m pytest` of a project that never uses kda-contracts (the plugin loads anyway) --
def run_unrelated_project(tmp_path, env_value, *args):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_unrelated.py").write_text("def test_nothing_to_do_with_contracts():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["KDA_CONTRACTS_MODE"] = env_value
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_an_empty_environment_value_lets_an_unrelated_project_run(tmp_path):
    done = run_unrelated_project(tmp_path, "")
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "kda-contracts:" not in done.stdout  # no contract ran, no option given: nothing to say


def test_a_bad_environment_value_is_a_usage_error_naming_it_and_the_modes_not_a_crash(tmp_path):
    done = run_unrelated_project(tmp_path, "loud")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert done.stderr.strip() == (
        "ERROR: KDA_CONTRACTS_MODE: unknown mode 'loud'; expected one of 'strict', 'check', 'off', 'watch' (empty or "
        "unset means the ini option, else strict). Set KDA_CONTRACTS_MODE to one of those or unset it, pass "
        "--kda-contracts=MODE, or disable this plugin with -p no:kda_contracts")
    assert "Traceback" not in done.stdout + done.stderr


def test_the_command_line_overrides_a_bad_environment_value(tmp_path):
    done = run_unrelated_project(tmp_path, "loud", "--kda-contracts=check")
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "kda-contracts: mode check;" in done.stdout


def test_after_an_in_process_session_a_bad_environment_value_is_reported_again(tmp_path):
    # the session's mode is the process default only while the session lasts
    (tmp_path / "test_unrelated.py").write_text("def test_nothing():\n    pass\n")
    script = ("import pytest, kda_contracts as kc\n"
              "args = ['-q', '-p', 'no:cacheprovider', '--kda-contracts=check', 'test_unrelated.py']\n"
              "assert pytest.main(args) == 0\n"
              "try:\n    kc.get_mode()\nexcept kc.AnnotationError as err:\n    print('after:', err)\n")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "KDA_CONTRACTS_MODE": "loud"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after: KDA_CONTRACTS_MODE: unknown mode 'loud'" in done.stdout


# -- the marker -------------------------------------------------------------------------------------
def test_the_marker_sets_the_mode_of_one_tests_setup_call_and_teardown(pytester):
    pytester.makepyfile(test_inner="""
import pytest
import kda_contracts as kc

seen = []

@pytest.fixture
def record():
    seen.append(("setup", kc.get_mode()))
    yield
    seen.append(("teardown", kc.get_mode()))

@pytest.mark.kda_contracts("off")
def test_marked(record):
    seen.append(("call", kc.get_mode()))

def test_unmarked_and_what_the_marked_one_saw():
    assert seen == [("setup", "off"), ("call", "off"), ("teardown", "off")]
    assert kc.get_mode() == "strict"
""")
    run(pytester).assert_outcomes(passed=2)


def test_the_marker_applies_to_a_class_and_the_closest_one_wins(pytester):
    pytester.makepyfile(test_inner="""
import pytest
import kda_contracts as kc

@pytest.mark.kda_contracts("check")
class TestChecked:
    def test_class_mode(self):
        assert kc.get_mode() == "check"

    @pytest.mark.kda_contracts(mode="off")
    def test_method_mode(self):
        assert kc.get_mode() == "off"
""")
    run(pytester).assert_outcomes(passed=2)


def test_the_marker_is_registered(pytester):
    reports_mode(pytester, "strict")
    run(pytester, "--strict-markers", "--markers").stdout.fnmatch_lines(
        ["@pytest.mark.kda_contracts(mode): *"])


def test_an_unknown_mode_in_the_marker_errors_that_test_only(pytester):
    pytester.makepyfile(test_inner="""
import pytest

@pytest.mark.kda_contracts("loud")
def test_bad():
    pass

def test_good():
    pass
""")
    result = run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_inner.py::test_bad: @pytest.mark.kda_contracts: unknown mode 'loud'; "
                                 "expected one of 'strict', 'check', 'off', 'watch'*"])


# -- the fixture ------------------------------------------------------------------------------------
def test_the_fixture_reports_the_mode_and_switches_it_for_a_block(pytester):
    pytester.makepyfile(test_inner="""
import pytest
import kda_contracts as kc

def test_switch(kda_contracts_mode):
    assert (kda_contracts_mode.name, kda_contracts_mode.session) == ("check", "check")
    with kda_contracts_mode("off"):
        assert kda_contracts_mode.name == kc.get_mode() == "off"
    assert kda_contracts_mode.name == "check"

@pytest.mark.kda_contracts("strict")
def test_marked(kda_contracts_mode):
    assert (kda_contracts_mode.name, kda_contracts_mode.session) == ("strict", "check")
""")
    run(pytester, "--kda-contracts=check").assert_outcomes(passed=2)


def test_parametrizing_the_fixture_runs_the_test_in_each_mode_and_wins_over_the_marker(pytester):
    pytester.makepyfile(test_inner="""
import pytest
import kda_contracts as kc

@pytest.mark.kda_contracts("strict")
@pytest.mark.parametrize("kda_contracts_mode", ["off", "check"], indirect=True)
def test_indirect(kda_contracts_mode, request):
    assert kda_contracts_mode.name == request.node.callspec.params["kda_contracts_mode"]

@pytest.mark.parametrize("kda_contracts_mode", ["off", "check"])
def test_direct(kda_contracts_mode):
    assert kc.get_mode() == kda_contracts_mode
""")
    run(pytester).assert_outcomes(passed=4)


# -- the summary line and --kda-contracts-require-all -----------------------------------------------
def test_the_summary_counts_only_what_the_session_did(pytester):
    @kc.contract(name="before")
    def before(x: Float[Tensor, "B"]) -> None: ...

    import torch
    before(torch.zeros(2))  # called before the session: not counted
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
    nonneg(torch.ones(3))
    with pytest.raises(kc.ValueRangeError):
        nonneg(-torch.ones(2))          # strict: the value check rejects it
    with kc.mode("off"):
        nonneg(torch.ones(2))           # off: not a checked call
""")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kda-contracts: mode strict; 1 contract exercised of 3 registered, "
                                 "3 checked calls, 1 violation raised"])


def test_require_all_fails_the_session_naming_the_contracts_never_exercised(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require-all")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["kda-contracts: --kda-contracts-require-all: 1 registered contract never exercised: "
                                 "unused"])


def test_require_all_passes_when_every_registered_contract_was_called(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
    with pytest.raises(kc.ShapeError):
        unused(torch.ones(2, 2))        # a rejected call still exercises the contract
""")
    result = run(pytester, "--kda-contracts-require-all")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*never exercised*")


def builtin_contracts_registered():
    """The registry as a real session has it: kda_contracts's packed-decode contracts are there."""
    for layout in ("VK", "KV"):
        enforce.register_contract(f"packed_decode[{layout}]", kc.packed_decode_contract(layout))


def test_require_all_leaves_out_the_contracts_kda_contracts_defines(pytester):
    builtin_contracts_registered()
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
    unused(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require-all")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["kda-contracts: mode strict; 2 contracts exercised of 4 registered, *"])


def test_require_all_in_a_fresh_session_of_a_project_with_one_contract(tmp_path):
    (tmp_path / "test_mine.py").write_text(
        "import torch, kda_contracts as kc\nfrom kda_contracts import Float, Tensor\n\n"
        "@kc.contract\ndef mine(x: Float[Tensor, 'B']) -> None: ...\n\n"
        "def test_it():\n    mine(torch.ones(3))\n")
    done = run_unrelated_project(tmp_path, "", "--kda-contracts-require-all")
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "never exercised" not in done.stdout


# -- --kda-contracts-require=PATTERN ----------------------------------------------------------------
def test_require_fails_the_session_naming_the_matching_contracts_never_exercised(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require=*n*")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["kda-contracts: --kda-contracts-require=*n*: 1 of 2 matching contracts never "
                                 "exercised: unused"])


def test_require_matches_the_qualified_module_and_name_and_is_repeatable(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require=test_inner:non*", "--kda-contracts-require=unused")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.no_fnmatch_line("*--kda-contracts-require=test_inner:non*")
    result.stdout.fnmatch_lines(["kda-contracts: --kda-contracts-require=unused: 1 of 1 matching contract never "
                                 "exercised: unused"])


def test_require_passes_when_every_matching_contract_was_called(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require=nonneg")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*never exercised*")


def test_a_pattern_that_matches_no_contract_fails_the_session_and_lists_the_registered_ones(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    result = run(pytester, "--kda-contracts-require=nonnegative")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["kda-contracts: --kda-contracts-require=nonnegative: matches no registered contract "
                                 "(registered: nonneg, unused)"])


def test_the_built_in_contracts_can_be_required_by_name(pytester):
    builtin_contracts_registered()
    reports_mode(pytester, "strict")
    result = run(pytester, "--kda-contracts-require=packed_decode*")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["kda-contracts: --kda-contracts-require=packed_decode*: 2 of 2 matching contracts "
                                 "never exercised: packed_decode[KV], packed_decode[VK]"])


# -- when the summary line is printed -----------------------------------------------------------------
def test_no_summary_line_when_no_contract_ran_and_no_option_was_given(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_nothing_called():
    pass
""")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("kda-contracts:*")


def test_the_summary_line_is_printed_when_a_contract_ran(pytester):
    pytester.makepyfile(test_inner=CONTRACTS + """
def test_calls():
    nonneg(torch.ones(2))
""")
    run(pytester).stdout.fnmatch_lines(["kda-contracts: mode strict; 1 contract exercised of 2 registered, "
                                        "1 checked call, 0 violations raised"])


@pytest.mark.parametrize("option", ["--kda-contracts=strict", "--kda-contracts-require-all", "ini"])
def test_the_summary_line_is_printed_when_an_option_of_the_plugin_was_given(pytester, option):
    reports_mode(pytester, "strict")
    if option == "ini":
        pytester.makeini("[pytest]\nkda_contracts_mode = strict\n")
    result = run(pytester, *([] if option == "ini" else [option]))
    result.stdout.fnmatch_lines(["kda-contracts: mode strict; 0 contracts exercised of 0 registered, "
                                 "0 checked calls, 0 violations raised"])


# -- --kda-contracts-packages ---------------------------------------------------------------------------
PACKAGE = """
import torch
from kda_contracts import Float, Tensor

def rmsnorm(x: Float[Tensor, "B D"], weight: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
    return x * weight
"""


def make_package(pytester, name, source=PACKAGE):
    pytester.mkpydir(name)
    pytester.path.joinpath(name, "layers.py").write_text(source)
    pytester.syspathinsert()


def test_packages_are_contracted_before_conftest_files_and_test_modules_import_them(pytester):
    make_package(pytester, "hooked_a")
    make_package(pytester, "hooked_b")
    pytester.makeconftest("import hooked_a.layers\n")
    pytester.makepyfile(test_inner="""
import pytest, torch
import kda_contracts as kc
import hooked_a.layers, hooked_b.layers

def test_contracted():
    for layers in (hooked_a.layers, hooked_b.layers):
        assert layers.rmsnorm(torch.ones(2, 4), torch.ones(4)).shape == (2, 4)
        with pytest.raises(kc.ShapeError, match="rmsnorm"):
            layers.rmsnorm(torch.ones(2, 4), torch.ones(1))
""")
    result = run(pytester, "--kda-contracts-packages=hooked_a", "--kda-contracts-packages", " hooked_b, ")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kda-contracts: mode strict; 2 contracts exercised of 2 registered, 4 checked calls, "
                                 "2 violations raised"])
    assert not any(type(f).__name__ == "ImportHook" for f in sys.meta_path)  # uninstalled with the session


def test_without_the_option_the_package_is_not_contracted(pytester):
    make_package(pytester, "hooked_c")
    pytester.makepyfile(test_inner="""
import hooked_c.layers

def test_plain():
    assert not hasattr(hooked_c.layers.rmsnorm, "__kda_contract__")
""")
    run(pytester).assert_outcomes(passed=1)


def test_a_function_the_engine_refuses_is_a_collection_error_naming_it(pytester):
    make_package(pytester, "hooked_d", PACKAGE + '\ndef mask(n: Float[Tensor, "B"]) -> Float[Tensor, "B T"]: ...\n')
    pytester.makepyfile(test_inner="import hooked_d.layers\n\ndef test_never_runs():\n    pass\n")
    result = run(pytester, "--kda-contracts-packages=hooked_d")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*AnnotationError: kc.install_import_hook: cannot contract a function of "
                                 "hooked_d.layers (fix the annotations, or mark a function or class "
                                 "@typing.no_type_check to leave it unchecked):",
                                 "*  mask: cannot bind dim 'T'*"])


def test_a_package_imported_before_the_session_is_named_in_a_warning(pytester, request):
    make_package(pytester, "hooked_e")
    request.addfinalizer(lambda: sys.modules.pop("hooked_e", None))
    import hooked_e  # noqa: F401  (imported before the session starts)
    reports_mode(pytester, "strict")
    result = run(pytester, "--kda-contracts-packages=hooked_e")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*ImportHookWarning: kc.install_import_hook: hooked_e imported before the hook "
                                 "was installed, not contracted; *"])


@pytest.mark.parametrize(("value", "message"), [
    ("kda_contracts", "'kda_contracts': kda_contracts is never hooked*"),
    ("my-model", "'my-model' is not a module name*"),
    (",", "no package named*"),
])
def test_a_bad_package_list_is_a_usage_error(pytester, value, message):
    reports_mode(pytester, "strict")
    result = run(pytester, f"--kda-contracts-packages={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --kda-contracts-packages={value}: kc.install_import_hook: {message}"])


def test_under_watch_a_violation_still_in_flight_fails_the_test_that_made_it(pytester):
    """On a GPU a watched call's violation may still be in flight when its test returns: the plugin
    flushes after each test's call (here a hook stands in for the device's pending report)."""
    pytester.makepyfile(test_inner="""
import kda_contracts as kc
from kda_contracts._engine import modes

PENDING = []

def _flush():
    if PENDING:
        PENDING.pop()
        raise kc.ValueRangeError("a slot index past the pool, found on the device")

modes.ON_WATCH_EXIT.append(_flush)

def test_makes_a_bad_call():
    assert kc.get_mode() == "watch"
    PENDING.append(1)  # what a watched CUDA call leaves when its flag copy has not arrived yet

def test_a_later_test_is_not_blamed():
    assert not PENDING
""")
    result = run(pytester, "--kda-contracts=watch")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ValueRangeError: a slot index past the pool, found on the device*"])
    assert "PluggyTeardownRaisedWarning" not in result.stdout.str()
