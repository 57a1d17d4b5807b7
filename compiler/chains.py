"""Building blocks of chains: the rigid instruction groups the scheduler places.

A `ChainBuilder` collects instructions at offsets from the chain's anchor and the stream groups
that connect them. Distances come from the floorplan: a READ at slice position p feeding a unit
at position q issues |q - p| + mem_read cycles before the unit reads; a result produced at q
in cycle t reaches a WRITE at slice position p in cycle t + |p - q|.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.alloc import slot_place
from lpu.compiler.chainspec import Chain, Ins
from lpu.isa import opcodes as O
from lpu.isa.machine import EAST, MXM_ACC, MXM_CTL, MXM_LW, WEST


class Ctx:
    """What lowering needs of the machine, shared by all chains of a compilation."""

    def __init__(self, machine, alloc):
        m = machine
        self.m = m
        self.alloc = alloc
        self.lat = O.latency_table(m)
        self.lanes = m.lanes
        self.nslices = m.mem_slices
        self.banks = m.banks_per_slice
        self.slice_pos = [m.slice_pos(s) for s in range(m.mem_slices)]
        self.mem_q = [(m.mem_queue(s, 0), m.mem_queue(s, 1)) for s in range(m.mem_slices)]
        self.vxm_q = tuple(m.vxm_queue(a) for a in range(m.vxm_alus))
        self.sxm_q = [tuple(m.sxm_queue(h, i) for i in range(m.sxm_queues_per_hemisphere)) for h in range(2)]
        self.lw_q = [tuple(m.mxm_queue(p, MXM_LW, i) for i in range(m.lw_ports_per_plane)) for p in range(m.mxm_planes)]
        self.ctl_q = [m.mxm_queue(p, MXM_CTL) for p in range(m.mxm_planes)]
        self.acc_q = [m.mxm_queue(p, MXM_ACC) for p in range(m.mxm_planes)]
        self.tables: dict[bytes, int] = {}
        self.mxm_load: dict[int, int] = {}   # plane -> cycles of work given to it so far
        self.lw_dirty: dict[int, int] = {}   # plane -> rows of its weight buffer that may be non-zero
        self.sxm_turn = 0

    def table(self, entries) -> int:
        key = np.asarray(entries, np.int32).tobytes()
        i = self.tables.get(key)
        if i is None:
            i = self.tables[key] = len(self.tables)
        return i

    def table_array(self) -> np.ndarray:
        out = np.full((len(self.tables), self.lanes), -1, np.int32)
        for key, i in self.tables.items():
            out[i] = np.frombuffer(key, np.int32)
        return out

    def next_sxm(self) -> int:
        """Alternate the two SXMs so that lane movement uses both."""
        self.sxm_turn ^= 1
        return self.sxm_turn

    def sxm_near(self, slot: int) -> int:
        """The SXM on the hemisphere of a plane slot: its data needs the fewest hops."""
        return self.m.slice_hemisphere(slot % self.nslices)


def _dir_to(src: int, dst: int) -> int:
    return EAST if dst > src else WEST


def _koff(d: int, off: int, pos: int) -> int:
    return off - pos if d == EAST else off + pos


class ChainBuilder:
    def __init__(self, ctx: Ctx, line: int = 0, node: int = -1, hint: tuple = ()):
        self.c = ctx
        self.hint = hint
        self.ins: list[Ins] = []
        self.groups: list = []
        self.line = line
        self.node = node

    def mem_conflict(self) -> bool:
        """Two SRAM accesses of this chain on one bank in the same cycle: it can never be placed."""
        seen = set()
        for ins in self.ins:
            if ins.bank >= 0:
                key = (ins.bank, ins.off)
                if key in seen:
                    return True
                seen.add(key)
        return False

    def chain(self) -> Chain:
        return Chain(self.ins, self.groups, self.line, self.node, self.hint)

    def _group(self, d, koff, w) -> int:
        self.groups.append((d, koff, w))
        return len(self.groups) - 1

    def link(self, src: int, dst: int, arrive: int, w: int) -> int:
        """A stream group from a unit at `src` to a unit at `dst`, arriving at offset `arrive`."""
        d = _dir_to(src, dst)
        return self._group(d, _koff(d, arrive, dst), w)

    # ---- SRAM ----------------------------------------------------------------------------------
    def read(self, base: int, w: int, dest: int, arrive: int) -> int:
        """READ the w planes of the vector at `base` so they reach position `dest` at offset
        `arrive`; returns the stream group."""
        c = self.c
        s0 = base % c.nslices
        d = _dir_to(c.slice_pos[s0], dest)
        gi = self._group(d, _koff(d, arrive, dest), w)
        for b in range(w):
            g = base + b
            s, bank, addr = slot_place(g, c.nslices, c.banks)
            off = arrive - abs(dest - c.slice_pos[s]) - c.lat[O.READ]
            self.ins.append(Ins(c.mem_q[s], off, O.READ, [bank, addr, 0],
                                ((2, gi, b, 0),), s * c.banks + bank, reads=(g,)))
        return gi

    def write(self, base: int, w: int, src: int, produce: int) -> int:
        """WRITE w planes at `base`, produced at position `src` at offset `produce`."""
        c = self.c
        s0 = base % c.nslices
        d = _dir_to(src, c.slice_pos[s0])
        gi = self._group(d, _koff(d, produce, src), w)
        for b in range(w):
            g = base + b
            s, bank, addr = slot_place(g, c.nslices, c.banks)
            off = produce + abs(c.slice_pos[s] - src)
            self.ins.append(Ins(c.mem_q[s], off, O.WRITE, [bank, addr, 0],
                                ((2, gi, b, 0),), s * c.banks + bank, writes=(g,)))
        return gi

    # ---- VXM -----------------------------------------------------------------------------------
    def vxm(self, op: int, off: int, a, b=None, out=None, nv=None, imm: int = 0, bimm: int = 0,
            cut: int = 0):
        """A VXM instruction at offset `off`. a, b: (group, dtype code) or None; out: (group,
        dtype code). Returns nothing; groups are already wired."""
        c = self.c
        nv = c.lanes if nv is None else nv
        spec = O.OPS[op]
        names = [f for f, _ in spec.fields]
        args = [0] * len(names)
        patch = []
        for fname, val in (("a", a), ("b", b), ("out", out)):
            if val is not None and fname in names:
                i = names.index(fname)
                patch.append((i, val[0], 0, val[1]))
        for fname, val in (("nv", nv), ("imm", imm), ("bimm", bimm), ("cut", cut)):
            if fname in names:
                args[names.index(fname)] = val
        if b is None and "b" in names:
            args[names.index("b")] = 0
        self.ins.append(Ins(c.vxm_q, off, op, args, tuple(patch)))

    # ---- SXM -----------------------------------------------------------------------------------
    def sxm(self, op: int, h: int, off: int, inp, out, param: int):
        c = self.c
        self.ins.append(Ins(c.sxm_q[h], off, op, [0, 0, param],
                            ((0, inp[0], 0, inp[1]), (1, out[0], 0, out[1]))))

    def tpin(self, h: int, off: int, inp, row: int, after, mark):
        self.ins.append(Ins(self.c.sxm_q[h], off, O.TPIN, [0, 0, row], ((0, inp[0], 0, inp[1]),),
                            after=after, mark=mark))

    def tpout(self, h: int, off: int, col: int, out, after, mark):
        self.ins.append(Ins(self.c.sxm_q[h], off, O.TPOUT, [0, col, 0], ((2, out[0], 0, out[1]),),
                            after=after, mark=mark))

    # ---- MXM -----------------------------------------------------------------------------------
    def lw(self, plane: int, off: int, row: int, inp, after, mark, cvt: int = 0):
        self.ins.append(Ins(self.c.lw_q[plane], off, O.LW, [row, 0, cvt], ((1, inp[0], 0, inp[1]),),
                            after=after, mark=mark))

    def iw(self, plane: int, off: int, dtype: int, trans: int, after, mark, pair: bool):
        extra = ((self.c.ctl_q[plane + 1], off),) if pair else ()
        self.ins.append(Ins((self.c.ctl_q[plane],), off, O.IW, [dtype, trans], after=after, mark=mark,
                            extra=extra))

    def abc(self, plane: int, off: int, inp, acc: int, accum: int, after, mark, hold: int, pair: bool):
        c = self.c
        extra = tuple((c.ctl_q[plane], off + i) for i in range(1, hold))
        if pair:
            extra += tuple((c.ctl_q[plane + 1], off + i) for i in range(hold))
        self.ins.append(Ins((c.ctl_q[plane],), off, O.ABC, [0, acc, accum], ((0, inp[0], 0, inp[1]),),
                            after=after, mark=mark, extra=extra))

    def acc(self, plane: int, off: int, row: int, out, after, mark):
        self.ins.append(Ins((self.c.acc_q[plane],), off, O.ACC, [row, 0], ((1, out[0], 0, out[1]),),
                            after=after, mark=mark))
