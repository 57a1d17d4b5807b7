"""Pass `row_groups` (before `rewrite`): row-wise regions that hold a lane reduction (a
layernorm) computed in groups of rows, one group after another.

Lowered node by node, a layernorm over R rows takes every row's mean before any row's variance:
the lane trees of all R means hold the SXM queues first, so the first normalized row comes only
after about R trees, and the matmul that reads the result waits for it with the MXM idle. Split
into groups of `GROUP` rows (the first of `FIRST`), each group's ops (the same ops on a row slice: views) are lowered
group after group (`level_order` puts a node marked `rows` g after every node of group g - 1 of
its region), so the first group is normalized after a few trees, and the next matmul starts on
its rows (lower_mxm: a left operand that arrives in groups is multiplied block by block) while
the later groups' trees run. The groups' results are joined along the rows (a `joined` concat:
computed straight into its rows, no copy). Every row is computed by the same ops as before:
the results are bit for bit the same.

A region grows from a lane reduction of a 2-D [R, C] tensor: forward through users that are
elementwise or lane reductions with R rows whose other operands are in the region or broadcast
(no R axis: gains, biases, scalars), and backward through elementwise producers all of whose
users are in it. Its inputs from outside with R rows are read as row slices (views); each region
node with users outside it is joined from the groups' results.
"""
from __future__ import annotations

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import DROP, rebuild

DTYPES = ("f32",)   # of the reduced rows: f16 rows' sums are MXM products (rewrite.py), not lane trees
GROUP = 64        # rows per group; regions of fewer than 2 groups' rows are left as they are
FIRST = GROUP - 1  # rows of the first group (its layernorm done sooner, the next matmul started
#                    on it sooner; the last group takes the rest). Measured on bert_base L=3 with
#                    the first group of 40: 45,354, 48: 45,195, 52: 45,020, 56: 44,550, 58: 44,458,
#                    60: 44,382, 61: 44,609, 62: 44,246, 63: 44,180, 64: 44,900, 72: 45,030 (a
#                    ragged landscape: placement is greedy); 12 layers: 60: 175,260, 62: 174,440,
#                    63: 174,095, 64: 176,930
FIRST_WIDE = 62   # rows of the first group of a region whose result is the left operand of a
FIRST_READ = 64   # product at least WIDE times as wide (bert_base's first layernorm, read by w1's
#                   3,072 columns), and of a region read by another product (its second, read by
#                   qkv): tuned on bert_base's 12 layers, a ragged landscape (placement is greedy).
#                   First/second layernorm's first group, 12 layers: 63/63 164,327, 56/63 164,069,
#                   62/63 163,748, 56/64 163,854, 58/64 164,806, 60/64 164,873, 61/64 164,806,
#                   62/64 163,646, 63/64 165,192, 56/65 168,595, 62/62 165,613 (every second
#                   layernorm, the last's too, which no product reads: FIRST there gives 163,630,
#                   L=1 14,628, L=2 27,990, L=3 41,554; 63/63 was 14,586, 28,157, 41,774)
WIDE = 4


