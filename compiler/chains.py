"""Building blocks of chains: the rigid instruction groups the scheduler places.

A `ChainBuilder` collects instructions at offsets from the chain's anchor and the stream groups
that connect them. Distances come from the floorplan: a READ at slice position p feeding a unit
at position q issues |q - p| + mem_read cycles before the unit reads; a result produced at q
in cycle t reaches a WRITE at slice position p in cycle t + |p - q|.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.alloc import slot_place
from lpu.compiler.chainspec import CHAIN_COLS, GROUP_COLS, INS_COLS, Flat, Ins, Registry, Rows
from lpu.isa import opcodes as O
from lpu.isa.opcodes import NARGS
from lpu.isa.machine import EAST, MXM_ACC, MXM_CTL, MXM_LW, WEST


class Ctx:
    """What lowering needs of the machine, shared by all chains of a compilation."""

    def __init__(self, machine, alloc, reg: Registry):
        m = machine
        self.reg = reg
        self.m = m
        self.alloc = alloc
        self.lat = O.latency_table(m)
        self.lanes = m.lanes
        self.nslices = m.mem_slices
        self.banks = m.banks_per_slice
        self.slice_pos = [m.slice_pos(s) for s in range(m.mem_slices)]
        self.slice_pos_a = np.asarray(self.slice_pos, np.int64)
        self.mem_q = [(m.mem_queue(s, 0), m.mem_queue(s, 1)) for s in range(m.mem_slices)]
        self.vxm_q = tuple(m.vxm_queue(a) for a in range(m.vxm_alus))
        self.sxm_q = [tuple(m.sxm_queue(h, i) for i in range(m.sxm_queues_per_hemisphere)) for h in range(2)]
        self.lw_q = [tuple(m.mxm_queue(p, MXM_LW, i) for i in range(m.lw_ports_per_plane)) for p in range(m.mxm_planes)]
        self.ctl_q = [m.mxm_queue(p, MXM_CTL) for p in range(m.mxm_planes)]
        self.acc_q = [m.mxm_queue(p, MXM_ACC) for p in range(m.mxm_planes)]
        self.mem_qg = [reg.qgroup(q) for q in self.mem_q]        # the same as registry ids
        self.mem_qg_a = np.asarray(self.mem_qg, np.int64)
        self.vxm_qg = reg.qgroup(self.vxm_q)
        self.sxm_qg = [reg.qgroup(q) for q in self.sxm_q]
        self.lw_qg = [reg.qgroup(q) for q in self.lw_q]
        names = [[f for f, _ in spec.fields] for spec in O.OPS]
        self.vxm_fields = [tuple(n.index(k) if k in n else -1 for k in ("a", "b", "out", "nv", "imm", "bimm", "cut"))
                           for n in names]             # where each VXM operand and field goes in args
        self.lat_read = self.lat[O.READ]
        pad = (0,) * (NARGS - 2)                       # READ/WRITE: bank, addr, stream, then zeros
        self.read_tail = pad + (1, 1, 0, 0, 0, 0)      # one patch, one slot read
        self.write_tail = pad + (1, 0, 1, 0, 0, 0)     # one patch, one slot written
        self.tables: dict[bytes, int] = {}
        self.mxm_load: dict[int, int] = {}   # plane -> cycles of work given to it so far
        self.lw_dirty: dict[int, int] = {}   # plane -> rows of its weight buffer that may be non-zero
        self.tp_dirty: dict = {}             # (sxm, plane) -> rows of a transpose buffer that may be (movement.py)
        self.acc_jobs: dict[int, list] = {}  # matmul left in the accumulators -> its jobs (lower_mxm)
        self.acc_held: dict[int, list] = {}  # plane -> [(first row, rows)] such sums hold
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


_READ, _WRITE = O.READ, O.WRITE


def _dir_to(src: int, dst: int) -> int:
    return EAST if dst > src else WEST


def _koff(d: int, off: int, pos: int) -> int:
    return off - pos if d == EAST else off + pos


class _InsSink:
    """`cb.ins.append(Ins(...))`: an instruction built by hand joins the chain."""

    def __init__(self, cb):
        self.cb = cb

    def append(self, ins: Ins):
        reg = self.cb.reg
        self.cb._add(reg.qgroup(ins.queues), ins.off, ins.op, ins.args, ins.patch, ins.bank, ins.reads,
                     ins.writes, [(reg.marker(k), d) for k, d in ins.after],
                     [(reg.marker(k), d) for k, d in ins.mark], ins.extra)


class ChainBuilder:
    """One chain, written straight into the flat form of chainspec (`chain()` returns it)."""

    def __init__(self, ctx: Ctx, line: int = 0, node: int = -1, hint: tuple = ()):
        self.c = ctx
        self.reg = ctx.reg
        self.f = Flat()
        self._add = self.f.add_ins
        self.hint = hint
        self.line = line
        self.node = node

    @property
    def ins(self):
        return _InsSink(self)

    @property
    def groups(self) -> list:
        """The chain's stream groups so far: [(dir, koff, width)]."""
        g = self.f.groups
        return [tuple(g[i:i + GROUP_COLS]) for i in range(0, len(g), GROUP_COLS)]

    def mem_conflict(self) -> bool:
        """Two SRAM accesses of this chain on one bank in the same cycle: it can never be placed."""
        seen = set()
        ins = self.f.ins
        for i in range(0, len(ins), INS_COLS):
            b, o = ins[i + 3], ins[i + 1]
            if b >= 0:
                if (b, o) in seen:
                    return True
                seen.add((b, o))
        return False

    def chain(self) -> Flat:
        f, h = self.f, self.hint
        f.end_chain(self.reg.hint(h[0]) if h else -1, h[1] if h else 0, self.line, self.node)
        return f

    def _group(self, d, koff, w) -> int:
        return self.f.add_group(d, koff, w)

    def _marks(self, pairs):
        m = self.reg.marker
        return [(m(k), d) for k, d in pairs]

    def link(self, src: int, dst: int, arrive: int, w: int) -> int:
        """A stream group from a unit at `src` to a unit at `dst`, arriving at offset `arrive`."""
        d = _dir_to(src, dst)
        return self._group(d, _koff(d, arrive, dst), w)

    # ---- SRAM ----------------------------------------------------------------------------------
    def read(self, base: int, w: int, dest: int, arrive: int) -> int:
        """READ the w planes of the vector at `base` so they reach position `dest` at offset
        `arrive`; returns the stream group."""
        c, f = self.c, self.f
        ns, nb, spos, qg, tail = c.nslices, c.banks, c.slice_pos, c.mem_qg, c.read_tail
        d = EAST if dest > spos[base % ns] else WEST
        gi = f.add_group(d, arrive - dest if d == EAST else arrive + dest, w)
        ins, pd = f.ins, f.p_data
        off0 = arrive - c.lat_read
        for b in range(w):
            g = base + b
            s, row = g % ns, g // ns          # slot_place, inlined
            bank = row % nb
            ins.extend((qg[s], off0 - abs(dest - spos[s]), _READ, s * nb + bank, bank, row // nb) + tail)
            pd.extend((2, gi, b, 0))
        f.r_data.extend(range(base, base + w))
        return gi

    def write(self, base: int, w: int, src: int, produce: int) -> int:
        """WRITE w planes at `base`, produced at position `src` at offset `produce`."""
        c, f = self.c, self.f
        ns, nb, spos, qg, tail = c.nslices, c.banks, c.slice_pos, c.mem_qg, c.write_tail
        d = EAST if spos[base % ns] > src else WEST
        gi = f.add_group(d, produce - src if d == EAST else produce + src, w)
        ins, pd = f.ins, f.p_data
        for b in range(w):
            g = base + b
            s, row = g % ns, g // ns          # slot_place, inlined
            bank = row % nb
            ins.extend((qg[s], produce + abs(spos[s] - src), _WRITE, s * nb + bank, bank, row // nb) + tail)
            pd.extend((2, gi, b, 0))
        f.w_data.extend(range(base, base + w))
        return gi

    # ---- VXM -----------------------------------------------------------------------------------
    def vxm(self, op: int, off: int, a, b=None, out=None, nv=None, imm: int = 0, bimm: int = 0,
            cut: int = 0):
        """A VXM instruction at offset `off`. a, b: (group, dtype code) or None; out: (group,
        dtype code). Returns nothing; groups are already wired."""
        c, f = self.c, self.f
        ia, ib, io, inv, iimm, ibimm, icut = c.vxm_fields[op]
        args = [0] * NARGS
        npatch = 0
        for i, val in ((ia, a), (ib, b), (io, out)):
            if val is not None and i >= 0:
                f.p_data.extend((i, val[0], 0, val[1]))
                npatch += 1
        for i, val in ((inv, c.lanes if nv is None else nv), (iimm, imm), (ibimm, bimm), (icut, cut)):
            if i >= 0:
                args[i] = val
        f.ins.extend((c.vxm_qg, off, op, -1))
        f.ins.extend(args)
        f.ins.extend((npatch, 0, 0, 0, 0, 0))

    # ---- SXM -----------------------------------------------------------------------------------
    def sxm(self, op: int, h: int, off: int, inp, out, param: int):
        self._add(self.c.sxm_qg[h], off, op, (0, 0, param), ((0, inp[0], 0, inp[1]), (1, out[0], 0, out[1])))

    def tpin(self, h: int, off: int, inp, row: int, after, mark):
        self._add(self.c.sxm_qg[h], off, O.TPIN, (0, 0, row), ((0, inp[0], 0, inp[1]),),
                  after=self._marks(after), mark=self._marks(mark))

    def tpout(self, h: int, off: int, col: int, out, after, mark):
        self._add(self.c.sxm_qg[h], off, O.TPOUT, (0, col, 0), ((2, out[0], 0, out[1]),),
                  after=self._marks(after), mark=self._marks(mark))

    # ---- MXM -----------------------------------------------------------------------------------
    def lw(self, plane: int, off: int, row: int, inp, after, mark, cvt: int = 0):
        self._add(self.c.lw_qg[plane], off, O.LW, (row, 0, cvt), ((1, inp[0], 0, inp[1]),),
                  after=self._marks(after), mark=self._marks(mark))

    def iw(self, plane: int, off: int, dtype: int, trans: int, after, mark, pair: bool):
        c = self.c
        extra = ((c.ctl_q[plane + 1], off),) if pair else ()
        self._add(c.reg.qgroup((c.ctl_q[plane],)), off, O.IW, (dtype, trans), after=self._marks(after),
                  mark=self._marks(mark), extra=extra)

    def abc(self, plane: int, off: int, inp, acc: int, accum: int, half: int, after, mark, hold: int, pair: bool):
        c = self.c
        extra = tuple((c.ctl_q[plane], off + i) for i in range(1, hold))
        if pair:
            extra += tuple((c.ctl_q[plane + 1], off + i) for i in range(hold))
        self._add(c.reg.qgroup((c.ctl_q[plane],)), off, O.ABC, (0, acc, accum, half), ((0, inp[0], 0, inp[1]),),
                  after=self._marks(after), mark=self._marks(mark), extra=extra)

    def acc(self, plane: int, off: int, row: int, out, after, mark):
        c = self.c
        self._add(c.reg.qgroup((c.acc_q[plane],)), off, O.ACC, (row, 0), ((1, out[0], 0, out[1]),),
                  after=self._marks(after), mark=self._marks(mark))


def lw_rows(ctx: Ctx, line: int, node: int, plane: int, srcs, w: int, pos: int, dt: int, cvt: int,
            after, mark) -> Rows:
    """One chain per weight row r (READ the w planes at srcs[r], LW row r on `plane`), built
    at once with numpy: the same chains as ChainBuilder.read + lw, row by row."""
    c = ctx
    n = len(srcs)
    if n == 0:
        return Rows()
    src = np.asarray(srcs, np.int64)
    spos = c.slice_pos_a
    east = pos > spos[src % c.nslices]
    k = w + 1                                                    # instructions per chain
    g = src[:, None] + np.arange(w)[None, :]                     # [n, w] plane slots
    s, row = g % c.nslices, g // c.nslices                       # slot_place
    bank = row % c.banks
    ins = np.zeros((n, k, INS_COLS), np.int64)
    ins[:, :w, 0], ins[:, w, 0] = c.mem_qg_a[s], c.lw_qg[plane]
    ins[:, :w, 1] = -np.abs(pos - spos[s]) - c.lat_read
    ins[:, :w, 2], ins[:, w, 2] = O.READ, O.LW
    ins[:, :w, 3], ins[:, w, 3] = s * c.banks + bank, -1
    ins[:, :w, 4], ins[:, :w, 5] = bank, row // c.banks          # READ bank, address
    ins[:, w, 4], ins[:, w, 6] = np.arange(n), cvt               # LW row, cvt
    cnt = 4 + NARGS                                              # patch, read, write, after, mark, extra
    am = [[(c.reg.marker(key), d) for key, d in x] for x in (after, mark)]
    ins[:, :, cnt] = 1
    ins[:, :w, cnt + 1] = 1
    ins[:, w, cnt + 3], ins[:, w, cnt + 4] = len(am[0]), len(am[1])
    patch = np.zeros((n, k, 4), np.int64)
    patch[:, :w, 0], patch[:, :w, 2] = 2, np.arange(w)[None, :]
    patch[:, w, 0], patch[:, w, 3] = 1, dt
    ch = np.empty((n, CHAIN_COLS), np.int64)
    ch[:] = (k, 1, -1, 0, line, node)
    grp = np.empty((n, 3), np.int64)
    grp[:, 0], grp[:, 1], grp[:, 2] = np.where(east, EAST, WEST), np.where(east, -pos, pos), w
    return Rows(chains=ch, groups=grp, ins=ins, p_data=patch, r_data=g,
                a_data=np.tile(np.asarray(am[0], np.int64).reshape(-1), n) if am[0] else None,
                m_data=np.tile(np.asarray(am[1], np.int64).reshape(-1), n) if am[1] else None)


def sxm_rows(ctx: Ctx, line: int, node: int, op: int, srcs, dsts, w: int, dt: int, params) -> Rows:
    """One chain per entry i (READ the w planes at srcs[i], SXM op with params[i] on the SXM
    nearest the source, WRITE to dsts[i]), built at once with numpy: the same chains as
    lower_common.sxm_chain, entry by entry."""
    c = ctx
    n = len(srcs)
    if n == 0:
        return Rows()
    m = c.m
    src = np.asarray(srcs, np.int64)
    dst = np.asarray(dsts, np.int64)
    spos_all = c.slice_pos_a
    h = (src % c.nslices >= m.mem_slices_per_hemisphere).astype(np.int64)      # sxm_near
    ids = {hh: c.reg.hint(("sxm", hh)) for hh in dict.fromkeys(h.tolist())}    # in order of first use
    hid = np.asarray([ids.get(0, -1), ids.get(1, -1)], np.int64)[h]
    pos = np.where(h == 0, m.sxm_pos(0), m.sxm_pos(1))
    lat = c.lat[op]
    k = 2 * w + 1                                                # instructions per chain
    gr = src[:, None] + np.arange(w)[None, :]                    # [n, w] plane slots read
    gw = dst[:, None] + np.arange(w)[None, :]                    # [n, w] plane slots written
    sr, br, ar = slot_place(gr, c.nslices, c.banks)
    sw, bw, aw = slot_place(gw, c.nslices, c.banks)
    mem_qg = c.mem_qg_a
    sxm_qg = np.asarray(c.sxm_qg, np.int64)
    ins = np.zeros((n, k, INS_COLS), np.int64)
    cnt = 4 + NARGS
    ins[:, :w, 0], ins[:, w:2 * w, 0], ins[:, 2 * w, 0] = mem_qg[sr], mem_qg[sw], sxm_qg[h]
    ins[:, :w, 1] = -np.abs(pos[:, None] - spos_all[sr]) - c.lat_read
    ins[:, w:2 * w, 1] = lat + np.abs(spos_all[sw] - pos[:, None])
    ins[:, :w, 2], ins[:, w:2 * w, 2], ins[:, 2 * w, 2] = O.READ, O.WRITE, op
    ins[:, :w, 3], ins[:, w:2 * w, 3], ins[:, 2 * w, 3] = sr * c.banks + br, sw * c.banks + bw, -1
    ins[:, :w, 4], ins[:, :w, 5] = br, ar
    ins[:, w:2 * w, 4], ins[:, w:2 * w, 5] = bw, aw
    ins[:, 2 * w, 6] = np.asarray(params, np.int64)
    ins[:, :, cnt] = 1
    ins[:, 2 * w, cnt] = 2
    ins[:, :w, cnt + 1] = 1
    ins[:, w:2 * w, cnt + 2] = 1
    patch = np.zeros((n, 2 * w + 2, 4), np.int64)
    patch[:, :2 * w, 0] = 2
    patch[:, w:2 * w, 1] = 1
    patch[:, :w, 2] = patch[:, w:2 * w, 2] = np.arange(w)[None, :]
    patch[:, 2 * w + 1, 0] = patch[:, 2 * w + 1, 1] = 1
    patch[:, 2 * w:, 3] = dt
    ch = np.empty((n, 6), np.int64)
    ch[:, 0], ch[:, 1], ch[:, 2], ch[:, 3], ch[:, 4], ch[:, 5] = k, 2, hid, -m.n_positions, line, node
    east_r = pos > spos_all[src % c.nslices]                     # READ group: source slice -> SXM
    east_w = spos_all[dst % c.nslices] > pos                     # WRITE group: SXM -> destination
    grp = np.empty((n, 2, 3), np.int64)
    grp[:, 0, 0], grp[:, 0, 1] = np.where(east_r, EAST, WEST), np.where(east_r, -pos, pos)
    grp[:, 1, 0], grp[:, 1, 1] = np.where(east_w, EAST, WEST), np.where(east_w, lat - pos, lat + pos)
    grp[:, :, 2] = w
    return Rows(chains=ch, groups=grp, ins=ins, p_data=patch, r_data=gr, w_data=gw)
