"""Lower bounds on the cycles of a program, computed from its IR graph and the machine config
alone (never from the compiler's schedule), so that `cycles / bound` says how far a schedule is
from what the machine could do. Each bound is a number no correct schedule can beat:

- compute: the MXM plane-cycles the matmuls need, over all planes: sum of MACs / macs_per_cycle
  (dtype), with i8 @ i8 at the i8 rate and every other matmul at the f16 rate (ragged tiles are
  not rounded up, so this is below what any tiling costs); plus the fill (no ABC can issue before
  the earliest matmul's operands are read and its weights installed: mem_read + K rows /
  lw_ports_per_plane + 1 IW) and the drain (the last ABC's result needs mxm_abc + mxm_acc, then
  1 + icu_skew): the busiest plane does at least the average work between the two.
- vxm: every elementwise op, mask, rope and reduction handles each of its 320-lane vectors (rows
  x ceil(last dim / lanes)) on one VXM ALU for at least one cycle: vectors / vxm_alus. Casts and
  shape ops are not counted here (a cast can fold into the VXM op that makes its operand).
- sram and stream: every byte of a declared tensor that the program reads (slices count only
  the region they read; the old version of a stored state is not read) and every byte it
  writes (outputs, stored regions) leaves or enters a MEM slice and crosses a stream at least
  once: bytes / sram_bytes_per_cycle and bytes / stream_bytes_per_cycle.
- critical path: the longest chain of dependent ops, each at its functional delay from the
  config ([latency]: mem_read for a leaf, vxm or vxm_transcendental, mxm_abc + mxm_acc for a
  matmul, for a lane reduction one SXM round trip (every shifted copy can travel in it) and a
  tree of VXM steps), plus the hops a value must travel between the units' positions on the
  floorplan (VXM <-> MXM, VXM <-> SXM), plus 1 + icu_skew at the end (the emulator's cycle
  count). A lane-axis sum may also go through the MXM (a matmul with a ones vector): the cheaper
  of the two counts.
  Each tensor's last vector is followed too: a matmul's last row issues no earlier than its
  first plus its MACs / macs_per_cycle, or plus its left operand's elements (rows x K) over the
  MXM's input lanes a cycle (macs_per_cycle / lanes: an f16 pair takes 160 a cycle, whatever
  the width of its output), whichever is more; weights that are computed (k.T in q @ k.T, v in
  p @ v) are installed only after their last row is made (then an LW and an IW), or
  min(rows, columns) / lw_ports_per_plane LW cycles after their first row, whichever is later.
  Conversions: ACC puts an f32 (i32) accumulator row on a stream, LW and ABC take f16 or i8, and
  only VXM ops convert, so a product's cast to another dtype (or an f32 product used as an MXM
  operand, rounded to f16) travels to the VXM (and back to the MXM): 2 x the hops + vxm.
  Layouts: a tensor may lie as rows (its last axis across the lanes) or transposed (its last
  axis across vectors); the path follows both (first and last row; first and last vector
  transposed). A lane reduction of a transposed tensor is a tree of VXM steps between vectors;
  elementwise ops keep either layout; a matmul C = A @ B is made as rows (A's rows through the
  inputs, B installed) or transposed (C.T = B.T @ A.T: B's columns through the inputs, A
  installed transposed); the SXM copies a tensor into the other layout (its vectors out at most
  2 x sxm_queues_per_hemisphere a cycle), and the copy goes on from the SXM's position (to the
  MXM next to it, say); views (slices, reshapes, transposes) look through to their inputs; a
  declared tensor is written as rows by the loader; outputs end as rows.
  A joined head's product concat(f16(p_h @ v_h)) @ W may run as sum_h p_h @ f16(v_h @ W_h)
  (compiler/rewrite_pack.split_joins): v_h @ W_h made and rounded first, then the p_h's rows.
  Nodes that no output, store or final state needs are dropped by the compiler: no bound counts
  their work.
  (The tests check that no compiled program, random program or reduction beats the bound.)

The program's bound is the largest of these."""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler.ir import IRGraph, Node
from lpu.compiler.ops import ELEMENTWISE as ops_ELEMENTWISE, LEAVES, OPS, REDUCE
from lpu.isa.dtypes import dtype_width
from lpu.isa.errors import LpuError
from lpu.isa.machine import MachineConfig

