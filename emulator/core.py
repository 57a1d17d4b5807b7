"""The jitted core (with emulator/arith.py, its number formats and VXM arithmetic,
emulator/core_streams.py, its hazard kinds and stream-ring helpers, and
emulator/core_sxm.py, the SXM's instructions): executes a program's instructions, already expanded and sorted by issue
cycle (see emulator/run.py), one after the other.

Arrays in, arrays out; every size comes in as a plain int argument. The core has its own
operation codes (`CORE_OPS`, mapped from the opcode table by name in run.py) so that Numba's
cache, which freezes globals, never holds a stale opcode numbering.

Streams: per (direction, stream) a ring buffer indexed by diagonal k mod `ring_size` (a power of
two above positions + latency) holds the diagonal written, the writer's position and execution
index, the payload bytes and whether anyone read it, and the SRAM row the payload is, where a
READ put a reference instead of a copy (C_READ_REF: prepare.by_reference proves that nothing
writes the row while the value can be read; else the payload is in ring_pay): the tuple `ring` =
(ring_tag, ring_ref, ring_pay, mem), a slot's fields packed in two int64 words (core_streams.py:
tag = diagonal, position, read flag; ref = writer, row). A value nobody read is a hazard
(H_UNREAD), found when its slot is reused or at the end of the run, and reported at its writer.

SRAM is the compact image of emulator/prepare.py, uint8[rows, lanes], with a valid flag per row
(set for loaded tensors and by WRITE/SCATTER): a READ of a row without a value is a hazard.

A hazard stops the run: `hz` receives (kind, execution index, cycle, x0, x1, x2, x3) and the
function returns the number of instructions executed before it.
"""
import numpy as np
from numba import njit

from lpu.emulator import hugemem, mxm_install, vxm_fast
from lpu.emulator.borrow import borrowed, prefetch, prefetch_row
from lpu.emulator.core_streams import (  # noqa: F401 (names used by run.py, prepare.py, c2c.py as core.X)
    CORE_UNIT_OF, C_READ_REF, H_ADDR, H_BANK, H_BUSY, H_C2C, H_DTYPE, H_FLUSH, H_INSTALL, H_NONE,
    H_NOT_READY, H_OPERAND, H_ORDER, H_SRAM_CLOBBERED, H_SRAM_EMPTY, H_STREAM_EMPTY, H_TWO_WRITERS,
    EMPTY_TAG, H_UNREAD, K_BANK_ACCESSES, K_MACS, K_MXM_BUSY, K_SRAM_READ, K_SRAM_WRITTEN, K_SXM_BUSY, K_VXM_BUSY,
    N_COUNTERS, ORD_ACCUM_READ, ORD_ACC_EMPTY, ORD_NEVER_READ, ORD_NOT_INSTALLED, ORD_RELOAD,
    ORD_RESET_UNREAD, ORD_STALE, RO_CLOBBERED, RO_LOADED, TRANSPOSE_BUFFERS, UNIT_CODE, U_C2C, U_MEM,
    U_MXM, U_SXM, U_VXM, copy_run, diagonal, first_unread, operand_error, order_done, order_hazard, ref_ok,
    slot_plane, stream_claim, stream_plane, stream_planes, stream_read, stream_slot_planes, stream_take,
    stream_write, zero_run,
)
from lpu.emulator.core_links import L_ON, c2c_exec
from lpu.emulator.core_sxm import sxm_exec
from lpu.emulator.mxm import flush
from lpu.emulator.mxm_install import lw_exec, mxm_input_ok
from lpu.emulator.arith import (  # noqa: F401 (CORE_OPS: used by run.py)
    CORE_OPS, C_ABC, C_ADD, C_GATHER, C_IW, C_LW, C_MASK, C_MIN, C_READ, C_WRITE, D_F16, D_F32, D_I32, D_I8,
    WIDTH, f16_value, vxm_compute,
)

