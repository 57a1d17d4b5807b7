"""Pass `schedule`: place chains of instructions on cycles, respecting every timing rule.

There are no interlocks on this machine: a value on a stream passes a position in exactly one
cycle, so a producer and its consumers form a rigid *chain* (chainspec.py) whose instructions
sit at fixed offsets from one anchor cycle T. The scheduler places chains one by one (in
program order) at the earliest T at which

  - every instruction's queue (or one of its alternative queues) is free at T + offset, and so
    are the extra queue cycles it reserves (an f16 product holds a plane pair 2 cycles);
  - every MEM bank it touches is free in that cycle (one access per bank per cycle);
  - every stream group (direction, diagonal T + koff, width w) finds w consecutive streams free
    on its diagonal (one value per stream position);
  - data is ready: an SRAM plane is read only after it was written (RAW), written only after
    the previous occupant's last read and write (WAR, WAW), and unit state is used in order
    (markers: LW after the previous IW, IW after the LWs and the last ABC, ACC after its
    accumulator row is ready, ...).

Chains are buffered and placed in batches by the jitted loop in `place_core` on array
resource tables that grow with the schedule. The result (`Placed`: cycle, queue, opcode,
args, line, node per instruction, in chain order) goes to `codegen`.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import place_core as P
from lpu.compiler import segments as SG
from lpu.compiler.chainspec import Chain, ChainArrays, Flat, Ins, Registry, Rows, encode  # noqa: F401  (Ins: the contract)
from lpu.isa.opcodes import OPS, latency_table

BATCH = 1 << 15     # instructions buffered before a batch is placed
_NO = np.zeros(0, np.int64)
_NO32 = np.zeros(0, np.int32)


class Placed:
    """Placed instructions: cycle, queue, op, args, line, node per instruction, in chain
    order, as the placed batches' arrays (no copy per batch; codegen.by_queue joins them):
    cycle int64, queue, args, line and node int32, op the batch's own column."""

    def __init__(self):
        self.n = 0
        self.parts: list = []

    def add(self, cycle, queue, op, args, line, node):
        self.parts.append([cycle, queue, op, args, line, node])
        self.n += len(cycle)

    def take_parts(self) -> list:
        """The batches as placed ([cycle, queue, op, args, line, node] each); the Placed is
        empty afterwards."""
        parts, self.parts, self.n = self.parts, [], 0
        return parts


