"""Pipeline partitioning: split an IR graph into consecutive stages, one per chip.

The compute nodes (every node but leaves and outputs), in program order, are cut into runs.
A leaf (input, weight, const) goes to every stage that uses it (a weight used by two stages
is held by both); a state, its stores and its uses must lie in one stage (a cut that splits
them is not taken); an output goes with the stage of its value.

Stacked tensors (`weight w : f16[L, D, D]` read as `w[l]`, `state kc : f16[L, C, D]` stored as
`kc[l, ...] <- v`): a weight or state of which every use is a slice or store with a constant
range on axis 0 is *split*: a stage holds only the rows of axis 0 it uses (`Stage.rows`: name ->
(start, stop); the host loads value[start:stop] on that chip and puts a state's rows back from
there), with its slices and stores shifted. A split state may be cut between its rows, never
inside one row's uses. A value computed in stage a
and used in a later stage b crosses: stage a outputs it and stage b takes it as an input, both
named `@<node id>>` and `@<node id>` (no DSL name has an `@`), and the system compiler
(compiler/system.py) moves it over the link from chip a to chip b.

Cuts: each stage aims at an equal share of the bytes of weights and states not yet placed;
around that point (within a tenth of a share) the cut where the fewest bytes cross is taken,
among the cuts whose stage fits a chip (`choose_cuts`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lpu.compiler.ir import LEAVES, IRGraph

LINK_PREFIX = "@"


def link_name(nid: int) -> str:
    """The name of value `nid` where a stage receives it."""
    return f"{LINK_PREFIX}{nid}"


def send_name(nid: int) -> str:
    """The name of value `nid` where a stage sends it (a relay receives and sends it)."""
    return f"{LINK_PREFIX}{nid}>"


RELAY_SUFFIX = "^"


def relay_name(nid: int) -> str:
    """The name of value `nid` where a chip relays part of it on a cut's second path
    (compiler/system_pp.py): not an input of the stage's program, only a buffer."""
    return f"{LINK_PREFIX}{nid}{RELAY_SUFFIX}"


@dataclass
class Stage:
    graph: IRGraph
    nodes: list                  # compute node ids of the original graph
    recv: list = field(default_factory=list)   # [(original node id, from stage)]
    send: list = field(default_factory=list)   # [(original node id, to stage)]
    rows: dict = field(default_factory=dict)   # split leaf name -> (start, stop) of axis 0 held here


def _row_range(n, version: int):
    """(start, stop) on axis 0 of a slice or store of `version` with a constant range there, or None."""
    if n.op == "slice" and n.inputs[0] == version:
        i = n.attrs["index"][0]
    elif n.op == "store" and n.inputs[0] == version and version not in n.inputs[1:]:
        i = n.attrs["index"][0]
    else:
        return None
    return (i, i + 1) if isinstance(i, int) else (int(i[0]), int(i[1]))


def split_uses(graph: IRGraph, leaf: int):
    """Every use of a weight or state leaf (through a state's versions): [(node id, (start, stop))],
    or None if some use is not a slice or store with a constant range on axis 0."""
    n0 = graph.node(leaf)
    if n0.op not in ("weight", "state") or len(n0.shape) < 2:
        return None
    uses, todo = [], [leaf]
    while todo:
        v = todo.pop()
        for u in graph.users(v):
            un = graph.node(u)
            r = _row_range(un, v)
            if r is None:
                return None
            uses.append((u, r))
            if un.op == "store":
                todo.append(u)
    return uses or None


def _split_versions(graph: IRGraph) -> set:
    """The stores (new versions) of split states."""
    return {u for leaf in graph.decls.values() for u, _ in (split_uses(graph, leaf) or ())
            if graph.node(u).op == "store"}


def _compute(graph: IRGraph) -> list:
    return [n for n in graph.nodes() if n.op not in LEAVES and n.op != "output"]