# ---- units -------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def mem_exec(op, a, s, p, t, ex, lat, spd, naddr, mem, valid, bank_base, bank_lo, bank_last, ring, sa, sb, hz,
             counters):
    bank, addr = a[0], a[1]
    lanes = mem.shape[1]
    if bank < 0 or bank >= bank_base.shape[1] or addr < 0 or addr >= naddr:
        hz[0], hz[3], hz[4], hz[5] = H_ADDR, s, bank, addr
        return False
    if bank_last[s, bank] == t:
        hz[0], hz[3], hz[4] = H_BANK, s, bank
        return False
    bank_last[s, bank] = t
    counters[K_BANK_ACCESSES] += 1
    row = bank_base[s, bank] + addr - bank_lo[s, bank]
    if op == C_READ or op == C_READ_REF or op == C_WRITE:
        if not ref_ok(a[2], 1, spd):
            return operand_error(hz, 2, a[2])
        if op != C_WRITE:
            if valid[row] == 0 or valid[row] == RO_CLOBBERED:
                hz[0], hz[3], hz[4], hz[5] = H_SRAM_EMPTY if valid[row] == 0 else H_SRAM_CLOBBERED, s, bank, addr
                return False
            counters[K_SRAM_READ] += lanes
            return stream_write(a[2], 1, p, t + lat, ex, ring, mem[row:row + 1], hz, row if op == C_READ_REF else -1)
        if not stream_read(a[2], 1, p, t, ring, mem[row:row + 1], hz):
            return False
        valid[row] = RO_CLOBBERED if valid[row] >= RO_LOADED else 1
        counters[K_SRAM_WRITTEN] += lanes
        return True
    for f in (2, 3):
        if not ref_ok(a[f], 1, spd):
            return operand_error(hz, f, a[f])
    if not stream_read(a[2], 1, p, t, ring, sb, hz):
        return False
    for l in range(lanes):
        if addr + sb[0, l] >= naddr:
            hz[0], hz[3], hz[4], hz[5] = H_ADDR, s, bank, addr + sb[0, l]
            return False
    if op == C_GATHER:
        for l in range(lanes):
            sa[0, l] = mem[row + sb[0, l], l]
        counters[K_SRAM_READ] += lanes
        return stream_write(a[3], 1, p, t + lat, ex, ring, sa, hz)
    if not stream_read(a[3], 1, p, t, ring, sa, hz):
        return False
    for l in range(lanes):
        mem[row + sb[0, l], l] = sa[0, l]
        valid[row + sb[0, l]] = RO_CLOBBERED if valid[row + sb[0, l]] >= RO_LOADED else 1
    counters[K_SRAM_WRITTEN] += lanes
    return True


