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
  shape ops are free (they can fold into loads, conversions on LW, or addressing).
- sram and stream: every byte of a declared tensor that the program reads (slices count only
  the region they read; the old version of a stored state is not read) and every byte it
  writes (outputs, stored regions) leaves or enters a MEM slice and crosses a stream at least
  once: bytes / sram_bytes_per_cycle and bytes / stream_bytes_per_cycle.
- critical path: the longest chain of dependent ops, each at its functional delay from the
  config ([latency]: mem_read for a leaf, vxm or vxm_transcendental, mxm_abc + mxm_acc for a
  matmul, for a lane reduction one SXM round trip (every shifted copy can travel in it) and a
  tree of VXM steps), plus the hops a value must travel between the units' positions on the
  floorplan (VXM <-> MXM, VXM <-> SXM), plus 1 + icu_skew
  at the end (the emulator's cycle count). A lane-axis sum may also go through the MXM (a matmul
  with a ones vector): the cheaper of the two counts. Like the vxm bound, this takes vectors to
  hold rows of the last axis; a schedule that lays a reduced axis across vectors needs no SXM
  trip there (the tests check that no compiled program or reduction beats the bound).
  Each tensor's last vector is followed too: a matmul's last row issues no earlier than its
  MACs / macs_per_cycle cycles after its first, and weights that are computed (k.T in q @ k.T,
  v in p @ v) are installed only after their last row is made (then an LW and an IW), or
  min(rows, columns) / lw_ports_per_plane LW cycles after their first row, whichever is later.

The program's bound is the largest of these."""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler.ir import IRGraph, Node
from lpu.compiler.ops import LEAVES, OPS, REDUCE
from lpu.isa.dtypes import dtype_width
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


def matmul_rate_dtype(graph: IRGraph, n: Node) -> str:
    a, b = graph.node(n.inputs[0]), graph.node(n.inputs[1])
    return "i8" if a.dtype == "i8" and b.dtype == "i8" else "f16"


def _leaf_bytes_read(graph: IRGraph, leaf: Node) -> int:
    """Bytes of `leaf` that some op reads: the union of the regions read through chains of
    slices (a store's old-version operand is not a read)."""
    shape = leaf.shape
    regions: list[tuple] = []
    whole = False

    def walk(nid: int, box: list, axes: list):
        nonlocal whole
        for u in graph.users(nid):
            n = graph.node(u)
            if n.op == "store" and n.inputs[0] == nid and n.inputs[1] != nid:
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


def traffic(graph: IRGraph) -> tuple[int, int]:
    """(bytes read from declared tensors, bytes written to outputs and stored regions)."""
    read = sum(_leaf_bytes_read(graph, n) for n in graph.nodes() if n.op in ("input", "weight", "state"))
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


def critical_path(graph: IRGraph, m: MachineConfig, first_matmul: list | None = None) -> int:
    """The critical path bound; `first_matmul`, if given, receives the earliest cycle any matmul
    can issue its first ABC (activations ready, weights read and installed)."""
    lat = m.latency
    d_mxm = min(abs(m.vxm_pos - m.mxm_pos(p)) for p in range(m.mxm_planes))
    d_sxm = min(abs(m.vxm_pos - m.sxm_pos(h)) for h in range(2))
    finish: dict[int, int] = {}
    last: dict[int, int] = {}        # the same for the tensor's last vector (a computed matmul's
    place: dict[int, str] = {}       # rows take MACs / macs_per_cycle cycles at least)
    for n in graph.nodes():
        p = _place(n)
        if n.op in LEAVES:
            finish[n.id] = last[n.id] = lat["mem_read"] if n.op != "const" else 0
            place[n.id] = p
            continue
        ready = ready_last = 0
        srcs = []
        for i in n.inputs:
            hop = d_mxm if {place[i], p} == {"mxm", "vxm"} else 0
            ready = max(ready, finish[i] + hop)
            ready_last = max(ready_last, last[i] + hop)
            srcs.append(place[i])
        if p == "free":
            finish[n.id], last[n.id] = ready, ready_last
            if n.op == "slice" and _drops_rows(graph, n):
                last[n.id] = ready           # (some rows only: their last is not followed)
            # a free op forwards its input's place (the value has not moved)
            place[n.id] = next((s for s in srcs if s != "mem"), srcs[0] if srcs else "mem")
            continue
        if n.op == "matmul":
            d = lat["mxm_abc"] + lat["mxm_acc"]
            install = lat["mem_read"] + math.ceil(min(graph.node(n.inputs[1]).shape[-2], m.lanes)
                                                  / m.lw_ports_per_plane) + 1
            ready = max(ready, install)
            b = n.inputs[1]
            if place[b] != "mem":     # computed weights: installed (LWs, an IW) after their last row
                lw = math.ceil(min(*graph.node(b).shape[-2:], m.lanes) / m.lw_ports_per_plane)
                hop = d_mxm if place[b] == "vxm" else 0
                ready = max(ready, max(finish[b] + lw - 1, last[b]) + hop + 2)
            a = n.inputs[0]
            work = math.ceil(matmul_macs(graph, n) / m.macs_per_cycle(matmul_rate_dtype(graph, n)))
            ready_last = max(ready + work - 1, last[a] + (d_mxm if place[a] == "vxm" else 0), ready)
            if first_matmul is not None:
                first_matmul.append(ready)
        elif n.op in REDUCE and n.attrs["axis"] == len(graph.node(n.inputs[0]).shape) - 1:
            width = graph.node(n.inputs[0]).shape[-1]
            levels = math.ceil(math.log2(min(width, m.lanes))) if width > 1 else 0
            # one SXM round trip carries every shifted copy, then a tree of VXM steps adds them
            d = lat["vxm"] * (levels + 1) + (lat["sxm"] + 2 * d_sxm if levels else 0)
            if n.op != "max":     # a sum can also be a matmul with a ones vector
                d = min(d, 2 * d_mxm + lat["mxm_abc"] + lat["mxm_acc"] + lat["vxm"])
        else:                 # the dependent VXM steps of one vector (the op table's path)
            d = sum(lat[k] for k in OPS[n.op].path)
        finish[n.id] = ready + d
        last[n.id] = max(ready, ready_last) + d
        place[n.id] = p
    ends = [last[nid] for nid in graph.outputs.values()] + [last[nid] for nid in graph.final_states.values()]
    return (max(ends) if ends else 0) + 1 + m.icu_skew


def lower_bounds(graph: IRGraph, m: MachineConfig) -> dict:
    """Every bound (cycles) and `bound`, the largest, with `bound_kind` naming it."""
    compute = 0.0
    vxm_vectors = 0
    macs = {"i8": 0, "f16": 0}
    for n in graph.nodes():
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
        "compute": math.ceil(compute) + (min(starts) + drain if starts else 0),
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
            "one_chip": one["bound"], "one_chip_kind": one["bound_kind"]}
