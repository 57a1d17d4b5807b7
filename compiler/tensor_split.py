"""Tensor parallel: one IR graph split over the N chips (ranks) of a node, Megatron style.

Every value of the graph gets a placement:

  rep        every rank holds it whole (norms, residuals, the inputs);
  split ax   rank r holds part r of axis ax (size / N each);
  own r      only rank r computes it (a head whose columns lie in rank r's part);
  partial    every rank holds a summand of it (a row-split matmul): an all-reduce follows.

Weights take the placement their use asks for: x @ W with x whole splits W by columns (its
last axis) and gives a split result; x @ W with x split on its last axis splits W by rows and
gives a partial sum, all-reduced at once; a weight used elementwise beside a split value (a
per-column scale) is split the same way. Slices of a split value that fall inside one rank's
part (the heads of q, of the KV cache) are owned by that rank; a concat of owned parts in rank
order (the heads joined) is split again. A state stored from a split value (the KV cache
written from split k and v) is split on that axis.

The rank graph (`TpGraph.graph`) is what every rank runs: one graph, the same for every rank
(the parts differ only in which slice of each weight and state the host loads: `TpGraph.split`,
name -> axis), so the ranks are compiled once. An all-reduce k of a partial P becomes in the
rank graph: an output `@ar{k}>` (P, sent on every link to the other ranks), inputs
`@ar{k}.{j}` (the summand that arrives on link j) and P + @ar{k}.0 + ... (the sum, whole on
every rank; each rank adds its own summand first, so the ranks' sums may differ in rounding).
compiler/system.py places the transfers. Anything else (a split reduced, an output that is
not whole, parts not in rank order) raises TpError: the program is not split this way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph

AR_PREFIX = "@ar"


class TpError(Exception):
    pass


def ar_out(k: int) -> str:
    return f"{AR_PREFIX}{k}>"


def ar_in(k: int, j: int) -> str:
    return f"{AR_PREFIX}{k}.{j}"


@dataclass
class TpGraph:
    graph: IRGraph                  # every rank's graph
    ranks: int
    split: dict = field(default_factory=dict)      # leaf name -> axis split over the ranks
    allreduce: list = field(default_factory=list)  # per all-reduce k: (shape, dtype, DSL line)

    def part(self, name: str, shape, rank: int) -> tuple:
        """The index (per axis (start, stop)) of rank's part of the leaf `name` of `shape`."""
        ax = self.split.get(name)
        idx = [(0, s) for s in shape]
        if ax is not None:
            c = shape[ax] // self.ranks
            idx[ax] = (rank * c, (rank + 1) * c)
        return tuple(idx)


REP, W = ("rep",), ("w",)


def _split(ax):
    return ("split", ax)


def _own(r):
    return ("own", r)


class _Lazy(dict):
    """Rank-graph ids; a leaf (input, const) is added where it is first used, so that every
    rank's graph has its nodes in the same order."""

    def __init__(self, sp):
        super().__init__()
        self.sp = sp

    def __missing__(self, nid):
        sp = self.sp
        n = sp.g.node(nid)
        if n.op not in ("input", "const"):
            raise KeyError(nid)
        i = self[nid] = sp.add(n, [], REP)
        if n.op == "input":
            sp.out.decls[n.attrs["name"]] = i
        return i


