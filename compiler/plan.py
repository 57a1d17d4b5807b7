"""Pass `plan`: decide for every IR node how it is stored.

  persistent  inputs, weights, states, non-scalar constants: placed first, never freed
  imm         scalar constants: folded into VXM instructions as immediates
  view        an index operation on another node's vector grid (slices and concats on whole
              chunks, integer indexes, reshapes and transposes that keep the last axis): no code
  mxm_t       a transpose whose every user is a matmul taking it as its right operand: the MXM
              installs the weights transposed (IW trans=1), so nothing is materialized
  mxm_cvt     an i8 -> float cast used only as f16 matmul weights: widened by LW (cvt=1)
  alias       a `store`: the new state version lives in the state's own region
  fused       an elementwise op whose one user is elementwise too: no storage, computed
              inside its user's chains (lower_fuse.py)
  acc         a matmul whose one user is a matmul taking it as its third operand (a @ b + c):
              left in the MXM's accumulators, which the user adds to (lower_mxm.py): no storage
  joined      a concat along the rows of temporaries only it uses, or along their lanes in
              whole chunks: its region is taken when the first of them is lowered, and each (a
              `part`) is computed straight into its rows or chunks (the heads' transposed
              outputs joined, a decode step's heads per chunk: no copy)
  temp        everything else: computed into a fresh region, freed after its last use

It also finds each temporary region's last use (through views) so that `lower` can free it.
"""
from __future__ import annotations

from dataclasses import dataclass

from lpu.compiler.ir import IRGraph
from lpu.compiler.lower_fuse import fusable
from lpu.compiler import ops


@dataclass
class Plan:
    order: list         # node ids in the order they are lowered
    kind: dict          # node id -> storage kind
    base: dict          # node id -> node id owning the region it lives in
    last_use: dict      # owning node id -> last node id (program order) that reads it
    outputs_alias: dict  # output node id -> True if it takes over its source's region
    alone: frozenset = frozenset()   # matmuls with no other matmul at their depth (lower_mxm.py)
    depth: dict = None               # node id -> its depth (level_order)


def _aligned_last(node, src_shape, lanes) -> bool:
    """A slice whose last-axis entry keeps whole chunks."""
    idx = node.attrs["index"]
    last = idx[len(src_shape) - 1] if len(idx) >= len(src_shape) else None
    if last is None:
        return True
    if isinstance(last, int):
        return False
    start, stop = last
    c = src_shape[-1]
    return (start, stop) == (0, c) or (start % lanes == 0 and (stop == c or stop % lanes == 0))


