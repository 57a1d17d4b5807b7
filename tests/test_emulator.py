"""The emulator on hand-built programs (tiny machine): data movement, every unit, REPEAT, the
cycle count, and every hazard kind with its cycle, queue and DSL line (the MXM's programs and
hazards: tests/test_emulator_mxm_programs.py)."""
import dataclasses

import numpy as np
import pytest

from lpu.emulator import arith
from lpu.emulator.run import HazardError, run, schedule
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import EAST, WEST, MachineConfig
from tests.progbuild import ProgBuilder, ref

M = MachineConfig.load("tiny")
L = M.lanes
LAT = M.latency
VPOS = M.vxm_pos
SXM_W = M.sxm_pos(0)
RNG = np.random.default_rng(7)


def f32_imm(x: float) -> int:
    return int(np.array([x], np.float32).view(np.int32)[0])


def rand(dtype, shape):
    if dtype == "i8":
        return RNG.integers(-128, 128, shape).astype(np.int8)
    if dtype == "i32":
        return RNG.integers(-1000, 1000, shape).astype(np.int32)
    return (RNG.standard_normal(shape) * 3).astype({"f16": np.float16, "f32": np.float32}[dtype])


# ---- data movement -----------------------------------------------------------------------------
def copy_program(direction, src, dst, dtype="i8", shape=(3, 20), shift=0, k=20):
    b = ProgBuilder(M, ["y = x"])
    x = b.tensor("x", "input", dtype, shape, src)
    y = b.tensor("y", "output", dtype, shape, dst, bank=1)
    nvec = x.slices.shape[0]
    b.read_vec(x, 0, direction, 2, k + shift, n=nvec)
    b.write_vec(y, 0, direction, 2, k, port=1, line=1, n=nvec)
    return b


@pytest.mark.parametrize("direction,src,dst", [(EAST, [0, 1, 2, 3], [9, 10, 11, 12]),
                                               (WEST, [12, 13, 14, 15], [1, 2, 3, 4]),
                                               (EAST, [2, 3, 4, 5], [4, 5, 6, 7])])
@pytest.mark.parametrize("dtype", ["i8", "f16", "f32"])
def test_copy_across_slices(direction, src, dst, dtype):
    xv = rand(dtype, (3, 20))
    r = run(copy_program(direction, src, dst, dtype).build(), {"x": xv})
    np.testing.assert_array_equal(r.outputs["y"], xv)
    assert r.counters["sram_read_bytes"] == r.counters["sram_written_bytes"] == 6 * L * np.dtype(xv.dtype).itemsize


def test_cycles_formula_and_counters():
    b = copy_program(EAST, [0], [5], shape=(L,))
    r = run(b.build(), {"x": rand("i8", (L,))}, trace=True)
    write_cycle = 20 + M.slice_pos(5)
    assert r.cycles == write_cycle + 1 + M.icu_skew
    assert r.instructions == 2
    assert list(r.trace.cycle) == [20 + M.slice_pos(0) - LAT["mem_read"], write_cycle]
    assert r.counters["mem"] == 2 and r.utilization["mem"] == 2 / (r.cycles * M.mem_slices * M.banks_per_slice)
    assert r.counters["queue_instructions"][M.mem_queue(5, 1)] == 1
    assert run(ProgBuilder(M).build(), {}).cycles == 0


def test_repeat_expands_with_bumped_address_and_trace():
    b = copy_program(EAST, [0], [6], shape=(8, L))
    p = b.build()
    assert p.n_instructions == 6  # NOP, READ, REPEAT per queue
    xv = rand("i8", (8, L))
    r = run(p, {"x": xv}, trace=True)
    np.testing.assert_array_equal(r.outputs["y"], xv)
    assert r.instructions == 16
    read = r.trace.index == r.trace.index[0]
    assert list(r.trace.repeat[read]) == list(range(8))
    assert np.all(np.diff(r.trace.cycle[read]) == 1)


def test_nop_sync_notify_timing():
    b = ProgBuilder(M)
    b.raw("icu", "NOTIFY")
    b.raw("mem0.0", "SYNC")
    b.raw("mem0.0", "NOP", 5)
    b.raw("mem0.0", "READ", 0, 0, ref("i8", EAST, 0))
    b.raw("mem0.0", "READ", 0, 1, ref("i8", EAST, 1))
    s = schedule(b.build())
    assert list(s.cycle) == [5, 6]
    b = ProgBuilder(M)
    b.raw("mem0.0", "SYNC")
    with pytest.raises(LpuError, match="NOTIFY"):
        run(b.build(), {})