# the op table's bound classes (compiler/ops.py): VXM work is counted for these
VXM_OPS = frozenset(d.name for d in OPS.values() if d.bound in ("vxm", "reduce"))


def vectors(shape: tuple, lanes: int) -> int:
    """320-lane vectors holding a tensor laid out by rows of its last axis."""
    if not shape:
        return 1
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * max(1, math.ceil(shape[-1] / lanes))


def matmul_macs(graph: IRGraph, n: Node) -> int:
    a = graph.node(n.inputs[0])
    k = a.shape[-1]
    return int(np.prod(n.shape, dtype=np.int64)) * k


def matmul_rows_cycles(graph: IRGraph, n: Node, m: MachineConfig) -> int:
    """Cycles from a matmul's first ABC to its last at least: its MACs at the MXM's rate, and its
    left operand's elements (rows x K) through the MXM's inputs, lanes per plane pass of
    macs_per_cycle / lanes MACs (an f16 pair takes 160 lanes a cycle, an i8 plane 320): a
    product narrower than the lanes uses the pass's inputs but not all its columns (two rows
    share a pass only by sharing its input lanes)."""
    inputs = matmul_macs(graph, n) // max(1, n.shape[-1]) if n.shape else 0
    return math.ceil(max(matmul_macs(graph, n), inputs * m.lanes) / m.macs_per_cycle(matmul_rate_dtype(graph, n)))


def matmul_rate_dtype(graph: IRGraph, n: Node) -> str:
    a, b = graph.node(n.inputs[0]), graph.node(n.inputs[1])
    return "i8" if a.dtype == "i8" and b.dtype == "i8" else "f16"


def _leaf_bytes_read(graph: IRGraph, leaf: Node, live: set) -> int:
    """Bytes of `leaf` that some live op reads: the union of the regions read through chains of
    slices (a store's old-version operand is not a read)."""
    shape = leaf.shape
    regions: list[tuple] = []
    whole = False

    def walk(nid: int, box: list, axes: list):
        nonlocal whole
        for u in graph.users(nid):
            n = graph.node(u)
            if u not in live or n.op == "store" and n.inputs[0] == nid and n.inputs[1] != nid:
                continue
            if n.op == "slice":
                nb, na = list(box), []
                for ax, ix in zip(axes, n.attrs["index"]):
                    lo = box[ax][0]
                    if isinstance(ix, int):
                        nb[ax] = (lo + ix, lo + ix + 1)
                    else:
                        nb[ax] = (lo + ix[0], lo + ix[1])
                        na.append(ax)
                walk(u, nb, na)
            else:
                if all(lo == 0 and hi == s for (lo, hi), s in zip(box, shape)):
                    whole = True
                regions.append(tuple(box))

    walk(leaf.id, [(0, s) for s in shape], list(range(len(shape))))
    if whole:
        return leaf.nbytes
    if not regions:
        return 0
    if len(regions) == 1:
        n = int(np.prod([hi - lo for lo, hi in regions[0]], dtype=np.int64))
    else:
        mask = np.zeros(shape, bool)
        for box in regions:
            mask[tuple(slice(lo, hi) for lo, hi in box)] = True
        n = int(mask.sum())
    return n * dtype_width(leaf.dtype)


def live_nodes(graph: IRGraph) -> set:
    """Nodes an output, a store or a final state depends on (the compiler drops the others:
    their work is not counted)."""
    todo = [n.id for n in graph.nodes() if n.op in ("output", "store")] + list(graph.final_states.values())
    live: set = set()
    while todo:
        i = todo.pop()
        if i not in live:
            live.add(i)
            todo.extend(graph.node(i).inputs)
    return live