class Scheduler:
    # cycles the resource tables start with: np.zeros maps them lazily (calloc), so rows the
    # schedule never reaches cost no memory, and the tables seldom grow (each growth copies them)
    CAP = 1 << 18

    def __init__(self, machine, reg: Registry | None = None):
        self.m = machine
        self.nstreams = machine.streams_per_direction
        self.lat = np.asarray(latency_table(machine), np.int64)
        self.reg = reg if reg is not None else Registry()
        self.cap = self.CAP
        nq = len(machine.queues)
        self.qbusy = np.zeros((self.cap, nq), np.uint8)
        self.bbusy = np.zeros((self.cap, machine.mem_slices * machine.banks_per_slice), np.uint8)
        self.streams = np.zeros((2, self.cap + 2 * P.DIAG0), np.int64)
        nslots = machine.mem_slices * machine.banks_per_slice * machine.addresses_per_bank
        self.slot_w = np.full(nslots, -1, np.int64)
        self.slot_r = np.full(nslots, -1, np.int64)
        self.markers = np.full(0, P.NONE, np.int64)
        self.hints = np.full(0, P.NONE, np.int64)
        # [last issue + latency, busy end, this segment's window: rows lo, hi, stream keys lo, hi, stream end]
        self.state = np.array([-1, 0, *SG.NO_WINDOW, 0], np.int64)
        self.seg: SG.Segment | None = None
        self.placed_again = 0       # chains placed as their twin in the trip before, shifted
        self.pending: list = []
        self.npending = 0
        self.out = Placed()

    def place(self, chain: Chain | Flat | Rows | ChainArrays):
        """Queue a chain (or a Flat, Rows or ChainArrays batch of them, ids from this scheduler's
        registry) for placement; chains are placed in the order given. A ChainArrays batch is
        placed as it is (its args get the stream references): give the scheduler its own."""
        self.pending.append(chain)
        self.npending += len(chain.ins) if isinstance(chain, Chain) else chain.n_ins
        if self.npending >= BATCH:
            self.flush()

    def flush(self):
        if not self.pending:
            return
        chains, self.pending, self.npending = self.pending, [], 0
        run = []
        for ch in chains:
            if isinstance(ch, ChainArrays):
                if run:
                    self._place(encode(run, self.reg))
                    run = []
                self._place(ch)
            else:
                run.append(ch)
        if run:
            self._place(encode(run, self.reg))

    def begin_segment(self, loop: int, trip: int, more: bool = True):
        """The chains from here to the next call are trip `trip` of top-level loop `loop`
        (segments.py: placed as the trip before, shifted, where that is provably the search's
        result); more: whether another trip follows (else no snapshot of the tables is taken
        for it: a pipeline stage's loop of one trip copied its whole tables for nothing)."""
        self.flush()
        prev = self._close_segment()
        twin = prev if prev is not None and (prev.loop, prev.trip) == (loop, trip - 1) else None
        if twin is not None:
            twin.twin = None
        self.seg = SG.Segment(loop, trip, twin)
        self.seg.more = more
        self.state[2:6] = SG.NO_WINDOW

    def _close_segment(self):
        seg, self.seg = self.seg, None
        if seg is not None:
            seg.window = tuple(int(x) for x in self.state[2:6])
        return seg

    def _start_segment(self, seg, a: ChainArrays):
        """Before a segment's first batch: the shift from its twin, whether the tables match the
        twin's, and a snapshot of them for the next trip."""
        e0 = int(P.earliest_of(0, a.ins_ptr, a.hint, a.hint_delta, a.off, a.r_ptr, a.r_data, a.w_ptr, a.w_data,
                               a.a_ptr, a.a_data, self.slot_w, self.slot_r, self.markers, self.hints)) \
            if a.n_chains else 0
        tw = seg.twin
        if tw is not None and tw.batches and tw.batches[0][0].n_chains and tw.window[0] <= tw.window[1]:
            seg.delta = e0 - int(tw.batches[0][1][0])
            seg.again = SG.same_chains(a, tw.batches[0][0]) and SG.tables_match(self, tw, seg.delta)
            lo, hi, klo, khi = tw.window
            first, kfirst = lo + seg.delta - (hi - lo), klo + seg.delta - (khi - klo)
        else:
            seg.again = False
            first, kfirst = e0 - SG.REACH, e0 - SG.REACH + P.DIAG0
        if tw is not None:
            tw.snap = None
        seg.snap = SG.snapshot(self, first, kfirst) if seg.more else None

    def _place(self, a: ChainArrays):
        self.markers = _grown(self.markers, len(self.reg.markers))
        self.hints = _grown(self.hints, len(self.reg.hints))
        qg_ptr, qg_q = self.reg.qgroup_arrays()
        n = a.n_ins
        out_cycle = np.zeros(n, np.int64)
        out_queue = np.zeros(n, np.int32)
        out_e = np.zeros(a.n_chains, np.int64)
        out_sid = np.zeros(len(a.g_dir), np.int64)
        seg = self.seg
        if seg is not None and not seg.batches:
            self._start_segment(seg, a)
        c = 0
        again, tw = False, None
        if seg is not None and seg.again:
            j = len(seg.batches)
            tw = seg.twin.batches[j] if j < len(seg.twin.batches) else None
            again = tw is not None and (j == 0 or SG.same_chains(a, tw[0]))
            seg.again = again
        _, tw_e, tw_cycle, tw_queue, tw_sid = tw if again else (None, _NO, _NO, _NO32, _NO)
        n_again = a.n_chains if again else 0      # chains placed as the twin's (FAR: up to c)
        while c < a.n_chains:
            status, c, need = P.place(
                c, a.ins_ptr, a.grp_ptr, a.hint, a.hint_delta, a.g_dir, a.g_koff, a.g_w,
                a.qg, a.off, a.op, a.bank, a.args, a.p_ptr, a.p_data, a.r_ptr, a.r_data, a.w_ptr, a.w_data,
                a.a_ptr, a.a_data, a.m_ptr, a.m_data, a.e_ptr, a.e_data, qg_ptr, qg_q, self.lat, self.nstreams,
                self.qbusy, self.bbusy, self.streams, self.slot_w, self.slot_r, self.markers, self.hints,
                out_cycle, out_queue, out_e, out_sid, self.state, again, seg.delta if again else 0,
                tw_e, tw_cycle, tw_queue, tw_sid)
            if status == P.OK:
                break
            if status == P.GROW:
                self._grow(need)
                continue
            if status == P.FAR:          # from here on the segment is searched
                again = seg.again = False
                n_again = c
                continue
            line = int(a.line[c])
            names = [OPS[int(o)].name for o in a.op[a.ins_ptr[c]:a.ins_ptr[c + 1]]]
            if status == P.WIDE:
                raise AssertionError(f"scheduler: a chain of DSL line {line} needs {need} streams on one "
                                     f"diagonal, the machine has {self.nstreams}")
            raise AssertionError(f"scheduler: no cycle found for a chain of DSL line {line} ({names})")
        if seg is not None:
            seg.batches.append((a, out_e, out_cycle, out_queue, out_sid))
        self.placed_again += n_again
        counts = np.diff(a.ins_ptr)
        self.out.add(out_cycle, out_queue, a.op, a.args, np.repeat(a.line.astype(np.int32), counts),
                     np.repeat(a.node.astype(np.int32), counts))

    def _grow(self, need: int):
        cap = max(2 * self.cap, need + 1024)
        self.qbusy = _longer(self.qbusy, cap)
        self.bbusy = _longer(self.bbusy, cap)
        self.streams = _widen(self.streams, cap + 2 * P.DIAG0)
        self.cap = cap

    def take_placed(self) -> Placed:
        """Every placed instruction (`.take_parts()` gives the batches); the scheduler's tables are
        released (it cannot place more)."""
        self.flush()
        self.seg = None
        self.qbusy = self.bbusy = self.streams = self.slot_w = self.slot_r = None
        out, self.out = self.out, Placed()
        return out

    def predicted_cycles(self) -> int:
        self.flush()
        last = int(self.state[0])
        if last < 0:
            return 0
        return last + 1 + self.m.icu_skew


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    if len(a) >= n:
        return a
    out = np.full(max(n, 2 * len(a)), P.NONE, np.int64)
    out[:len(a)] = a
    return out


def _longer(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, a.shape[1]), a.dtype)
    out[:a.shape[0]] = a
    return out


def _widen(a: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros((a.shape[0], cols), a.dtype)
    out[:, :a.shape[1]] = a
    return out
