"""Running a `Program`: load tensors into emulated SRAM, expand and order the instructions, call
the jitted core, raise hazards as `HazardError`, read the outputs back.

There are no stalls on this machine, so every instruction's issue cycle is known statically:
each queue issues from cycle 0, one instruction per cycle, except `NOP n` (n cycles), `SYNC` and
`NOTIFY` (zero-time markers) and `REPEAT n d` (the previous instruction again at +d, +2d, ...,
+nd with its addr/row/acc field +1 each time; the queue goes on one cycle after the last). The
expanded instructions, sorted by (cycle, phase, queue, index), are executed in that order, which
is also the order of the trace.

cycles = max over executed instructions of (issue + latency) + 1 + icu_skew (0 if none).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from lpu.emulator import blas, core, hugemem, mxm, prepare_core, sram_core
from lpu.emulator.core_links import NO_LINKS
from lpu.emulator.prepare import Prepared, prepare
from lpu.isa import opcodes as O
from lpu.isa.dtypes import NP_DTYPE
from lpu.isa.errors import LpuError
from lpu.isa.machine import UNIT_ICU, UNIT_MXM, UNIT_NAMES
from lpu.isa.program import Program, Symbol, vector_grid

PHASE = np.array([s.phase for s in O.OPS], np.int32)
OP_UNIT = np.array([s.unit for s in O.OPS], np.int32)
OP_ROLE = np.array([s.role for s in O.OPS], np.int32)
REPEAT_FIELD = np.array(O.REPEAT_FIELD, np.int32)
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

MAX_EXECUTED = 1 << 31     # executed instructions a run can hold (src is int32)
DENSE_SLACK, DENSE_MIN = 8, 1 << 22     # schedule(): a counting sort over cycles unless they are mostly empty

HAZARD_TEXT = {
    core.H_STREAM_EMPTY: "stream read with no valid value",
    core.H_TWO_WRITERS: "two writers on one stream position",
    core.H_BANK: "two accesses to one bank in a cycle",
    core.H_ADDR: "address out of range",
    core.H_BUSY: "unit issued twice",
    core.H_NOT_READY: "operand not ready",
    core.H_DTYPE: "dtype mismatch",
    core.H_OPERAND: "invalid operand",
    core.H_SRAM_EMPTY: "SRAM read of an address that holds no value",
    core.H_SRAM_CLOBBERED: "SRAM read of a loaded tensor's address",
    core.H_UNREAD: "value put on a stream that nothing reads",
    core.H_INSTALL: "weights installed as another type than loaded",
    core.H_ORDER: "MXM weight or accumulator used out of order:",
}
ORDER_TEXT = {
    core.ORD_RELOAD: "weight buffer row {row} of plane {plane} is loaded again before it was installed",
    core.ORD_STALE: "the IW installs stale weights: buffer row {row} of plane {plane} was not loaded since the "
                    "previous IW",
    core.ORD_RESET_UNREAD: "accumulator row {row} of plane {plane} is reset before its result was read (ACC)",
    core.ORD_ACCUM_READ: "accumulates onto accumulator row {row} of plane {plane}, already read out and not reset",
    core.ORD_ACC_EMPTY: "reads accumulator row {row} of plane {plane}, which no ABC wrote",
    core.ORD_NOT_INSTALLED: "weight buffer row {row} of plane {plane} is loaded but no later IW installs it",
    core.ORD_NEVER_READ: "the result in accumulator row {row} of plane {plane} is never read",
}


class HazardError(LpuError):
    """The program broke the machine's timing or resource rules at run time."""

    def __init__(self, message, cycle, queue, index, opcode, line, kind, expected):
        super().__init__(message, cycle=cycle, queue=queue, index=index, opcode=opcode, line=line,
                         kind=kind, expected=expected)
        self.cycle, self.queue, self.index, self.opcode = cycle, queue, index, opcode
        self.line, self.kind, self.expected = line, kind, expected