def _state_spans(graph: IRGraph, pos: dict) -> list[tuple[int, int]]:
    """(first, last) compute position touching each state (its versions' users and stores), or
    each row of a split state: no cut may fall inside such a span."""
    spans = []
    for name, leaf in graph.decls.items():
        if graph.node(leaf).op != "state":
            continue
        uses = split_uses(graph, leaf)
        if uses:
            rows = {}
            for u, (a, b) in uses:
                for r in range(a, b):
                    rows.setdefault(r, []).append(pos[u])
            spans += [(min(p), max(p)) for p in rows.values()]
            continue
        touched = []
        todo = [leaf]
        while todo:
            v = todo.pop()
            for u in graph.users(v):
                if u in pos:
                    touched.append(pos[u])
                    if graph.node(u).op == "store" and graph.node(u).inputs[0] == v:
                        todo.append(u)
        if touched:
            spans.append((min(touched), max(touched)))
    return spans


def cut_costs(graph: IRGraph):
    """(compute nodes, resident bytes attributed to each, bytes crossing a cut before each
    position, allowed[k]: a cut before position k keeps every state in one stage). Kept on the
    graph (--chips auto asks for several chip counts)."""
    key = len(graph)
    hit = graph.__dict__.get("_cut_costs")
    if hit is not None and hit[0] == key:
        return hit[1]
    out = _cut_costs(graph)
    graph.__dict__["_cut_costs"] = (key, out)
    return out


def _cut_costs(graph: IRGraph):
    comp = _compute(graph)
    pos = {n.id: i for i, n in enumerate(comp)}
    k = len(comp)
    resident = np.zeros(k, np.int64)
    for n in graph.nodes():
        if n.op in ("weight", "state", "const"):
            uses = split_uses(graph, n.id)
            if uses:                       # each row counts where it is first used
                per_row, seen = n.nbytes // n.shape[0], set()
                for u, (a, b) in sorted(uses, key=lambda x: pos[x[0]]):
                    new = set(range(a, b)) - seen
                    resident[pos[u]] += per_row * len(new)
                    seen |= new
                continue
            users = [pos[u] for u in graph.users(n.id) if u in pos]
            if users:
                resident[min(users)] += n.nbytes
    # value of compute node i crosses a cut before k if i < k <= last user position (a split
    # state's versions stay: each chip keeps its rows)
    versions = _split_versions(graph)
    delta = np.zeros(k + 1, np.int64)
    for i, n in enumerate(comp):
        if n.id in versions:
            continue
        last = max((pos[u] for u in graph.users(n.id) if u in pos), default=i)
        if last > i:
            delta[i + 1] += n.nbytes
            delta[last + 1] -= n.nbytes
    crossing = np.cumsum(delta)[:k + 1]
    allowed = np.ones(k + 1, bool)
    allowed[0] = allowed[k] = False
    for a, b in _state_spans(graph, pos):
        allowed[a + 1:b + 1] = False
    return comp, resident, crossing, allowed


def choose_cuts(graph: IRGraph, chips: int, capacity: int | None = None, costs=None) -> list[int]:
    """Positions (into the compute nodes) where stages 1 .. chips-1 begin. Each stage aims at an
    equal share of the bytes not yet placed; near that point (a tenth of a share either way) the
    cut where the fewest bytes cross is taken. With `capacity` (bytes a chip can hold for the
    stage's resident tensors and the values it receives and sends), only cuts within it are
    taken while there are any (the farthest such, when none is near the aim). costs: cut_costs
    of the graph, if already computed."""
    comp, resident, crossing, allowed = costs or cut_costs(graph)
    k = len(comp)
    if chips > 1 and np.count_nonzero(allowed) < chips - 1:
        raise ValueError(f"the program has {np.count_nonzero(allowed) + 1} places to cut it at most, "
                         f"{chips} chips need {chips - 1}")
    weight = resident if resident.sum() > 0 else np.ones(k, np.int64)
    before = np.concatenate([[0], np.cumsum(weight)])      # bytes before position k
    total = int(before[-1])
    cuts, prev = [], 0
    for i in range(1, chips):
        share = (total - before[prev]) / (chips - i + 1)
        target, slack = before[prev] + share, share / 10
        cand = np.flatnonzero(allowed[prev + 1:k - (chips - 1 - i)]) + prev + 1
        if not len(cand):
            raise ValueError(f"no place to cut the program into {chips} stages")
        fits = cand[before[cand] - before[prev] + crossing[prev] + crossing[cand] <= capacity] if capacity else cand
        if capacity and len(fits):
            cand = fits
        near = cand[np.abs(before[cand] - target) <= slack]
        if len(near):      # the fewest bytes crossing, then nearest the aim, then the first
            best = near[np.lexsort((near, np.abs(before[near] - target), crossing[near]))[0]]
        elif capacity and len(fits) and before[fits[-1]] < target:
            best = fits[-1]                  # the aim does not fit: as far as fits
        else:
            best = cand[np.lexsort((cand, crossing[cand], np.abs(before[cand] - target)))[0]]
        cuts.append(int(best))
        prev = int(best)
    return cuts