class _Splitter:
    def __init__(self, g: IRGraph, n: int, rank: int, axes: dict | None = None, own_used=frozenset()):
        self.g, self.n, self.rank, self.axes, self.own_used = g, n, rank, axes, own_used
        self.out = IRGraph(g.source_name, g.source)
        self.out.params = dict(g.params)
        self.pl: dict = {}            # node id -> placement
        self.new = _Lazy(self)        # node id -> rank-graph id (rep / split / own by this rank)
        self.wnew: dict = {}          # (node id, axis or None) -> rank-graph id of a weight view
        self.leaf_ax: dict = {}       # leaf id -> axis or None (whole)
        self.tp = TpGraph(self.out, n)
        self.mark: dict = {}          # node id -> rank-graph nodes made before it

    def fail(self, n, why):
        raise TpError(f"{self.g.source_name}:{n.line}: {n.op}: {why}")

    def chunk(self, n, ax):
        if n.shape[ax] % self.n:
            self.fail(n, f"axis {ax} of {list(n.shape)} does not split {self.n} ways")
        return n.shape[ax] // self.n

    def local_shape(self, n, p):
        s = list(n.shape)
        if p[0] == "split":
            s[p[1]] = self.chunk(n, p[1])
        return tuple(s)

    def add(self, n, ins, p, attrs=None, shape=None):
        return self.out.add(n.op, ins, shape or self.local_shape(n, p), n.dtype,
                            dict(n.attrs) if attrs is None else attrs, n.line, n.col)

    # ---- weights and states: placed by their use ------------------------------------------
    def want(self, nid, ax):
        """The rank-graph node of weight view `nid` split on axis ax (None: whole)."""
        key = (nid, ax)
        if key in self.wnew:
            return self.wnew[key]
        n = self.g.node(nid)
        if n.op in ("weight", "state"):
            got = self.leaf_ax.setdefault(nid, ax)
            if got != ax:
                self.fail(n, f"'{n.attrs['name']}' is used split on axis {ax} and on axis {got}")
            if ax is not None:
                self.chunk(n, ax)
                self.tp.split[n.attrs["name"]] = ax
            i = self.add(n, [], _split(ax) if ax is not None else REP)
            self.out.decls[n.attrs["name"]] = i
            if n.op == "state":
                self.out.final_states[n.attrs["name"]] = i
        elif n.op == "cast":
            i = self.add(n, [self.want(n.inputs[0], ax)], _split(ax) if ax is not None else REP)
        elif n.op == "transpose":
            perm = list(n.attrs["perm"])
            i = self.add(n, [self.want(n.inputs[0], None if ax is None else perm[ax])],
                         _split(ax) if ax is not None else REP)
        elif n.op == "slice":
            src = self.g.node(n.inputs[0])
            idx = list(n.attrs["index"])
            kept = [a for a, e in enumerate(idx) if not isinstance(e, int)] + list(range(len(idx), len(src.shape)))
            if ax is None:
                i = self.add(n, [self.want(n.inputs[0], None)], REP)
            else:
                sax = kept[ax]
                if sax < len(idx) and tuple(idx[sax]) != (0, src.shape[sax]):
                    self.fail(n, "a weight sliced on the axis it is split on")
                if sax < len(idx):
                    idx[sax] = (0, self.chunk(src, sax))
                i = self.add(n, [self.want(n.inputs[0], sax)], _split(ax), dict(n.attrs, index=tuple(idx)))
        elif ax is None and n.op == "reshape":
            i = self.add(n, [self.want(n.inputs[0], None)], REP)
        else:
            self.fail(n, "a weight reshaped and split")
        self.wnew[key] = i
        return i

    def get(self, nid, p):
        """The rank-graph node of input `nid` as placement p asks (W nodes resolved)."""
        if self.pl[nid] == W:
            return self.want(nid, p[1] if p[0] == "split" else None)
        return self.new[nid]

    # ---- the walk -----------------------------------------------------------------------------
    def run(self) -> TpGraph:
        g = self.g
        if self.axes is not None:           # the leaves before the first loop first, as declared
            first = min((t[0][0] for t in g.loops), default=len(g))
            for n in g.nodes():
                if n.id < first and n.op in ops.LEAVES:
                    if n.op in ("weight", "state"):
                        self.want(n.id, self.axes.get(n.id))
                    elif n.id not in self.own_used:     # (a head's constants: where used)
                        self.new[n.id]
        for n in g.nodes():
            self.mark[n.id] = len(self.out)
            if n.op in ("weight", "state"):
                self.pl[n.id] = W
            elif n.op in ops.LEAVES:          # made where first used (the ranks' graphs alike)
                self.pl[n.id] = REP
            else:
                self.node(n)
        for name, leaf in g.decls.items():        # the states' last versions (a state never used: whole)
            if g.node(leaf).op == "state":
                last = g.final_states.get(name, leaf)
                self.out.final_states[name] = self.get(last, REP)
        self._loops()
        return self.tp

    def node(self, n):
        pls = [self.pl[i] for i in n.inputs]
        fam = ops.OPS[n.op].family
        others = {p[1] for p in pls if p[0] == "own" and p[1] != self.rank}
        if others and n.op != "concat":      # another rank's: checked when that rank is built
            self.pl[n.id] = _own(others.pop())
            return
        if n.op in ("cast", "transpose", "slice", "reshape") and pls[0] == W:
            self.pl[n.id] = W
            return
        if n.op == "matmul":
            return self.matmul(n, pls)
        if n.op == "output":
            if pls[0] == W:
                self.want(n.inputs[0], None)
                pls[0] = REP
            if pls[0] != REP:
                self.fail(n, "an output that is not whole on every rank (a gather is not built)")
            o = self.add(n, [self.get(n.inputs[0], REP)], REP)
            self.out.outputs[n.attrs["name"]] = o
            self.pl[n.id] = REP
            return
        if n.op == "store":
            return self.store(n, pls)
        if fam in ("unary", "binary", "compare", "select", "cast", "reduce", "positional"):
            return self.elementwise(n, pls, fam)
        if n.op == "slice":
            return self.slice(n, pls[0])
        if n.op == "transpose":
            p = pls[0]
            if p[0] == "split":
                p = _split(list(n.attrs["perm"]).index(p[1]))
            return self.emit(n, [self.new[n.inputs[0]]], p)
        if n.op == "reshape":
            p = pls[0]
            if p[0] == "split":
                p = _split(self.reshaped_axis(n, p[1]))
                return self.emit(n, [self.new[n.inputs[0]]], p, dict(n.attrs, shape=self.local_shape(n, p)))
            return self.emit(n, [self.new[n.inputs[0]]], p)
        if n.op == "concat":
            return self.concat(n, pls)
        self.fail(n, "not split for tensor parallel")

    def reshaped_axis(self, n, ax):
        """Axis ax of a reshape's input in its output, where the reshape only adds or drops
        axes of size 1 (else TpError)."""
        src = self.g.node(n.inputs[0]).shape
        a = [i for i, s in enumerate(src) if s != 1]
        b = [i for i, s in enumerate(n.shape) if s != 1]
        if [src[i] for i in a] != [n.shape[i] for i in b] or ax not in a:
            self.fail(n, "a split value reshaped")
        return b[a.index(ax)]

    def emit(self, n, ins, p, attrs=None):
        self.pl[n.id] = p
        if p[0] != "own" or p[1] == self.rank:
            self.new[n.id] = self.add(n, ins, p, attrs)

    def elementwise(self, n, pls, fam):
        nd = len(n.shape)
        owns = {p[1] for p in pls if p[0] == "own"}
        splits = {p[1] + nd - len(self.g.node(i).shape) for i, p in zip(n.inputs, pls) if p[0] == "split"}
        if len(owns) > 1 or len(splits) > 1 or (owns and splits):
            self.fail(n, "operands split in different ways")
        if owns:
            p = _own(owns.pop())
            if p[1] != self.rank:
                self.pl[n.id] = p
                return
            return self.emit(n, [self.get(i, REP) for i in n.inputs], p)
        if not splits:
            return self.emit(n, [self.get(i, REP) for i in n.inputs], REP)
        ax = splits.pop()
        if fam == "reduce" and n.attrs["axis"] == ax:
            self.fail(n, "a reduction over the split axis")
        if fam == "positional" and ax >= nd - (1 if n.op == "rope" else 2):
            self.fail(n, "a positional op across the split axis")
        ins = []
        for i, p in zip(n.inputs, pls):
            x = self.g.node(i)
            iax = ax - (nd - len(x.shape))
            bcast = iax < 0 or x.shape[iax] == 1
            if p[0] == "split" or bcast:
                ins.append(self.get(i, REP) if p == W else self.new[i])
            elif p == W:
                ins.append(self.want(i, iax))
            else:
                self.fail(n, "a whole value beside a split one (a per-rank slice is not built)")
        self.emit(n, ins, _split(ax))

    def matmul(self, n, pls):
        a, b = pls
        na, nb = self.g.node(n.inputs[0]), self.g.node(n.inputs[1])
        if b == W and a == W:
            self.fail(n, "a product of two weights")
        if b == W:
            if a == REP:                       # column parallel
                return self.emit(n, [self.new[n.inputs[0]], self.want(n.inputs[1], len(nb.shape) - 1)],
                                 _split(len(n.shape) - 1))
            if a == _split(len(na.shape) - 1):    # row parallel: a partial sum, all-reduced
                part = self.add(n, [self.new[n.inputs[0]], self.want(n.inputs[1], len(nb.shape) - 2)], REP)
                self.pl[n.id] = REP
                self.new[n.id] = self.allreduce(n, part)
                return
            if a[0] == "own":
                if a[1] != self.rank:
                    self.pl[n.id] = a
                    return
                return self.emit(n, [self.new[n.inputs[0]], self.want(n.inputs[1], None)], a)
            self.fail(n, "a weight product of a value split on a row axis")
        if a == W:
            self.fail(n, "a weight as the left operand")
        return self.elementwise_like_matmul(n, a, b)

    def elementwise_like_matmul(self, n, a, b):
        if a == REP and b == REP:
            return self.emit(n, [self.new[i] for i in n.inputs], REP)
        owns = {p[1] for p in (a, b) if p[0] == "own"}
        if owns and all(p[0] in ("own", "rep") for p in (a, b)) and len(owns) == 1:
            p = _own(owns.pop())
            if p[1] != self.rank:
                self.pl[n.id] = p
                return
            return self.emit(n, [self.new[i] for i in n.inputs], p)
        self.fail(n, "a product of values split this way")

    def allreduce(self, n, part):
        k = len(self.tp.allreduce)
        self.tp.allreduce.append((tuple(n.shape), n.dtype, n.line))
        o = self.out
        o.outputs[ar_out(k)] = o.add("output", [part], n.shape, n.dtype, {"name": ar_out(k)}, n.line, n.col)
        total = part
        for j in range(self.n - 1):
            r = o.add("input", [], n.shape, n.dtype, {"name": ar_in(k, j)}, n.line, n.col)
            o.decls[ar_in(k, j)] = r
            total = o.add("add", [total, r], n.shape, n.dtype, {}, n.line, n.col)
        return total

    def slice(self, n, p):
        src = self.g.node(n.inputs[0])
        if p[0] == "own" and p[1] != self.rank:
            self.pl[n.id] = p
            return
        if p[0] != "split":
            return self.emit(n, [self.new[n.inputs[0]]], p)
        idx = list(n.attrs["index"])
        ax = p[1]
        e = idx[ax] if ax < len(idx) else (0, src.shape[ax])
        c = self.chunk(src, ax)
        dropped = sum(1 for a in range(ax) if a < len(idx) and isinstance(idx[a], int))
        if not isinstance(e, int) and tuple(e) == (0, src.shape[ax]):
            if ax < len(idx):
                idx[ax] = (0, c)
            return self.emit(n, [self.new[n.inputs[0]]], _split(ax - dropped), dict(n.attrs, index=tuple(idx)))
        lo, hi = (e, e + 1) if isinstance(e, int) else e
        r = lo // c
        if hi > (r + 1) * c:
            self.fail(n, f"a slice [{lo}:{hi}] across the parts of {self.n} ranks ({c} each)")
        idx[ax] = e - r * c if isinstance(e, int) else (lo - r * c, hi - r * c)
        return self.emit(n, [self.new[n.inputs[0]]] if r == self.rank else [], _own(r), dict(n.attrs, index=tuple(idx)))

    def concat(self, n, pls):
        ax = n.attrs["axis"]
        if all(p == REP for p in pls):
            return self.emit(n, [self.new[i] for i in n.inputs], REP)
        if all(p[0] == "split" and p == pls[0] and p[1] != ax for p in pls):
            return self.emit(n, [self.new[i] for i in n.inputs], pls[0])
        if all(p[0] == "own" for p in pls):
            ranks = [p[1] for p in pls]
            per = len(ranks) // self.n
            sizes = {self.g.node(i).shape[ax] for i in n.inputs}
            if per and len(sizes) == 1 and ranks == [k // per for k in range(len(ranks))]:
                mine = [self.new[i] for i, p in zip(n.inputs, pls) if p[1] == self.rank]
                return self.emit(n, mine, _split(ax))
            if len(set(ranks)) == 1:
                return self.emit(n, [self.new[i] for i in n.inputs] if ranks[0] == self.rank else [], pls[0])
        self.fail(n, "a concat of parts that are not in rank order")

    def store(self, n, pls):
        st, v = n.inputs
        sn, vn = self.g.node(st), self.g.node(v)
        idx = list(n.attrs["index"])
        ps, pv = pls
        if pv[0] == "own":
            self.fail(n, "a store of a value one rank holds")
        if pv[0] == "split":
            sax = pv[1] + len(sn.shape) - len(vn.shape)
            if sax < len(idx) and tuple(idx[sax]) != (0, sn.shape[sax]):
                self.fail(n, "a store of a split value into part of the split axis")
            if ps == W:
                old = self.want(st, sax)
            elif ps == _split(sax):
                old = self.new[st]
            else:
                self.fail(n, "a split value stored into a state held whole")
            if sax < len(idx):
                idx[sax] = (0, self.chunk(sn, sax))
            return self.emit(n, [old, self.new[v]], _split(sax), dict(n.attrs, index=tuple(idx)))
        if ps[0] == "split":
            self.fail(n, "a whole value stored into a split state")
        return self.emit(n, [self.get(st, REP), self.get(v, REP)], REP)

    def _loops(self):
        """Each top-level loop's trips as rank-graph id ranges (as partition._map_loops does)."""
        end = len(self.out)
        for trips in getattr(self.g, "loops", []) or []:
            mapped = [(self.mark[a], self.mark.get(b, end)) for a, b in trips]
            if len(mapped) > 1:
                self.out.loops.append(mapped)


def split_graph(graph: IRGraph, ranks: int) -> TpGraph:
    """The rank graph of `graph` over `ranks` ranks; TpError where the graph does not split so,
    or where the ranks' graphs would differ (the ranks share one compile)."""
    first = _Splitter(graph, ranks, 0)
    first.run()
    axes = dict(first.leaf_ax)
    own_used = {i for n in graph.nodes() if first.pl.get(n.id, REP)[0] == "own" for i in n.inputs}
    tp = _Splitter(graph, ranks, 0, axes, own_used).run()
    sig = _signature(tp.graph)
    for r in range(1, ranks):
        other = _Splitter(graph, ranks, r, axes, own_used).run()
        if _signature(other.graph) != sig:
            raise TpError(f"{graph.source_name}: the ranks' parts differ (rank {r} is not rank 0's like); "
                          f"the graph is not split {ranks} ways")
    return tp


def _signature(g: IRGraph):
    out = []
    for n in g.nodes():
        a = {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in n.attrs.items()}
        out.append((n.op, n.inputs, n.shape, n.dtype, repr(sorted(a.items()))))
    return out, sorted(g.outputs), sorted(g.decls)
