"""A lower bound on the cycles of any pipeline schedule of a graph over given cuts (compiler/
partition.py), from the IR, the machine config and the link latencies alone, without
compiling a stage. `--parallel auto` (compiler/system.py) compiles tensor parallel first and
skips compiling the pipeline when this bound already exceeds tensor parallel's cycles: the
pipeline it would have compiled cannot win, so the choice is the one comparing both schedules.

The bound follows, for every node, the earliest cycle F at which any element of it can exist
and the earliest cycle L by which all of them can (leaves: 0), through three rules:

- data: an element exists after the elements it is computed from. Every element of an
  elementwise op, matmul, reduction or rope output uses an element of each input (F >= the
  inputs' F), and every input element is used by some output element (L >= the inputs' L);
  a slice keeps F, a concat takes the earliest part's F and the latest part's L, a store's new
  version the old version's or the value's F and the value's L. Barriers: an output element of
  a matmul whose left operand is one row needs that whole row (F >= its L), and so does a
  reduction of one row (F >= its input's L).
- links: a value computed on chip a reaches chip b no earlier than one hop latency
  (isa/system.py `hop_between`) after it exists on a.
- streams: an anchor `a` (a reduction of one row of more than `lanes` elements, or a value's
  arrival on a chip) exists from F(a) on. Take the elements of declared tensors (weights,
  states, inputs; not constants) that a target node needs, where they first meet another
  operand at an op on chip c whose other operand depends element by element on a (a weight at
  its matmul, a scale at its multiply, cache rows at q @ k.T): each meets an element that exists
  only from F(a) on, in a unit, so its value (or what the chip computed from it) reaches a unit
  after F(a). A unit receives values on streams, except what an MXM plane holds installed or in
  its weight buffer; the streams deliver at most stream_bytes_per_cycle a cycle (the one-chip
  bound's rule, benchmarks/bounds.py) plus what is on them at F(a) (`held_bytes` counts both
  exceptions). So L(target) >= F(a) + (needed bytes - held_bytes) / stream_bytes_per_cycle,
  each element at its declared dtype's width (weight-only i8 is converted by LW: 1 byte).
  Needed elements are found by following boxes of each value backwards through slices,
  concats, stores (a store's region to its value, the other rows to the declared state) and
  broadcasts, down to the declarations.

The cycles of any schedule are at least L of the outputs. Like benchmarks/bounds.py, this
assumes that a matmul computes its whole product (the compiler narrows none), and that the
compiler's rewrites keep each declared element's product with the value it meets (they mask,
split and join products, as rewrite_decode, rewrite_pack, split_gemv do; none folds a weight
into another tensor before the step's input arrives).

llama2_7b_decode on 40 chips (tsp-v1): 267,746 cycles, found in about 1.5 s; tensor parallel
compiles to 254,255, so auto does not compile the pipeline. The bound is below the stream
figure of all weights (about 318k cycles) where a cut falls inside a layer: gate and up on one
chip, down on the next may stream at the same time, and each chip may hold held_bytes ahead.
"""
from __future__ import annotations

import math

from lpu.compiler import partition as P
from lpu.compiler.ops import ELEMENTWISE, LEAVES, OPS, REDUCE, UNARY
from lpu.isa.dtypes import dtype_width

# every output element uses an element of each input, every input element is used
SELECT = frozenset(d.name for d in OPS.values() if d.family == "select")
_EACH = (ELEMENTWISE - SELECT) | REDUCE | {"matmul", "rope", "output", "reshape", "transpose"}
_VIEWS = frozenset({"slice", "reshape", "transpose"})
MAX_BOXES = 256          # regions followed per value (fewer: fewer bytes counted, still a bound)


