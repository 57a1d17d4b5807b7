"""The emulator's dispatch comes from the opcode table (unit and name, never numeric ranges); the
hazards the checker also rejects (SRAM read of an address without a value, a stream value
nobody reads, weights installed as another type than loaded, a wrong cycle count); the VXM
fast path. (The MXM's bulk and row paths: tests/test_emulator_mxm.py.)"""
import dataclasses

import numpy as np
import pytest
from numba import njit

from lpu.emulator import arith as A
from lpu.emulator import core, vxm_fast
from lpu.emulator.prepare import MISSING, dispatch_table, refuse_missing
from lpu.emulator.run import F16_TO_F32, HazardError, run
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import EAST, UNIT_VXM, WEST, MachineConfig
from tests.progbuild import ProgBuilder, ref

M = MachineConfig.load("tiny")
L = M.lanes
LAT = M.latency
RNG = np.random.default_rng(11)


# ---- dispatch by the opcode table -----------------------------------------------------------------
def test_dispatch_reads_unit_and_name_from_the_table():
    cop, cunit = dispatch_table()
    for s in O.OPS:
        if s.name in core.CORE_OPS:
            assert cop[s.code] == core.CORE_OPS.index(s.name)
            assert cunit[s.code] == core.CORE_UNIT_OF[s.name]
    # a copy of the table with ADD moved to the end (a new code) and a dummy VXM op appended
    add = O.BY_NAME["ADD"]
    table = [s for s in O.OPS if s.name != "ADD"]
    table = [dataclasses.replace(s, code=i) for i, s in enumerate(table)]
    table.append(dataclasses.replace(add, code=len(table)))
    table.append(O.OpSpec(len(table), "FROB", UNIT_VXM, (("a", "ref"), ("out", "ref")), "vxm", 1))
    table.append(O.OpSpec(len(table), "READ", UNIT_VXM, (("a", "ref"),), "vxm", 1))   # READ on the wrong unit
    cop, cunit = dispatch_table(table)
    moved, frob, misplaced = len(table) - 3, len(table) - 2, len(table) - 1
    assert cop[moved] == core.C_ADD and cunit[moved] == core.U_VXM
    assert cop[frob] == MISSING and cunit[frob] == core.U_VXM
    assert cop[misplaced] == MISSING
    assert cop[O.BY_NAME["READ"].code] == core.C_READ and cunit[O.BY_NAME["READ"].code] == core.U_MEM
    with pytest.raises(LpuError, match="opcode FROB .VXM unit. has no implementation in the emulator"):
        refuse_missing(None, table, cop, np.array([moved, frob]))
    refuse_missing(None, table, cop, np.array([moved]))      # a program without FROB is fine


# ---- hazards the checker also rejects ---------------------------------------------------------------
def _raises(p, values, kind):
    with pytest.raises(HazardError) as e:
        run(p, values)
    assert e.value.kind == kind, str(e.value)
    return e.value


def test_read_of_sram_without_a_value():
    b = ProgBuilder(M, ["y = x"])
    y = b.tensor("y", "output", "i8", (L,), [3])
    b.at(6, "mem3.0", "READ", int(y.banks[0, 0]), int(y.addrs[0, 0]), ref("i8", EAST, 0), line=1)
    b.write_vec(y, 0, EAST, 0, b.diag(6 + LAT["mem_read"], EAST, M.slice_pos(3)), port=1)
    h = _raises(b.build(), {}, "sram-live")
    assert (h.cycle, h.queue, h.opcode, h.line) == (6, "mem3.0", "READ", 1)
    assert "holds no value" in str(h) and "DSL line 1 'y = x'" in str(h)


def test_stream_value_nobody_reads():
    b = ProgBuilder(M, ["x"])
    x = b.tensor("x", "input", "i8", (L,), [2])
    b.read_vec(x, 0, EAST, 5, 30, line=1)
    h = _raises(b.build(), {"x": RNG.integers(-9, 9, L).astype(np.int8)}, "stream-unread")
    assert (h.queue, h.opcode, h.line) == ("mem2.0", "READ", 1)
    assert h.cycle == b.issue_for(30, EAST, M.slice_pos(2), LAT["mem_read"])
    assert "E5 diagonal 30" in str(h)


