"""Pass `heads_rope` (after `rewrite`): the heads' rope of one row in one op.

concat([rope(x[:, i*HD:(i+1)*HD], pos) for i in 0..H], axis=-1), with the heads covering x's
last axis in order (llama's roped k, stored in the cache), moves every head's lanes out of x,
ropes them and moves them back: three trips between the MEM and the SXM per head on a decode
step's critical path. It is rope(x, pos) with the rotation and the tables per HD lanes (attr
`hd`): one SXM permute within each head's lanes and the VXM products, one trip (movement.rope).
Only where no head straddles two vector chunks. Each lane's value is the one the heads' ropes
give (the same products and sum in f32, the same tables).
"""
from __future__ import annotations

from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import rebuild


def _heads(g: IRGraph, n, lanes: int):
    """(x id, pos, theta, HD) where concat n is of the heads' ropes of x in order, else None."""
    if n.op != "concat" or len(n.shape) < 1 or n.attrs["axis"] not in (len(n.shape) - 1, -1) or len(n.inputs) < 2:
        return None
    key, off = None, 0
    for i in n.inputs:
        r = g.node(i)
        if r.op != "rope" or "hd" in r.attrs or g.users(i) != [n.id]:
            return None
        s = g.node(r.inputs[0])
        if s.op != "slice" or g.users(s.id) != [r.id]:
            return None
        x = g.node(s.inputs[0])
        idx = tuple(s.attrs["index"])
        hd = r.shape[-1]
        lead_full = all(not isinstance(e, int) and tuple(e) == (0, d) for e, d in zip(idx[:-1], x.shape[:-1]))
        if (len(idx) != len(x.shape) or not lead_full or isinstance(idx[-1], int)
                or tuple(idx[-1]) != (off, off + hd) or off // lanes != (off + hd - 1) // lanes):
            return None
        k = (x.id, r.attrs.get("pos", 0), r.attrs.get("theta", 10000.0), hd, x.dtype == r.dtype)
        if key is not None and k != key:
            return None
        key, off = k, off + hd
    if off != g.node(key[0]).shape[-1] or not key[4] or g.node(key[0]).shape != n.shape:
        return None
    return key[:4]


def heads_rope(g: IRGraph, lanes: int) -> IRGraph:
    """g with every concat of the heads' ropes of one tensor as one rope (g itself if none)."""
    cands = {n.id: h for n in g.nodes() if (h := _heads(g, n, lanes)) is not None}
    if not cands:
        return g

    def node(new, n, m):
        if n.id not in cands:
            return None
        x, pos, theta, hd = cands[n.id]
        return new.add("rope", (m[x],), n.shape, n.dtype, {"pos": pos, "theta": theta, "hd": hd}, n.line, n.col)
    return rebuild(g, node)
