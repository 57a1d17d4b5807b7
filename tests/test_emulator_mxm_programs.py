"""The MXM on hand-built programs (tiny machine, with tests/test_emulator.py's helpers): LW, IW,
ABC and ACC, i8 and f16, transposed, half ABCs, what the weight buffer keeps between installs,
accumulators across runs, and the MXM's hazards (tests/test_emulator_mxm.py: its arithmetic)."""
import dataclasses

import numpy as np
import pytest

from lpu.emulator.run import HazardError, run, schedule
from lpu.isa import opcodes as O
from lpu.isa.machine import EAST, WEST
from tests.progbuild import ProgBuilder, ref
from tests.test_emulator import LAT, L, M, rand
from tests.test_emulator_mxm import reference


# ---- MXM ---------------------------------------------------------------------------------------
def mxm_program(dtype, trans=False, batches=2, acc_shift=0, abc_gap=None, half=0):
    """Weights w[L, L] and activations x[batches * 4, L] come west to MXM plane 0; z[4, L] =
    sum over batches of x[batch rows] @ w (or w.T), ACCed back east; half=1: half ABCs (x's
    lanes >= L/2 read as zero), issued as often as their hold allows."""
    b = ProgBuilder(M, ["z = x @ w"])
    w = b.tensor("w", "weight", dtype, (L, L), [2, 3])
    x = b.tensor("x", "input", dtype, (4 * batches, L), [4, 5])
    acc_t = "i32" if dtype == "i8" else "f32"
    z = b.tensor("z", "output", acc_t, (4, L), [8, 9, 10, 11])
    gap = abc_gap or M.abc_cycles(dtype == "f16", half != 0)
    k = 20
    b.read_vec(w, 0, WEST, 0, k, n=L)
    b.at(b.issue_for(k, WEST, 0), "mxm0.lw0", "LW", 0, ref(dtype, WEST, 0))
    b.raw("mxm0.lw0", "REPEAT", L - 1, 1)
    t = b.issue_for(k, WEST, 0) + L
    b.at(t, "mxm0", "IW", 1 if dtype == "f16" else 0, int(trans))
    k2 = b.diag(t + 1, WEST, 0)
    b.read_vec(x, 0, WEST, 2, k2, n=4 * batches, d=gap)
    for bt in range(batches):
        b.at(t + 1 + 4 * gap * bt, "mxm0", "ABC", ref(dtype, WEST, 2), 0, int(bt > 0), half, line=1)
        b.raw("mxm0", "REPEAT", 3, gap)
    ta = t + 1 + 4 * gap * (batches - 1) + 3 * gap + LAT["mxm_abc"] - 3 * gap + acc_shift
    b.at(ta, "mxm0.acc", "ACC", 0, ref(acc_t, EAST, 4), line=1)
    b.raw("mxm0.acc", "REPEAT", 3, gap)
    b.write_vec(z, 0, EAST, 4, b.diag(ta + LAT["mxm_acc"], EAST, 0), n=4, d=gap)
    return b.build()


def f16_matmul(x, w):
    """The f16 ABC rule: the exact sum of the exact products, rounded to f32 once."""
    return reference(np.asarray(x, np.float64), np.asarray(w, np.float64))


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_mxm(dtype, trans):
    wv, xv = rand(dtype, (L, L)), rand(dtype, (8, L))
    r = run(mxm_program(dtype, trans), {"w": wv, "x": xv})
    wm = wv.T if trans else wv
    if dtype == "i8":
        want = xv[:4].astype(np.int32) @ wm.astype(np.int32) + xv[4:].astype(np.int32) @ wm.astype(np.int32)
    else:
        want = (f16_matmul(xv[:4], wm) + f16_matmul(xv[4:], wm)).astype(np.float32)
    np.testing.assert_array_equal(r.outputs["z"], want)
    assert r.counters["macs"] == 8 * L * L
    assert r.counters["mxm"] == 8 * (1 if dtype == "i8" else 2 * M.f16_pair_cycles)
    assert 0 < r.utilization["mxm"] <= 1


def test_an_f16_install_keeps_the_rows_an_i8_load_left():
    """The rows an IW did not load keep what the weight buffer holds: after an f16 install, i8
    LWs (no conversion) replace only each row's low bytes, so an f16 IW after LWs of the first
    rows takes the rows above as those i8 bytes under the f16 rows' high bytes (one buffer's
    bits, which the two sides of mxm_install.lw_exec keep by copying the high bytes)."""
    top = L // 4
    b = ProgBuilder(M, ["z = x @ w"])
    w1 = b.tensor("w1", "weight", "f16", (L, L), [2, 3])
    w2 = b.tensor("w2", "weight", "i8", (L, L), [2], bank=1)
    w3 = b.tensor("w3", "weight", "f16", (top, L), [2, 3], bank=1, addr=L)
    x = b.tensor("x", "input", "f16", (4, L), [4, 5])
    z = b.tensor("z", "output", "f32", (4, L), [8, 9, 10, 11])
    t = 19
    for w, dt, n in ((w1, "f16", L), (w2, "i8", L), (w3, "f16", top)):
        k = b.diag(t + 1, WEST, 0)
        b.read_vec(w, 0, WEST, 0, k, n=n)
        b.at(t + 1, "mxm0.lw0", "LW", 0, ref(dt, WEST, 0))
        b.raw("mxm0.lw0", "REPEAT", n - 1, 1)
        t += 1 + n
        b.at(t, "mxm0", "IW", 1 if dt == "f16" else 0, 0)
    gap = M.abc_cycles(True, False)
    b.read_vec(x, 0, WEST, 2, b.diag(t + 1, WEST, 0), n=4, d=gap)
    b.at(t + 1, "mxm0", "ABC", ref("f16", WEST, 2), 0, 0, 0, line=1)
    b.raw("mxm0", "REPEAT", 3, gap)
    ta = t + 1 + LAT["mxm_abc"]
    b.at(ta, "mxm0.acc", "ACC", 0, ref("f32", EAST, 4), line=1)
    b.raw("mxm0.acc", "REPEAT", 3, gap)
    b.write_vec(z, 0, EAST, 4, b.diag(ta + LAT["mxm_acc"], EAST, 0), n=4, d=gap)
    v = {"w1": rand("f16", (L, L)), "w2": rand("i8", (L, L)), "w3": rand("f16", (top, L)), "x": rand("f16", (4, L))}
    w = np.concatenate([v["w3"], ((v["w1"][top:].view(np.uint16) & 0xFF00) | v["w2"][top:].view(np.uint8)
                                  ).astype(np.uint16).view(np.float16)])
    assert np.isfinite(w).all() and not np.array_equal(w[top:], v["w1"][top:])
    np.testing.assert_array_equal(run(b.build(), v).outputs["z"], f16_matmul(v["x"], w).astype(np.float32))