# ---- VXM ---------------------------------------------------------------------------------------
def vxm_program(opname, adt, odt, bdt=None, nv=L, extra=(), imm=0, bimm=0):
    """z = op(x[, y]) on one vector: x on E0.., y on E4.., z back east on E0.. two diagonals on."""
    b = ProgBuilder(M, ["z = f(x, y)"])
    x = b.tensor("x", "input", adt, (L,), [0, 1, 2, 3])
    k = 20
    b.read_vec(x, 0, EAST, 0, k)
    c = b.issue_for(k, EAST, VPOS)
    if bdt is not None:
        y = b.tensor("y", "input", bdt, (L,), [4, 5, 6, 7])
        b.read_vec(y, 0, EAST, 4, k)
    lat = LAT["vxm_transcendental"] if opname in ("DIV", "EXP", "GELU", "TANH", "SILU") else LAT["vxm"]
    out = ref(odt, EAST, 0)
    if bdt is not None or bimm:
        a, bb = ref(adt, EAST, 0), ref(bdt or adt, EAST, 4)
        args = (bb, a, out, nv, imm, bimm) if bimm == 2 else (a, bb, out, nv, imm, bimm)
    else:
        args = (ref(adt, EAST, 0), out, nv) + tuple(extra)
    b.at(c, "vxm1", opname, *args, line=1)
    z = b.tensor("z", "output", odt, (L,), [8, 9, 10, 11])
    b.write_vec(z, 0, EAST, 0, b.diag(c + lat, EAST, VPOS))
    return b.build()


NP_BIN = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide, "MAX": np.maximum,
          "MIN": np.minimum}


@pytest.mark.parametrize("opname", list(NP_BIN))
@pytest.mark.parametrize("dtype", ["f16", "f32", "i8"])
def test_vxm_binary(opname, dtype):
    xv, yv = rand(dtype, (L,)), rand(dtype, (L,))
    if dtype == "i8":
        yv[yv == 0] = 3
        yv[0] = 0  # integer x / 0 = 0
        a, c = xv.astype(np.int64), yv.astype(np.int64)
        if opname == "DIV":
            want = np.where(c == 0, 0, np.sign(a) * np.sign(c) * (np.abs(a) // np.maximum(np.abs(c), 1)))
        else:
            want = NP_BIN[opname](a, c)
        want = np.clip(want, -128, 127).astype(np.int8)
    else:
        want = NP_BIN[opname](xv.astype(np.float32), yv.astype(np.float32)).astype(xv.dtype)
    r = run(vxm_program(opname, dtype, dtype, dtype, nv=L - 3), {"x": xv, "y": yv})
    want[L - 3:] = 0
    np.testing.assert_array_equal(r.outputs["z"], want)
    assert r.counters["vxm"] == 1


def test_vxm_immediates_and_mixed_types():
    xv = rand("f16", (L,))
    r = run(vxm_program("MUL", "f16", "f32", bimm=1, imm=f32_imm(2.5)), {"x": xv})
    np.testing.assert_array_equal(r.outputs["z"], xv.astype(np.float32) * np.float32(2.5))
    r = run(vxm_program("SUB", "f16", "f16", bimm=2, imm=f32_imm(1.0)), {"x": xv})
    np.testing.assert_array_equal(r.outputs["z"], (np.float32(1) - xv.astype(np.float32)).astype(np.float16))
    iv = rand("i8", (L,))
    r = run(vxm_program("ADD", "i8", "i8", bimm=1, imm=100), {"x": iv})
    np.testing.assert_array_equal(r.outputs["z"], np.clip(iv.astype(int) + 100, -128, 127).astype(np.int8))


def test_vxm_conversions_round_and_saturate():
    xv = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.6, 127.5, 300, -300, np.nan, np.inf, -np.inf, 3.49, -3.51,
                   65519.0, 65520.0], np.float32)
    r = run(vxm_program("CONV", "f32", "i8"), {"x": xv})
    np.testing.assert_array_equal(r.outputs["z"], [0, 2, 2, 0, -2, 127, 127, 127, -128, 0, 127, -128, 3, -4, 127, 127])
    r = run(vxm_program("CONV", "f32", "f16"), {"x": xv})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(r.outputs["z"], xv.astype(np.float16))
    iv = np.array([5, -5, 127, 128, -129, 100000, -100000, 0] * 2, np.int32)
    r = run(vxm_program("CONV", "i32", "i8"), {"x": iv})
    np.testing.assert_array_equal(r.outputs["z"], np.clip(iv, -128, 127).astype(np.int8))


