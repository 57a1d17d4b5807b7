"""One chip of a system (emulator/system.py): its program run in windows of cycles. Its
chip-to-chip instructions run inside the jitted core (emulator/core_links.py): SENDs fill the
chip's outbox, RECVs take what the host delivered to its inbox, and the run pauses at the first
RECV at or after the window's end.

SEND reads its byte plane from the stream at the link's position in its cycle; it is a hazard if
the link is still carrying the previous vector (less than slot_cycles since the last SEND on that
link). RECV takes the oldest vector delivered to its link; it is a hazard if none has arrived by
its cycle (a vector arrives hop_cycles after its SEND). Its payload goes on the stream at the
link's position in its cycle.

`advance(until)` executes every instruction up to the first RECV at cycle `until` or later: a
chip's other instructions (its SENDs too) do not depend on other chips, so it may run past the
window; only what it receives does.
"""
from __future__ import annotations

import numpy as np

from lpu.emulator import blas, core, sram_core
from lpu.emulator import core_links as CL
from lpu.emulator import run as R
from lpu.emulator.prepare import prepare
from lpu.isa import opcodes as O
from lpu.isa.dtypes import NP_DTYPE
from lpu.isa.program import vector_grid

H_LINK_EARLY, H_LINK_BUSY, H_LINK_UNREAD = "link-early", "link-busy", "link-unread"
BLOCK = 1 << 20            # values drawn at a time into a chip's image (`draw`)


