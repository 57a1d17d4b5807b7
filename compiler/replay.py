"""Trips of a loop lowered once and replayed (part of pass `lower`).

The trips of a top-level `for` loop (`IRGraph.loops`) usually differ only in which block of a
weight or state they read (`wqkv[l]`). Lowering builds the same chains for them, at other SRAM
addresses, and lowering is the compiler's most expensive pass. So a node of trip k is not
lowered again when it is *alike* its twin in trip k-1 (the node at the same place in the trip's
node-id range): then its chains are the twin's, with the SRAM slots (and READ/WRITE addresses)
of the inputs that moved shifted and the node id changed. Alike means everything lowering looks
at is equal:

  - the node: op, shape, dtype, attributes, source position;
  - each input: its storage kind, dtype and shape, its value if it is an immediate, and its
    vector grid up to one constant shift d that is a multiple of the slice-and-bank period
    (slices x banks slots: the shifted slots are in the same slice and bank, d / period
    addresses further). Blocks of tensors indexed by a loop variable are laid out at such a
    stride (`alloc.layout(period=...)`, `periodic_leaves`);
  - the allocator: doing the twin's allocations and releases now gives the same regions
    (`SlotAllocator.replays`), so the node's result and scratch vectors sit where the twin's did;
  - the unit state lowering keeps (`Ctx.lw_dirty`: which weight-buffer rows may hold stale
    values) is the same as before the twin; the choices it steers (`mxm_load`, `sxm_turn`)
    only balance work, and are advanced as the twin advanced them.

Otherwise the node is lowered as usual. The scheduler places replayed chains like any others,
so every timing rule is checked as before; only Python's building of the chains is skipped.
"""
from __future__ import annotations

import copy

import numpy as np

from lpu.compiler import replay_core as RC
from lpu.compiler.chainspec import FIELDS, ChainArrays, _EMPTY, _arrays, batch_rows
from lpu.isa import opcodes as O
from lpu.isa.opcodes import dtype_width

_ADDR = 1                                  # READ/WRITE's addr arg


def periodic_leaves(graph, plan) -> set:
    """Persistent tensors (two or more axes) whose first axis a loop trip indexes with an
    integer: laid out with a period stride so that the trips' blocks look alike."""
    out = set()
    for trips in graph.loops:
        for s, e in trips:
            for nid in range(s, e):
                n = graph.node(nid)
                if n.op != "slice" or not n.attrs["index"] or not isinstance(n.attrs["index"][0], int):
                    continue
                root = graph.node(plan.base.get(n.inputs[0], n.inputs[0]))
                if plan.kind.get(root.id) == "persistent" and len(root.shape) >= 2 and root.shape[0] > 1:
                    out.add(root.id)
    return out


class Record:
    __slots__ = ("log", "arrays", "dirty_before", "dirty_after", "sxm_flip", "load_delta", "out_region", "deferred",
                 "row_held")


