"""REPEAT in the instruction stream: codegen folds regular runs (constant cycle distance, the
op's address/row/accumulator/column field up by one) into one instruction plus `REPEAT n d`;
the program runs, checks and verifies exactly as the spelled-out one."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

from lpu import api
from lpu.compiler.driver import compile_graph
from lpu.compiler.codegen import by_queue
from lpu.compiler import repeat_core as RC
from lpu.compiler.repeat_core import _cycle_order, find_runs
from lpu.compiler.verify import verify
from lpu.emulator.run import run
from lpu.isa import opcodes as O

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELD = np.array(O.REPEAT_FIELD, np.int64)


def _runs(cyc, addr, q=None, line=None):
    n = len(cyc)
    q = [0] * n if q is None else q
    line = [0] * n if line is None else line
    parts = [_part([c], [qq], [ln]) for c, qq, ln in zip(cyc, q, line)]
    for p, a in zip(parts, addr):
        p[3][0, :] = 0
        p[3][0, 1] = a                                    # READ: bank, addr, out
    start, rec = by_queue(parts, [("q",)] * (max(q) + 1))
    count, dist = find_runs(start, rec, FIELD)
    return count.tolist(), dist.tolist()


def test_find_runs_needs_constant_distance_and_step_one():
    assert _runs([0, 3, 6, 9], [5, 6, 7, 8]) == ([3, -1, -1, -1], [3, 0, 0, 0])
    assert _runs([0, 3, 7, 10], [5, 6, 7, 8]) == ([1, -1, 1, -1], [3, 0, 3, 0])   # distance changes
    assert _runs([0, 1, 2, 3], [5, 6, 8, 9]) == ([0, 0, 0, 0], [0, 0, 0, 0])      # pairs at d=1: no gain
    assert _runs([0, 1, 2], [5, 6, 7], q=[0, 0, 1]) == ([0, 0, 0], [0, 0, 0])     # other queue
    assert _runs([0, 1, 2], [5, 6, 7], line=[1, 1, 2]) == ([0, 0, 0], [0, 0, 0])  # other DSL line


def _part(cyc, q, tag):
    n = len(cyc)
    args = np.zeros((n, O.NARGS), np.int32)
    args[:, 0] = tag
    return [np.asarray(cyc, np.int64), np.asarray(q, np.int32), np.full(n, O.READ, np.int32), args,
            np.asarray(tag, np.int32), np.zeros(n, np.int32)]


def test_by_queue_sorts_each_queue_by_cycle_across_batches():
    queues = [("a",), ("b",), ("c",)]
    parts = [_part([5, 1, 9], [2, 0, 2], [0, 1, 2]), _part([3, 0, 7, 2], [0, 2, 2, 0], [3, 4, 5, 6])]
    start, rec = by_queue(parts, queues)
    assert start.tolist() == [0, 3, 3, 7] and rec[:, RC.CYC].tolist() == [1, 2, 3, 0, 5, 7, 9]
    assert rec[:, RC.LINE].tolist() == [1, 6, 3, 4, 0, 5, 2]
    assert rec[:, RC.ARGS].tolist() == rec[:, RC.LINE].tolist()                      # rows move whole
    assert parts == []                                                                   # batches freed


def test_by_queue_refuses_a_queue_issuing_twice_in_a_cycle():
    with pytest.raises(AssertionError, match="queue b issues twice in cycle 4"):
        by_queue([_part([4, 1], [1, 0], [0, 0]), _part([4], [1], [0])], [("a",), ("b",)])


@given(st.lists(st.integers(0, 1 << 40), min_size=1, max_size=300), st.integers(0, 3))
def test_cycle_order_is_the_stable_sort(cycles, dups):
    c = np.asarray(cycles + cycles[:dups], np.int64)        # ties keep their order
    assert _cycle_order(c).tolist() == np.argsort(c, kind="stable").tolist()


def test_repeated_program_runs_like_the_spelled_out_one(tsp):
    prog, graph = api.compile(os.path.join(ROOT, "programs", "mlp.lpu"), {}, tsp)
    flat = compile_graph(graph, tsp, repeat=False)
    assert np.count_nonzero(prog.op == O.REPEAT) > 0 and len(prog.op) < len(flat.op)
    assert not np.any(flat.op == O.REPEAT)
    values = api.inputs_for(graph, prog, 0)
    a, b = run(prog, values), run(flat, values)
    assert a.cycles == b.cycles == prog.predicted_cycles
    for k in b.outputs:
        assert np.array_equal(a.outputs[k], b.outputs[k])
    assert verify(prog) == []