def stage_bytes(costs, cuts: list[int]) -> list[int]:
    """Per stage of the cuts: its resident bytes plus the bytes it receives and sends."""
    comp, resident, crossing, _ = costs
    b = [0] + list(cuts) + [len(comp)]
    return [int(resident[b[i]:b[i + 1]].sum()) + int(crossing[b[i]]) + int(crossing[b[i + 1]])
            for i in range(len(b) - 1)]


def fewest_chips(graph: IRGraph, start: int, top: int, capacity: int) -> int:
    """The fewest chips from `start` (at most `top`) whose cuts keep every stage within
    `capacity`, or `start` if no count up to `top` does (the compile then says which stage is
    too large). Cheap beside compiling: a count too small is found here, not by compiling
    every stage up to the one that does not fit."""
    costs = cut_costs(graph)
    for n in range(max(1, start), top + 1):
        if n == 1:
            if int(costs[1].sum()) <= capacity:
                return 1
            continue
        try:
            cuts = choose_cuts(graph, n, capacity, costs)
        except ValueError:
            return start
        if max(stage_bytes(costs, cuts)) <= capacity:
            return n
    return start


def split(graph: IRGraph, cuts: list[int], route=None) -> list[Stage]:
    """The stage graphs of the cuts (positions into the compute nodes). route(a, b): the stages a
    value from stage a to stage b passes (default: straight there); each stage in between relays
    it (receives it as an input and sends it on as an output of the same name)."""
    comp = _compute(graph)
    bounds = [0] + list(cuts) + [len(comp)]
    stage_of = {}
    for s in range(len(bounds) - 1):
        for n in comp[bounds[s]:bounds[s + 1]]:
            stage_of[n.id] = s
    stages = [Stage(IRGraph(graph.source_name, graph.source), [n.id for n in comp[bounds[s]:bounds[s + 1]]])
              for s in range(len(bounds) - 1)]
    versions = _split_versions(graph)          # a split state's rows stay where they are
    crossings = {}                         # (node, stage) -> True
    for n in comp:
        if n.id in versions:
            continue
        for u in graph.users(n.id):
            if u in stage_of and stage_of[u] != stage_of[n.id]:
                crossings[(n.id, stage_of[u])] = True
    hops = {}
    for nid, to in crossings:
        path = route(stage_of[nid], to) if route else [stage_of[nid], to]
        for a, b in zip(path, path[1:]):
            hops[(nid, a, b)] = True
    for nid, a, b in hops:
        stages[a].send.append((nid, b))
        stages[b].recv.append((nid, a))
    uses = {leaf: split_uses(graph, leaf) for leaf in graph.decls.values()}
    for s, st in enumerate(stages):
        _build(graph, st, s, stage_of, uses)
    return stages


