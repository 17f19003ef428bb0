"""pytest plugin (registered by the ``pytest11`` entry point): contracts run in ``strict`` mode
under pytest, per-test modes, and a summary of what the session exercised.

- ``--kda-contracts=strict|check|off|watch`` sets the session's default mode. Without it:
  ``$KDA_CONTRACTS_MODE`` (empty means unset), else the ini option ``kda_contracts_mode``, else
  ``strict``. A value naming no mode is a usage error that says where it came from (``--help``
  and ``--version`` still work, with a warning).
- ``@pytest.mark.kda_contracts("check")`` runs one test (setup, call and teardown) in a mode.
- The ``kda_contracts_mode`` fixture gives a test a :class:`ModeControl`; parametrizing it
  (``@pytest.mark.parametrize("kda_contracts_mode", ["check", "strict"], indirect=True)``) runs
  the test once per mode, and wins over the marker.
- ``--kda-contracts-packages=pkg1,pkg2`` installs :func:`kda_contracts.install_import_hook` for
  those packages before conftest files and test modules are imported (contracts in the session's
  mode; uninstalled when the session ends).
- A terminal summary line counts the contracts exercised, the checked calls and the violations
  raised during the session; it is printed when a contract was called in the session or an option
  of this plugin was given (command line or ini), so an unrelated project's output stays as it was.
- ``--kda-contracts-require-all`` fails the session when a registered contract defined outside
  kda_contracts was never called (the built-in ones are exercised by kda-contracts's own tests);
  ``--kda-contracts-require=PATTERN`` (repeatable) when a contract whose name, registry key or
  ``module:name`` matches the fnmatch pattern was never called, or when nothing matches it.

Example::

    @pytest.mark.kda_contracts("check")      # this test expects check-mode behaviour
    def test_negative_values_pass_in_check_mode(): ...

    def test_both_modes(kda_contracts_mode):
        assert kda_contracts_mode.name == "strict"
        with kda_contracts_mode("off"):
            ...
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import os
import warnings
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .. import modes
from ..contract.compiled import Contract
from ..contract.decorator import registered_contracts
from .import_hook import ImportHook, ImportHookWarning, install_import_hook

MODES = ("strict", "check", "off", "watch")
_EXPECTED = "expected one of 'strict', 'check', 'off', 'watch'"
_FIX_ENV = (f" (empty or unset means the ini option, else strict). Set {modes.ENV_VAR} to one of those or unset it, "
            "pass --kda-contracts=MODE, or disable this plugin with -p no:kda_contracts")
FIXTURE = "kda_contracts_mode"
INI = "kda_contracts_mode"


@dataclass
class _SessionState:
    mode: str
    previous_default: int | None  # the process default before the session (see modes.replace_default)
    baseline: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(contract) -> (calls, rejections)
    seen: dict[int, tuple[str, Contract]] = field(default_factory=dict)  # every contract met, by id
    unmet: list[str] = field(default_factory=list)  # --kda-contracts-require(-all) lines, when the session fails them
    hook: ImportHook | None = None  # --kda-contracts-packages
    hook_warnings: list[str] = field(default_factory=list)  # to issue once warnings can be (pytest_configure)


_STATE = pytest.StashKey[_SessionState]()
_ITEM_MODE = pytest.StashKey["str | None"]()


class ModeControl:
    """What the ``kda_contracts_mode`` fixture gives a test.

    ``.name`` is the mode in force now, ``.session`` the session default, and calling it with a
    mode name gives a ``kc.mode`` context for a block.

    Example::

        def test_off_skips_checks(kda_contracts_mode):
            with kda_contracts_mode("off"):
                assert kda_contracts_mode.name == "off"
    """

    def __init__(self, session: str) -> None:
        self.session = session

    @property
    def name(self) -> str:
        return modes.get_mode()

    def __call__(self, name: modes.ModeName) -> modes.mode:
        return modes.mode(name)

    def __repr__(self) -> str:
        return f"<kda_contracts mode {self.name} (session {self.session})>"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kda-contracts", "kda-contracts: shape/dtype contracts")
    group.addoption(
        "--kda-contracts", dest="kda_contracts", choices=MODES, default=None, metavar="{strict,check,off,watch}",
        help="contract mode for the session (default: $KDA_CONTRACTS_MODE, else ini kda_contracts_mode, "
             "else strict).",
    )
    group.addoption(
        "--kda-contracts-require-all", dest="kda_contracts_require_all", action="store_true", default=False,
        help="fail the session if a registered contract defined outside kda_contracts was never called.",
    )
    group.addoption(
        "--kda-contracts-require", dest="kda_contracts_require", action="append", default=[], metavar="PATTERN",
        help="fail the session if a contract whose name, key or module:name matches PATTERN (fnmatch) was never "
             "called, or if none matches. Repeatable.",
    )
    group.addoption(
        "--kda-contracts-packages", dest="kda_contracts_packages", action="append", default=[],
        metavar="PKG[,PKG...]",
        help="contract every tensor-annotated function of these packages (kc.install_import_hook), installed "
             "before conftest files and test modules are imported.",
    )
    parser.addini(INI, "contract mode for the session: strict, check or off (default strict).", default="")


def _resolve(config: pytest.Config, cli: str | None) -> str:
    """The session mode: command line, else environment, else ini file, else strict."""
    ini_origin = f"{INI} (in {config.inipath})" if config.inipath else INI
    for origin, value in (("--kda-contracts", cli), (modes.ENV_VAR, os.environ.get(modes.ENV_VAR)),
                          (ini_origin, config.getini(INI))):
        name = str(value or "").strip().lower()
        if name:
            if name not in MODES:
                fix = _FIX_ENV if origin == modes.ENV_VAR else ""
                raise pytest.UsageError(f"{origin}: unknown mode {value!r}; {_EXPECTED}{fix}")
            return name
    return "strict"


def _only_help_or_version(config: pytest.Config) -> bool:
    args = config.known_args_namespace
    return bool(getattr(args, "help", False) or getattr(args, "version", False))


def _apply_session_mode(config: pytest.Config, cli: str | None, *, warn: bool) -> None:
    try:
        name = _resolve(config, cli)
    except pytest.UsageError as err:
        if not _only_help_or_version(config):
            raise
        # like pytest with a broken conftest: --help and --version still answer
        if warn:
            config.issue_config_time_warning(pytest.PytestConfigWarning(str(err)), stacklevel=2)
        return
    value = modes.parse_mode(name)
    state = config.stash.get(_STATE, None)
    if state is None:
        state = config.stash[_STATE] = _SessionState(name, modes.replace_default(value))
    else:
        modes.replace_default(value)
    state.mode = name


def _install_hook(config: pytest.Config, values: list[str]) -> None:
    """``--kda-contracts-packages``: the import hook, once, for the packages named."""
    state = config.stash.get(_STATE, None)
    if state is None or state.hook is not None or not values:
        return
    packages = [p.strip() for value in values for p in value.split(",") if p.strip()]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state.hook = install_import_hook(packages)
    except (TypeError, ValueError) as err:
        raise pytest.UsageError(f"--kda-contracts-packages={','.join(values)}: {err}") from None
    state.hook_warnings = [str(w.message) for w in caught]
    # (after the hook, so that a parent package found on the way is imported through it)
    missing = [p for p in packages if _find(p) is None]
    if missing:
        state.hook.uninstall()
        raise pytest.UsageError(f"--kda-contracts-packages={','.join(values)}: no package or module named "
                                f"{', '.join(map(repr, missing))} can be imported here (a typo? the hook would "
                                "contract nothing)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # As early as possible: a contract decorated while the mode is "off" is the function itself,
    # and conftest files and test modules are imported after this (so are the hooked packages).
    args = early_config.known_args_namespace
    _apply_session_mode(early_config, args.kda_contracts, warn=False)
    _install_hook(early_config, args.kda_contracts_packages)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kda_contracts(mode): run this test's setup, call and teardown in kda-contracts mode "
        "'strict', 'check', 'off' or 'watch'.",
    )
    # Again here, for sessions where the plugin was registered after the initial conftests.
    _apply_session_mode(config, config.getoption("kda_contracts"), warn=True)
    _install_hook(config, config.getoption("kda_contracts_packages"))
    state = config.stash.get(_STATE, None)
    for message in state.hook_warnings if state is not None else ():
        config.issue_config_time_warning(ImportHookWarning(message), stacklevel=2)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        modes.replace_default(state.previous_default)
        if state.hook is not None:
            state.hook.uninstall()


def _note_registered(state: _SessionState) -> dict[str, Contract]:
    # A contract re-registered under the same key replaces the old one; remember every object
    # met so the calls of a replaced contract still count.
    reg = registered_contracts()
    for key, c in reg.items():
        state.seen.setdefault(id(c), (key, c))
    return reg


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash[_STATE]
    for key, c in registered_contracts().items():
        state.baseline[id(c)] = (c.calls, c.rejections)
        state.seen[id(c)] = (key, c)


def _item_mode(item: pytest.Item) -> str | None:
    """The mode a test asks for: a parametrized ``kda_contracts_mode``, else the closest marker."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and FIXTURE in callspec.params:
        name, origin = callspec.params[FIXTURE], f"parametrize({FIXTURE!r})"
    else:
        marker = item.get_closest_marker("kda_contracts")
        if marker is None:
            return None
        name = marker.args[0] if marker.args else marker.kwargs.get("mode")
        origin = "@pytest.mark.kda_contracts"
    if not isinstance(name, str) or name.strip().lower() not in MODES:
        pytest.fail(f"{item.nodeid}: {origin}: unknown mode {name!r}; {_EXPECTED}", pytrace=False)
    return name.strip().lower()