def test_weights_installed_as_another_type():
    b = ProgBuilder(M, ["z = x @ w"])
    w = b.tensor("w", "weight", "i8", (L, L), [2])
    b.read_vec(w, 0, WEST, 0, 20, n=L)
    t = b.issue_for(20, WEST, 0)
    b.at(t, "mxm0.lw0", "LW", 0, ref("i8", WEST, 0))
    b.raw("mxm0.lw0", "REPEAT", L - 1, 1)
    b.at(t + L, "mxm0", "IW", O.DT_F16, 0, line=1)
    h = _raises(b.build(), {"w": RNG.integers(-9, 9, (L, L)).astype(np.int8)}, "mxm-order")
    assert (h.cycle, h.queue, h.opcode, h.line) == (t + L, "mxm0", "IW", 1)
    assert "loaded as i8, the IW installs f16" in str(h)


def test_wrong_cycle_count():
    b = ProgBuilder(M, ["y = x"])
    x = b.tensor("x", "input", "i8", (L,), [0])
    y = b.tensor("y", "output", "i8", (L,), [5], bank=1)
    b.read_vec(x, 0, EAST, 2, 20)
    b.write_vec(y, 0, EAST, 2, 20, line=1)
    p = b.build()
    xv = RNG.integers(-9, 9, L).astype(np.int8)
    assert run(p, {"x": xv}).cycles == p.predicted_cycles
    p.predicted_cycles += 1
    h = _raises(p, {"x": xv}, "cycles")
    assert (h.queue, h.opcode, h.line) == ("mem5.0", "WRITE", 1)
    assert f"the program says {p.predicted_cycles}" in str(h)


def test_a_program_over_billions_of_mostly_empty_cycles_runs():
    """Two instructions after a wait of 2e9 cycles: the schedule is sorted without a table over
    every cycle (which needed 48 GB: MemoryError from a fuzzed binary's NOP of 2^31 - 1)."""
    b = ProgBuilder(M, ["y = x"])
    x = b.tensor("x", "input", "i8", (L,), [0])
    y = b.tensor("y", "output", "i8", (L,), [5], bank=1)
    b.read_vec(x, 0, EAST, 2, 2_000_000_000)
    b.write_vec(y, 0, EAST, 2, 2_000_000_000, line=1)
    p = b.build()
    xv = RNG.integers(-9, 9, L).astype(np.int8)
    r = run(p, {"x": xv})
    assert r.cycles == p.predicted_cycles > 2_000_000_000 and np.array_equal(r.outputs["y"], xv)


def test_the_sorted_schedule_without_the_cycle_table_is_the_same(monkeypatch):
    """schedule()'s sparse path (a stable argsort, for programs whose cycles are mostly empty)
    gives the order of its counting sort, field by field, on a bundled program."""
    import dataclasses as dc

    from lpu.emulator import run as R
    from tests.test_emulator_mxm import PROGRAMS, compile_file
    prog, _ = compile_file(f"{PROGRAMS}/attention_decode.lpu", {}, M)
    dense = R.schedule(prog)
    monkeypatch.setattr(R, "DENSE_SLACK", 0)
    monkeypatch.setattr(R, "DENSE_MIN", -1)
    sparse = R.schedule(prog)
    for f in dc.fields(dense):
        assert np.array_equal(getattr(dense, f.name), getattr(sparse, f.name)), f.name


def test_too_many_executed_instructions_is_one_clear_error(monkeypatch):
    from lpu.emulator import run as R
    b = ProgBuilder(M, ["y = x"])
    x = b.tensor("x", "input", "i8", (L,), [0])
    b.read_vec(x, 0, EAST, 2, 2)
    p = b.build()
    i = int(np.flatnonzero(p.op == O.READ)[0])
    rep = np.zeros((1, p.args.shape[1]), p.args.dtype)
    rep[0, :2] = 2**31 - 1, 1
    q = dataclasses.replace(p, op=np.insert(p.op, i + 1, O.REPEAT), args=np.insert(p.args, i + 1, rep, axis=0),
                            queue=np.insert(p.queue, i + 1, p.queue[i]), line=np.insert(p.line, i + 1, 0),
                            node=np.insert(p.node, i + 1, 0))
    monkeypatch.setattr(R, "MAX_EXECUTED", 2**31 - 1)      # (the limit itself, 2^31, is one more)
    with pytest.raises(LpuError, match="executes 2,147,483,648 instructions"):
        run(q, {"x": np.zeros(L, np.int8)})


