"""Shared test setup: Hypothesis profiles and session-wide machine configs.

Profiles: `ci` (the default: few examples, no deadline, so the default test run stays short)
and `dev` (many more examples, for a longer run): `pytest tests/property --hypothesis-profile=dev`.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import tomllib

import pytest


def _missing_dependencies() -> list[str]:
    """The packages of pyproject.toml's `dependencies` and `test` extra that this Python cannot
    import (a pytest outside the venv lpu was installed in, say)."""
    meta = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    wanted = meta["dependencies"] + meta["optional-dependencies"]["test"]
    names = [re.split(r"[<>=!~;\[ ]", w, maxsplit=1)[0] for w in wanted]
    return [n for n in names if importlib.util.find_spec(n) is None]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    missing = _missing_dependencies()
    if missing:                  # one clear message instead of an import error per test file
        pytest.exit(f"this Python ({sys.executable}) lacks lpu's dependencies: {', '.join(missing)}. "
                    "Install them first, in a venv as the README shows: pip install -e '.[test]', then run "
                    "pytest from that venv.", returncode=4)
    from hypothesis import HealthCheck, settings
    relaxed = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=12, deadline=None, suppress_health_check=relaxed,
                              print_blob=True)
    settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=relaxed,
                              print_blob=True)
    settings.load_profile("ci")   # --hypothesis-profile=NAME (Hypothesis' pytest plugin) overrides it


@pytest.fixture(scope="session")
def tiny():
    from lpu.isa.machine import MachineConfig
    return MachineConfig.load("tiny")


@pytest.fixture(scope="session")
def tsp():
    from lpu.isa.machine import MachineConfig
    return MachineConfig.load("tsp-v1")