@dataclass
class Trace:
    """One record per executed instruction, in execution order."""
    cycle: np.ndarray    # int64: issue cycle
    index: np.ndarray    # int32: instruction index in the program arrays
    repeat: np.ndarray   # int32: 0, or which repetition of a REPEAT it was


@dataclass
class RunResult:
    outputs: dict
    states: dict
    cycles: int
    instructions: int
    counters: dict
    utilization: dict
    trace: Trace | None = None


@dataclass
class Schedule:
    """The expanded instructions, sorted in execution order."""
    cycle: np.ndarray
    src: np.ndarray
    repeat: np.ndarray
    queue: np.ndarray
    op: np.ndarray       # opcode
    args: np.ndarray
    latency: np.ndarray

    @functools.cached_property
    def cycles(self) -> int:
        """(Kept: a pass over every executed instruction, 47 ms a run of bert_base's 12 layers.)"""
        return 0 if not len(self.cycle) else int((self.cycle + self.latency).max()) + 1

    def queue_counts(self, nq: int) -> np.ndarray:
        """Executed instructions per queue (a copy of the kept count)."""
        if "_queue_counts" not in self.__dict__:
            self.__dict__["_queue_counts"] = np.bincount(self.queue, minlength=nq)
        return self.__dict__["_queue_counts"].copy()


def _structure_error(program: Program, i: int, what: str) -> LpuError:
    name = program.machine.queues[program.queue[i]][0] if 0 <= program.queue[i] < len(program.machine.queues) else "?"
    op = O.OPS[program.op[i]].name if 0 <= program.op[i] < len(O.OPS) else str(program.op[i])
    return LpuError(f"bad program: instruction {i} ({op} on queue {name}): {what}")


def schedule(program: Program) -> Schedule:
    """Issue cycle of every instruction, REPEATs expanded, sorted by (cycle, phase, queue, index)
    (emulator/prepare_core.py: numpy's lexsort of five keys over every executed instruction took
    seconds on a 12-layer program)."""
    m = program.machine
    queue, op, args = np.asarray(program.queue), np.asarray(program.op), np.asarray(program.args)
    n = len(op)
    nq = len(m.queues)
    bad = np.flatnonzero((op < 0) | (op >= len(O.OPS)) | (queue < 0) | (queue >= nq))
    if len(bad):
        raise _structure_error(program, bad[0], "unknown opcode or queue")
    if n and np.any(queue[1:] < queue[:-1]):
        raise _structure_error(program, int(np.flatnonzero(queue[1:] < queue[:-1])[0]) + 1, "queues out of order")
    qunit = np.array([q[1] for q in m.queues], np.int32)
    qrole = np.array([q[3] for q in m.queues], np.int32)
    unit = OP_UNIT[op]
    bad = np.flatnonzero((unit != UNIT_ICU) & ((unit != qunit[queue]) | ((unit == UNIT_MXM) & (OP_ROLE[op] != qrole[queue]))))
    if len(bad):
        raise _structure_error(program, bad[0], f"a {UNIT_NAMES[unit[bad[0]]]} instruction cannot issue on this "
                                                f"{UNIT_NAMES[qunit[queue[bad[0]]]]} queue")
    first = np.ones(n, bool)
    first[1:] = queue[1:] != queue[:-1]
    a0, a1 = args[:, 0].astype(np.int64), args[:, 1].astype(np.int64)
    is_rep, is_nop = op == O.REPEAT, op == O.NOP
    for cond, what in (((op == O.SYNC) & ~first, "SYNC must be the first instruction of its queue"),
                       (is_nop & (a0 < 0), "NOP count must be >= 0"),
                       (is_rep & ((a0 < 0) | (a1 < 1)), "REPEAT needs n >= 0 and d >= 1"),
                       (is_rep & (first | (OP_UNIT[np.roll(op, 1)] == UNIT_ICU)),
                        "REPEAT must follow a unit instruction of its queue")):
        if np.any(cond):
            raise _structure_error(program, int(np.flatnonzero(cond)[0]), what)
    if np.any(op == O.SYNC) and not np.any((op == O.NOTIFY) & (queue == 0)):
        raise LpuError("bad program: a queue waits in SYNC but the ICU queue has no NOTIFY")
    dur = np.where(is_nop, a0, np.where(is_rep, a0 * a1, np.where((op == O.SYNC) | (op == O.NOTIFY), 0, 1)))
    ends = np.cumsum(dur)
    issue = ends - dur
    starts = np.flatnonzero(first)
    issue -= np.repeat(issue[starts], np.diff(np.append(starts, n)))
    is_unit = OP_UNIT != UNIT_ICU
    nphase = int(PHASE.max()) + 1
    span = int((issue + dur).max()) + 1 if n else 1
    total = int(np.count_nonzero(is_unit[op] & ~is_rep)) + int(a0[is_rep].sum())
    if total > MAX_EXECUTED:
        raise LpuError(f"bad program: it executes {total:,} instructions (REPEATs expanded), more than the emulator "
                       f"holds ({MAX_EXECUTED:,})")
    dense = span * nphase <= DENSE_SLACK * total + DENSE_MIN     # the counting sort's table is worth its size
    try:
        at = (prepare_core.places(queue, op, args, issue, is_unit, O.REPEAT, PHASE, span) if dense
              else np.zeros(1, np.int64))
        nf = args.shape[1]
        s = Schedule(*(np.empty(shape, dt) for shape, dt in (
            (total, np.int64), (total, np.int32), (total, np.int32), (total, np.int32), (total, np.int32),
            ((total, nf), np.int64), (total, np.int64))))
    except MemoryError:
        raise LpuError(f"bad program: its {total:,} executed instructions over {span:,} cycles do not fit in this "
                       f"machine's memory") from None
    prepare_core.expand(queue, op, args, issue, is_unit, O.REPEAT, PHASE, REPEAT_FIELD,
                        np.array(O.latency_table(m), np.int64), at, dense, s.cycle, s.src, s.repeat, s.queue, s.op,
                        s.args, s.latency)
    if not dense:       # a few instructions over many cycles: sort them (stable: the visit order breaks ties)
        order = np.argsort(s.cycle * nphase + PHASE[s.op], kind="stable")
        s = Schedule(*(a[order] for a in (s.cycle, s.src, s.repeat, s.queue, s.op, s.args, s.latency)))
    return s