# ---- VXM fast path = arith's general path ---------------------------------------------------------
@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV", "MAX", "MIN", "CONV", "NEG", "ABS", "RELU", "EXP", "LOG",
                                "SQRT", "RSQRT", "TANH", "SIGMOID", "SILU", "GELU"])
def test_vxm_fast_path_equals_general_path(op):
    c = A.CORE_OPS.index(op)
    raw = RNG.integers(0, 256, (4, L)).astype(np.uint8)
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 1e-8, -3.5, 65519.0, -65520.0, 2.0**-14,
                     -2.0**-14 * (1 - 2.0**-12), 2.0**-25, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11], np.float32)
    b32 = np.concatenate([vals, RNG.standard_normal(L - len(vals)).astype(np.float32) * 1e3]).view(np.uint32)
    with np.errstate(over="ignore"):       # -65520 rounds to -inf in f16
        b16 = np.concatenate([vals, RNG.standard_normal(L - len(vals)).astype(np.float32)]).astype(np.float16).view(np.uint16)
    planes = {A.D_F32: np.stack([(b32 >> (8 * i)) & 0xFF for i in range(4)]).astype(np.uint8),
              A.D_F16: np.stack([b16 & 0xFF, b16 >> 8, raw[2], raw[3]]).astype(np.uint8)}
    imm = int(np.array([1.5], np.float32).view(np.int32)[0])
    for adt in (A.D_F16, A.D_F32):
        for bdt in (A.D_F16, A.D_F32):
            for odt in (A.D_F16, A.D_F32):
                for bimm in ((0,) if c >= A.C_NEG else (0, 1, 2)):
                    a, b = planes[adt], np.roll(planes[bdt], 3, axis=1)
                    assert vxm_fast.handles(c, adt, bdt, bimm, odt)
                    outs = []
                    for fast in (True, False):
                        scratch = (np.zeros(L, np.float32), np.zeros(L, np.float32), np.zeros(L, np.int64),
                                   np.zeros(L, np.uint32))
                        fa, fb, ia, u32 = scratch
                        dst = np.full((4, L), 7, np.uint8)
                        if fast:
                            vxm_fast.compute(c, a, adt, b, bdt, bimm, imm, odt, L - 2, L, fa, fb, u32,
                                             u32.view(np.float32), dst)
                        else:
                            A.vxm_compute(c, a, adt, b, bdt, bimm, imm, odt, L - 2, 0, L, F16_TO_F32, fa, fb, ia, u32,
                                          u32.view(np.float32), dst)
                        outs.append(dst[:A.WIDTH[odt]].copy())
                    assert np.array_equal(outs[0], outs[1]), (op, adt, bdt, odt, bimm)
    assert not vxm_fast.handles(A.C_ADD, A.D_I8, A.D_I8, 0, A.D_I8)
    assert not vxm_fast.handles(A.C_EXP, A.D_I8, 0, 0, A.D_F32)
    assert not vxm_fast.handles(A.C_MASK, A.D_F32, 0, 0, A.D_F32)


def test_f16_values_by_the_cpu_equal_the_table():
    """arith.f16_value (the CPU's half -> float conversion, NaNs kept) on every bit pattern."""
    from numba import njit

    @njit
    def decode(lo, hi, out):
        for i in range(out.shape[0]):
            out[i] = A.f16_value(lo[i], hi[i])
    bits = np.arange(1 << 16, dtype=np.uint32)
    out = np.zeros(1 << 16, np.float32)
    decode((bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8), out)
    assert np.array_equal(out.view(np.uint32), F16_TO_F32.view(np.uint32))