def traffic(graph: IRGraph) -> tuple[int, int]:
    """(bytes read from declared tensors, bytes written to outputs and stored regions)."""
    live = live_nodes(graph)
    read = sum(_leaf_bytes_read(graph, n, live) for n in graph.nodes() if n.op in ("input", "weight", "state"))
    written = 0
    for n in graph.nodes():
        if n.op == "output":
            written += graph.node(n.inputs[0]).nbytes
        elif n.op == "store":
            written += graph.node(n.inputs[1]).size * dtype_width(n.dtype)
    return read, written


def _place(n: Node) -> str:
    if n.op in LEAVES:
        return "mem"
    if n.op == "matmul":
        return "mxm"
    if n.op in VXM_OPS:
        return "vxm"
    return "free"


def _drops_rows(graph: IRGraph, n: Node) -> bool:
    """A slice that leaves out vectors of its source (indexes an axis but the last, or takes
    part of it)."""
    src = graph.node(n.inputs[0]).shape
    for ax, ix in enumerate(n.attrs["index"][:len(src) - 1]):
        if isinstance(ix, int) or tuple(ix) != (0, src[ax]):
            return True
    return False


MXM_DTYPES = ("f16", "bf16", "i8")     # what LW and ABC take from a stream


def _absorbable(graph: IRGraph, n: Node, place: dict) -> list:
    """[(p_h, v_h)] where n = A @ W, W read from SRAM (weights: place mem) and A = f16(p @ v)
    or concat(f16(p_h @ v_h), axis=-1) (attention heads joined): the compiler may compute n as
    sum_h p_h @ (v_h @ W_h) (compiler/rewrite_pack.split_joins); else []."""
    a, w = (graph.node(i) for i in n.inputs)
    if place[w.id] != "mem" or len(n.shape) != 2:
        return []
    parts = a.inputs if a.op == "concat" and a.attrs["axis"] in (-1, len(a.shape) - 1) else (a.id,)
    out = []
    for i in parts:
        x = graph.node(i)
        if x.op != "cast" or graph.node(x.inputs[0]).op != "matmul" or len(x.shape) != 2:
            return []
        out.append(tuple(graph.node(x.inputs[0]).inputs))
    return out


def _vectors_t(shape: tuple, lanes: int) -> int:
    """Vectors holding a tensor laid out transposed (its last axis across vectors)."""
    if len(shape) < 2:
        return shape[-1] if shape else 1
    lead = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    return lead * shape[-1] * max(1, math.ceil(shape[-2] / lanes))