@njit(cache=True, inline="always")
def vxm_exec(op, a, p, t, ex, lat, lanes, spd, ring, f16tab,
             sa, sb, so, fa, fb, ia, u32, f32v, hz, counters):
    """One VXM instruction: vxm_fast reads the operands' planes where they lie and writes the result
    into its ring slot; arith.vxm_compute (the rest) goes through the scratch planes sa, sb, so."""
    binary = op >= C_ADD and op <= C_MIN
    bref, cut, imm, bimm = 0, 0, 0, 0
    if binary:
        aref, bref, oref, nv, imm, bimm = a[0], a[1], a[2], a[3], a[4], a[5]
        nvf = 3
    else:
        aref, oref, nv = a[0], a[1], a[2]
        nvf = 2
        if op == C_MASK:
            cut, imm = a[3], a[4]
    if bimm < 0 or bimm > 2:
        return operand_error(hz, 5, bimm)
    if nv < 0 or nv > lanes:
        return operand_error(hz, nvf, nv)
    reads_a = not (binary and bimm == 2)
    reads_b = binary and bimm != 1
    for f, ref, used in ((0, aref, reads_a), (1, bref, reads_b), (nvf - 1, oref, True)):
        if used and (ref < 0 or ref >> 8 >= 5 or not ref_ok(ref, WIDTH[(ref >> 8) % 5], spd)):
            return operand_error(hz, f, ref)
    adt, bdt, odt = aref >> 8, bref >> 8, oref >> 8
    wa, wb, wo = WIDTH[adt] if reads_a else 1, WIDTH[bdt] if reads_b else 1, WIDTH[odt]
    sla = stream_take(aref, wa, p, t, ring, hz) if reads_a else 0
    if sla < 0:
        return False
    slb = stream_take(bref, wb, p, t, ring, hz) if reads_b else 0
    if slb < 0:
        return False
    counters[K_VXM_BUSY] += 1
    slo = stream_claim(oref, wo, p, t + lat, ex, ring, hz)
    if slo < 0:
        return False
    if vxm_fast.handles(op, adt, bdt, bimm, odt):     # the operands' planes where they lie, the result into its slot
        pa = stream_planes(ring, aref, wa, sla) if reads_a else stream_planes(ring, oref, wo, slo)
        pb = stream_planes(ring, bref, wb, slb) if reads_b else pa
        vxm_fast.compute(op, pa, adt, pb, bdt, bimm, imm, odt, nv, lanes, fa, fb, u32, f32v,
                         stream_slot_planes(ring, oref, wo, slo))
        return True
    for b in range(wa if reads_a else 0):
        copy_run(stream_plane(ring, aref, b, sla), sa[b])
    for b in range(wb if reads_b else 0):
        copy_run(stream_plane(ring, bref, b, slb), sb[b])
    vxm_compute(op, sa, adt, sb, bdt, bimm, imm, odt, nv, cut, lanes, f16tab, fa, fb, ia, u32, f32v, so)
    for b in range(wo):
        copy_run(so[b], slot_plane(ring, oref, b, slo))
    return True