# ---- SRAM images of tensors ---------------------------------------------------------------------
def _to_bits(dtype: str, arr: np.ndarray) -> np.ndarray:
    """Tensor values -> little-endian bytes [..., width] (bf16: rounded to nearest even)."""
    if dtype == "bf16":
        u = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        bits[nan] = (u[nan] >> 16) | 0x40
        arr = bits.astype("<u2")
    else:
        arr = arr.astype(np.dtype(NP_DTYPE[dtype]).newbyteorder("<"), copy=False)
    return np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape + (-1,))


def _store(mem: np.ndarray, rows: np.ndarray, sym: Symbol, arr: np.ndarray, m):
    """A tensor's bits into its rows. A strided part of a tensor (a tensor-parallel rank's
    columns) is read in place, not copied first: only bf16 converts."""
    nrow, chunks, cols = vector_grid(tuple(sym.shape), m.lanes)
    uint = np.dtype(f"u{sym.width}").newbyteorder("<")
    if sym.dtype == "bf16":
        bits = _to_bits(sym.dtype, arr.reshape(nrow, cols)).view(uint).reshape(nrow, cols)
    else:
        bits = arr.reshape(nrow, cols).astype(np.dtype(NP_DTYPE[sym.dtype]).newbyteorder("<"), copy=False).view(uint)
    sram_core.store(mem, rows, bits.astype(f"u{sym.width}", copy=False), chunks, sym.width)


def _fetch(mem: np.ndarray, rows: np.ndarray, sym: Symbol, m) -> np.ndarray:
    nrow, chunks, cols = vector_grid(tuple(sym.shape), m.lanes)
    bits = np.empty((nrow, cols), f"u{sym.width}")
    sram_core.fetch(mem, rows, bits, chunks)
    if sym.dtype == "bf16":
        vals = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        vals = bits.view(np.dtype(NP_DTYPE[sym.dtype]))
    return vals.astype(NP_DTYPE[sym.dtype], copy=False).reshape(tuple(sym.shape))