def _in_item_mode(item: pytest.Item) -> contextlib.AbstractContextManager[object]:
    name = item.stash.get(_ITEM_MODE, None)
    return modes.mode(name) if name is not None else contextlib.nullcontext()  # type: ignore[arg-type]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_ITEM_MODE] = None  # what teardown sees if the requested mode is invalid
    item.stash[_ITEM_MODE] = _item_mode(item)
    with _in_item_mode(item):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    with _in_item_mode(item):
        result = yield  # (a test that raised goes on raising: nothing more is asked)
        if modes.current_mode() == modes.WATCH:
            # what this test's watched calls found on a device is this test's: raised here, not in a later test
            for hook in modes.ON_WATCH_EXIT:
                hook()
        return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with _in_item_mode(item):
        yield
    _note_registered(item.config.stash[_STATE])


@pytest.fixture
def kda_contracts_mode(request: pytest.FixtureRequest) -> ModeControl:
    """A :class:`ModeControl` for this test: ``.name`` (the mode in force), ``.session`` (the
    session default), and ``kda_contracts_mode("off")`` as a context for a block. Parametrize it
    (``indirect=True``) to run the test in each of several modes."""
    return ModeControl(request.config.stash[_STATE].mode)


def _counts(state: _SessionState) -> tuple[set[str], int, int]:
    """Keys of the contracts called this session, checked calls, violations raised (deltas)."""
    exercised: set[str] = set()
    calls = rejections = 0
    for key, c in state.seen.values():
        base_calls, base_rejections = state.baseline.get(id(c), (0, 0))
        if c.calls > base_calls:
            exercised.add(key)
        calls += c.calls - base_calls
        rejections += c.rejections - base_rejections
    return exercised, calls, rejections