def held_bytes(m) -> int:
    """Bytes of a value that a unit can use after a cycle t without a stream bringing it after
    t: a stream is a chain of registers, one vector a stream at each position, and every value
    read from SRAM, an accumulator (ACC), a transpose buffer or a link (RECV) reaches a unit on
    one; the values on a stream at t are those on diagonals written up to a unit's latency before
    t and still crossing the positions. Besides those, only what an MXM plane holds without a
    stream: its installed weights and the weight buffer an IW installs from (f16: 2 bytes a
    weight). So over cycles t .. t+d the units receive at most
    held_bytes + d x stream_bytes_per_cycle bytes."""
    streams = 2 * m.streams_per_direction * m.lanes * (m.n_positions + max(m.latency.values()))
    return streams + m.mxm_planes * 2 * 2 * m.lanes * m.lanes


def _rows(shape, skip=None) -> int:
    return math.prod(d for ax, d in enumerate(shape) if ax != skip)


def _barrier(graph, n) -> int | None:
    """The input whose every element each output element of n needs, or None."""
    if n.op == "matmul" and _rows(graph.node(n.inputs[0]).shape[:-1]) == 1:
        return n.inputs[0]
    if n.op in REDUCE:
        src = graph.node(n.inputs[0]).shape
        if _rows(src, n.attrs["axis"] % len(src)) == 1:
            return n.inputs[0]
    return None


def _clip(box, shape):
    """Broadcast a box of an op's output onto an input of `shape` (numpy's right alignment)."""
    box = box[len(box) - len(shape):] if len(shape) <= len(box) else None
    if box is None:
        return None
    return tuple((0, 1) if d == 1 else b for b, d in zip(box, shape))


def _back(graph, n, box):
    """[(input id, box of it)] that the elements of n in `box` need (a subset is fine)."""
    if n.op in ELEMENTWISE - SELECT or n.op in ("rope", "output"):
        return [(i, b) for i in n.inputs if (b := _clip(box, graph.node(i).shape)) is not None]
    if n.op in REDUCE:
        src = graph.node(n.inputs[0]).shape
        ax = n.attrs["axis"] % len(src)
        return [(n.inputs[0], tuple((0, src[k]) if k == ax else b for k, b in enumerate(box)))]
    if n.op == "matmul":
        a, w = (graph.node(i) for i in n.inputs)
        if len(a.shape) != len(n.shape) or len(w.shape) != len(n.shape):
            return []
        lead = box[:-2]
        return [(a.id, _clip(lead, a.shape[:-2]) + (box[-2], (0, a.shape[-1]))),
                (w.id, _clip(lead, w.shape[:-2]) + ((0, w.shape[-2]), box[-1]))]
    if n.op == "slice":
        src = graph.node(n.inputs[0]).shape
        out, it = [], iter(box)
        for ax, d in enumerate(src):
            ix = n.attrs["index"][ax] if ax < len(n.attrs["index"]) else (0, d)
            if isinstance(ix, int):
                out.append((ix, ix + 1))
            else:
                lo, hi = next(it)
                out.append((ix[0] + lo, ix[0] + hi))
        return [(n.inputs[0], tuple(out))]
    if n.op == "transpose":
        perm = n.attrs["perm"]
        out = [None] * len(perm)
        for k, p in enumerate(perm):
            out[p] = box[k]
        return [(n.inputs[0], tuple(out))]
    if n.op == "reshape":
        src = graph.node(n.inputs[0]).shape
        if all(b == (0, d) for b, d in zip(box, n.shape)):
            return [(n.inputs[0], tuple((0, d) for d in src))]
        if [d for d in src if d != 1] != [d for d in n.shape if d != 1]:
            return []                       # only unit axes added or dropped are followed
        it = iter(b for b, d in zip(box, n.shape) if d != 1)
        return [(n.inputs[0], tuple((0, 1) if d == 1 else next(it) for d in src))]
    if n.op == "concat":
        ax, off, out = n.attrs["axis"], 0, []
        for i in n.inputs:
            d = graph.node(i).shape[ax]
            lo, hi = max(box[ax][0], off), min(box[ax][1], off + d)
            if lo < hi:
                out.append((i, box[:ax] + ((lo - off, hi - off),) + box[ax + 1:]))
            off += d
        return out
    if n.op == "store":       # the stored region comes from the value (the rest: not followed)
        reg = n.attrs["index"]
        b = [(max(lo, r0), min(hi, r1)) for (lo, hi), (r0, r1) in zip(box, reg)]
        if all(lo < hi for lo, hi in b):
            return [(n.inputs[1], tuple((lo - r0, hi - r0) for (lo, hi), (r0, _) in zip(b, reg)))]
    return []