def load(program: Program, values: dict, prep: Prepared | None = None, huge: bool = True,
         keep: frozenset = frozenset()) -> np.ndarray:
    """The compact SRAM image uint8[rows, lanes] (emulator/prepare.py), cleared, holding every
    input, weight, state and constant tensor of the program at its place. The array is the
    prepared program's own (kept between runs, so a run pays no page faults for it): a program
    is run by one thread at a time. huge: on huge pages (hugemem; a system's chips pass False:
    eight images of a tensor-parallel llama2_7b_decode L=2 in one process, a third of their rows
    never written, took 4.9-7.4 s a run on huge pages against 3.9-4.5 s, peak RSS 1.79 against
    1.52 GB, where one chip's bert_base L=1 runs 5-10% faster on them). keep: tensors the image
    still holds (run's `resident`): each may be left out of `values`, and is then not written."""
    m = program.machine
    prep = prep or prepare(program, schedule)
    if prep.mem is None:
        prep.mem = (hugemem.zeros if huge else np.zeros)((max(prep.nrows, 1), m.lanes), np.uint8)
    else:
        sram_core.clear(prep.mem, prep.unloaded_rows)    # the loaded tensors' rows are all written below
    mem = prep.mem
    prep.last_valid, prep.runs = None, prep.runs + 1     # the image changes: nothing is resident until a run ends
    wanted = {s.name: s for s in program.symbols if s.kind in ("input", "weight", "state")}
    unknown = sorted(set(values) - set(wanted))
    if unknown:
        raise LpuError(f"unknown tensor(s) {', '.join(unknown)} (the program takes: {', '.join(wanted) or 'none'})")
    missing = [n for n in wanted if n not in values and n not in keep]
    if missing:
        raise LpuError(f"missing value(s) for {', '.join(missing)}")
    for sym in program.symbols:
        if sym.name in keep and sym.name not in values:
            continue
        if sym.kind == "const":
            arr = np.asarray(sym.data)
            if arr.size != int(np.prod(sym.shape, dtype=np.int64)):
                raise LpuError(f"constant '{sym.name}' holds {arr.size} values, its shape {list(sym.shape)} needs "
                               f"{int(np.prod(sym.shape, dtype=np.int64))}")
        elif sym.name in wanted:
            arr = np.asarray(values[sym.name])
            want = np.dtype(NP_DTYPE[sym.dtype])
            if arr.shape != tuple(sym.shape) or arr.dtype != want:
                raise LpuError(f"tensor '{sym.name}': expected {sym.dtype} {list(sym.shape)} ({want}), "
                               f"got {arr.dtype} {list(arr.shape)}")
        else:
            continue
        _store(mem, prep.sym_rows[sym.name], sym, arr.reshape(tuple(sym.shape)), m)
    return mem


# ---- the run ------------------------------------------------------------------------------------
HAZARD_KIND = {core.H_STREAM_EMPTY: "stream-read", core.H_TWO_WRITERS: "two-writers", core.H_BANK: "bank-conflict",
               core.H_ADDR: "address", core.H_BUSY: "unit-busy", core.H_NOT_READY: "not-ready",
               core.H_DTYPE: "dtype", core.H_OPERAND: "operand", core.H_SRAM_EMPTY: "sram-live", core.H_SRAM_CLOBBERED: "sram-live",
               core.H_UNREAD: "stream-unread", core.H_INSTALL: "mxm-order", core.H_ORDER: "mxm-order"}


def _stream_name(d: int, s: int) -> str:
    return ("E" if d == 0 else "W") + str(s)


def _dtype_name(code: int) -> str:
    return O.DTYPES[code] if 0 <= code < len(O.DTYPES) else "none"


