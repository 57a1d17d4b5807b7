"""The independent schedule checker: `verify(program) -> list[Violation]`.

It reads a compiled `Program` (the binary alone: instruction columns, symbols, machine config)
and re-derives everything it needs from the opcode table and the machine description, without
the scheduler's state (compiler/schedule.py) or the emulator (emulator/): issue cycles per queue
from NOP/REPEAT/SYNC/NOTIFY, positions from the floorplan, stream diagonals from latencies. It
proves, for every instruction and every repetition of a REPEAT:

  structure       valid opcodes and queues, queues in order, an op only on a queue of its unit
  operand         stream refs, banks, addresses, rows and dtypes in range
  queue           no queue issues two instructions in a cycle
  unit-busy       no MXM plane does two things at once (an f16 ABC holds its plane pair)
  bank-conflict   no MEM bank takes two accesses in a cycle
  two-writers     one value per (direction, stream, diagonal): no stream position carries two
  stream-empty    every stream operand finds, on its diagonal, a value written at or upstream
                  of the reader: it arrives in exactly the cycle it is read
  stream-unread   every value put on a stream is read by someone
  sram-live       an SRAM plane slot is read only after it holds a value (a WRITE, or a symbol
                  loaded before cycle 0); no WRITE falls between two reads of a slot by one IR
                  node (the reads of one value) by another node; an input/weight/const slot is not written
                  before its last read
  mxm-order       LW rows are installed by a later IW (and loaded once per install), ABC
                  finds installed weights of its dtype, an accumulator row is read (ACC) after
                  its last ABC is done and before it is reset, TPIN rows are read out (TPOUT)
                  before they are overwritten
  output          every output plane slot is written (unless it aliases a loaded symbol)
  cycles          the program's predicted cycle count matches its last result + 1 + icu_skew

Timing model (isa/opcodes.py): an instruction issued at cycle t reads its stream operands at its
queue's position p in cycle t and puts its result at p in cycle t + latency; a value on an
eastward stream at p in cycle c lies on diagonal k = c - p (westward: c + p). Within a cycle,
phase-0 instructions act before phase-1 ones. GATHER and SCATTER address SRAM through a
run-time index: their bank use is checked, their slot liveness cannot be (the compiler emits
neither).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass

import numpy as np

from lpu.compiler.verify_units import check_mxm, check_transposes
from lpu.isa import opcodes as O
from lpu.isa.machine import UNIT_ICU, UNIT_MEM, UNIT_MXM
from lpu.isa.program import Program
from lpu.isa.validate import operand_problems, program_problems

KINDS = ("structure", "operand", "queue", "unit-busy", "bank-conflict", "two-writers", "stream-empty",
         "stream-unread", "sram-live", "mxm-order", "output", "cycles")
WIDTH = np.array(O.DTYPE_WIDTH, np.int64)
PHASE = np.array([s.phase for s in O.OPS], np.int64)
UNIT = np.array([s.unit for s in O.OPS], np.int64)
ROLE = np.array([s.role for s in O.OPS], np.int64)
BUMP = np.array(O.REPEAT_FIELD, np.int64)
MEMOPS = (O.READ, O.WRITE, O.GATHER, O.SCATTER)
BINARY = frozenset(O.VXM_BINARY.values())


def _stream_fields(spec) -> tuple[tuple, int]:
    """(fields read from streams, field written to a stream or -1) of an opcode."""
    refs = [i for i, (_, kind) in enumerate(spec.fields) if kind == "ref"]
    outs = [i for i in refs if spec.fields[i][0] == "out"]
    return tuple(i for i in refs if i not in outs), (outs[0] if outs else -1)


STREAM_FIELDS = [_stream_fields(s) for s in O.OPS]


@dataclass
class Violation:
    kind: str
    cycle: int
    queue: str
    index: int       # instruction index in the program's columns (-1: not one instruction)
    opcode: str
    line: int        # DSL source line (0: none)
    message: str
    source: str = ""  # the DSL source line's text

    def __str__(self):
        where = f"cycle {self.cycle} {self.queue} #{self.index} {self.opcode}" if self.index >= 0 else "program"
        src = f" (line {self.line}: {self.source})" if self.line else ""
        return f"{self.kind}: {where}{src}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


class _Expanded:
    """Every issued instruction (REPEATs expanded), in execution order (cycle, phase, queue, index)."""

    def __init__(self, p: Program):
        m = p.machine
        op, q, args = p.op.astype(np.int64), p.queue.astype(np.int64), p.args.astype(np.int64)
        n = len(op)
        first = np.ones(n, bool)
        first[1:] = q[1:] != q[:-1]
        is_nop, is_rep = op == O.NOP, op == O.REPEAT
        dur = np.where(is_nop, args[:, 0], np.where(is_rep, args[:, 0] * args[:, 1],
                                                      np.where(UNIT[op] == UNIT_ICU, 0, 1)))
        end = np.cumsum(dur)
        issue = end - dur
        starts = np.flatnonzero(first)
        issue -= np.repeat(issue[starts], np.diff(np.append(starts, n)))
        base = np.flatnonzero(UNIT[op] != UNIT_ICU)
        reps = np.flatnonzero(is_rep)
        cnt = args[reps, 0]
        rep_of = np.repeat(reps, cnt)
        j = np.arange(len(rep_of)) - np.repeat(np.cumsum(cnt) - cnt, cnt) + 1
        src = np.concatenate([base, rep_of - 1])
        rep = np.concatenate([np.zeros(len(base), np.int64), j])
        cyc = issue[src] + rep * np.concatenate([np.zeros(len(base), np.int64), args[rep_of, 1]])
        eargs = args[src].copy()
        f = BUMP[op[src]]
        has = np.flatnonzero(f >= 0)
        eargs[has, f[has]] += rep[has]
        order = np.lexsort((rep, src, q[src], PHASE[op[src]], cyc))
        self.src, self.rep, self.cycle, self.args = src[order], rep[order], cyc[order], eargs[order]
        self.op, self.queue = op[self.src], q[self.src]
        self.phase = PHASE[self.op]
        self.pos = np.array([x[4] for x in m.queues], np.int64)[self.queue]
        self.unit = np.array([x[2] for x in m.queues], np.int64)[self.queue]
        self.lat = np.array(O.latency_table(m), np.int64)[self.op]


class Checker:
    def __init__(self, program: Program, limit: int = 1000):
        self.p, self.m, self.limit = program, program.machine, limit
        self.out: list[Violation] = []

    # ---- reporting ---------------------------------------------------------------------------
    def add(self, kind, i, message, e=None):
        """A violation at expanded instruction i (or program instruction i if e is None)."""
        if len(self.out) >= self.limit:
            return
        if i is None or i < 0:
            self.out.append(Violation(kind, -1, "", -1, "", 0, message))
            return
        if e is not None:
            src, cyc = int(e.src[i]), int(e.cycle[i])
            if e.rep[i]:
                message = f"(repetition {int(e.rep[i])}) {message}"
        else:
            src, cyc = int(i), -1
        q = int(self.p.queue[src])
        qn = self.m.queues[q][0] if 0 <= q < len(self.m.queues) else str(q)
        opc = int(self.p.op[src])
        name = O.OPS[opc].name if 0 <= opc < len(O.OPS) else str(opc)
        line = int(self.p.line[src])
        self.out.append(Violation(kind, cyc, qn, src, name, line, message, self.p.source_line(line)))

    def few(self, items):
        """The first of `items` that can still be reported (at most `limit` violations in all):
        a broken program can have millions, and each report costs Python time."""
        return itertools.islice(items, max(self.limit - len(self.out), 0))

    def describe(self, e, i) -> str:
        return f"#{int(e.src[i])} {O.OPS[int(e.op[i])].name} on {self.m.queues[int(e.queue[i])][0]} at cycle {int(e.cycle[i])}"

    # ---- passes ------------------------------------------------------------------------------
    def structure(self) -> bool:
        p, m = self.p, self.m
        op, q, args = p.op.astype(np.int64), p.queue.astype(np.int64), p.args.astype(np.int64)
        n = len(op)
        nq = len(m.queues)
        bad = (op < 0) | (op >= len(O.OPS)) | (q < 0) | (q >= nq)
        for i in np.flatnonzero(bad)[:20]:
            self.add("structure", int(i), "unknown opcode or queue")
        if bad.any():
            return False
        qunit = np.array([x[1] for x in m.queues], np.int64)[q]
        qrole = np.array([x[3] for x in m.queues], np.int64)[q]
        first = np.ones(n, bool)
        first[1:] = q[1:] != q[:-1]
        prev_op = np.roll(op, 1)
        checks = (
            (np.append(False, np.diff(q) < 0), "queues out of order (the columns must be grouped by queue)"),
            ((UNIT[op] != UNIT_ICU) & (UNIT[op] != qunit), "instruction on a queue of another unit"),
            ((UNIT[op] == UNIT_MXM) & (qunit == UNIT_MXM) & (ROLE[op] != qrole), "MXM instruction on the wrong queue role"),
            ((op == O.SYNC) & ~first, "SYNC is not the first instruction of its queue"),
            ((op == O.NOP) & (args[:, 0] < 0), "NOP count < 0"),
            ((op == O.REPEAT) & ((args[:, 0] < 0) | (args[:, 1] < 1)), "REPEAT needs n >= 0 and d >= 1"),
            ((op == O.REPEAT) & (first | (UNIT[prev_op] == UNIT_ICU)), "REPEAT does not follow a unit instruction"),
        )
        ok = True
        for mask, what in checks:
            for i in np.flatnonzero(mask)[:20]:
                self.add("structure", int(i), what)
            ok &= not mask.any()
        if np.any(op == O.SYNC) and not np.any((op == O.NOTIFY) & (q == 0)):
            self.add("structure", None, "queues wait in SYNC but the ICU queue has no NOTIFY")
        if not ok:
            return False
        # what the emulator cannot run (symbol layouts and shapes, constants, tables) or that
        # would be too large to expand: reported here, before the expansion
        problems = program_problems(p)
        for i, what in problems:
            self.add("structure", i, what)
        for i, what in operand_problems(p):
            self.add("operand", i, what)
        return not problems

    def queues(self, e):
        key = e.queue * (1 << 40) + e.cycle
        order = np.argsort(key, kind="stable")
        dup = np.flatnonzero(key[order][1:] == key[order][:-1])
        for d in self.few(dup):
            a, b = order[d], order[d + 1]
            self.add("queue", int(b), f"queue already issued {self.describe(e, a)} in this cycle", e)

    def streams(self, e):
        m = self.m
        spd = m.streams_per_direction
        reads, writes = [], []      # (event index, ref, width)
        for code in np.unique(e.op):
            spec = O.OPS[int(code)]
            sel = np.flatnonzero(e.op == code)
            rfields, wfield = STREAM_FIELDS[int(code)]
            for f in rfields:
                s = sel
                if int(code) in BINARY:  # bimm 1: b is imm; bimm 2: a is imm
                    bimm = e.args[sel, 5]
                    s = sel[bimm != (2 if spec.fields[f][0] == "a" else 1)]
                reads.append((s, e.args[s, f]))
            if wfield >= 0:
                writes.append((sel, e.args[sel, wfield]))
        r_ev, r_dir, r_s, r_k = self._planes(e, reads, spd, is_write=False)
        w_ev, w_dir, w_s, w_k = self._planes(e, writes, spd, is_write=True)
        lane_r = r_dir * spd + r_s
        lane_w = w_dir * spd + w_s
        SH = 1 << 40
        wkey = lane_w * SH + (w_k + (SH >> 1))
        rkey = lane_r * SH + (r_k + (SH >> 1))
        order = np.lexsort((w_ev, wkey))
        wk_s, wev_s = wkey[order], w_ev[order]
        dup = np.flatnonzero(wk_s[1:] == wk_s[:-1])
        for d in self.few(dup):
            a, b = wev_s[d], wev_s[d + 1]
            k = int(w_k[order][d + 1])
            self.add("two-writers", int(b), f"{self._sname(w_dir[order][d + 1], w_s[order][d + 1])} diagonal {k} "
                     f"already carries the value of {self.describe(e, a)}", e)
        idx = np.searchsorted(wk_s, rkey)
        idx_c = np.minimum(idx, max(len(wk_s) - 1, 0))
        found = (idx < len(wk_s)) & (wk_s[idx_c] == rkey) if len(wk_s) else np.zeros(len(rkey), bool)
        wpos = e.pos[wev_s[idx_c]] if len(wk_s) else np.zeros(len(rkey), np.int64)
        rpos = e.pos[r_ev]
        upstream = np.where(r_dir == 0, wpos <= rpos, wpos >= rpos)
        bad = np.flatnonzero(~(found & upstream))
        for i in self.few(bad):
            ev = int(r_ev[i])
            name = self._sname(r_dir[i], r_s[i])
            if found[i]:
                msg = (f"reads {name} diagonal {int(r_k[i])} at position {int(rpos[i])}, but its value is written "
                       f"downstream, at position {int(wpos[i])}, by {self.describe(e, wev_s[idx_c[i]])}")
            else:
                msg = f"reads {name} at position {int(rpos[i])}, where no value passes in this cycle"
                lo, hi = np.searchsorted(wk_s, [rkey[i] - 3, rkey[i] + 4])
                near = [(abs(int(wk_s[j] - rkey[i])), int(wk_s[j] - rkey[i]), int(wev_s[j])) for j in range(lo, hi)]
                if near:
                    _, dk, w = min(near)
                    msg += (f" (the nearest value on it, from {self.describe(e, w)}, passes here "
                            f"{abs(dk)} cycle{'s' if abs(dk) > 1 else ''} {'late' if dk > 0 else 'early'})")
            self.add("stream-empty", ev, msg, e)
        unread = np.flatnonzero(~np.isin(wk_s, rkey))
        for j in self.few(unread):
            self.add("stream-unread", int(wev_s[j]), f"its value on {self._sname(w_dir[order][j], w_s[order][j])} "
                     f"diagonal {int(w_k[order][j])} is never read", e)

    def _planes(self, e, parts, spd, is_write):
        """Expand (events, refs) into byte planes: (event, dir, stream, diagonal); bad refs reported."""
        evs, dirs, strs, ks = [], [], [], []
        for sel, ref in parts:
            dt, d, s = ref >> 8, (ref >> 6) & 3, ref & 63
            mem = np.isin(e.op[sel], MEMOPS)
            acc = e.op[sel] == O.ACC
            ok = (ref >= 0) & (dt < len(O.DTYPES)) & (d <= 1)
            w = np.where(mem, 1, np.where(acc, 4, WIDTH[np.clip(dt, 0, len(WIDTH) - 1)]))
            ok &= s + w <= spd
            ok &= ~acc | (dt == O.DT_I32) | (dt == O.DT_F32)
            for i in self.few(np.flatnonzero(~ok)):
                self.add("operand", int(sel[i]), f"invalid stream operand {int(ref[i])}", e)
            sel, d, s, w = sel[ok], d[ok], s[ok], w[ok]
            c = e.cycle[sel] + (e.lat[sel] if is_write else 0)
            k = np.where(d == 0, c - e.pos[sel], c + e.pos[sel])
            rep = np.repeat(np.arange(len(sel)), w)
            b = np.arange(len(rep)) - np.repeat(np.cumsum(w) - w, w)
            evs.append(sel[rep]), dirs.append(d[rep]), strs.append(s[rep] + b), ks.append(k[rep])
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
        return cat(evs), cat(dirs), cat(strs), cat(ks)

    @staticmethod
    def _sname(d, s) -> str:
        return ("E" if int(d) == 0 else "W") + str(int(s))

    def banks(self, e):
        m = self.m
        sel = np.flatnonzero(UNIT[e.op] == UNIT_MEM)
        bank, addr = e.args[sel, 0], e.args[sel, 1]
        ok = (bank >= 0) & (bank < m.banks_per_slice) & (addr >= 0) & (addr < m.addresses_per_bank)
        for i in self.few(np.flatnonzero(~ok)):
            self.add("operand", int(sel[i]), f"bank {int(bank[i])} address {int(addr[i])} out of range "
                     f"(banks < {m.banks_per_slice}, addresses < {m.addresses_per_bank})", e)
        sel, bank, addr = sel[ok], bank[ok], addr[ok]
        gb = e.unit[sel] * m.banks_per_slice + bank
        key = gb * (1 << 40) + e.cycle[sel]
        order = np.argsort(key, kind="stable")
        ks = key[order]
        for d in self.few(np.flatnonzero(ks[1:] == ks[:-1])):
            a, b = sel[order[d]], sel[order[d + 1]]
            self.add("bank-conflict", int(b), f"slice {int(e.unit[b])} bank {int(e.args[b, 0])} is already accessed "
                     f"in this cycle by {self.describe(e, a)}", e)
        rw = np.isin(e.op[sel], (O.READ, O.WRITE))
        self.sram(e, sel[rw], gb[rw] * m.addresses_per_bank + addr[rw])

    def symbol_slots(self):
        """Plane slot ids of every symbol, and the kind of each."""
        m = self.m
        out = {}
        for s in self.p.symbols:
            sl = np.asarray(s.slices, np.int64).ravel()
            bk = np.asarray(s.banks, np.int64).ravel()
            ad = np.asarray(s.addrs, np.int64).ravel()
            out.setdefault(s.kind, []).append((sl * m.banks_per_slice + bk) * m.addresses_per_bank + ad)
        return {k: np.unique(np.concatenate(v)) for k, v in out.items()}

    def sram(self, e, ev, slot):
        syms = self.symbol_slots()
        empty = np.zeros(0, np.int64)
        ro = np.concatenate([syms.get(k, empty) for k in ("input", "weight", "const")])
        state = syms.get("state", empty)
        is_ro, is_state = np.isin(slot, ro), np.isin(slot, state)
        loaded = is_ro | is_state
        wr = e.op[ev] == O.WRITE
        order = np.lexsort((ev, slot))   # ev is in execution order already
        ev, slot, wr, loaded, is_ro, is_state = (x[order] for x in (ev, slot, wr, loaded, is_ro, is_state))
        n = len(ev)
        start = np.ones(n, bool)
        start[1:] = slot[1:] != slot[:-1]
        gid = np.cumsum(start) - 1
        gstart = np.flatnonzero(start)
        cw = np.cumsum(wr) - wr
        writes_before = cw - cw[gstart][gid]
        cr = np.cumsum(~wr)
        reads_total = np.add.reduceat(~wr, gstart) if n else empty
        reads_after = reads_total[gid] - (cr - np.concatenate([[0], cr])[gstart][gid])
        for i in self.few(np.flatnonzero(~wr & (writes_before == 0) & ~loaded)):
            self.add("sram-live", int(ev[i]), f"reads {self._slot(slot[i])}, which holds no value yet", e)
        # a value is live from its WRITE through the reads of one consumer: no other WRITE may
        # fall between the first and the last read of a slot by one IR node (a write nobody
        # reads is legal: the compiler stores dead values and chunks no view uses)
        node = self.p.node[e.src[ev]].astype(np.int64)
        r = np.flatnonzero(~wr & (node >= 0))
        if len(r):
            key = slot[r] * (len(self.p.nodes) + 1) + node[r]
            o = np.argsort(key, kind="stable")
            k, pos = key[o], r[o]
            gs = np.flatnonzero(np.append(True, k[1:] != k[:-1]))
            ge = np.append(gs[1:], len(k)) - 1
            cwi = np.cumsum(wr)
            hit = np.flatnonzero(cwi[pos[ge]] - cwi[pos[gs]] > 0)
            wpos = np.flatnonzero(wr)
            for g in self.few(hit):
                a, b = pos[gs[g]], pos[ge[g]]
                between = wpos[np.searchsorted(wpos, a):np.searchsorted(wpos, b)]
                other = between[node[between] != node[a]]     # a node may reuse its own scratch
                if not len(other):
                    continue
                w = other[0]
                self.add("sram-live", int(ev[w]), f"overwrites {self._slot(slot[w])} while it is still read: by "
                         f"{self.describe(e, ev[a])} and again by {self.describe(e, ev[b])} (same IR node)", e)
        for i in self.few(np.flatnonzero(wr & is_ro & (reads_after > 0))):
            self.add("sram-live", int(ev[i]), f"overwrites {self._slot(slot[i])} of a loaded tensor, which is "
                     f"still read later ({int(reads_after[i])} more read{'s' if reads_after[i] > 1 else ''})", e)

    def _slot(self, g) -> str:
        m = self.m
        g = int(g)
        return (f"slice {g // m.addresses_per_bank // m.banks_per_slice} bank "
                f"{g // m.addresses_per_bank % m.banks_per_slice} address {g % m.addresses_per_bank}")

    def outputs(self, e):
        m = self.m
        syms = self.symbol_slots()
        sel = np.flatnonzero(e.op == O.WRITE)
        written = (e.unit[sel] * m.banks_per_slice + e.args[sel, 0]) * m.addresses_per_bank + e.args[sel, 1]
        loaded = np.concatenate([syms.get(k, np.zeros(0, np.int64)) for k in ("input", "weight", "const", "state")])
        for s in self.p.symbols:
            if s.kind != "output":
                continue
            sl = (np.asarray(s.slices, np.int64) * m.banks_per_slice + np.asarray(s.banks)) * m.addresses_per_bank \
                + np.asarray(s.addrs)
            miss = ~np.isin(sl, written) & ~np.isin(sl, loaded)
            if miss.any():
                v, b = (int(x[0]) for x in np.nonzero(miss))
                line = self._decl_line(s.name)
                self.out.append(Violation(
                    "output", -1, "", -1, "", line,
                    f"output '{s.name}': {int(miss.sum())} of {miss.size} plane slots are never written "
                    f"(first: vector {v} byte plane {b}, {self._slot(sl[v, b])})", self.p.source_line(line)))

    def _decl_line(self, name) -> int:
        pat = re.compile(rf"^\s*output\s+{re.escape(name)}\b")
        return next((i + 1 for i, t in enumerate(self.p.source_lines) if pat.match(t)), 0)

    def mxm(self, e):
        check_mxm(self, e)
        check_transposes(self, e)

    def cycles(self, e):
        want = int((e.cycle + e.lat).max()) + 1 + self.m.icu_skew if len(e.cycle) else 0
        if self.p.predicted_cycles != want:
            self.add("cycles", None, f"predicted_cycles is {self.p.predicted_cycles}, but the last result is "
                     f"ready in cycle {want - 1 - self.m.icu_skew} (+1, +icu_skew {self.m.icu_skew}: {want})")

    def run(self) -> list[Violation]:
        if not self.structure():
            return self.out
        e = _Expanded(self.p)
        self.queues(e)
        self.banks(e)
        self.streams(e)
        self.mxm(e)
        self.outputs(e)
        self.cycles(e)
        self.out.sort(key=lambda v: (v.cycle < 0, v.cycle, v.index))
        return self.out


def verify(program: Program, limit: int = 1000) -> list[Violation]:
    """Every violation of the machine's timing and resource rules in `program` (at most `limit`)."""
    return Checker(program, limit).run()


__all__ = ["verify", "Violation", "KINDS"]