@pytest.mark.parametrize("opname,fn", [
    ("EXP", np.exp), ("TANH", np.tanh),
    ("SILU", lambda x: x / (np.float32(1) + np.exp(-x))),
    ("GELU", lambda x: np.float32(0.5) * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))),
])
def test_vxm_transcendental(opname, fn):
    xv = rand("f32", (L,))
    r = run(vxm_program(opname, "f32", "f32"), {"x": xv})
    np.testing.assert_allclose(r.outputs["z"], fn(xv).astype(np.float32), rtol=2e-6, atol=1e-6)  # 1 - tanh cancels


def test_mask():
    xv = rand("f16", (L,))
    r = run(vxm_program("MASK", "f16", "f16", extra=(5, f32_imm(-1e4))), {"x": xv})
    want = np.concatenate([xv[:5], np.full(L - 5, -1e4, np.float16)])
    np.testing.assert_array_equal(r.outputs["z"], want)
    r = run(vxm_program("MASK", "i8", "i8", nv=12, extra=(5, -7)), {"x": rand("i8", (L,))})
    assert list(r.outputs["z"][5:]) == [-7] * 7 + [0] * 4


# ---- SXM ---------------------------------------------------------------------------------------
def sxm_program(opname, dtype, arg, b=None):
    """x comes west to the west SXM, the result goes back east into z."""
    b = b or ProgBuilder(M)
    x = b.tensor("x", "input", dtype, (L,), [2, 3])
    k = 30
    b.read_vec(x, 0, WEST, 1, k)
    c = b.issue_for(k, WEST, SXM_W)
    b.at(c, "sxm0.1", opname, ref(dtype, WEST, 1), ref(dtype, EAST, 3), arg)
    z = b.tensor("z", "output", dtype, (L,), [4, 5])
    b.write_vec(z, 0, EAST, 3, b.diag(c + LAT["sxm"], EAST, SXM_W))
    return b


@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_sxm_ops(dtype):
    xv = rand(dtype, (L,))
    lane = np.arange(L)
    perm = RNG.permutation(L)
    perm[3] = -1
    for opname, arg, idx in [("SHIFT", 3, lane - 3), ("SHIFT", -2, lane + 2), ("ROTATE", 5, (lane - 5) % L),
                             ("DISTRIBUTE", 7, np.full(L, 7)), ("PERMUTE", 0, perm)]:
        b = ProgBuilder(M)
        if opname == "PERMUTE":
            b.table(perm)
        r = run(sxm_program(opname, dtype, arg, b).build(), {"x": xv})
        ok = (idx >= 0) & (idx < L)
        want = np.where(ok, xv[np.clip(idx, 0, L - 1)], 0).astype(xv.dtype)
        np.testing.assert_array_equal(r.outputs["z"], want, err_msg=f"{opname} {arg}")
        assert r.counters["sxm"] == 1


@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_transpose(dtype):
    b = ProgBuilder(M)
    x = b.tensor("x", "input", dtype, (L, L), [2, 3])
    z = b.tensor("z", "output", dtype, (L, L), [4, 5])
    k = 30
    b.read_vec(x, 0, WEST, 0, k, n=L)
    c = b.issue_for(k, WEST, SXM_W)
    b.at(c, "sxm0.0", "TPIN", ref(dtype, WEST, 0), 2, 0)
    b.raw("sxm0.0", "REPEAT", L - 1, 1)
    t = c + L
    b.at(t, "sxm0.1", "TPOUT", 2, 0, ref(dtype, EAST, 4))
    b.raw("sxm0.1", "REPEAT", L - 1, 1)
    b.write_vec(z, 0, EAST, 4, b.diag(t + LAT["sxm"], EAST, SXM_W), n=L)
    xv = rand(dtype, (L, L))
    np.testing.assert_array_equal(run(b.build(), {"x": xv}).outputs["z"], xv.T)