def _hazard(program: Program, s: Schedule, hz: np.ndarray) -> HazardError:
    m = program.machine
    kind, i, cycle, x0, x1, x2, x3 = (int(v) for v in hz[:7])
    src = int(s.src[i])
    op = O.OPS[s.op[i]]
    if kind == core.H_STREAM_EMPTY:
        expected = f"a value written on diagonal {x2}"
        detail = f"on {_stream_name(x0, x1)} (expected {expected})"
        if x3 >= 0:
            detail += f"; the value on that diagonal was written downstream, at position {x3}"
    elif kind == core.H_TWO_WRITERS:
        expected = "one value per stream position"
        detail = (f"on {_stream_name(x0, x1)} diagonal {x2} (already written by instruction {int(s.src[x3])}: "
                  f"{O.OPS[s.op[x3]].name} at cycle {int(s.cycle[x3])})")
    elif kind == core.H_BANK:
        expected = "one access per bank per cycle"
        detail = f"on slice {x0} bank {x1}"
    elif kind == core.H_ADDR:
        expected = f"bank < {m.banks_per_slice}, address < {m.addresses_per_bank}"
        detail = f"on slice {x0}: bank {x1} address {x2} (expected {expected})"
    elif kind == core.H_BUSY:
        expected = f"issue at cycle {x1} or later"
        detail = f"on MXM plane {x0}, busy until cycle {x1}"
    elif kind == core.H_NOT_READY:
        expected = f"issue at cycle {x2} or later"
        detail = f"accumulator row {x1} of MXM plane {x0} is ready at cycle {x2}"
    elif kind == core.H_SRAM_CLOBBERED:
        expected = "the loaded input, weight or constant, still live"
        detail = f"on slice {x0} bank {x1} address {x2}, which an earlier WRITE overwrote (expected {expected})"
    elif kind == core.H_SRAM_EMPTY:
        expected = "a WRITE to the address earlier, or a tensor loaded there"
        detail = f"on slice {x0} bank {x1} address {x2} (expected {expected})"
    elif kind == core.H_UNREAD:
        expected = "a reader at or downstream of the writer in the cycle the value passes"
        detail = f"on {_stream_name(x0, x1)} diagonal {x2} (expected {expected})"
    elif kind == core.H_INSTALL:
        expected = _dtype_name(x1)
        detail = f"weight row {x2} was loaded as {_dtype_name(x0)}, the IW installs {expected}"
    elif kind == core.H_ORDER:
        expected = "the MXM protocol: LW rows 0..n-1, IW, ABCs, one ACC per result"
        detail = ORDER_TEXT.get(x0, "reason {plane}").format(plane=x1, row=x2)
    elif kind == core.H_DTYPE:
        expected = _dtype_name(x1)
        detail = f"{_dtype_name(x0)} where the unit holds {expected}"
    else:
        expected = f"a valid '{op.fields[x0][0]}'"
        detail = f"field '{op.fields[x0][0]}' = {x1}"
    line = int(program.line[src])
    text = program.source_line(line)
    where = f"instruction {src}: {op.name}" + (f" repetition {int(s.repeat[i])}" if s.repeat[i] else "")
    if line:
        where += f", DSL line {line}" + (f" '{text}'" if text else "")
    qname = m.queues[s.queue[i]][0]
    return HazardError(f"hazard at cycle {cycle} on {qname} ({where}): {HAZARD_TEXT[kind]} {detail}",
                       cycle, qname, src, op.name, line, HAZARD_KIND[kind], expected)


BULK_WORK = None       # batches of this many multiply-adds or more are multiplied out with BLAS (mxm.flush);
                       # None: by host, blas.bulk_work() (2^24 where the jitted short path has wider vectors than
                       # numpy's BLAS kernel: no tsp-v1 batch, at most 128 x 320 x 320, goes to BLAS; else 2^21)


def _bulk(ws, plane: int) -> None:
    """Multiply out the pending ABCs of `plane` with one BLAS product (mxm.flush asked for it: the
    core has no BLAS of its own, emulator/blas.py), then settle it to the contract's bits
    (mxm.settle; i8: BLAS's float64 sum is exact)."""
    _, _, _, _, _, wts32, wnorm, wdt, _, acc_bits, _, _, _, pend_x, pend_meta, pend_n, _, wcols, _, _ = ws
    n = int(pend_n[plane])
    y = mxm.blas_products(pend_x[plane, :n], wts32[plane], wdt[0, plane], wnorm[plane], wcols[plane])
    mxm.accumulate(acc_bits[plane], pend_meta[plane], n, y)
    pend_n[plane] = 0


