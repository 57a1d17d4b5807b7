"""A group of a system's chips run in one process (emulator/system.py): the chips' parts of the
split tensors (`part_index`, `chip_values`), and `Group`, which advances its chips window by
window, in this process, in a local worker (emulator/system_workers.py) or in a Ray actor
(emulator/cluster.py)."""
from __future__ import annotations

import dataclasses
import math

from lpu.emulator.c2c import H_LINK_UNREAD, ChipRun
from lpu.emulator.run import HazardError

LOADED = ("input", "weight", "state")


def part_index(r) -> tuple:
    """The numpy index of a chip's part of a split tensor: `rows` holds (start, stop) of axis 0
    (a pipeline stage's rows) or ((start, stop) per axis) (a tensor-parallel rank's part)."""
    if len(r) == 2 and not isinstance(r[0], (tuple, list)):
        return (slice(int(r[0]), int(r[1])),)
    return tuple(slice(int(a), int(b)) for a, b in r)


def full_index(part: tuple, shape) -> tuple:
    """part_index's slices, one per axis of `shape`, with their bounds (start, stop) given."""
    part = tuple(part) + (slice(None),) * (len(shape) - len(part))
    return tuple(slice(*sl.indices(int(d))[:2]) for sl, d in zip(part, shape))


def tile(parts, shape) -> bool:
    """Whether the full_index parts cover the tensor of `shape`, each value in one of them."""
    spans = [[(sl.start, sl.stop) for sl in part] for part in parts]
    apart = all(any(max(a0, b0) >= min(a1, b1) for (a0, a1), (b0, b1) in zip(u, v))
                for i, u in enumerate(spans) for v in spans[:i])
    size = sum(math.prod(b - a for a, b in sp) for sp in spans)
    return apart and size == math.prod(int(d) for d in shape)


def chip_values(program, values: dict, rows: dict) -> dict:
    """The values a chip loads: a split tensor's part (`rows`: name -> part_index's argument)."""
    out = {}
    for s in program.symbols:
        if s.kind in LOADED and s.name in values:
            v = values[s.name]
            out[s.name] = v[part_index(rows[s.name])] if s.name in rows else v
    return out


def rows_of(sp, c: int) -> dict:
    return sp.rows[c] if getattr(sp, "rows", None) else {}


KEEP_BELOW = 20_000_000     # instructions in a group: above, a chip's emulator state is dropped when it ends


def _receives(program) -> bool:
    """A chip that waits for another before it computes: it receives a pipeline stage's input
    (a tensor-parallel rank's all-reduces, `@ar...`, come after its own work; a relay's buffer,
    `@<node>^`, may too: compiler/system_pp.py)."""
    return any(y.kind == "link" and not y.name.startswith("@ar") and not y.name.endswith("^")
               for y in program.symbols)


def share_prepared(p, running) -> None:
    """A chip whose program is another running chip's (the same arrays: a tensor-parallel node's
    ranks) takes that chip's preparation (schedule, layout) with its own SRAM image and unit
    state, instead of preparing it again."""
    for q in running:
        hit = q.__dict__.get("_emulator_prepared")
        if q is not p and q.op is p.op and q.args is p.args and q.symbols is p.symbols and hit is not None:
            key = (p.queue, p.op, p.args, p.tables, p.symbols, p.machine)
            if all(a is b for a, b in zip(hit[0], key)):
                p.__dict__["_emulator_prepared"] = (key, dataclasses.replace(hit[1], workspace=None, mem=None))
            return


class Group:
    """Some chips of a system, run in this process. A chip that has run its last instruction is
    finished at once. In a group of more than KEEP_BELOW instructions a chip that receives starts
    when its first vector is delivered (before that it could only run ahead to its first RECV)
    and its prepared program and SRAM image are let go when it ends (a pipeline of 40 chips holds
    about two at a time); a smaller group prepares every chip at the start and keeps them for the
    next run, as a one-chip run keeps its own."""

    def __init__(self, items, slot_cycles: int, trace: bool = False):
        self.slot, self.trace = slot_cycles, trace
        self.chips = [c for c, _, _ in items]
        self.waiting = {c: (p, v) for c, p, v in items}
        self.keep = sum(len(p.op) for _, p, _ in items) < KEEP_BELOW
        self.runs, self.results = {}, {}
        for c, p, _ in items:                # a small group prepares every chip now (a worker
            if self.keep or not _receives(p):    # does so beside the others)
                self._start(c)

    def _start(self, c: int) -> None:
        p, v = self.waiting.pop(c)
        share_prepared(p, [r.program for r in self.runs.values()])
        self.runs[c] = ChipRun(c, p, v, self.slot, trace=self.trace)

    def _end(self, c: int) -> None:
        r = self.runs.pop(c)
        self.results[c] = r.finish()
        if not self.keep:
            r.program.__dict__.pop("_emulator_prepared", None)

    def step(self, until: dict, deliveries: list):
        """Deliver [(chip, links, arrivals, payloads)], advance every chip c to until[c]. Returns
        (sent [(chip, links, cycles, payloads)], paused {chip: the cycle it waits at}, waiting:
        the chips not started)."""
        for c, links, arrivals, payloads in deliveries:
            if c in self.results:
                raise HazardError(f"hazard at cycle {int(arrivals[0])} on chip {c}: a vector delivered on link "
                                  f"{int(links[0])} after the chip's last instruction (no RECV took it)",
                                  int(arrivals[0]), "-", -1, "-", 0, H_LINK_UNREAD, "one RECV per vector sent")
            if c in self.waiting:
                self._start(c)
            self.runs[c].deliver(links, arrivals, payloads)
        sent, paused = [], {}
        for c, r in list(self.runs.items()):
            links, cycles, payloads = r.advance(until[c])
            if len(links):
                sent.append((c, links, cycles, payloads))
            if r.done:
                self._end(c)
            else:
                paused[c] = int(r.s.cycle[r.at])
        return sent, paused, list(self.waiting)

    def finish(self) -> dict:
        for c in list(self.waiting):          # never sent anything: it stops at its first RECV
            self._start(c)
            self.runs[c].advance(1 << 62)
        for c in list(self.runs):
            self._end(c)
        return self.results