def _is_builtin(c: Contract) -> bool:
    """Whether a contract is one kda_contracts defines (its own tests exercise those)."""
    module = getattr(c.fn, "__module__", None) or ""
    return module == "kda_contracts" or module.startswith("kda_contracts.")


def _find(name: str) -> object | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent that is not a package, or fails to import
        return None


def _matches(pattern: str, key: str, c: Contract) -> bool:
    """Whether a contract matches a ``--kda-contracts-require`` pattern, by its registry key, its
    name, or its module and name written either way (``mod:fn`` or ``mod.fn``, so ``mod.*`` and
    ``mod:*`` both match the functions of ``mod``)."""
    module = getattr(c.fn, "__module__", None)
    names = (key, c.name, f"{module}:{c.name}", f"{module}.{c.name}")
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def _listed(names: list[str], at_most: int = 8) -> str:
    more = len(names) - at_most
    return ", ".join(names[:at_most]) + (f" and {more} more" if more > 0 else "")


def _unmet(config: pytest.Config, state: _SessionState, registered: dict[str, Contract]) -> list[str]:
    """One line per requirement (``--kda-contracts-require-all``, each ``--kda-contracts-require``)
    the session did not meet."""
    exercised, _, _ = _counts(state)
    known = {**{key: c for key, c in state.seen.values()}, **registered}
    lines = []
    if config.getoption("kda_contracts_require_all"):
        missing = sorted(k for k, c in registered.items() if not _is_builtin(c) and k not in exercised)
        if missing:
            lines.append(f"--kda-contracts-require-all: {_plural(len(missing), 'registered contract')} never "
                         f"exercised: {', '.join(missing)}")
    for pattern in config.getoption("kda_contracts_require"):
        matching = sorted(k for k, c in known.items() if _matches(pattern, k, c))
        missing = [k for k in matching if k not in exercised]
        if not matching:
            lines.append(f"--kda-contracts-require={pattern}: matches no registered contract (registered: "
                         f"{_listed(sorted(known)) or 'none'})")
        elif missing:
            of = _plural(len(matching), "matching contract")
            lines.append(f"--kda-contracts-require={pattern}: {len(missing)} of {of} never exercised: "
                         f"{', '.join(missing)}")
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[_STATE]
    state.unmet = _unmet(config, state, _note_registered(state))
    if state.unmet and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _option_given(config: pytest.Config) -> bool:
    """Whether this session asked for the plugin: an option of it on the command line or in the ini file."""
    options = ("kda_contracts", "kda_contracts_require_all", "kda_contracts_require", "kda_contracts_packages")
    return any(config.getoption(o) for o in options) or bool(str(config.getini(INI)).strip())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    registered = _note_registered(state)
    exercised, calls, rejections = _counts(state)
    if calls or rejections or _option_given(config):
        n_exercised = len(exercised & set(registered))
        terminalreporter.write_line(
            f"kda-contracts: mode {state.mode}; {_plural(n_exercised, 'contract')} exercised of {len(registered)} "
            f"registered, {_plural(calls, 'checked call')}, {_plural(rejections, 'violation')} raised"
        )
    for line in state.unmet:
        terminalreporter.write_line(f"kda-contracts: {line}", red=True, bold=True)