# ---- MEM gather / scatter ----------------------------------------------------------------------
def test_gather_and_scatter():
    b = ProgBuilder(M)
    tab = b.tensor("tab", "input", "i8", (8, L), [5], bank=1)
    idx = b.tensor("idx", "input", "i8", (L,), [4])
    vals = b.tensor("vals", "input", "i8", (L,), [3])
    g = b.tensor("g", "output", "i8", (L,), [6])
    dst = b.tensor("dst", "state", "i8", (8, L), [7], bank=1)
    k = 10
    b.read_vec(idx, 0, EAST, 0, k)
    c = b.issue_for(k, EAST, M.slice_pos(5))
    b.at(c, "mem5.0", "GATHER", 1, 0, ref("i8", EAST, 0), ref("i8", EAST, 1))
    b.write_vec(g, 0, EAST, 1, b.diag(c + LAT["mem_read"], EAST, M.slice_pos(5)))
    b.read_vec(vals, 0, EAST, 2, k)
    b.at(b.issue_for(k, EAST, M.slice_pos(7)), "mem7.0", "SCATTER", 1, 0, ref("i8", EAST, 0), ref("i8", EAST, 2))
    tv, iv, vv = rand("i8", (8, L)), RNG.integers(0, 8, L).astype(np.int8), rand("i8", (L,))
    dv = np.zeros((8, L), np.int8)
    r = run(b.build(), {"tab": tv, "idx": iv, "vals": vv, "dst": dv})
    np.testing.assert_array_equal(r.outputs["g"], tv[iv, np.arange(L)])
    dv[iv, np.arange(L)] = vv
    np.testing.assert_array_equal(r.states["dst"], dv)


def test_scatter_sees_no_bytes_of_an_earlier_run():
    """A SCATTER writes some lanes of a row: the others must read as on a fresh machine when the
    prepared program runs again (prepare.indexed_reach: the rows a run clears)."""
    b = ProgBuilder(M)
    idx = b.tensor("idx", "input", "i8", (L,), [4])
    vals = b.tensor("vals", "input", "i8", (L,), [3])
    dst = b.tensor("dst", "output", "i8", (8, L), [7], bank=1)
    k = 10
    b.read_vec(idx, 0, EAST, 0, k)
    b.read_vec(vals, 0, EAST, 2, k)
    b.at(b.issue_for(k, EAST, M.slice_pos(7)), "mem7.0", "SCATTER", 1, 0, ref("i8", EAST, 0), ref("i8", EAST, 2))
    prog = b.build()
    lanes = np.arange(L)
    first = {"idx": (lanes % 8).astype(np.int8), "vals": rand("i8", (L,))}
    second = {"idx": ((lanes + 1) % 8).astype(np.int8), "vals": rand("i8", (L,))}
    run(prog, first)
    again = run(prog, second).outputs["dst"]
    fresh = run(dataclasses.replace(prog, op=prog.op.copy()), second).outputs["dst"]
    np.testing.assert_array_equal(again, fresh)
    want = np.zeros((8, L), np.int8)
    want[(lanes + 1) % 8, lanes] = second["vals"]
    np.testing.assert_array_equal(fresh, want)


# ---- hazards -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shift", [-1, 1])
def test_read_moved_one_cycle_is_caught_at_the_reader(shift):
    p = copy_program(EAST, [0], [5], shape=(L,), shift=shift).build()
    with pytest.raises(HazardError) as e:
        run(p, {"x": rand("i8", (L,))})
    h = e.value
    assert (h.kind, h.cycle, h.queue, h.opcode, h.line) == ("stream-read", 20 + M.slice_pos(5), "mem5.1", "WRITE", 1)
    assert h.index == int(np.flatnonzero(p.op == O.WRITE)[0])
    assert "DSL line 1 'y = x'" in str(h) and "E2" in str(h) and "diagonal 20" in str(h)
    assert str(h).startswith(f"hazard at cycle {h.cycle} on mem5.1 (instruction {h.index}: WRITE")


def test_downstream_writer_is_not_visible():
    b = ProgBuilder(M)
    x = b.tensor("x", "input", "i8", (L,), [5])
    b.read_vec(x, 0, EAST, 0, 20)
    b.at(b.issue_for(20, EAST, M.slice_pos(4)), "mem4.0", "WRITE", 0, 0, ref("i8", EAST, 0))
    with pytest.raises(HazardError, match=f"written downstream, at position {M.slice_pos(5)}"):
        run(b.build(), {"x": rand("i8", (L,))})


def test_two_writers_on_one_diagonal():
    b = ProgBuilder(M)
    x = b.tensor("x", "input", "i8", (L,), [0])
    y = b.tensor("y", "input", "i8", (L,), [1])
    b.read_vec(x, 0, EAST, 0, 20)
    b.read_vec(y, 0, EAST, 0, 20, line=1)
    with pytest.raises(HazardError) as e:
        run(b.build(), {"x": rand("i8", (L,)), "y": rand("i8", (L,))})
    assert e.value.kind == "two-writers" and e.value.queue == "mem1.0" and "E0 diagonal 20" in str(e.value)