def bulk_args(bulk: bool) -> np.ndarray:
    """mxm.flush's `bulk`: (multiply-adds from which a batch goes to BLAS, the core's dgemm or 0);
    (0, 0): every batch on the exact row path."""
    work = BULK_WORK if BULK_WORK is not None else blas.bulk_work()
    return np.array([work, blas.dgemm_address()] if bulk else [0, 0], np.int64)


def _unwritten_output(program: Program, prep, valid: np.ndarray, cycles: int) -> HazardError | None:
    """An output plane slot that the run never wrote (nor loaded): its value would be whatever
    the SRAM held, so it is refused like any other hazard."""
    for y in program.symbols:
        if y.kind != "output":
            continue
        miss = valid[prep.sym_rows[y.name]] == 0
        if miss.any():
            v, b = (int(x[0]) for x in np.nonzero(miss))
            where = f"slice {int(y.slices[v, b])} bank {int(y.banks[v, b])} address {int(y.addrs[v, b])}"
            return HazardError(f"hazard at the end of the run: output '{y.name}': {int(miss.sum())} of {miss.size} "
                               f"plane slots are never written (first: vector {v} byte plane {b}, {where})",
                               cycles, "-", -1, "-", 0, "output", "every output slot written")
    return None


def _cycles_hazard(program: Program, s: Schedule, cycles: int) -> HazardError:
    """The binary's cycle count is not the run's: reported at the instruction of the last result."""
    m = program.machine
    qname, src, opname, line, last = "-", -1, "-", 0, cycles - 1 - m.icu_skew
    where = "no instruction"
    if len(s.cycle):
        i = int(np.argmax(s.cycle + s.latency))
        src, opname, line = int(s.src[i]), O.OPS[s.op[i]].name, int(program.line[s.src[i]])
        qname = m.queues[s.queue[i]][0]
        text = program.source_line(line)
        where = f"instruction {src}: {opname}" + (f", DSL line {line}" + (f" '{text}'" if text else "") if line else "")
    return HazardError(f"hazard at cycle {max(last, 0)} on {qname} ({where}): wrong cycle count: the program says "
                       f"{program.predicted_cycles}, its last result is ready in cycle {last} "
                       f"(+1, +icu_skew {m.icu_skew}: {cycles})", max(last, 0), qname, src, opname, line, "cycles",
                       str(cycles))


def _intact(program: Program, prep: Prepared, valid: np.ndarray) -> frozenset:
    """The tensors SRAM still holds after a run: every state (its rows are what the run returned
    as the state), and each input, weight and constant whose rows no instruction overwrote."""
    clobbered = valid == core.RO_CLOBBERED
    return frozenset(y.name for y in program.symbols if y.kind == "state" or (
        y.kind in ("input", "weight", "const") and not clobbered[prep.sym_rows[y.name]].any()))


class ResidentStates(Mapping):
    """A resident run's states, read from SRAM (and kept) on first access: a decode loop that
    leaves its KV cache on the chip does not copy it out every step. Valid until the program
    runs again; reading one after that is an error, not a newer value."""

    def __init__(self, program: Program, prep: Prepared, symbols: list):
        self._program, self._prep, self._run = program, prep, prep.runs
        self._symbols, self._read = {y.name: y for y in symbols}, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._read:
            y = self._symbols[name]
            if self._prep.runs != self._run:
                raise LpuError(f"state '{name}' of a resident run was not read before the program ran again: "
                               f"read the states you need before the next run")
            self._read[name] = _fetch(self._prep.mem, self._prep.sym_rows[name], y, self._program.machine)
        return self._read[name]

    def __iter__(self):
        return iter(self._symbols)

    def __len__(self) -> int:
        return len(self._symbols)


