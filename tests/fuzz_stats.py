"""Counters of the fuzz and abuse modules: printed at the end of each module, and written as JSON
to ``$KDA_FUZZ_STATS/<name>.json`` when that variable names a folder (for docs/reliability.md)."""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter

import pytest


def report_counters(request: pytest.FixtureRequest, stats: Counter, name: str) -> None:
    """Print ``stats`` on the terminal (past output capture) and save them if asked to."""
    if not stats:
        return
    summary = ", ".join(f"{k}={v}" for k, v in sorted(stats.items()))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(f"\n{name} counters: {summary}")
    folder = os.environ.get("KDA_FUZZ_STATS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as fh:
            json.dump(dict(stats), fh, indent=1, sort_keys=True)
