"""Helpers shared by the property tests: compile a generated program or reject it."""
from __future__ import annotations

import numpy as np
from hypothesis import assume, note

from lpu.compiler.driver import compile_source
from lpu.compiler.reference import random_values
from lpu.compiler.verify import _Expanded
from lpu.isa.errors import CapacityError, UnsupportedError


def build(dsl, machine):
    """(program, graph) of a generated program; programs the machine cannot hold are rejected
    (a user error, not a bug). The DSL text goes into Hypothesis' report."""
    note(repr(dsl))
    note(f"machine: {machine.to_dict()}")
    try:
        return compile_source(dsl.text, "generated.lpu", {}, machine)
    except (CapacityError, UnsupportedError) as e:
        note(f"rejected: {e}")
        assume(False)


def values(graph, seed=0):
    return random_values(graph, seed)


def issue_cycles(p) -> np.ndarray:
    """Issue cycle of every program row (-1 for NOP/SYNC/NOTIFY); REPEAT copies ignored."""
    e = _Expanded(p)
    out = np.full(len(p.op), -1, np.int64)
    first = e.rep == 0
    out[e.src[first]] = e.cycle[first]
    return out