def run(program: Program, values: dict, trace: bool = False, bulk: bool = True, resident: bool = False) -> RunResult:
    """Run `program` on `values` (every input, weight and state tensor, by name). `bulk=False`
    multiplies every batch of ABCs in the core, in lane order (the same bits; for tests).
    resident: SRAM keeps what the program's previous run left in it, as a chip does between
    decode steps: a tensor left out of `values` is not loaded again, provided that run ended
    without a hazard and no instruction overwrote the tensor's rows (weights and constants as
    loaded; states as that run returned them, updated). The result's states are then read from
    SRAM when asked for, until the program runs again (`ResidentStates`)."""
    m = program.machine
    prep = prepare(program, schedule)
    s = prep.sched
    keep = _intact(program, prep, prep.last_valid) if resident and prep.last_valid is not None else frozenset()
    mem = load(program, values, prep, keep=keep)
    valid = prep.valid0.copy()
    hz = np.zeros(8, np.int64)
    counters = np.zeros(core.N_COUNTERS, np.int64)
    if prep.workspace is None:
        prep.workspace = core.workspace(m.lanes, m.streams_per_direction, prep.ring_size, m.mxm_planes, m.acc_rows,
                                        m.mem_slices, m.banks_per_slice)
    else:
        core.reset(prep.workspace)
    at, flush_args = 0, bulk_args(bulk)
    with blas.one_thread():
        while True:
            at = core.execute(at, s.cycle, prep.meta, s.args,
                              m.lanes, m.streams_per_direction, m.acc_rows, m.f16_pair_cycles,
                              m.addresses_per_bank, prep.bank_base, prep.bank_lo, mem, valid, prep.tables, F16_TO_F32,
                              prep.workspace, NO_LINKS, flush_args, hz, counters)
            if hz[0] == core.H_C2C:
                raise LpuError(f"{program.source_name or 'the program'}: instruction {int(s.src[at])} sends or "
                               f"receives over a chip-to-chip link: it is one chip of a system; run the system "
                               f"(lpu run --chips)")
            if hz[0] != core.H_FLUSH:
                break
            _bulk(prep.workspace, int(hz[3]))
            hz[:] = 0
    if hz[0] != core.H_NONE:
        raise _hazard(program, s, hz)
    cycles = s.cycles + m.icu_skew if len(s.cycle) else 0
    if cycles != program.predicted_cycles:
        raise _cycles_hazard(program, s, cycles)
    unwritten = _unwritten_output(program, prep, valid, cycles)
    if unwritten is not None:
        raise unwritten
    busy = {"mem": int(counters[core.K_BANK_ACCESSES]), "vxm": int(counters[core.K_VXM_BUSY]),
            "mxm": int(counters[core.K_MXM_BUSY]), "sxm": int(counters[core.K_SXM_BUSY])}
    units = {"mem": m.mem_slices * m.banks_per_slice, "vxm": m.vxm_alus, "mxm": m.mxm_planes,
             "sxm": 2 * m.sxm_queues_per_hemisphere}
    counts = dict(busy, macs=int(counters[core.K_MACS]), sram_read_bytes=int(counters[core.K_SRAM_READ]),
                  sram_written_bytes=int(counters[core.K_SRAM_WRITTEN]),
                  queue_instructions=s.queue_counts(len(m.queues)))
    util = {k: (busy[k] / (cycles * units[k]) if cycles else 0.0) for k in ("mxm", "vxm", "mem", "sxm")}
    prep.last_valid = valid
    states = [y for y in program.symbols if y.kind == "state"]
    return RunResult(
        outputs={y.name: _fetch(mem, prep.sym_rows[y.name], y, m) for y in program.symbols if y.kind == "output"},
        states=(ResidentStates(program, prep, states) if resident else
                {y.name: _fetch(mem, prep.sym_rows[y.name], y, m) for y in states}),
        cycles=cycles, instructions=len(s.cycle), counters=counts, utilization=util,
        trace=Trace(s.cycle, s.src, s.repeat) if trace else None)