def _volume(boxes) -> int:
    """Elements in the union of boxes (a sweep over the first axis)."""
    if not boxes:
        return 0
    if len(boxes[0]) == 0:
        return 1
    cuts = sorted({b[0][0] for b in boxes} | {b[0][1] for b in boxes})
    total = 0
    for lo, hi in zip(cuts, cuts[1:]):
        rest = list({b[1:] for b in boxes if b[0][0] <= lo and hi <= b[0][1]})
        total += (hi - lo) * _volume(rest) if rest else 0
    return total


def _minus(box, reg):
    """Box less region, as disjoint boxes."""
    out, box = [], list(box)
    for ax, ((lo, hi), (r0, r1)) in enumerate(zip(box, reg)):
        if r1 <= lo or hi <= r0:
            return out + [tuple(box)]
        if lo < r0:
            out.append(tuple(box[:ax] + [(lo, r0)] + box[ax + 1:]))
        if r1 < hi:
            out.append(tuple(box[:ax] + [(r1, hi)] + box[ax + 1:]))
        box[ax] = (max(lo, r0), min(hi, r1))
    return out


def _old_rows(graph, nid, box):
    """The declared state under version nid (a chain of stores) when no store of the chain
    wrote into `box`, else None."""
    n = graph.node(nid)
    while n.op == "store":
        if all(lo < r1 and r0 < hi for (lo, hi), (r0, r1) in zip(box, n.attrs["index"])):
            return None
        n = graph.node(n.inputs[0])
    return n.id if n.op == "state" else None


_PASS = _VIEWS | UNARY | {"cast", "rope", "concat", "store", "output"}   # no operands meet here


def _needed(graph, target, chip, chip_of) -> dict:
    """(op id, input index) -> bytes of declared tensors (weights, states, inputs) that the
    elements of `target` need and that meet the op's other operands at that op (the first op
    with several operands on the way from the declaration), over the ops on `chip`."""
    todo, seen = [target], {target}
    while todo:                                  # the ancestors on this chip
        for j in graph.node(todo.pop()).inputs:
            if j not in seen and (chip_of.get(j) == chip or graph.node(j).op in LEAVES):
                seen.add(j)
                todo.append(j)
    boxes = {target: {(tuple((0, d) for d in graph.node(target).shape), None)}}
    leaf = {}                                    # (leaf, tag) -> boxes
    for nid in sorted(seen, reverse=True):
        n = graph.node(nid)
        mine = boxes.pop(nid, ())
        if n.op in LEAVES:
            for b, tag in mine:
                if tag is not None and n.op != "const":
                    leaf.setdefault((nid, tag), []).append(b)
            continue
        for b, tag in mine:
            if n.op == "store":              # rows no store overwrote: the declared state's
                for r in _minus(b, n.attrs["index"]):
                    if (o := _old_rows(graph, n.inputs[0], r)) is not None and tag is not None:
                        leaf.setdefault((o, tag), []).append(r)
            for i, ib in _back(graph, n, b):
                t = tag if n.op in _PASS else (nid, n.inputs.index(i))
                if i in seen:
                    lst = boxes.setdefault(i, set())
                    if len(lst) < MAX_BOXES:
                        lst.add((ib, t))
    out = {}
    for (lid, tag), bs in leaf.items():
        out[tag] = out.get(tag, 0) + _volume(list(set(bs))) * dtype_width(graph.node(lid).dtype)
    return out