class Replayer:
    def __init__(self, lw):
        self.lw = lw
        m = lw.m
        self.period = m.mem_slices * m.banks_per_slice
        self.twin: dict[int, int] = {}            # node id -> its twin in the previous trip
        for trips in lw.g.loops:
            for a, b in zip(trips, trips[1:]):
                self.twin.update(_aligned(lw.g, a, b))
        self.wanted = set(self.twin.values())     # nodes some later node may replay
        self.next_of = {t: n for n, t in self.twin.items()}   # node -> its twin in the next trip
        self.carried = self._carried()
        self.rec: dict[int, Record] = {}
        self.replayed = self.lowered = 0

    def _carried(self) -> list:
        """[(first trip's (start, end), [(o, p)])] per loop: o, a node of the first trip that the
        second trip reads where the first read p (a value from before the loop: `h` in
        `for l { h = f(h, l) }`). Giving o a region whose slots are p's shifted by a multiple of
        the period, held from the loop's start so that no node of the first trip uses it, lets
        the second trip replay the first (`Lowerer.hold_carried`)."""
        g, plan = self.lw.g, self.lw.plan
        out = []
        for trips in g.loops:
            if len(trips) < 2:
                continue
            (s0, e0), (s1, e1) = trips[0], trips[1]
            pairs = {}
            for m in range(s1, e1):
                if m not in self.twin:
                    continue
                mine, theirs = g.node(m).inputs, g.node(self.twin[m]).inputs
                if len(mine) != len(theirs):
                    continue
                for i, j in zip(mine, theirs):
                    o, p = plan.base.get(i, i), plan.base.get(j, j)
                    if s0 <= o < e0 and p < s0 and plan.kind.get(o) in ("temp", "joined"):
                        pairs.setdefault(o, p)
            if pairs:
                out.append(((s0, e0), sorted(pairs.items())))
        return out

    # ---- recording -------------------------------------------------------------------------
    def begin(self, n):
        """Before lowering node n the usual way: start its record if a later node may replay it."""
        if n.id not in self.wanted:
            return None
        lw, c = self.lw, self.lw.ctx
        r = Record()
        r.log = []
        r.dirty_before = dict(c.lw_dirty)
        r.sxm_flip = c.sxm_turn
        r.load_delta = dict(c.mxm_load)
        r.deferred = len(lw.deferred)
        r.row_held = len(lw.row_held)
        lw.alloc.log = r.log
        return r

    def end(self, n, r: Record | None, aliased: bool):
        """After lowering node n: close its record (its chains become one ChainArrays batch)."""
        self.lowered += 1
        self._forget(n.id)
        if r is None:
            return
        lw, c = self.lw, self.lw.ctx
        lw.alloc.log = None
        r.dirty_after = dict(c.lw_dirty)
        r.sxm_flip ^= c.sxm_turn
        r.load_delta = {u: v - r.load_delta.get(u, 0) for u, v in c.mxm_load.items()}
        r.out_region = None if aliased or not r.log else (r.log[0][2], r.log[0][1])
        r.deferred = [region for _, region in lw.deferred[r.deferred:]]   # scratch freed later (free_scratch)
        r.row_held = lw.row_held[r.row_held:]          # temporaries held to a row region's end
        r.arrays = _arrays([_rows(lw.chains, lw.ctx.reg)])
        lw.chains = [_own(r.arrays)]
        self.rec[n.id] = r

    def _forget(self, nid):
        t = self.twin.get(nid)
        if t is not None:
            self.rec.pop(t, None)

    # ---- replaying -------------------------------------------------------------------------
    def replay(self, n, aliased: bool, out=None) -> bool:
        """Give node n its twin's storage and chains, if they are alike; False if not. out: the
        grid n writes when it is given (a part of a joined tensor: its rows of the join's region),
        which must lie where the twin's did, up to a shift by a multiple of the period."""
        t = self.twin.get(n.id)
        r = self.rec.get(t) if t is not None else None
        if r is None:
            return False
        lw = self.lw
        shifts = self._shifts(n, lw.g.node(t))
        if shifts is not None and out is not None:
            d = _shift_of(out, lw.grid.get(t), self.period)
            if d is None:
                return False
            if d:
                shifts.append((lw.grid[t], dtype_width(n.dtype), d))
        if shifts is None or lw.ctx.lw_dirty != r.dirty_before:
            return False
        if (r.out_region is None) != aliased and r.log:
            return False
        names = self._names(r.arrays.node, n.id)
        arrays = _shifted(r.arrays, shifts, names, self.period) if shifts else _renamed(r.arrays, names)
        if arrays is None or not lw.alloc.replays(r.log):
            return False
        c = lw.ctx
        c.lw_dirty = dict(r.dirty_after)
        c.sxm_turn ^= r.sxm_flip
        for u, v in r.load_delta.items():
            c.mxm_load[u] = c.mxm_load.get(u, 0) + v
        lw.deferred += [(lw.depth, region) for region in r.deferred]
        lw.row_held += r.row_held
        if out is None:
            lw.grid[n.id] = lw.grid[t]
        if r.out_region is not None:
            lw.regions[n.id] = r.out_region
        # the scheduler writes stream references into the batch's args: a shifted batch has args of
        # its own already (the record keeps them: the next trip copies them again, and placing
        # rewrites every stream reference), a renamed one shares the record's
        lw.chains = [arrays if shifts else _own(arrays)]
        self._forget(n.id)
        if n.id in self.wanted:       # n is the next trip's twin: its record is the twin's, renamed
            new = copy.copy(r)
            new.arrays = arrays
            self.rec[n.id] = new
        self.replayed += 1
        return True

    def _names(self, nodes, nid):
        """The node of each chain in this trip: the twin's chains name the twin (now nid) or a node
        of the twin's trip lowered with it (a fused producer: now its own next-trip node)."""
        u = RC.distinct(nodes)
        t = self.twin.get(nid)
        return RC.renamed(nodes, u, np.array([nid if x == t else self.next_of.get(int(x), int(x)) for x in u], np.int64))

    def _shifts(self, n, t):
        """[(twin's input grid, width, d)] for the inputs that moved, or None if n and t differ."""
        if (n.op, n.shape, n.dtype, n.line, n.col, len(n.inputs)) != (t.op, t.shape, t.dtype, t.line, t.col, len(t.inputs)):
            return None
        out = []
        if not _same_attrs(n.attrs, t.attrs):
            moved = self._block_moved(n, t)
            if moved is None:
                return None
            out.append(moved)
        return out if self._alike_inputs(n, t, out) else None

    def _block_moved(self, n, t):
        """For slices that differ only in the integer index of their first axis (`kc[l, 0:T, a:b]`
        in trip l, copied because its lanes are not whole chunks): (the twin's block's grid,
        width, d) when the two blocks of their one input lie a multiple of the period apart, as
        blocks of a periodic layout do; else None."""
        grid = self.lw.grid.get(n.inputs[0])
        if n.op != "slice" or grid is None or grid.ndim < 2 or grid is not self.lw.grid.get(t.inputs[0]):
            return None
        rest = ({k: v for k, v in x.attrs.items() if k != "index"} for x in (n, t))
        a, b = n.attrs["index"], t.attrs["index"]
        if not _same_attrs(*rest) or len(a) != len(b) or not a or not isinstance(a[0], int) \
                or not isinstance(b[0], int) or a[1:] != b[1:]:
            return None
        d = grid[a[0]] - grid[b[0]]
        d0 = int(d.flat[0]) if d.size else 0
        if not d.size or np.any(d != d0) or d0 % self.period:
            return None
        return grid[b[0]], dtype_width(self.lw.g.node(n.inputs[0]).dtype), d0

    def _alike_inputs(self, n, t, out) -> bool:
        """Compare n's and t's inputs (through fused producers, which lowering reads through),
        adding [(twin's grid, width, d)] to out for the inputs that moved."""
        lw, g, kind = self.lw, self.lw.g, self.lw.plan.kind
        for i, j in zip(n.inputs, t.inputs):
            a, b = g.node(i), g.node(j)
            if (kind[i], a.dtype, a.shape) != (kind[j], b.dtype, b.shape):
                return False
            if kind[i] == "imm":
                if not np.array_equal(a.attrs["value"], b.attrs["value"]):
                    return False
                continue
            if kind[i] == "fused":
                if (a.op, len(a.inputs)) != (b.op, len(b.inputs)) or not _same_attrs(a.attrs, b.attrs):
                    return False
                if not self._alike_inputs(a, b, out):
                    return False
                continue
            ga, gb = lw.grid.get(i), lw.grid.get(j)
            if ga is None or gb is None or ga.shape != gb.shape:
                return False
            d = ga - gb
            d0 = int(d.flat[0]) if d.size else 0
            if d.size and (np.any(d != d0) or d0 % self.period):
                return False
            if d0:
                out.append((gb, dtype_width(a.dtype), d0))
        return True