def _build(graph: IRGraph, st: Stage, s: int, stage_of: dict, leaf_uses: dict) -> None:
    g = st.graph
    g.params = dict(graph.params)
    new = {}
    mine = set(st.nodes)
    incoming = {nid for nid, _ in st.recv}
    split = {}                               # leaf id -> (start, stop) held here
    version_of = {}                          # a split state's version (node id) -> its leaf id
    for name, leaf in graph.decls.items():
        uses = leaf_uses[leaf]
        if not uses:
            continue
        for u, _ in uses:
            if graph.node(u).op == "store":
                version_of[u] = leaf
        here = [r for u, r in uses if u in mine]
        if here:
            split[leaf] = (min(a for a, _ in here), max(b for _, b in here))
            st.rows[name] = split[leaf]
    current = {}                             # split state leaf -> this stage's latest version

    def ref(i):
        leaf = version_of.get(i, i)
        if leaf in split:                    # a split leaf (or a state version): this stage's rows
            if leaf not in current:
                n = graph.node(leaf)
                a, b = split[leaf]
                current[leaf] = g.add(n.op, [], (b - a,) + tuple(n.shape[1:]), n.dtype, dict(n.attrs), n.line, n.col)
                g.decls[n.attrs["name"]] = current[leaf]
                if n.op == "state":
                    g.final_states[n.attrs["name"]] = current[leaf]
            return current[leaf]
        if i not in new:                  # a leaf used here, or a value received over a link
            n = graph.node(i)
            if i in incoming:
                new[i] = g.add("input", [], n.shape, n.dtype, {"name": link_name(i)}, n.line, n.col)
                g.decls[link_name(i)] = new[i]
            else:
                assert n.op in LEAVES, (n.op, i)
                new[i] = g.add(n.op, [], n.shape, n.dtype, dict(n.attrs), n.line, n.col)
                if "name" in n.attrs and n.op != "const":
                    g.decls[n.attrs["name"]] = new[i]
                    if n.op == "state":
                        g.final_states[n.attrs["name"]] = new[i]
        return new[i]

    for nid in st.nodes:                     # leaves first, so that a loop's trips stay alike
        for i in graph.node(nid).inputs:
            if i not in mine:
                ref(i)
    for n in map(graph.node, sorted(mine.union(graph.outputs.values()))):    # its nodes and the outputs
        if n.id in mine:
            ins = [ref(i) for i in n.inputs]
            attrs, shape = dict(n.attrs), n.shape
            leaf = version_of.get(n.inputs[0], n.inputs[0]) if n.inputs else None
            if leaf in split and n.op in ("slice", "store"):
                a, b = split[leaf]
                i0 = attrs["index"][0]
                attrs["index"] = ((i0 - a) if isinstance(i0, int) else (i0[0] - a, i0[1] - a),) + \
                    tuple(attrs["index"][1:])
                if n.op == "store":
                    shape = (b - a,) + tuple(shape[1:])
            new[n.id] = g.add(n.op, ins, shape, n.dtype, attrs, n.line, n.col)
            if n.op == "store":
                g.final_states[n.attrs["name"]] = new[n.id]
                if leaf in split:
                    current[leaf] = new[n.id]
        elif n.op == "output" and stage_of.get(n.inputs[0], _leaf_stage(graph, n.inputs[0], s)) == s:
            o = g.add("output", [ref(n.inputs[0])], n.shape, n.dtype, dict(n.attrs), n.line, n.col)
            g.outputs[n.attrs["name"]] = o
    _map_loops(graph, g, new, mine)
    for nid, _ in st.send:
        if send_name(nid) not in g.outputs:
            n = graph.node(nid)
            g.outputs[send_name(nid)] = g.add("output", [ref(nid)], n.shape, n.dtype,
                                              {"name": send_name(nid)}, n.line, n.col)


def _map_loops(graph: IRGraph, g: IRGraph, new: dict, mine: set) -> None:
    """The stage's part of each top-level loop's trips (`IRGraph.loops`, where the IR records
    them: lowering replays alike trips), as node-id ranges of the stage graph."""
    loops = getattr(graph, "loops", None)
    if loops is None or not hasattr(g, "loops"):
        return
    for trips in loops:
        mapped = []
        for a, b in trips:
            ids = [new[i] for i in range(a, b) if i in mine]
            if ids and ids[-1] - ids[0] + 1 == len(ids):
                mapped.append((ids[0], ids[-1] + 1))
        if len(mapped) > 1:
            g.loops.append(mapped)


def _leaf_stage(graph: IRGraph, nid: int, s: int) -> int:
    """An output of a leaf (a declared tensor output as it is): the first stage owns it."""
    return 0
