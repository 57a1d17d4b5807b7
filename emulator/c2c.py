"""One chip of a system (emulator/system.py): its program run in windows of cycles, and its
chip-to-chip instructions, which the core hands to the host (core.H_C2C) one at a time.

SEND reads its byte plane from the stream at the link's position in its cycle and puts it in the
chip's outbox with the link and the cycle; it is a hazard if the link is still carrying the
previous vector (less than slot_cycles since the last SEND on that link). RECV takes the oldest
vector delivered to its link; it is a hazard if none has arrived by its cycle (a vector arrives
hop_cycles after its SEND). Its payload goes on the stream at the link's position in its cycle.

`advance(until)` executes every instruction up to the first RECV at cycle `until` or later: a
chip's other instructions (its SENDs too) do not depend on other chips, so it may run past the
window; only what it receives does.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from lpu.emulator import core
from lpu.emulator import run as R
from lpu.emulator.prepare import prepare
from lpu.isa import opcodes as O

H_LINK_EARLY, H_LINK_BUSY, H_LINK_UNREAD = "link-early", "link-busy", "link-unread"


class ChipRun:
    def __init__(self, chip: int, program, values: dict, slot_cycles: int, bulk: bool = True, trace: bool = False):
        m = program.machine
        self.chip, self.program, self.slot, self.trace = chip, program, slot_cycles, trace
        self.prep = prep = prepare(program, R.schedule)
        self.s = prep.sched
        self.mem = R.load(program, values, prep)
        self.valid = np.zeros(len(self.mem), np.uint8)
        self.valid[prep.loaded_rows] = 1
        for y in program.symbols:
            if y.kind in ("input", "weight", "const"):
                self.valid[prep.sym_rows[y.name]] = core.RO_LOADED
        self.hz = np.zeros(8, np.int64)
        self.counters = np.zeros(core.N_COUNTERS, np.int64)
        if prep.workspace is None:
            prep.workspace = core.workspace(m.lanes, m.streams_per_direction, prep.ring_size, m.mxm_planes,
                                            m.acc_rows, m.mem_slices, m.banks_per_slice)
        else:
            core.reset(prep.workspace)
        self.bulk = R.BULK_MIN if bulk else 0
        self.at = 0
        self.done = False
        self.inbox = {}                  # link -> deque of (arrival cycle, payload)
        self.last_send = {}              # link -> cycle
        self.buf = np.zeros((4, m.lanes), np.uint8)
        self.sent = self.received = 0

    def deliver(self, link: int, arrival: int, payload: np.ndarray) -> None:
        self.inbox.setdefault(link, deque()).append((arrival, payload))

    def advance(self, until: int) -> list:
        """Run up to the first RECV at or after cycle `until` (or the end); returns the vectors
        sent meanwhile: [(link, cycle, payload)]."""
        m, s, prep, hz = self.program.machine, self.s, self.prep, self.hz
        out = []
        while not self.done:
            self.at = core.execute(self.at, s.cycle, prep.cop, prep.cunit, prep.uidx, prep.upos, s.args, s.latency,
                                   m.lanes, m.streams_per_direction, m.acc_rows, m.f16_pair_cycles,
                                   m.addresses_per_bank, prep.bank_base, prep.bank_lo, self.mem, self.valid,
                                   prep.tables, R.F16_TO_F32, prep.workspace, self.bulk, hz, self.counters)
            if hz[0] == core.H_FLUSH:
                R._bulk(prep.workspace, int(hz[3]))
                hz[:] = 0
            elif hz[0] == core.H_C2C:
                i = self.at
                if s.cycle[i] >= until and s.op[i] == O.RECV:
                    hz[:] = 0
                    break
                self._c2c(i, out)
                hz[:] = 0
                self.at = i + 1
            elif hz[0] != core.H_NONE:
                raise self._chip_error(R._hazard(self.program, s, hz))
            else:
                self.done = True
        return out

    def _c2c(self, i: int, out: list) -> None:
        s, prep = self.s, self.prep
        t, link, ref = int(s.cycle[i]), int(prep.uidx[i]), int(s.args[i, 0])
        ring = prep.workspace[0] + (self.mem,)     # the core's stream tuple: a READ's value may be a row of mem
        spd = self.program.machine.streams_per_direction
        if not core.ref_ok(ref, 1, spd):
            self.hz[0], self.hz[1], self.hz[2], self.hz[3], self.hz[4] = core.H_OPERAND, i, t, 0, ref
            raise self._chip_error(R._hazard(self.program, s, self.hz))
        if s.op[i] == O.SEND:
            last = self.last_send.get(link)
            if last is not None and t - last < self.slot:
                raise self._link_error(i, H_LINK_BUSY, f"two sends on link {link} in one slot (the previous at cycle "
                                       f"{last}; a link carries one vector per {self.slot} cycles)",
                                       f"send at cycle {last + self.slot} or later")
            if not core.stream_read(ref, 1, int(prep.upos[i]), t, ring, self.buf, self.hz):
                self.hz[1], self.hz[2] = i, t
                raise self._chip_error(R._hazard(self.program, s, self.hz))
            self.last_send[link] = t
            out.append((link, t, self.buf[0].copy()))
            self.sent += 1
            return
        q = self.inbox.get(link)
        if not q or q[0][0] > t:
            what = (f"the next vector on link {link} arrives at cycle {q[0][0]}" if q else
                    f"no vector has arrived on link {link}")
            raise self._link_error(i, H_LINK_EARLY, f"receive before arrival: {what}",
                                   f"receive at cycle {q[0][0]} or later" if q else "a vector sent hop_cycles earlier")
        _, payload = q.popleft()
        self.buf[0] = payload
        self.hz[:] = 0
        if not core.stream_write(ref, 1, int(prep.upos[i]), t, i, ring, self.buf, self.hz):
            self.hz[1], self.hz[2] = (self.hz[6], s.cycle[self.hz[6]]) if self.hz[0] == core.H_UNREAD else (i, t)
            raise self._chip_error(R._hazard(self.program, s, self.hz))
        self.received += 1

    def _link_error(self, i: int, kind: str, detail: str, expected: str):
        p, s = self.program, self.s
        src, t = int(s.src[i]), int(s.cycle[i])
        op = O.OPS[s.op[i]].name
        line = int(p.line[src])
        qname = p.machine.queues[s.queue[i]][0]
        where = f"instruction {src}: {op}" + (f", DSL line {line}" + (f" '{p.source_line(line)}'" if
                                                                     p.source_line(line) else "") if line else "")
        return R.HazardError(f"hazard at cycle {t} on chip {self.chip} {qname} ({where}): {detail}", t, qname, src,
                             op, line, kind, expected)

    def _chip_error(self, e):
        e.message = e.message.replace(f" on {e.queue} ", f" on chip {self.chip} {e.queue} ", 1)
        e.chip = self.chip
        return e

    def finish(self) -> R.RunResult:
        """The chip's result, after its last instruction (its cycle count checked)."""
        p, s, prep, m = self.program, self.s, self.prep, self.program.machine
        left = sum(len(q) for q in self.inbox.values())
        if left:
            link = next(k for k, q in self.inbox.items() if q)
            raise R.HazardError(f"hazard at the end of the run on chip {self.chip}: {left} vector(s) delivered on "
                                f"link {link} (and others) that no RECV took", 0, "-", -1, "-", 0, H_LINK_UNREAD,
                                "one RECV per vector sent")
        cycles = s.cycles + m.icu_skew if len(s.cycle) else 0
        if cycles != p.predicted_cycles:
            raise self._chip_error(R._cycles_hazard(p, s, cycles))
        unwritten = R._unwritten_output(p, prep, self.valid, cycles)
        if unwritten is not None:
            raise self._chip_error(unwritten)
        c = self.counters
        busy = {"mem": int(c[core.K_BANK_ACCESSES]), "vxm": int(c[core.K_VXM_BUSY]),
                "mxm": int(c[core.K_MXM_BUSY]), "sxm": int(c[core.K_SXM_BUSY])}
        units = {"mem": m.mem_slices * m.banks_per_slice, "vxm": m.vxm_alus, "mxm": m.mxm_planes,
                 "sxm": 2 * m.sxm_queues_per_hemisphere}
        counts = dict(busy, macs=int(c[core.K_MACS]), sram_read_bytes=int(c[core.K_SRAM_READ]),
                      sram_written_bytes=int(c[core.K_SRAM_WRITTEN]), link_vectors_sent=self.sent,
                      link_vectors_received=self.received)
        util = {k: (busy[k] / (cycles * units[k]) if cycles else 0.0) for k in ("mxm", "vxm", "mem", "sxm")}
        mem = self.mem
        return R.RunResult(
            outputs={y.name: R._fetch(mem, prep.sym_rows[y.name], y, m) for y in p.symbols if y.kind == "output"},
            states={y.name: R._fetch(mem, prep.sym_rows[y.name], y, m) for y in p.symbols if y.kind == "state"},
            cycles=cycles, instructions=len(s.cycle), counters=counts, utilization=util,
            trace=R.Trace(s.cycle, s.src, s.repeat) if self.trace else None)