def _shift_of(grid, twin_grid, period: int):
    """The one shift (a multiple of the period) from twin_grid to grid, else None."""
    if twin_grid is None or grid.shape != twin_grid.shape:
        return None
    d = grid - twin_grid
    d0 = int(d.flat[0]) if d.size else 0
    if d.size and (np.any(d != d0) or d0 % period):
        return None
    return d0


def _aligned(g, a: tuple, b: tuple) -> dict:
    """{node of trip b: its twin in trip a}, pairing nodes in order by (op, source position);
    a constant that only one trip has (made by a rewrite in the first trip that needs it and
    shared by the later ones) is skipped. Pairing stops at the first other difference."""
    def key(i):
        n = g.node(i)
        return n.op, n.line, n.col
    out = {}
    i, j = a[0], b[0]
    while i < a[1] and j < b[1]:
        if key(i) == key(j):
            out[j] = i
            i, j = i + 1, j + 1
        elif g.node(i).op == "const":
            i += 1
        elif g.node(j).op == "const":
            j += 1
        else:
            break
    return out


def _same_attrs(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
            if not np.array_equal(v, w):
                return False
        elif v != w:
            return False
    return True


def _rows(chains, reg) -> dict:
    """The chains of one node (Chain, Flat and Rows batches, in order) as one rows dict."""
    parts = batch_rows(chains, reg)
    if len(parts) == 1:
        return parts[0]
    return {f: np.concatenate([p[f] for p in parts]) if parts else _EMPTY[f] for f in FIELDS}


def _copy(a: ChainArrays) -> ChainArrays:
    """A shallow copy (copy.copy goes through __reduce_ex__: ~10x slower, 3,094 copies a bert_base)."""
    b = object.__new__(ChainArrays)
    b.__dict__.update(a.__dict__)
    return b


def _own(a: ChainArrays) -> ChainArrays:
    """The batch with its own args (the scheduler writes the stream references into them)."""
    b = _copy(a)
    b.args = a.args.copy()
    return b


def _renamed(a: ChainArrays, names: np.ndarray) -> ChainArrays:
    b = _copy(a)
    b.node = names
    return b


def _shifted(a: ChainArrays, shifts, names: np.ndarray, period: int):
    """The batch with every slot of a moved input shifted (and its READ/WRITE's address), or
    None where a slot would move by two different amounts or a non-MEM instruction touches one."""
    starts = np.cumsum([0] + [g.size for g, _, _ in shifts])
    grids = np.concatenate([g.reshape(-1) for g, _, _ in shifts]).astype(np.int64)
    lo, table = RC.shift_table(grids, np.array([w for _, w, _ in shifts], np.int64),
                               np.array([d for _, _, d in shifts], np.int64), starts)
    if lo < 0:                                    # a slot that would move by two amounts
        return None
    ok, r_data, w_data, args = RC.shift_slots(lo, table, a.r_ptr, a.r_data, a.w_ptr, a.w_data, a.op, a.args,
                                              period, _ADDR, O.READ, O.WRITE)
    if not ok:
        return None
    b = _renamed(a, names)
    b.r_data, b.w_data, b.args = r_data, w_data, args
    return b