def test_i8_to_f16_bits_by_the_cpu_equal_numpy():
    """arith.i8_to_f16_bits (LW's i8 -> f16 conversion) on every i8 value, as an int8 byte read
    from a stream and as an int64, against numpy's float16."""
    from numba import njit

    @njit
    def convert(v, out8, out64):
        for i in range(v.shape[0]):
            out8[i] = A.i8_to_f16_bits(np.int8(v[i]))
            out64[i] = A.i8_to_f16_bits(np.int64(np.int8(v[i])))
    v = np.arange(256, dtype=np.uint8)
    out8, out64 = np.zeros(256, np.int64), np.zeros(256, np.int64)
    convert(v, out8, out64)
    want = v.view(np.int8).astype(np.float16).view(np.uint16).astype(np.int64)
    assert np.array_equal(out8, want) and np.array_equal(out64, want)


def test_huge_page_arrays_are_zeroed_aligned_and_independent():
    from lpu.emulator import hugemem
    a = hugemem.zeros((3000, 320), np.uint8)              # 960,000 bytes: plain numpy
    b = hugemem.zeros((4, 2048, 320), np.uint32)          # 10.5 MB: its own huge-page mapping
    c = hugemem.zeros((4, 2048, 320), np.uint32)
    for x, shape, dt in ((a, (3000, 320), np.uint8), (b, (4, 2048, 320), np.uint32)):
        assert x.shape == shape and x.dtype == dt and x.flags.c_contiguous and x.flags.writeable
        assert not x.any()
    assert b.ctypes.data % hugemem.HUGE == 0
    b[3, 2047, 319] = 7
    b[0, 0, 0] = 1
    assert c.sum() == 0 and b.sum() == 8


@njit(cache=True)
def _f16_mismatches(low_bits):
    """f32 patterns (every sign, exponent and top 11 mantissa bits, with each of `low_bits`
    below: the round bit of an f16 normal is bit 12, a subnormal's higher, the rest only sticky)
    where the CPU's conversion and arith.f32_bits_to_f16 differ; NaNs left out."""
    bad = 0
    for hi in range(1 << 20):
        for lo in low_bits:
            u = np.int64((hi << 12) | lo)
            if (u & 0x7FFFFFFF) <= 0x7F800000:
                x = np.array([u], np.int64).astype(np.uint32).view(np.float32)[0]
                bad += vxm_fast.f16_bits(x) != A.f32_bits_to_f16(u)
    return bad


def test_f16_bits_rounds_as_f32_bits_to_f16():
    assert _f16_mismatches(np.array([0, 1, 0x7FF, 0x800, 0xFFF], np.int64)) == 0


def test_vxm_fast_f16_result_keeps_nan_payloads():
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FC02000, 0xFFFFFFFF, 0x7FA00000],
                    np.uint32)
    b32 = np.concatenate([nans, RNG.standard_normal(L - len(nans)).astype(np.float32).view(np.uint32)])
    a = np.stack([(b32 >> (8 * i)) & 0xFF for i in range(4)]).astype(np.uint8)
    outs = []
    for fast in (True, False):
        fa, fb, ia, u32 = np.zeros(L, np.float32), np.zeros(L, np.float32), np.zeros(L, np.int64), np.zeros(L, np.uint32)
        dst = np.zeros((4, L), np.uint8)
        if fast:
            vxm_fast.compute(A.C_CONV, a, A.D_F32, a, A.D_F32, 0, 0, A.D_F16, L, L, fa, fb, u32, u32.view(np.float32), dst)
        else:
            A.vxm_compute(A.C_CONV, a, A.D_F32, a, A.D_F32, 0, 0, A.D_F16, L, 0, L, F16_TO_F32, fa, fb, ia, u32,
                          u32.view(np.float32), dst)
        outs.append(dst[:2].copy())
    assert np.array_equal(outs[0], outs[1])
    assert len(set((outs[0][0, :len(nans)] | (outs[0][1, :len(nans)].astype(np.int64) << 8)).tolist())) > 4