def row_bounds(rows: int, first: int = FIRST) -> list[int]:
    """Where the groups of a region of `rows` rows start, and `rows` (one group if fewer than
    two groups' rows)."""
    if rows < 2 * GROUP:
        return [0, rows]
    return [0] + list(range(first, rows - GROUP // 2, GROUP)) + [rows]


def _first(g: IRGraph, region: set) -> int:
    """FIRST_WIDE if a node of the region is the left operand of a product outside it at least
    WIDE times as wide as the node, FIRST_READ if of another product, else FIRST (a pipeline
    cut's groups: links.planes_of)."""
    widths = [g.node(u).shape[-1] / g.node(nid).shape[-1] for nid in region for u in g.users(nid)
              if u not in region and g.node(u).op == "matmul" and g.node(u).inputs[0] == nid]
    if not widths:
        return FIRST
    return FIRST_WIDE if max(widths) >= WIDE else FIRST_READ


def _row_wise(n, rows: int) -> bool:
    if len(n.shape) != 2 or n.shape[0] != rows:
        return False
    if n.op in ops.REDUCE:
        return n.attrs["axis"] in (1, -1)
    return n.op in ops.ELEMENTWISE


def _broadcast(n) -> bool:
    """An operand without the rows axis (a gain, a bias, a scalar)."""
    return len(n.shape) < 2 or n.shape[0] == 1


def _region(g: IRGraph, red, taken: set) -> set | None:
    """The region of lane reduction `red`, grown from the tensor it reduces."""
    rows = red.shape[0]
    x = g.node(red.inputs[0])
    seed = x if _row_wise(x, rows) and x.op not in ops.REDUCE and x.id not in taken else red
    region = {seed.id}
    changed = True
    while changed:
        changed = False
        for nid in sorted(region):
            n = g.node(nid)
            for u in g.users(nid):
                un = g.node(u)
                if u in region or u in taken or not _row_wise(un, rows):
                    continue
                if all(i in region or _broadcast(g.node(i)) for i in un.inputs):
                    region.add(u)
                    changed = True
            for i in n.inputs:
                p = g.node(i)
                if i in region or i in taken or not _row_wise(p, rows) or p.op in ops.REDUCE:
                    continue
                if all(u in region for u in g.users(i)) and i not in g.outputs.values():
                    region.add(i)
                    changed = True
    last = max(region)
    for nid in region:      # every outside user after the region (it is emitted at its last node)
        if any(u not in region and u < last for u in g.users(nid)):
            return None
    return region


def _regions(g: IRGraph) -> list[set]:
    out, taken = [], set()
    for n in g.nodes():
        if n.op == "mean" and n.id not in taken and _row_wise(n, n.shape[0] if n.shape else 0) \
                and n.shape[0] >= 2 * GROUP and g.node(n.inputs[0]).shape[-1] > 1 \
                and g.node(n.inputs[0]).dtype in DTYPES:
            r = _region(g, n, taken)
            if r is not None:
                taken |= r
                out.append(r)
    return out


def row_groups(g: IRGraph) -> IRGraph:
    regions = _regions(g)
    if not regions:
        return g
    at_last = {max(r): r for r in regions}
    member = {nid for r in regions for nid in r}

    def node(new, n, m):
        if n.id in at_last:
            _emit(g, new, at_last[n.id], m)      # the region's nodes, mapped in m
            return DROP
        return DROP if n.id in member else None
    return rebuild(g, node)


def _emit(g: IRGraph, new: IRGraph, region: set, m: dict):
    """The region's nodes group by group (each group's in program order), then the joins."""
    order = sorted(region)
    rows = g.node(order[0]).shape[0]
    parts: dict[int, list] = {nid: [] for nid in order}
    bounds = row_bounds(rows, _first(g, region))
    for gi, (r0, r1) in enumerate(zip(bounds, bounds[1:])):
        local: dict[int, int] = {}

        def operand(i, like):
            if i in local:
                return local[i]
            src = g.node(i)
            if _broadcast(src):
                return m[i]
            local[i] = new.add("slice", (m[i],), (r1 - r0, src.shape[1]), src.dtype,
                               {"index": ((r0, r1), (0, src.shape[1])), "rows": gi}, like.line, like.col)
            return local[i]

        for nid in order:
            n = g.node(nid)
            ins = tuple(local[i] if i in region else operand(i, n) for i in n.inputs)
            local[nid] = new.add(n.op, ins, (r1 - r0, n.shape[1]), n.dtype, {**n.attrs, "rows": gi},
                                 n.line, n.col)
            parts[nid].append(local[nid])
    for nid in order:
        if any(u not in region for u in g.users(nid)) or nid in g.outputs.values():
            n = g.node(nid)
            m[nid] = new.add("concat", tuple(parts[nid]), n.shape, n.dtype, {"axis": 0}, n.line, n.col)
