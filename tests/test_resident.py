"""run(..., resident=True): SRAM keeps what the previous run left (weights as loaded, states as
returned), so a run given only new inputs equals a full run given the previous states."""
import numpy as np
import pytest

from lpu.compiler.driver import compile_source
from lpu.compiler.reference import random_values
from lpu.emulator import core
from lpu.emulator.prepare import prepare
from lpu.emulator.run import _intact, load, run, schedule
from lpu.isa.errors import LpuError

SRC = ("input x : f16[2, 20]\nweight w : f16[20, 20]\nstate c : f16[4, 20]\n"
       "h = x @ w\nc[0:2, :] <- h\noutput y = h + c[2:4, :]\n")


@pytest.fixture
def prog_vals(tiny):
    prog, g = compile_source(SRC, "r.lpu", {}, tiny)
    vals = random_values(g, 5)
    vals["c"][2:4] = vals["c"][0:2] + 1.0     # the previous step's rows differ from the stored ones
    return prog, vals


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_resident_step_equals_a_full_run_given_the_previous_states(prog_vals):
    prog, vals = prog_vals
    first = run(prog, vals)
    states = {k: v.copy() for k, v in first.states.items()}
    x2 = (vals["x"] * 2.0).astype(vals["x"].dtype)
    step = run(prog, {"x": x2}, resident=True)
    got_out, got_states = dict(step.outputs), dict(step.states)
    full = run(prog, {**vals, **states, "x": x2})
    _same(got_out, full.outputs)
    _same(got_states, full.states)
    assert not np.array_equal(got_states["c"], states["c"])      # the state moved on


def test_a_tensor_given_in_a_resident_run_replaces_the_held_one(prog_vals):
    prog, vals = prog_vals
    run(prog, vals)
    w2 = (vals["w"] * -0.5).astype(vals["w"].dtype)
    step = run(prog, {"x": vals["x"], "w": w2, "c": vals["c"]}, resident=True)
    _same(step.outputs, run(prog, {**vals, "w": w2}).outputs)


def test_nothing_is_resident_before_a_run_or_after_a_failed_one(prog_vals):
    prog, vals = prog_vals
    with pytest.raises(LpuError, match="missing value"):
        run(prog, {"x": vals["x"]}, resident=True)
    run(prog, vals)
    with pytest.raises(LpuError, match="expected f16"):
        run(prog, {"x": vals["x"].astype(np.float32)}, resident=True)
    with pytest.raises(LpuError, match="missing value.*w"):
        run(prog, {"x": vals["x"]}, resident=True)
    run(prog, vals)
    load(prog, vals, prepare(prog, schedule))     # the image loaded outside a run (a system's chip does)
    with pytest.raises(LpuError, match="missing value.*w"):
        run(prog, {"x": vals["x"]}, resident=True)


def test_states_of_a_resident_run_read_after_the_next_run_are_refused(prog_vals):
    prog, vals = prog_vals
    run(prog, vals)
    a = run(prog, {"x": vals["x"]}, resident=True)
    c = a.states["c"].copy()                       # read in time: kept
    b = run(prog, {"x": vals["x"]}, resident=True)
    assert np.array_equal(a.states["c"], c)
    run(prog, {"x": vals["x"]}, resident=True)
    with pytest.raises(LpuError, match="not read before the program ran again"):
        b.states["c"]


def test_an_overwritten_tensor_is_not_resident(prog_vals):
    prog, vals = prog_vals
    prep = prepare(prog, schedule)
    valid = prep.valid0.copy()
    assert _intact(prog, prep, valid) == {"x", "w", "c"}
    valid[prep.sym_rows["w"][0, 0]] = core.RO_CLOBBERED
    assert _intact(prog, prep, valid) == {"x", "c"}