class ChipRun:
    def __init__(self, chip: int, program, values: dict | None, slot_cycles: int, bulk: bool = True,
                 trace: bool = False):
        """values None: the SRAM image is only allocated (`warm`), and `reload` loads it."""
        m = program.machine
        self.chip, self.program, self.slot, self.trace = chip, program, slot_cycles, trace
        self.prep = prep = prepare(program, R.schedule)
        self.s = s = prep.sched
        if values is None:
            prep.mem = np.zeros((max(prep.nrows, 1), m.lanes), np.uint8) if prep.mem is None else prep.mem
            prep.last_valid, prep.runs = None, prep.runs + 1      # a system's run leaves nothing resident
            self.mem = prep.mem
        else:
            self.mem = R.load(program, values, prep, huge=False)
        self.valid = prep.valid0.copy()
        self.hz = np.zeros(8, np.int64)
        self.counters = np.zeros(core.N_COUNTERS, np.int64)
        if prep.workspace is None:
            prep.workspace = core.workspace(m.lanes, m.streams_per_direction, prep.ring_size, m.mxm_planes,
                                            m.acc_rows, m.mem_slices, m.banks_per_slice)
        else:
            core.reset(prep.workspace)
        self.bulk = R.bulk_args(bulk)
        self.at = 0
        self.done = False
        c2c = prep.cunit == core.U_C2C
        recv = np.bincount(prep.uidx[c2c & (s.op == O.RECV)], minlength=m.c2c_links)
        self.links = CL.links_state(m.lanes, m.c2c_links, int(np.count_nonzero(c2c) - recv.sum()), recv,
                                    slot_cycles, True)
        self.in_end = np.cumsum(recv)    # link j's inbox rows end here
        self.extra = {}                  # link -> vectors delivered beyond its RECVs (none will take them)

    def deliver(self, links: np.ndarray, arrivals: np.ndarray, payloads: np.ndarray) -> None:
        """Vectors that arrive on this chip's `links` at `arrivals` (in the order sent on each link)."""
        in_arrival, in_pay, in_tail, end = self.links[5], self.links[6], self.links[8], self.in_end
        for link in np.unique(links):
            sel = np.flatnonzero(links == link)
            t = int(in_tail[link])
            k = min(len(sel), int(end[link]) - t)
            if k < len(sel):
                self.extra[int(link)] = self.extra.get(int(link), 0) + len(sel) - k
            in_arrival[t:t + k] = arrivals[sel[:k]]
            in_pay[t:t + k] = payloads[sel[:k]]
            in_tail[link] = t + k

    def advance(self, until: int) -> tuple:
        """Run up to the first RECV at or after cycle `until` (or the end); returns the vectors
        sent meanwhile: (links, cycles, payloads)."""
        prep, hz = self.prep, self.hz
        ctl, _, out_link, out_cycle, out_pay = self.links[:5]
        ctl[CL.L_UNTIL] = until
        while not self.done:
            self.at = self._execute(self.at)
            if hz[0] == core.H_FLUSH:
                R._bulk(prep.workspace, int(hz[3]))
                hz[:] = 0
            elif hz[0] == core.H_C2C:
                hz[:] = 0
                break
            elif hz[0] in (CL.H_LINK_BUSY, CL.H_LINK_EARLY):
                raise self._link_hazard()
            elif hz[0] != core.H_NONE:
                raise self._chip_error(R._hazard(self.program, self.s, hz))
            else:
                self.done = True
        n = int(ctl[CL.L_OUT])
        ctl[CL.L_OUT] = 0
        return out_link[:n].copy(), out_cycle[:n].copy(), out_pay[:n].copy() if n else out_pay[:0]

    def _execute(self, at: int) -> int:
        m, s, prep = self.program.machine, self.s, self.prep
        with blas.one_thread():      # (run.run's reason: the core's products are small)
            return core.execute(at, s.cycle, prep.meta, s.args, m.lanes,
                                m.streams_per_direction, m.acc_rows, m.f16_pair_cycles, m.addresses_per_bank,
                                prep.bank_base, prep.bank_lo, self.mem, self.valid, prep.tables, R.F16_TO_F32,
                                prep.workspace, self.links, self.bulk, self.hz, self.counters)

    def warm(self) -> None:
        """Before the values arrive (emulator/system_workers.py `start`): the jitted core loaded (called
        at the program's end, it executes nothing). The SRAM image is left untouched: its pages
        are made as the values and the run write them, and a third of its rows (gaps between a
        bank's tensors) never are."""
        self._execute(len(self.s.cycle))

    def reload(self, values: dict, drawn=frozenset()) -> None:
        """The SRAM image loaded again from `values`, before the first instruction; the symbols
        `drawn` are in the (fresh) image already (`draw`), the others are stored beside them."""
        self.prep.last_valid, self.prep.runs = None, self.prep.runs + 1
        if not drawn:
            self.mem = R.load(self.program, values, self.prep)
            return
        m = self.program.machine
        for y in self.program.symbols:
            if y.kind == "const" or (y.kind in ("input", "weight", "state") and y.name not in drawn):
                arr = np.asarray(y.data if y.kind == "const" else values[y.name])
                R._store(self.mem, self.prep.sym_rows[y.name], y, arr.reshape(tuple(y.shape)), m)

    def draw(self, name: str, plan, part: tuple, shape: tuple, scratch: dict) -> bool:
        """The integer tensor `name`'s part (part_index of the whole, `shape`) drawn from `plan`
        (compiler/draw_core.py Plan, the whole tensor's draws) straight into the image, about
        BLOCK values at a time through `scratch` (dtype -> a buffer kept by the caller). False:
        a draw rejected."""
        y = next(y for y in self.program.symbols if y.name == name)
        nrow, chunks, cols = vector_grid(tuple(y.shape), self.program.machine.lanes)
        whole = np.arange(int(np.prod(shape[:-1], dtype=np.int64)), dtype=np.int64).reshape(shape[:-1])
        starts = whole[part[:-1]].reshape(-1) * shape[-1] + (part[-1].start or 0)
        dt = np.dtype(NP_DTYPE[y.dtype])
        block = max(1, BLOCK // max(cols, 1))
        buf = scratch.get(dt)
        if buf is None or buf.size < block * cols:
            buf = scratch[dt] = np.empty(block * cols, dt)
        rows, ok = self.prep.sym_rows[name], True
        for r0 in range(0, nrow, block):
            n = min(block, nrow - r0)
            out = buf[:n * cols].reshape(n, cols)
            ok &= plan.make_rows(starts[r0:r0 + n], out)
            sram_core.store(self.mem, rows[r0 * chunks:(r0 + n) * chunks], out.view(f"u{y.width}"), chunks, y.width)
        return ok

    def _link_hazard(self):
        i, link, x = int(self.hz[1]), int(self.hz[3]), int(self.hz[4])
        if self.hz[0] == CL.H_LINK_BUSY:
            return self._link_error(i, H_LINK_BUSY, f"two sends on link {link} in one slot (the previous at cycle "
                                    f"{x}; a link carries one vector per {self.slot} cycles)",
                                    f"send at cycle {x + self.slot} or later")
        what = f"the next vector on link {link} arrives at cycle {x}" if x >= 0 else f"no vector has arrived on link {link}"
        return self._link_error(i, H_LINK_EARLY, f"receive before arrival: {what}",
                                f"receive at cycle {x} or later" if x >= 0 else "a vector sent hop_cycles earlier")

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
        ctl, in_head, in_tail = self.links[0], self.links[7], self.links[8]
        left = in_tail - in_head
        if left.any() or self.extra:
            link = int(np.flatnonzero(left)[0]) if left.any() else min(self.extra)
            left = int(left.sum()) + sum(self.extra.values())
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
                      sram_written_bytes=int(c[core.K_SRAM_WRITTEN]), link_vectors_sent=int(ctl[CL.L_SENT]),
                      link_vectors_received=int(ctl[CL.L_RECEIVED]))
        util = {k: (busy[k] / (cycles * units[k]) if cycles else 0.0) for k in ("mxm", "vxm", "mem", "sxm")}
        mem = self.mem
        return R.RunResult(
            outputs={y.name: R._fetch(mem, prep.sym_rows[y.name], y, m) for y in p.symbols if y.kind == "output"},
            states={y.name: R._fetch(mem, prep.sym_rows[y.name], y, m) for y in p.symbols if y.kind == "state"},
            cycles=cycles, instructions=len(s.cycle), counters=counts, utilization=util,
            trace=R.Trace(s.cycle, s.src, s.repeat) if self.trace else None)