def test_bank_conflict_and_address_range():
    b = ProgBuilder(M)
    b.tensor("x", "input", "i8", (8, L), [3], bank=1)
    b.at(4, "mem3.0", "READ", 1, 0, ref("i8", EAST, 0))
    b.at(4, "mem3.1", "READ", 1, 7, ref("i8", EAST, 1))
    with pytest.raises(HazardError) as e:
        run(b.build(), {"x": rand("i8", (8, L))})
    assert (e.value.kind, e.value.cycle, e.value.queue) == ("bank-conflict", 4, "mem3.1")
    b = ProgBuilder(M)
    b.at(4, "mem3.0", "READ", 0, M.addresses_per_bank, ref("i8", EAST, 0))
    with pytest.raises(HazardError, match="address out of range"):
        run(b.build(), {})


def test_structural_errors():
    b = ProgBuilder(M)
    b.raw("vxm0", "READ", 0, 0, 0)
    with pytest.raises(LpuError, match="READ on queue vxm0"):
        run(b.build(), {})
    b = ProgBuilder(M)
    b.raw("mem0.0", "REPEAT", 2, 1)
    with pytest.raises(LpuError, match="REPEAT must follow"):
        run(b.build(), {})


# ---- loading -----------------------------------------------------------------------------------
def test_load_checks_names_shapes_dtypes():
    p = copy_program(EAST, [0], [5], shape=(2, 20)).build()
    with pytest.raises(LpuError, match="missing value"):
        run(p, {})
    with pytest.raises(LpuError, match="unknown tensor"):
        run(p, {"x": rand("i8", (2, 20)), "q": 1})
    with pytest.raises(LpuError, match=r"'x': expected i8 \[2, 20\] \(int8\), got int8 \[20, 2\]"):
        run(p, {"x": rand("i8", (20, 2))})
    with pytest.raises(LpuError, match="got float32"):
        run(p, {"x": rand("f32", (2, 20))})


def test_constants_and_padding_lanes():
    b = ProgBuilder(M)
    c = b.tensor("c", "const", "f16", (20,), [0, 1], data=np.arange(20, dtype=np.float16))
    y = b.tensor("y", "output", "f16", (20,), [4, 5])
    b.read_vec(c, 0, EAST, 0, 20, n=2)
    b.write_vec(y, 0, EAST, 0, 20, n=2)
    r = run(b.build(), {})
    np.testing.assert_array_equal(r.outputs["y"], np.arange(20, dtype=np.float16))


# ---- number formats ----------------------------------------------------------------------------
def encode(vals, dt):
    n = len(vals)
    u32 = np.zeros(n, np.uint32)
    dst = np.zeros((4, n), np.uint8)
    arith.encode_f32(np.asarray(vals, np.float32), dt, n, n, u32, u32.view(np.float32), dst)
    return dst


def test_f32_to_f16_rounding_matches_numpy():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    lo, hi = every[:-1].astype(np.float64), every[1:].astype(np.float64)
    with np.errstate(all="ignore"):
        mids = ((lo + hi) / 2)[np.isfinite(lo) & np.isfinite(hi)].astype(np.float32)
        rnd = RNG.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
        vals = np.concatenate([every.astype(np.float32), mids, rnd, rnd * np.float32(1e-30), rnd * np.float32(1e-34)])
        want = vals.astype(np.float16)
    got = encode(vals, arith.D_F16)[:2].T.copy().view(np.float16)[:, 0]
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


def test_float_to_int_rounds_to_even_and_saturates():
    vals = np.concatenate([np.arange(-300, 300, 0.25, dtype=np.float32), [np.nan, np.inf, -np.inf, 3e9, -3e9]])
    got8 = encode(vals, arith.D_I8)[0].view(np.int8)
    want8 = np.clip(np.rint(np.nan_to_num(vals, nan=0, posinf=1e9, neginf=-1e9)), -128, 127)
    np.testing.assert_array_equal(got8, want8)
    got32 = encode(vals, arith.D_I32).T.copy().view(np.int32)[:, 0]
    want32 = np.clip(np.rint(np.nan_to_num(vals.astype(np.float64), nan=0, posinf=3e9, neginf=-3e9)),
                     -2 ** 31, 2 ** 31 - 1)
    np.testing.assert_array_equal(got32, want32)


