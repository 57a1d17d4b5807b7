"""Shared test setup: Hypothesis profiles and session-wide machine configs.

Profiles: `ci` (the default: few examples, no deadline, so the default test run stays short)
and `dev` (many more examples, for a longer run): `pytest tests/property --hypothesis-profile=dev`.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from lpu.isa.machine import MachineConfig

_RELAXED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=12, deadline=None, suppress_health_check=_RELAXED,
                          print_blob=True)
settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=_RELAXED,
                          print_blob=True)
settings.load_profile("ci")   # --hypothesis-profile=NAME (Hypothesis' pytest plugin) overrides it


@pytest.fixture(scope="session")
def tiny() -> MachineConfig:
    return MachineConfig.load("tiny")


@pytest.fixture(scope="session")
def tsp() -> MachineConfig:
    return MachineConfig.load("tsp-v1")