def test_accumulating_onto_an_unwritten_row_finds_zeros_in_every_run():
    """core.reset clears only the accumulator rows an ABC wrote (core.clear_written): ABCs that
    accumulate onto rows no ABC of the run wrote find zeros when the prepared program runs
    again, and a reset after a run leaves every accumulator zero."""
    from lpu.emulator import core
    from lpu.emulator.prepare import prepare
    p = mxm_program("i8")
    args = p.args.copy()
    args[p.op == O.ABC, 2] = 1
    p = dataclasses.replace(p, args=args)
    first = {"w": rand("i8", (L, L)), "x": rand("i8", (8, L))}
    second = {"w": rand("i8", (L, L)), "x": rand("i8", (8, L))}
    run(p, first)
    again = run(p, second).outputs["z"]
    fresh = run(dataclasses.replace(p, op=p.op.copy()), second).outputs["z"]
    x, w = second["x"].astype(np.int32), second["w"].astype(np.int32)
    np.testing.assert_array_equal(fresh, x[:4] @ w + x[4:] @ w)
    np.testing.assert_array_equal(again, fresh)
    ws = prepare(p, schedule).workspace
    assert ws[9].any()
    core.reset(ws)
    assert not ws[9].any()


@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_half_abc_reads_half_the_lanes_in_half_the_cycles(dtype):
    wv, xv = rand(dtype, (L, L)), rand(dtype, (8, L))
    p = mxm_program(dtype, half=1)
    r = run(p, {"w": wv, "x": xv})
    xh = xv.copy()
    xh[:, L // 2:] = 0
    if dtype == "i8":
        want = xh[:4].astype(np.int32) @ wv.astype(np.int32) + xh[4:].astype(np.int32) @ wv.astype(np.int32)
    else:
        want = (f16_matmul(xh[:4], wv) + f16_matmul(xh[4:], wv)).astype(np.float32)
    np.testing.assert_array_equal(r.outputs["z"], want)
    hold = M.abc_cycles(dtype == "f16", True)
    assert hold == (1 if dtype == "i8" else M.f16_pair_cycles // 2)
    assert r.counters["macs"] == 8 * L * (L // 2)
    assert r.counters["mxm"] == 8 * hold * (2 if dtype == "f16" else 1)
    assert r.cycles < mxm_program(dtype).predicted_cycles or dtype == "i8"


def test_full_abc_after_half_gap_is_caught_and_bad_half_flag():
    with pytest.raises(HazardError) as e:   # full f16 ABCs at a half ABC's spacing
        run(mxm_program("f16", abc_gap=M.abc_cycles(True, True)), {"w": rand("f16", (L, L)), "x": rand("f16", (8, L))})
    assert (e.value.kind, e.value.opcode) == ("unit-busy", "ABC")
    with pytest.raises(HazardError) as e:
        run(mxm_program("f16", half=2, abc_gap=M.f16_pair_cycles), {"w": rand("f16", (L, L)), "x": rand("f16", (8, L))})
    assert (e.value.kind, e.value.opcode) == ("operand", "ABC")


# ---- hazards ---------------------------------------------------------------------------------
def test_acc_too_early():
    with pytest.raises(HazardError) as e:
        run(mxm_program("i8", acc_shift=-1), {"w": rand("i8", (L, L)), "x": rand("i8", (8, L))})
    assert e.value.kind == "not-ready" and e.value.queue == "mxm0.acc" and e.value.opcode == "ACC"


def test_abc_on_busy_f16_pair():
    with pytest.raises(HazardError) as e:
        run(mxm_program("f16", abc_gap=1), {"w": rand("f16", (L, L)), "x": rand("f16", (8, L))})
    assert (e.value.kind, e.value.queue, e.value.opcode, e.value.line) == ("unit-busy", "mxm0", "ABC", 1)
    assert "repetition 1" in str(e.value)


def test_abc_dtype_mismatch_and_bad_operand():
    b = ProgBuilder(M)
    b.at(0, "mxm0", "IW", 0, 0)
    b.at(3, "mxm0", "ABC", ref("f16", WEST, 0), 0, 0)
    with pytest.raises(HazardError, match="dtype mismatch f16 where the unit holds i8"):
        run(b.build(), {})
    b = ProgBuilder(M)
    b.at(3, "mxm1", "ABC", ref("f16", WEST, 0), 0, 0)
    with pytest.raises(HazardError, match="invalid operand field 'inp'"):
        run(b.build(), {})