def _descendants(graph, seeds, chip, chip_of, nodes) -> set:
    """Nodes on `chip` every element of which depends on an element of a seed."""
    fd = set(seeds)
    for n in nodes:
        if n.id in fd or chip_of.get(n.id) != chip:
            continue
        if n.op == "concat":
            hit = all(i in fd for i in n.inputs)
        elif n.op in _EACH or n.op == "slice":
            hit = any(i in fd for i in n.inputs)
        else:
            hit = False
        if hit:
            fd.add(n.id)
    return fd


def pipeline_bound(graph, system, cuts) -> int:
    """Cycles no pipeline schedule of `graph` cut at `cuts` (P.choose_cuts) on `system` beats."""
    m = system.machine
    comp = P._compute(graph)
    bounds = [0] + list(cuts) + [len(comp)]
    chip_of = {}
    for s in range(len(bounds) - 1):
        for n in comp[bounds[s]:bounds[s + 1]]:
            chip_of[n.id] = s
    for n in graph.nodes():
        if n.op == "output":
            chip_of[n.id] = chip_of.get(n.inputs[0], 0)

    def hop(a, b):
        return system.hop_between(a, b) if a != b else 0

    nodes = [n for n in graph.nodes() if n.op not in LEAVES]
    by_chip = {}
    for n in nodes:
        by_chip.setdefault(chip_of[n.id], []).append(n)
    keys = {}             # anchor -> (its chip, the values it starts from)
    targets = set()       # where the streams rule is applied: what an anchor waits for, outputs
    for n in nodes:
        c = chip_of[n.id]
        b = _barrier(graph, n)
        if n.op in REDUCE and b is not None and graph.node(b).size > m.lanes:
            keys[("r", n.id)] = (c, {n.id})
            targets.add(b)
        for i in n.inputs:
            if chip_of.get(i, c) != c:
                keys[("a", i, c)] = (c, {i})
                targets.add(i)
        if n.op == "output":
            targets.add(n.inputs[0])
    rate, held = m.stream_bytes_per_cycle(), held_bytes(m)
    F, L, fds = {}, {}, {}
    for n in graph.nodes():
        if n.op in LEAVES:
            F[n.id] = L[n.id] = 0
            continue
        c = chip_of[n.id]
        fi, li = [], []
        for i in n.inputs:
            h = hop(chip_of[i], c) if i in chip_of and chip_of[i] != c else 0
            fi.append(F[i] + h)
            li.append(L[i] + h)
        if n.op == "concat":
            f, l_ = min(fi), max(li)
        elif n.op == "store":
            f, l_ = min(fi), li[1]
        elif n.op in _EACH:
            f, l_ = max(fi), max(li)
            b = _barrier(graph, n)
            if b is not None:
                f = max(f, li[n.inputs.index(b)])
        else:                                # slices, masks, selects: their first element
            f = l_ = fi[0] if n.op == "slice" else min(fi)
        F[n.id], L[n.id] = f, max(f, l_)
        if n.id in targets:
            L[n.id] = max(L[n.id], _stream_term(graph, n.id, c, chip_of, by_chip, keys, F, hop, rate, held, fds))
    return max(L[n.inputs[0]] for n in graph.nodes() if n.op == "output")


def _stream_term(graph, target, c, chip_of, by_chip, keys, F, hop, rate, held, fds) -> int:
    """The streams rule for `target` on chip c: the largest F(a) + (needed bytes that meet a
    value depending on anchor a on this chip - held) / rate."""
    need = _needed(graph, target, c, chip_of)
    if not need:
        return 0
    best = 0
    for key, (ac, seeds) in keys.items():
        if ac != c or key[1] not in F:        # an anchor after the target: nothing it needs
            continue
        start = F[key[1]] + (hop(chip_of[key[1]], c) if key[0] == "a" else 0)
        if key not in fds:
            fds[key] = _descendants(graph, seeds, c, chip_of, by_chip[c])
        fd = fds[key]
        total = sum(b for (op, k), b in need.items()
                    if any(i in fd for j, i in enumerate(graph.node(op).inputs) if j != k))
        if total > held:
            best = max(best, start + math.ceil((total - held) / rate))
    return best