def test_read_by_reference_only_where_no_write_can_change_its_row():
    """A READ puts a reference to its SRAM row on the stream (core.C_READ_REF) only where no WRITE
    reaches that row while the value can still be read (prepare.by_reference): here x's row is
    overwritten with w one cycle after x is read, before z's WRITE takes x's value off the stream,
    so x's READ copies and z gets x's old value; w's READ (nothing writes w) is a reference."""
    from lpu.emulator import core
    from lpu.emulator.prepare import prepare
    b = ProgBuilder(M, ["z = x"])
    x = b.tensor("x", "input", "i8", (L,), [0])
    w = b.tensor("w", "input", "i8", (L,), [1])
    z = b.tensor("z", "output", "i8", (L,), [5], bank=1)
    t_read = b.issue_for(20, EAST, M.slice_pos(0), LAT["mem_read"])
    kw = t_read + 1 + M.slice_pos(0)                     # x's row is written (WEST) in the next cycle
    b.read_vec(x, 0, EAST, 2, 20)
    b.read_vec(w, 0, WEST, 3, kw)
    b.write_vec(x, 0, WEST, 3, kw, port=1)
    b.write_vec(z, 0, EAST, 2, 20, port=1, line=1)
    p = b.build()
    prep = prepare(p, schedule)
    s = prep.sched
    read_x = np.flatnonzero((s.op == O.READ) & (prep.uidx == 0))
    read_w = np.flatnonzero((s.op == O.READ) & (prep.uidx == 1))
    assert list(prep.cop[read_x]) == [core.C_READ] and list(prep.cop[read_w]) == [core.C_READ_REF]
    assert s.cycle[np.flatnonzero(s.op == O.WRITE)].min() == t_read + 1
    xv, wv = rand("i8", (L,)), rand("i8", (L,))
    np.testing.assert_array_equal(run(p, {"x": xv, "w": wv}).outputs["z"], xv)


def test_schedule_is_the_sorted_expansion():
    """schedule (emulator/prepare_core.py's counting sort) against the definition spelled out:
    per queue, issue from cycle 0, NOP n takes n cycles, SYNC/NOTIFY none, REPEAT n d copies the
    instruction before it at +d .. +nd (field + j) and takes n * d; sorted by (cycle, phase, queue,
    index, repetition). A compiled program with REPEATs in both phases."""
    from lpu import api
    import os
    prog, _ = api.compile(os.path.join(os.path.dirname(os.path.dirname(__file__)), "programs", "mlp.lpu"))
    rows, t, q_prev = [], 0, -1
    for i, (q, o) in enumerate(zip(prog.queue.tolist(), prog.op.tolist())):
        t = 0 if q != q_prev else t
        q_prev, a = q, [int(v) for v in prog.args[i]]
        if o == O.REPEAT:
            f = O.REPEAT_FIELD[prog.op[i - 1]]
            for j in range(1, a[0] + 1):
                b = [int(v) for v in prog.args[i - 1]]
                b[f] += j if f >= 0 else 0
                rows.append((t - 1 + j * a[1], O.OPS[prog.op[i - 1]].phase, q, i - 1, j, b))
            t += a[0] * a[1]
        elif o == O.NOP:
            t += a[0]
        elif O.OPS[o].unit != O.OPS[O.NOP].unit:
            rows.append((t, O.OPS[o].phase, q, i, 0, a))
            t += 1
    rows.sort(key=lambda r: r[:5])
    s = schedule(prog)
    assert any(r[4] for r in rows) and len({r[1] for r in rows}) == 2
    assert s.cycle.tolist() == [r[0] for r in rows] and s.queue.tolist() == [r[2] for r in rows]
    assert s.src.tolist() == [r[3] for r in rows] and s.repeat.tolist() == [r[4] for r in rows]
    assert s.args.tolist() == [r[5] for r in rows]


def test_dispatch_fields_pack_into_one_word():
    """The core reads an instruction's operation, unit, unit index, position and latency from one
    int64 (core.pack_meta); a field too wide for its bits is refused, not cut."""
    from lpu.emulator import core
    cols = [np.array(v, np.int64) for v in ([0, 21, 5], [0, 4, 2], [87, 0, 3], [92, 0, 17], [2, 6, core.M_MASK])]
    meta = core.pack_meta(*cols)
    for f, shift in zip(cols, (0, core.M_UNIT, core.M_UIDX, core.M_UPOS, core.M_LAT)):
        assert list((meta >> shift) & core.M_MASK) == list(f)
    with pytest.raises(ValueError, match="latency"):
        core.pack_meta(*cols[:4], np.array([0, 0, core.M_MASK + 1]))