def make_plan(graph: IRGraph, lanes: int) -> Plan:
    kind, base = {}, {}
    nodes = graph.nodes()
    store_ids: dict[str, list[int]] = {}
    for n in nodes:
        if n.op == "store":
            store_ids.setdefault(n.attrs["name"], []).append(n.id)

    def is_view(n) -> bool:
        src = graph.node(n.inputs[0]) if n.inputs else None
        if n.op == "slice" and n.attrs.get("splat"):
            # lane 0 of a value held in every lane (compiler/rewrite.py): a view where every
            # user is elementwise (the VXM zeroes an output's lanes past its width)
            return all(graph.node(u).op in ops.ELEMENTWISE for u in graph.users(n.id))
        if n.op == "slice":
            return _aligned_last(n, src.shape, lanes)
        if n.op == "reshape":
            return len(src.shape) > 0 and len(n.shape) > 0 and src.shape[-1] == n.shape[-1]
        if n.op == "transpose":
            return n.attrs["perm"][-1] == len(n.shape) - 1
        if n.op == "concat":
            ax = n.attrs["axis"]
            if ax != len(n.shape) - 1:
                return True
            return all(graph.node(i).shape[-1] % lanes == 0 for i in n.inputs[:-1])
        return False

    for n in nodes:
        if n.op in ("input", "weight", "state"):
            kind[n.id], base[n.id] = "persistent", n.id
        elif n.op == "const":
            kind[n.id] = "imm" if n.size == 1 and len(n.shape) <= 2 else "persistent"
            base[n.id] = n.id
        elif n.op == "store":
            kind[n.id], base[n.id] = "alias", base[n.inputs[0]]
        elif _in_acc(graph, n):
            kind[n.id], base[n.id] = "acc", n.id
        elif n.op == "output":
            kind[n.id], base[n.id] = "output", n.id
        elif n.op == "transpose" and _mxm_transposable(graph, n):
            kind[n.id], base[n.id] = "mxm_t", base[n.inputs[0]]
        elif n.op == "cast" and _mxm_widenable(graph, n):
            kind[n.id], base[n.id] = "mxm_cvt", base[n.inputs[0]]
        elif is_view(n) and n.op != "concat":
            kind[n.id], base[n.id] = "view", base[n.inputs[0]]
        elif n.op == "concat" and is_view(n) and len({base[i] for i in n.inputs}) == 1:
            kind[n.id], base[n.id] = "view", base[n.inputs[0]]
        else:
            kind[n.id], base[n.id] = "temp", n.id
    # a view of a state version read after a later store to that state must be a copy
    for n in nodes:
        if kind[n.id] == "view":
            root = _root(graph, kind, n.id)
            rn = graph.node(root)
            if rn.op in ("state", "store"):
                name = rn.attrs["name"]
                last = max(graph.users(n.id), default=n.id)
                if any(root < s < last for s in store_ids.get(name, [])) or n.id in graph.outputs.values():
                    kind[n.id], base[n.id] = "temp", n.id
    for p in _keep_old_reads(graph, kind, fusable(graph, kind, lanes), store_ids):
        kind[p] = "fused"
    for n in nodes:
        if _joins_rows(graph, kind, n, lanes):
            kind[n.id] = "joined"
            for i in n.inputs:
                kind[i], base[i] = "part", n.id
    order, depth = level_order(graph, kind)
    mm_depth = [depth[n.id] for n in nodes if n.op == "matmul"]
    alone = frozenset(n.id for n in nodes if n.op == "matmul" and mm_depth.count(depth[n.id]) == 1)
    pos = {nid: i for i, nid in enumerate(order)}
    at = {}                        # the last node whose lowering reads a node's inputs (fused: its users')
    for n in reversed(nodes):
        at[n.id] = max((at[u] for u in graph.users(n.id)), key=pos.get) if kind[n.id] == "fused" else n.id
    last_use: dict[int, int] = {}
    for n in nodes:
        for i in n.inputs:
            b = base.get(i, i)
            if pos[at[n.id]] > pos.get(last_use.get(b, -1), -1):
                last_use[b] = at[n.id]
    outputs_alias = {}
    claimed = set()
    for name, oid in graph.outputs.items():
        src = graph.node(oid).inputs[0]
        ok = kind[src] == "temp" and src not in claimed
        outputs_alias[oid] = ok
        if ok:
            claimed.add(src)
    return Plan(order, kind, base, last_use, outputs_alias, alone, depth)


def _keep_old_reads(graph: IRGraph, kind: dict, fused: set, store_ids: dict) -> set:
    """The fused set without producers that read a state version a later store overwrites before
    their last user: a fused producer's operands are read when its user is lowered, which would
    be after the store (the same rule as for views above)."""
    final: dict[int, int] = {}

    def last(nid):
        if nid not in final:
            final[nid] = max((last(u) if u in fused else u for u in graph.users(nid)), default=nid)
        return final[nid]

    out = set(fused)
    for p in sorted(fused, reverse=True):
        for i in graph.node(p).inputs:
            root = _root(graph, kind, i)
            rn = graph.node(root)
            if rn.op in ("state", "store") and any(root < s < last(p) for s in store_ids.get(rn.attrs["name"], [])):
                out.discard(p)
                break
    return out


# a late column part (compiler/rewrite_late.py) is lowered this many depths after the first
# matmul that reads the early part: after a softmax's max, exp, sum and division of the scores
# (their chains placed first, the product filling the MXM around them). Measured (bert_base
# L=3 / gpt2_small_prefill): 1: 45,684; 3: 45,187; 4: 44,965; 5: 44,909 / 182,393;
# 6: 44,900 / 182,368; 7: 45,093; 9: 45,806; not split: 45,867 / 193,247
LATE_DEPTHS = 6


def level_order(graph: IRGraph, kind: dict) -> tuple[list[int], dict]:
    """A topological order by depth: every node after all nodes of smaller depth, so that
    independent work (the heads of an attention, say) is lowered side by side and its chains
    interleave on the units instead of queueing behind each other in program order. A store
    also waits for every read of the state version it replaces (through views too), and a node
    of row group g (attribute `rows`, compiler/rewrite_rows.py) comes after every node of group
    g - 1 of its region (the groups' nodes are consecutive in the graph), and a node with
    attribute `after` comes after that node (an earlier one). Returns the order and
    each node's depth."""
    nodes = graph.nodes()
    preds = {n.id: list(n.inputs) for n in nodes}
    for n in nodes:
        if n.op == "store":
            todo, readers = [n.inputs[0]], []
            while todo:
                v = todo.pop()
                for u in graph.users(v):
                    if u != n.id and u < n.id:
                        readers.append(u)
                        if kind.get(u) in ("view", "mxm_t", "mxm_cvt"):
                            todo.append(u)
            preds[n.id] += readers
        elif n.op == "slice" and kind.get(n.inputs[0]) == "joined":
            preds[n.id] = _parts_read(graph, n)
    depth = _depths(nodes, preds, {})
    late = {n.id: depth[n.id + n.attrs["late"]] + LATE_DEPTHS for n in nodes if n.attrs.get("late")}
    if late:
        depth = _depths(nodes, preds, late)
    return sorted(depth, key=lambda i: (depth[i], i)), depth