@njit(cache=True)
def abc_exec(a, plane, p, t, ex, lat, lanes, spd, acc_rows, pair_cycles, ring, lbuf, lrows, wts32, wnorm, wcols,
             wbuf, wdt, busy, acc_bits, acc_kind, acc_ready, ord_acc, ord_last, sa, pend_x, pend_meta, pend_n, ybuf,
             act, bulk, hz, counters):
    """ABC: timing, hazards, the operand; the product joins the plane's batch (mxm.flush)."""
    if pend_n[plane] == pend_x.shape[1] and not flush(plane, lbuf, lrows, wts32, wnorm, wcols, wdt, pend_x,
                                                     pend_meta, pend_n, ybuf, wbuf, act, acc_bits, bulk, hz):
        return False
    ref, row, accum, half = a[0], a[1], a[2], a[3]
    if not mxm_input_ok(ref, plane, spd):
        return operand_error(hz, 0, ref)
    if row < 0 or row >= acc_rows:
        return operand_error(hz, 1, row)
    if half != 0 and half != 1:
        return operand_error(hz, 3, half)
    dt = ref >> 8
    if wdt[0, plane] != dt:
        hz[0], hz[3], hz[4] = H_DTYPE, dt, wdt[0, plane]
        return False
    kind = D_I32 if dt == D_I8 else D_F32
    if accum != 0 and acc_kind[plane, row] != kind and acc_kind[plane, row] != -1:
        hz[0], hz[3], hz[4] = H_DTYPE, kind, acc_kind[plane, row]
        return False
    state = ord_acc[plane, row]
    if accum == 0 and state == 1:
        return order_hazard(hz, ORD_RESET_UNREAD, plane, row)
    if accum != 0 and state == 2:
        return order_hazard(hz, ORD_ACCUM_READ, plane, row)
    span = 1 if dt == D_I8 else 2
    for pl in range(plane, plane + span):
        if busy[pl] > t:
            hz[0], hz[3], hz[4] = H_BUSY, pl, busy[pl]
            return False
    hold = 1 if dt == D_I8 else pair_cycles
    if half != 0:
        hold = (hold + 1) // 2
    for pl in range(plane, plane + span):
        busy[pl] = t + hold
    if not stream_read(ref, WIDTH[dt], p, t, ring, sa, hz):
        return False
    nb = pend_n[plane]
    x = pend_x[plane, nb]
    if dt == D_I8:
        for l in range(lanes):
            x[l] = np.float64(np.int8(sa[0, l]))
    else:
        for l in range(lanes):
            x[l] = np.float64(f16_value(sa[0, l], sa[1, l]))
    if half != 0:
        zero_run(x[lanes // 2:])
    pend_meta[plane, nb, 0], pend_meta[plane, nb, 1], pend_meta[plane, nb, 2] = row, accum, dt
    pend_n[plane] = nb + 1
    acc_kind[plane, row] = kind
    acc_ready[plane, row] = t + lat
    ord_acc[plane, row], ord_last[plane, row] = 1, ex
    counters[K_MXM_BUSY] += hold if dt == D_I8 else 2 * hold
    counters[K_MACS] += lanes * (lanes // 2 if half != 0 else lanes)
    return True


@njit(cache=True)
def mxm_exec(op, a, plane, p, t, ex, lat, lanes, spd, acc_rows, ring, lbuf, lrows, lw_dt, wts32, wnorm, wcols,
             wbuf, wdt, busy, acc_bits, acc_kind, acc_ready, order, so, pend_x, pend_meta, pend_n, ybuf, act,
             bulk, hz):
    """IW and ACC (LW and ABC: `lw_exec`, `abc_exec`)."""
    if op == C_IW:
        if not flush(plane, lbuf, lrows, wts32, wnorm, wcols, wdt, pend_x, pend_meta, pend_n, ybuf, wbuf, act,
                     acc_bits, bulk, hz):
            return False
        dt, trans = a[0], a[1]
        if not (dt == D_I8 or (dt == D_F16 and plane % 2 == 0)):
            return operand_error(hz, 0, dt)
        if busy[plane] > t:
            hz[0], hz[3], hz[4] = H_BUSY, plane, busy[plane]
            return False
        for r in range(lanes):
            if lw_dt[plane, r] != -1 and lw_dt[plane, r] != dt:
                hz[0], hz[3], hz[4], hz[5] = H_INSTALL, lw_dt[plane, r], dt, r
                return False
        top = -1
        for r in range(lanes):
            if lw_dt[plane, r] != -1:
                top = r
        for r in range(top):
            if lw_dt[plane, r] == -1:
                return order_hazard(hz, ORD_STALE, plane, r)
        lw_dt[plane, :] = -1
        order[0][plane, :] = -1
        busy[plane] = t + 1
        mxm_install.install_lazily(plane, dt, trans, top, lanes, lrows, wdt)
        return True
    row, ref = a[0], a[1]  # ACC: the batch is multiplied out first if one of its ABCs writes this row (the
    waits = False          # other rows are not observable before their own ACC)
    for b in range(pend_n[plane]):
        if pend_meta[plane, b, 0] == row:
            waits = True
            break
    if waits and not flush(plane, lbuf, lrows, wts32, wnorm, wcols, wdt, pend_x, pend_meta, pend_n, ybuf, wbuf, act,
                           acc_bits, bulk, hz):
        return False
    if row < 0 or row >= acc_rows:
        return operand_error(hz, 0, row)
    if ref < 0 or not (ref >> 8 == D_I32 or ref >> 8 == D_F32) or not ref_ok(ref, 4, spd):
        return operand_error(hz, 1, ref)
    if order[1][plane, row] == 0:
        return order_hazard(hz, ORD_ACC_EMPTY, plane, row)
    if acc_ready[plane, row] > t:
        hz[0], hz[3], hz[4], hz[5] = H_NOT_READY, plane, row, acc_ready[plane, row]
        return False
    if acc_kind[plane, row] != -1 and acc_kind[plane, row] != ref >> 8:
        hz[0], hz[3], hz[4] = H_DTYPE, ref >> 8, acc_kind[plane, row]
        return False
    order[1][plane, row] = 2
    src = acc_bits[plane, row]
    for b in range(4):          # a byte plane at a time (a loop that vectorizes: 23 vs 56 ns a row, lane by lane)
        dst, sh = so[b], np.uint32(8 * b)
        for l in range(lanes):
            dst[l] = (src[l] >> sh) & np.uint32(0xFF)
    return stream_write(ref, 4, p, t + lat, ex, ring, so, hz)


# An instruction's dispatch fields in one int64 (`pack_meta`, once per program: the loop streams
# three columns, cycle, meta and operands, 64 bytes an instruction, instead of seven, 96 bytes)
M_UNIT, M_UIDX, M_UPOS, M_LAT = 12, 24, 36, 48    # the core operation in bits 0-11
M_MASK = (1 << 12) - 1


def pack_meta(cop, cunit, uidx, upos, lat) -> np.ndarray:
    """int64 [n]: core operation, unit, unit index, position and latency of every instruction."""
    fields = (cop, cunit, uidx, upos, lat)
    for name, f in zip(("operation", "unit", "unit index", "position", "latency"), fields):
        if len(f) and (f.min() < 0 or f.max() > M_MASK):
            raise ValueError(f"instruction {name} {int(f.min())}..{int(f.max())} outside 0..{M_MASK}")
    return (cop.astype(np.int64) | cunit.astype(np.int64) << M_UNIT | uidx.astype(np.int64) << M_UIDX
            | upos.astype(np.int64) << M_UPOS | lat.astype(np.int64) << M_LAT)


PREFETCH_AHEAD = 12   # instructions: far enough ahead for a cache miss, near enough to stay cached
STREAM_AHEAD = 128    # instructions: the columns of the instruction list are asked for this far ahead
ABC_BATCH = 128    # an ABC's product is computed at its plane's IW, an ACC of its row, or when 128 wait


# ---- the run -----------------------------------------------------------------------------------
def workspace(lanes, spd, ring_size, nplanes, acc_rows, slices, banks):
    """The core's unit state (allocated once per prepared program, reset by `reset`): stream
    rings, bank use, MXM weight buffers, weights, accumulators and pending ABCs, transpose
    buffers, and scratch vectors. The ring payloads, installed weights and accumulators (MBs,
    touched at random) lie on huge pages each (emulator/hugemem.py; all of the state in one
    huge-page mapping measured no faster: 0.99-1.01 of the SRAM image alone)."""
    return ((np.full((2, spd, ring_size), EMPTY_TAG, np.int64), np.zeros((2, spd, ring_size), np.int64),
             hugemem.zeros((2, spd, ring_size, lanes), np.uint8)),
            np.full((slices, banks), -1, np.int64),               # bank_last
            np.zeros((nplanes, lanes, 2, 2, lanes), np.uint8),    # lbuf: [plane, row, side, byte plane, lane]
            np.full((nplanes, lanes), -1, np.int64),              # lw_dt
            np.zeros((lanes, lanes), np.float64),                 # wbuf: weights as float64 for BLAS (mxm.blas_over)
            hugemem.zeros((nplanes, lanes, lanes), np.float32),   # wts32: installed weights (f16, i8: exact)
            np.zeros((nplanes, 2, lanes), np.float64),            # wnorm: column norms and grains of the weights
            np.full((4, nplanes), -1, np.int64),                  # wdt: mxm_install.install_lazily
            np.zeros(nplanes, np.int64),                          # busy
            hugemem.zeros((nplanes, acc_rows, lanes), np.uint32), # acc_bits
            np.full((nplanes, acc_rows), -1, np.int64),           # acc_kind
            np.zeros((nplanes, acc_rows), np.int64),              # acc_ready
            np.zeros((2, TRANSPOSE_BUFFERS, lanes, lanes), np.uint8),   # tbuf
            np.zeros((nplanes, ABC_BATCH, lanes), np.float64),    # pend_x: ABCs not yet multiplied out
            np.zeros((nplanes, ABC_BATCH, 3), np.int64),          # pend_meta: (acc row, accum, dtype)
            np.zeros(nplanes, np.int64),                          # pend_n
            (np.full((nplanes, lanes), -1, np.int64),             # order: the LW each buffer row waits to install,
             np.zeros((nplanes, acc_rows), np.int64),             #   accumulator rows (0 unused, 1 result pending,
             np.full((nplanes, acc_rows), -1, np.int64)),         #   2 read out) and each row's last ABC
            np.zeros((nplanes, lanes, 2), np.int64),               # wcols: columns of each weight row's nonzeros
            np.zeros((ABC_BATCH, lanes), np.float64),             # ybuf: a batch's products (scratch, here
                                                                  #   not per call: 142 calls a run of bert_base
                                                                  #   L=1 zeroed 320 KB each, 1.2 ms)
            np.zeros((nplanes, lanes, 3), np.int64))              # lrows: per buffer row, its installed side and
                                                                  #   a non-finite flag per side (mxm_install)


def reset(ws):
    """Back to the state of a machine that has run nothing (what a run can observe). Not cleared
    (3 MB on tsp-v1): the converted weights (wts32, wnorm, wcols), none of which counts as
    installed (wdt[2] = lanes: mxm_install.install_lazily); an ABC before a plane's first IW is a
    dtype hazard; side 1 of every weight buffer row (lrows: side 0 is installed, and an LW writes
    a row's other side before an IW installs it). Of the accumulators (10 MB) only the rows an ABC
    wrote (`clear_written`)."""
    (ring, bank_last, lbuf, lw_dt, _, _, _, wdt, busy, acc_bits, acc_kind, acc_ready, tbuf, _, _, pend_n,
     order, _, _, lrows) = ws
    ring[0].fill(EMPTY_TAG)
    clear_written(acc_bits, acc_kind)
    for a, v in ((bank_last, -1), (lbuf[:, :, 0], 0), (lw_dt, -1), (wdt, -1), (busy, 0), (acc_kind, -1),
                 (acc_ready, 0), (tbuf, 0), (pend_n, 0), (order[0], -1), (order[1], 0), (order[2], -1),
                 (lrows, 0)):
        a.fill(v)
    wdt[2].fill(lbuf.shape[1])


@njit(cache=True)
def clear_written(acc_bits, acc_kind):
    """Zero the accumulator rows of kind other than -1: the only ones that can hold anything but
    zeros. Every write of a row (mxm.accumulate) is of a pending ABC's row, whose kind the ABC
    set (abc_exec); a row is zero when allocated (`workspace`) and when `reset` sets its kind
    back to -1 (after this). (bert_base L=1 writes 256 rows of 8,192: 0.3 MB, not 10.)"""
    for pl in range(acc_kind.shape[0]):
        for r in range(acc_kind.shape[1]):
            if acc_kind[pl, r] != -1:
                zero_run(acc_bits[pl, r])


@njit(cache=True)
def execute(start, cyc, meta, args, lanes, spd, acc_rows, pair_cycles,
            naddr, bank_base, bank_lo, mem, valid, tables, f16tab, ws, links, bulk, hz, counters):
    """Execute the sorted instruction list from `start`; returns where it stopped: the end, the
    instruction of a hazard, or one that waits for the host to multiply out a batch (hz[0] ==
    H_FLUSH: call again from there), or a RECV at or after the window's end (hz[0] == H_C2C: the
    host delivers what other chips sent and calls again from it; emulator/core_links.py, whose
    `links` state a one-chip run passes switched off: then every C2C instruction stops the run
    with H_C2C). Dispatch is by each instruction's core
    unit, then by its core operation (both in `meta`, with its unit index, position and latency:
    `pack_meta`). (This function allocates the scratch vectors and
    keeps every array alive while `_loop` uses them borrowed: emulator/borrow.py.)"""
    (ring, bank_last, lbuf, lw_dt, wbuf, wts32, wnorm, wdt, busy, acc_bits, acc_kind, acc_ready, tbuf, pend_x,
     pend_meta, pend_n, order, wcols, ybuf, lrows) = ws
    act = np.zeros(lanes, np.int64)
    sa = np.zeros((4, lanes), np.uint8)
    sb = np.zeros((4, lanes), np.uint8)
    so = np.zeros((4, lanes), np.uint8)
    fa = np.zeros(lanes, np.float32)
    fb = np.zeros(lanes, np.float32)
    ia = np.zeros(lanes, np.int64)
    u32 = np.zeros(lanes, np.uint32)
    return _loop(start, cyc, meta, args, lanes, spd, acc_rows, pair_cycles, naddr, bank_base,
                 bank_lo, mem, valid, tables, f16tab, ring[0], ring[1], ring[2], bank_last, lbuf, lrows,
                 lw_dt, wts32, wnorm, wdt, busy, acc_bits, acc_kind, acc_ready, tbuf, pend_x, pend_meta, pend_n,
                 order[0], order[1], order[2], wcols, wbuf, act, sa, sb, so, fa, fb, ia, u32, ybuf, links[0], links[1],
                 links[2], links[3], links[4], links[5], links[6], links[7], links[8], bulk, hz, counters)


@njit(cache=True)
def _loop(start, cyc, meta, args, lanes, spd, acc_rows, pair_cycles, naddr, bank_base, bank_lo,
          mem, valid, tables, f16tab, ring_tag, ring_ref, ring_pay, bank_last, lbuf, lrows, lw_dt, wts32,
          wnorm, wdt, busy, acc_bits, acc_kind, acc_ready, tbuf, pend_x, pend_meta, pend_n, ord_lw, ord_acc, ord_last,
          wcols, wbuf, act, sa, sb, so, fa, fb, ia, u32, ybuf, lk_ctl, lk_last, out_link, out_cycle, out_pay,
          in_arrival, in_pay, in_head, in_tail, bulk, hz, counters):
    """`execute`'s loop, on borrowed arrays (no reference counting: emulator/borrow.py)."""
    cyc, meta, args = borrowed(cyc), borrowed(meta), borrowed(args)
    bank_base, bank_lo, mem, valid, tables, f16tab = (borrowed(bank_base), borrowed(bank_lo), borrowed(mem),
                                                      borrowed(valid), borrowed(tables), borrowed(f16tab))
    ring = (borrowed(ring_tag), borrowed(ring_ref), borrowed(ring_pay), mem)
    bank_last, lbuf, lrows, lw_dt, wts32, wnorm, wdt = (borrowed(bank_last), borrowed(lbuf), borrowed(lrows),
                                                        borrowed(lw_dt), borrowed(wts32), borrowed(wnorm), borrowed(wdt))
    busy, acc_bits, acc_kind, acc_ready, tbuf = (borrowed(busy), borrowed(acc_bits), borrowed(acc_kind),
                                                 borrowed(acc_ready), borrowed(tbuf))
    pend_x, pend_meta, pend_n, wcols, wbuf = (borrowed(pend_x), borrowed(pend_meta), borrowed(pend_n),
                                              borrowed(wcols), borrowed(wbuf))
    order = (borrowed(ord_lw), borrowed(ord_acc), borrowed(ord_last))
    act, sa, sb, so, fa, fb, ia, u32, ybuf = (borrowed(act), borrowed(sa), borrowed(sb), borrowed(so), borrowed(fa),
                                              borrowed(fb), borrowed(ia), borrowed(u32), borrowed(ybuf))
    hz, counters = borrowed(hz), borrowed(counters)
    lk_ctl, lk_last, out_link, out_cycle, out_pay = (borrowed(lk_ctl), borrowed(lk_last), borrowed(out_link),
                                                     borrowed(out_cycle), borrowed(out_pay))
    in_arrival, in_pay, in_head, in_tail = borrowed(in_arrival), borrowed(in_pay), borrowed(in_head), borrowed(in_tail)
    f32v = u32.view(np.float32)
    n = cyc.shape[0]
    for i in range(start, n):
        if i & 7 == 0 and i + STREAM_AHEAD < n:     # the instruction columns, 8 instructions at a time
            f = i + STREAM_AHEAD
            prefetch(cyc, f, 64)
            prefetch(meta, f, 64)
            prefetch(args, f * args.shape[1], 8 * 8 * args.shape[1])
        j = i + PREFETCH_AHEAD      # the SRAM row of a MEM instruction a few ahead is asked for now
        mj = meta[j] if j < n else 0   # (and its stream slot's fields, and its row's valid flag)
        if j < n and (mj >> M_UNIT) & M_MASK == U_MEM:
            bank, addr, sl, opj = args[j, 0], args[j, 1], (mj >> M_UIDX) & M_MASK, mj & M_MASK
            if bank >= 0 and bank < bank_base.shape[1] and addr >= 0 and addr < naddr:
                row = bank_base[sl, bank] + addr - bank_lo[sl, bank]
                prefetch_row(mem, row)
                prefetch(valid, row, 1)
            ref = args[j, 2]
            if ref_ok(ref, 1, spd):
                c = cyc[j] + ((mj >> M_LAT) & M_MASK) if opj == C_READ or opj == C_READ_REF else cyc[j]
                d, s, _, slot = diagonal(ref, (mj >> M_UPOS) & M_MASK, c, ring_tag.shape[2])
                slot += (d * spd + s) * ring_tag.shape[2]
                prefetch(ring[0], slot, 1)
                prefetch(ring[1], slot, 1)
                if opj == C_WRITE:
                    prefetch(ring[2], slot * lanes, lanes)
        t, mi, a = cyc[i], meta[i], args[i]
        op, u, ui, p, li = (mi & M_MASK, (mi >> M_UNIT) & M_MASK, (mi >> M_UIDX) & M_MASK, (mi >> M_UPOS) & M_MASK,
                            (mi >> M_LAT) & M_MASK)
        if u == U_MEM:
            ok = mem_exec(op, a, ui, p, t, i, li, spd, naddr, mem, valid, bank_base, bank_lo, bank_last,
                          ring, sa, sb, hz, counters)
        elif u == U_MXM and op == C_LW:
            ok = lw_exec(a, ui, p, t, i, lanes, spd, ring, lbuf, lrows, lw_dt, order[0], sa, hz)
        elif u == U_MXM and op == C_ABC:
            ok = abc_exec(a, ui, p, t, i, li, lanes, spd, acc_rows, pair_cycles, ring, lbuf, lrows, wts32, wnorm,
                          wcols, wbuf, wdt, busy, acc_bits, acc_kind, acc_ready, order[1], order[2], sa, pend_x, pend_meta,
                          pend_n, ybuf, act, bulk, hz, counters)
        elif u == U_MXM:
            ok = mxm_exec(op, a, ui, p, t, i, li, lanes, spd, acc_rows, ring, lbuf, lrows, lw_dt, wts32,
                          wnorm, wcols, wbuf, wdt, busy, acc_bits, acc_kind, acc_ready, order, so, pend_x,
                          pend_meta, pend_n, ybuf, act, bulk, hz)
        elif u == U_VXM:
            ok = vxm_exec(op, a, p, t, i, li, lanes, spd, ring, f16tab,
                          sa, sb, so, fa, fb, ia, u32, f32v, hz, counters)
        elif u == U_C2C:
            if lk_ctl[L_ON] == 0:
                hz[0] = H_C2C
                return i
            ok = c2c_exec(op, a[0], ui, p, t, i, spd, ring, lk_ctl, lk_last, out_link, out_cycle, out_pay,
                          in_arrival, in_pay, in_head, in_tail, sa, hz)
        else:
            ok = sxm_exec(op, a, ui, p, t, i, li, lanes, spd, tables, ring, tbuf, hz, counters)
        if not ok:
            if hz[0] == H_FLUSH or hz[0] == H_C2C:
                return i
            if hz[0] == H_UNREAD:      # reported at the writer of the value nobody read
                hz[1], hz[2] = hz[6], cyc[hz[6]]
            else:
                hz[1], hz[2] = i, t
            return i
    if not first_unread(ring, hz) or not order_done(order, hz):
        hz[1], hz[2] = hz[6], cyc[hz[6]]
    return cyc.shape[0]