def critical_path(graph: IRGraph, m: MachineConfig, first_matmul: list | None = None) -> int:
    """The critical path bound; `first_matmul`, if given, receives the earliest cycle any matmul
    can issue its first ABC (activations ready, weights read and installed). A tensor is made
    (where its op runs) with four times: its first and last vector laid out as rows (f, l), its
    first vector and the whole of it laid out transposed (tf, t: its last axis across vectors);
    the SXM makes a copy in the other layout (rows from t, transposed from l). A consumer takes
    either, with its hops; views (slices, reshapes, transposes) look through to their inputs."""
    lat = m.latency
    d_mxm = min(abs(m.vxm_pos - m.mxm_pos(p)) for p in range(m.mxm_planes))
    d_sxm = min(abs(m.vxm_pos - m.sxm_pos(h)) for h in range(2))
    d_ms = min(abs(m.mxm_pos(p) - m.sxm_pos(h)) for p in range(m.mxm_planes) for h in range(2))
    d_mm = lat["mxm_abc"] + lat["mxm_acc"]
    far = {frozenset(("mxm", "vxm")): d_mxm, frozenset(("sxm", "vxm")): d_sxm, frozenset(("mxm", "sxm")): d_ms}
    none = 1 << 60
    out_rate = 2 * m.sxm_queues_per_hemisphere     # vectors the SXMs put out a cycle, at most
    own: dict[int, dict] = {}        # made where the op runs: f, l, tf, t
    copy: dict[int, dict] = {}       # the SXM's copy in the other layout
    place: dict[int, str] = {}
    swap = {"f": "tf", "l": "t", "tf": "f", "t": "l"}
    memo: dict = {}

    def spread(n_vectors):
        return max(0, math.ceil(n_vectors / out_rate) - 1)

    def dist(a, b):
        return far.get(frozenset((a, b)), 0)

    def hop(src, dtype, p):
        """Cycles from a value of `dtype` at place src to unit p: an f32 (i32) accumulator row or
        SXM output is rounded by the VXM on its way to the MXM (ACC puts f32 or i32 on a stream,
        LW and ABC take f16 or i8, only VXM ops convert)."""
        if p == "mxm" and src in ("mxm", "sxm") and dtype not in MXM_DTYPES:
            return dist(src, "vxm") + lat["vxm"] + d_mxm
        return dist(src, p)

    def arr(i, p, k):
        """When tensor i's vectors of kind k (f, l, tf, t) can be at unit p."""
        key = (i, p, k)
        if key not in memo:
            n = graph.node(i)
            if i not in own:             # a view: its inputs' vectors
                if n.op == "transpose" and len(n.shape) >= 2 and \
                        tuple(n.attrs["perm"][-2:]) == (len(n.shape) - 1, len(n.shape) - 2):
                    k2 = swap[k]         # x.T's rows are x transposed, and the other way
                elif k == "l" and n.op == "slice" and _drops_rows(graph, n):
                    k2 = "f"             # (some rows only: their last is not followed)
                else:
                    k2 = k
                memo[key] = max((arr(j, p, k2) for j in n.inputs), default=0)
            else:
                memo[key] = min(own[i][k] + hop(place[i], n.dtype, p), copy[i][k] + hop("sxm", n.dtype, p))
        return memo[key]

    def weights(b, rows, lw):
        """When the weights b can be installed: read from SRAM, or computed (LWs and an IW after
        the last of its rows, or after the whole of it transposed: a transposed install)."""
        ready = lat["mem_read"] + math.ceil(min(rows, m.lanes) / m.lw_ports_per_plane) + 1
        if place[b] != "mem":
            made = min(max(arr(b, "mxm", "f") + lw - 1, arr(b, "mxm", "l")), arr(b, "mxm", "t"))
            ready = max(ready, made + 2)
        return ready

    for n in graph.nodes():
        p = _place(n)
        if n.op in LEAVES:
            r = lat["mem_read"] if n.op != "const" else 0
            own[n.id] = {"f": r, "l": r, "tf": none, "t": none} if n.op != "const" else dict.fromkeys(swap, 0)
            first = r + lat["sxm"]            # the loader writes rows: transposed by the SXM
            copy[n.id] = {"f": none, "l": none, "tf": first, "t": first + spread(_vectors_t(n.shape, m.lanes))} \
                if n.op != "const" else dict.fromkeys(swap, 0)
            place[n.id] = p
            continue
        if n.op == "cast" and place[n.inputs[0]] == "mxm" and n.dtype != graph.node(n.inputs[0]).dtype:
            p = "vxm"        # only a VXM op converts an accumulator's f32 or i32 (see above)
        if p == "free":      # a view: no place of its own (forwarded for _absorbable)
            srcs = [place[i] for i in n.inputs]
            place[n.id] = next((s for s in srcs if s != "mem"), srcs[0] if srcs else "mem")
            continue
        a_f, a_l, a_tf, a_t = (max((arr(i, p, k) for i in n.inputs), default=0) for k in ("f", "l", "tf", "t"))
        if n.op == "matmul":
            a, b = n.inputs
            an, bn = graph.node(a), graph.node(b)
            # as rows: A's rows through the MXM's inputs, B installed
            ready = max(arr(a, p, "f"), weights(b, bn.shape[-2], math.ceil(
                min(*bn.shape[-2:], m.lanes) / m.lw_ports_per_plane)))
            work = matmul_rows_cycles(graph, n, m)
            f = ready + d_mm
            l = max(ready + work - 1, arr(a, p, "l")) + d_mm
            heads = _absorbable(graph, n, place)
            if heads:                 # sum_h p_h @ f16(v_h @ W_h) (see above): v_h @ W_h made and
                r = 0                 # rounded on the VXM, installed, the p_h through the inputs
                for ph, vh in heads:
                    vn = graph.node(vh)
                    vw = vn.size * max(n.shape[-1], m.lanes) if len(vn.shape) == 2 else 0
                    r = max(r, arr(ph, p, "f"), min(arr(vh, p, "f"), arr(vh, p, "tf")) + d_mm + 2 * d_mxm
                            + lat["vxm"] + 2 + max(0, math.ceil(vw / m.macs_per_cycle("f16")) - 1))
                w = math.ceil(sum(graph.node(ph).size for ph, _ in heads) * max(n.shape[-1], m.lanes)
                              / m.macs_per_cycle("f16"))
                ready, f = min(ready, r), min(f, r + d_mm)
                l = min(l, max(r + w - 1, max(arr(ph, p, "l") for ph, _ in heads)) + d_mm)
            # transposed (C.T = B.T @ A.T): B's columns through the inputs, A installed transposed
            rows_a = an.shape[-2] if len(an.shape) >= 2 else 1
            ready_t = max(arr(b, p, "tf"), weights(a, rows_a, math.ceil(min(rows_a, m.lanes) / m.lw_ports_per_plane)))
            macs = matmul_macs(graph, n)
            work_t = math.ceil(max(macs, macs // max(1, rows_a) * m.lanes) / m.macs_per_cycle(matmul_rate_dtype(graph, n)))
            ttf, tt = ready_t + d_mm, max(ready_t + work_t - 1, arr(b, p, "t")) + d_mm
            if first_matmul is not None:
                first_matmul.append(min(ready, ready_t))
        elif n.op in REDUCE and n.attrs["axis"] == len(graph.node(n.inputs[0]).shape) - 1:
            i = n.inputs[0]
            src = graph.node(i)
            width = src.shape[-1]
            levels = math.ceil(math.log2(min(width, m.lanes))) if width > 1 else 0
            tree = lat["vxm"] * (levels + 1)

            def lane(k):
                """The reduction's result at the VXM from i's rows (first or last): one trip
                through the SXM carries every shifted copy to a tree of VXM steps; a sum may go
                through the MXM instead (a matmul with a ones vector, f32 rows split on the VXM
                into f16 parts first)."""
                if not levels:
                    return arr(i, p, k) + tree
                via = arr(i, "sxm", k) + lat["sxm"] + d_sxm + tree
                if n.op != "max":
                    at = arr(i, p, k) + 2 * d_mxm + d_mm + lat["vxm"]
                    if src.dtype in MXM_DTYPES:
                        at = min(at, arr(i, "mxm", k) + d_mm + d_mxm + lat["vxm"])
                    via = min(via, at)
                return via
            f, l = lane("f"), max(lane("f"), lane("l"))
            # the input transposed: a tree of VXM steps between its vectors, the last one in
            ttf = tt = max(a_t + lat["vxm"], a_tf + lat["vxm"] * max(1, math.ceil(math.log2(width))))
        else:                 # the dependent VXM steps of one vector (the op table's path)
            d = sum(lat[k] for k in OPS[n.op].path)
            f, l = a_f + d, max(a_f, a_l) + d
            # element by element (or by position) in either layout; else only the SXM's copy
            elementwise = n.op in ops_ELEMENTWISE or n.op in ("causal", "rope")
            ttf, tt = (a_tf + d, max(a_tf, a_t) + d) if elementwise else (none, none)
        own[n.id] = {"f": f, "l": max(f, l), "tf": ttf, "t": max(ttf, tt)}
        to_sxm = dist(p, "sxm") + lat["sxm"]     # the SXM's copy in the other layout
        rows = own[n.id]["t"] + to_sxm if ttf < none else none
        cols = own[n.id]["l"] + to_sxm
        copy[n.id] = {"f": rows, "l": rows + spread(vectors(n.shape, m.lanes)) if rows < none else none,
                      "tf": cols, "t": cols + spread(_vectors_t(n.shape, m.lanes))}
        place[n.id] = p
    ends = [arr(i, "mem", "l") for i in list(graph.outputs.values()) + list(graph.final_states.values())]
    return (max(ends) if ends else 0) + 1 + m.icu_skew


def lower_bounds(graph: IRGraph, m: MachineConfig) -> dict:
    """Every bound (cycles) and `bound`, the largest, with `bound_kind` naming it."""
    compute = 0.0
    vxm_vectors = 0
    macs = {"i8": 0, "f16": 0}
    live = live_nodes(graph)
    for n in graph.nodes():
        if n.id not in live:
            continue
        if n.op == "matmul":
            dt = matmul_rate_dtype(graph, n)
            mk = matmul_macs(graph, n)
            macs[dt] += mk
            compute += mk / m.macs_per_cycle(dt)
        elif n.op in VXM_OPS:
            vxm_vectors += vectors(graph.node(n.inputs[0]).shape if n.op in REDUCE else n.shape, m.lanes)
    read, written = traffic(graph)
    starts: list = []
    path = critical_path(graph, m, starts)
    lat = m.latency
    drain = lat["mxm_abc"] + lat["mxm_acc"] + 1 + m.icu_skew
    b = {
        "compute": math.ceil(compute) + (min(starts) + drain if starts and compute else 0),
        "vxm": math.ceil(vxm_vectors / m.vxm_alus),
        "sram": math.ceil((read + written) / m.sram_bytes_per_cycle()),
        "stream": math.ceil((read + written) / m.stream_bytes_per_cycle()),
        "critical_path": path,
    }
    kind = max(b, key=b.get)
    return dict(b, bound=b[kind], bound_kind=kind, macs_i8=macs["i8"], macs_f16=macs["f16"],
                bytes_read=read, bytes_written=written)


# ---- many chips (issue 15) ------------------------------------------------------------------
# Three figures for a program on a system of N chips (isa/system.py), from the IR graph, the
# chip's config and the link figures alone:
#
# - any: no partition of the work over N chips beats max(each resource's total work / N, the
#   critical path): every chip has the same units.
# - pipeline (pp): consecutive layers on consecutive chips, one input: a layer needs its whole
#   input (attention reads every row's keys), so the chips work one after another: each
#   resource's total work at one chip's rate, plus one link hop per cut. (A stage's row-wise
#   tail may overlap the next stage's head; that overlap is left out, so this is the figure a
#   pipeline aims at rather than a strict bound.)
# - tensor parallel (tp, Megatron-style): every weight matmul split over the chips of a node,
#   by columns where its input is whole and by rows where its input is split by columns; the
#   partial sums of a row split are all-reduced over the node's direct links (reduce-scatter then
#   all-gather: each chip sends 2 (N-1)/N of the bytes over its N-1 links), and a reduction
#   over a split last axis (a layernorm of split columns) gathers first. Bound: max(each
#   resource's work / N, the links' slots) plus a hop per collective. Past one node the nodes
#   form a pipeline (tensor parallel in a node), one global hop per cut.
# - pp_schedule: a strict bound on any pipeline over the compiler's cuts, the figure
#   `--parallel auto` compares with tensor parallel (compiler/pipeline_bound.py).

FULL, COLS, LOCAL = 0, 1, 2          # whole on every chip; last axis split over chips; a head's own chip


def _weightlike(graph: IRGraph) -> set:
    """Nodes computed from weights and constants alone (split with their weights for free)."""
    out = set()
    for n in graph.nodes():
        if n.op in ("weight", "const") or (n.op not in LEAVES and n.inputs and all(i in out for i in n.inputs)):
            out.add(n.id)
    return out


def tp_collectives(graph: IRGraph) -> list[tuple[str, int]]:
    """The collectives a Megatron-style tensor-parallel split of `graph` needs, in program
    order: [('all-reduce' | 'all-gather', bytes of the whole tensor)]."""
    wl = _weightlike(graph)
    label: dict[int, int] = {}
    out = []
    for n in graph.nodes():
        if n.op in LEAVES:
            label[n.id] = FULL
            continue
        ins = [label[i] for i in n.inputs]
        if n.id in wl:
            lab = FULL
        elif n.op == "matmul":
            a, b = ins
            if n.inputs[1] in wl:
                if a == FULL:
                    lab = COLS
                else:                                 # rows split: partial sums reduced
                    out.append(("all-reduce", n.nbytes))
                    lab = FULL
            elif COLS in (a, b):                      # an activation's split axis summed
                out.append(("all-reduce", n.nbytes))
                lab = FULL
            else:
                lab = LOCAL if LOCAL in ins else FULL
        elif n.op == "slice" and ins[0] == COLS:
            last = n.attrs["index"][-1]
            src = graph.node(n.inputs[0]).shape[-1]
            whole = not isinstance(last, int) and last[0] == 0 and last[1] == src
            lab = COLS if whole else LOCAL
        elif n.op == "concat" and LOCAL in ins and n.attrs["axis"] == len(n.shape) - 1:
            lab = COLS
        elif n.op in REDUCE and ins[0] == COLS and n.attrs["axis"] == len(graph.node(n.inputs[0]).shape) - 1:
            out.append(("all-gather", graph.node(n.inputs[0]).nbytes))
            lab = FULL
        elif n.op == "store":
            lab = COLS if ins[1] != FULL else ins[0]
        elif n.op == "output":
            lab = FULL
        else:
            lab = COLS if COLS in ins else LOCAL if LOCAL in ins else FULL
        label[n.id] = lab
    return out


def collective_cycles(kind: str, nbytes: int, n: int, system) -> int:
    """Link cycles of one collective over n chips of a node (each pair of chips has a direct
    link): the slots each link carries plus the hops."""
    if n <= 1:
        return 0
    per_link = math.ceil(nbytes / n / system.link["vector_bytes"])       # vectors a chip sends a peer
    phases = 2 if kind == "all-reduce" else 1
    return phases * (per_link * system.slot_cycles + system.hop_cycles)


def system_bounds(graph: IRGraph, m: MachineConfig, system, chips: int) -> dict:
    """The multi-chip figures above (cycles): any, pp, tp, with tp_links (the collectives'
    cycles) and tp_chips (the chips of a node splitting each matmul)."""
    one = lower_bounds(graph, m)
    work = ("compute", "vxm", "sram", "stream")
    any_ = max(max(math.ceil(one[k] / chips) for k in work), one["critical_path"])
    nodes = math.ceil(chips / system.chips_per_node)
    cut_hops = sum(system.hop_between(c, c + 1) for c in range(chips - 1)) if chips > 1 else 0
    pp = max(one[k] for k in work) + cut_hops
    n = min(chips, system.chips_per_node)
    links = sum(collective_cycles(k, b, n, system) for k, b in tp_collectives(graph)) if n > 1 else 0
    per_node = max(max(math.ceil(one[k] / n) for k in work), links) if n > 1 else max(one[k] for k in work)
    tp = max(per_node, one["critical_path"]) + (nodes - 1) * system.global_hop_cycles
    return {"chips": chips, "any": any_, "pp": pp, "tp": tp, "tp_links": links, "tp_chips": n,
            "pp_schedule": _pp_schedule(graph, system, chips),
            "one_chip": one["bound"], "one_chip_kind": one["bound_kind"]}


def _pp_schedule(graph: IRGraph, system, chips: int) -> int | None:
    """The strict bound on a pipeline over the compiler's cuts (compiler/pipeline_bound.py, the
    one `--parallel auto` compares with tensor parallel), None if the program does not cut."""
    from dataclasses import replace

    from lpu.compiler.pipeline_bound import pipeline_bound
    from lpu.compiler.system import pipeline_cuts
    if chips < 2:
        return None
    sys_n = replace(system, chips=chips)
    try:
        return pipeline_bound(graph, sys_n, pipeline_cuts(graph, sys_n))
    except LpuError:
        return None