def _depths(nodes, preds: dict, late: dict) -> dict:
    """Each node's depth: 1 + its deepest predecessor's, at least late[n] (a late column part,
    compiler/rewrite_late.py), and a node of row group g after every node of group g - 1."""
    depth = {}
    deepest: dict[int, int] = {}       # row group -> its deepest node so far (this region's)
    for n in nodes:
        depth[n.id] = max(1 + max((depth[p] for p in preds[n.id]), default=-1), late.get(n.id, 0))
        if "after" in n.attrs:        # lowered after that node (off its path: rewrite_pack)
            depth[n.id] = max(depth[n.id], depth[n.attrs["after"]] + 1)
        g = n.attrs.get("rows")
        if g is None:
            continue
        if g == 0 and max(deepest, default=0) > 0:      # a new region (compiler/rewrite_rows.py)
            deepest = {}
        if g > 0 and g - 1 in deepest:                  # after every node of the group before
            depth[n.id] = max(depth[n.id], deepest[g - 1] + 1)
        deepest[g] = max(deepest.get(g, -1), depth[n.id])
    return depth


def _parts_read(graph: IRGraph, n) -> list:
    """The parts of a joined concat that slice n reads (it waits for those only)."""
    cat = graph.node(n.inputs[0])
    ax = 0 if cat.attrs["axis"] in (0, -2) else len(cat.shape) - 1
    ix = n.attrs["index"][ax] if ax < len(n.attrs["index"]) else None
    lo, hi = (ix, ix + 1) if isinstance(ix, int) else tuple(ix) if ix is not None else (0, cat.shape[ax])
    out, off = [], 0
    for i in cat.inputs:
        w = graph.node(i).shape[ax]
        if off < hi and lo < off + w:
            out.append(i)
        off += w
    return out


def _joins_rows(graph: IRGraph, kind: dict, n, lanes: int) -> bool:
    """A concat along the rows of 2-D temporaries that only it uses (the heads' transposed
    outputs), or along their lanes in whole chunks (a decode step's heads combined per chunk,
    compiler/rewrite_decode.py): each is computed straight into its rows or chunks of the
    concat's region, no copy."""
    if n.op != "concat" or len(n.shape) != 2 or kind[n.id] != "temp":
        return False
    if n.attrs["axis"] not in (0, -2) and any(graph.node(i).shape[-1] % lanes for i in n.inputs[:-1]):
        return False
    if n.id in graph.outputs.values() or len(set(n.inputs)) != len(n.inputs):
        return False
    return all(kind[i] == "temp" and graph.users(i) == [n.id] and graph.node(i).dtype == n.dtype
               and graph.node(i).op not in ("input", "weight", "state", "const") and i not in graph.outputs.values()
               for i in n.inputs)


def _in_acc(graph: IRGraph, n) -> bool:
    """A matmul whose one user is a matmul that adds it in the accumulators (its third operand)."""
    us = graph.users(n.id)
    return n.op == "matmul" and len(us) == 1 and graph.node(us[0]).op == "matmul" \
        and tuple(graph.node(us[0]).inputs[2:]) == (n.id,) and n.id not in graph.outputs.values()


def _root(graph, kind, nid):
    while kind[nid] == "view":
        nid = graph.node(nid).inputs[0]
    return nid


def _mxm_widenable(graph, n) -> bool:
    """An i8 tensor cast to a float and used only as the weights of f16 matmuls: the MXM
    widens it to f16 as it loads (LW cvt=1), exactly, with no copy in SRAM."""
    if graph.node(n.inputs[0]).dtype != "i8" or n.dtype not in ("f16", "f32"):
        return False
    users = graph.users(n.id)
    return bool(users) and all(
        graph.node(u).op == "matmul" and graph.node(u).inputs[1] == n.id and graph.node(u).inputs[0] != n.id
        and graph.node(u).dtype == "f32" for u in users)


def _mxm_transposable(graph, n) -> bool:
    nd = len(n.shape)
    if nd < 2 or list(n.attrs["perm"]) != list(range(nd - 2)) + [nd - 1, nd - 2]:
        return False
    users = graph.users(n.id)
    return bool(users) and all(
        graph.node(u).op == "matmul" and graph.node(u).inputs[1] == n.id and graph.node(u).inputs[0] != n.id
        for u in users)
