"""Rewrites (the first ones) that shorten a step's chain of dependent trips, for decode rows.

Pass `one_pass_var`: a layernorm's variance from two independent sums. The prelude's layernorm
takes var = mean(d * d) with d = x - mean(x): the second lane sum waits for the first (its
reduction trip, the subtraction, the square), and on a decode row each sum is a trip from the
VXM to the MXM (or the SXM) at the chip's edge and back. Lowered as mean(x * x) - mu * mu
instead, both sums read x alone and run side by side: one trip on the critical path instead of
two. Measured (tsp-v1): gpt2_small_decode 29,396 -> 27,410 cycles, gpt2_block_decode 1,773 ->
1,589, gpt2_block_prefill 4,002 -> 3,914, bert_base 178,788 -> 173,937 (L=1 16,298 -> 15,526),
gpt2_small_prefill 193,247 -> 187,863; no program slower. Only the lowered graph changes: the
reference, the GPU baseline and the prelude keep the two-pass form, and the one-pass value
agrees within the reference's tolerance (the same sums in the operands' dtype; the difference
cancels in that dtype, which loses digits only for rows whose mean is far larger than their
spread). Matched where d's square feeds nothing but the variance, over the same axis as the
mean, every value in one dtype, f32 (SAFE_DTYPES: in f16 the square overflows), on at most
MAX_ROWS rows.

Pass `split_gemv`: a decode row's product with i8 weights waits on its weight installs (a
K-tile's LWs take lanes / lw_ports_per_plane cycles on its plane pair, its ABC one or two).
With an odd number of output chunks for the 2 pairs (gpt2's wo and w2: 3 chunks of 768), one
pair loads two chunks' tiles while the other idles for one. Split over K's halves, a @ w is
a[:, :h] @ w[:h] + a[:, h:] @ w[h:]: the lowering spreads the halves' jobs over both pairs
and the VXM adds the partial sums (f32, within the reference's tolerance). Measured:
gpt2_small_decode 27,410 -> 26,701 (w2 alone 26,965; L=1 2,520 -> 2,407, L=2 4,830 -> 4,738);
no other bundled program has such a product.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import DROP, rebuild

FEW_ROWS = 16     # rows of a decode step's products (compiler/lower_mxm.py's FEW_ROWS)
MIN_MOVED = 16    # weight-load cycles a K split must move to the other pair to outweigh its add
#                   (tsp-v1 wo, 1 K-tile of 20 cycles: faster; tiny, 1 K-tile of 4: 89 -> 94 cycles)
SAFE_DTYPES = ("f32",)   # x * x in f16 overflows from |x| = 256 on (65,504), and mean(x * x) - mu * mu
#                   cancels: gpt2_small_prefill's 12 layers (f16 rows) failed the check, max abs
#                   error 8.0 in state kc; f32 rows (bert_base) check ok
MAX_ROWS = 128    # rows normalised at most: past that the sums' work, not their latency, decides
#                   (gpt2_block_prefill at D=768, H=12: S=64 9,595 -> 9,280 cycles, S=128 16,248 ->
#                   15,669, but S=256 31,388 -> 31,629 and S=512 72,108 -> 72,154)


def _two_pass(g: IRGraph, v):
    """(x id, mu id, d * d id) when v is mean(d * d) of d = x - mu, mu = mean(x) on v's axis,
    else None."""
    if v.op != "mean":
        return None
    sq = g.node(v.inputs[0])
    if sq.op != "mul" or sq.inputs[0] != sq.inputs[1] or g.users(sq.id) != [v.id]:
        return None
    d = g.node(sq.inputs[0])
    if d.op != "sub":
        return None
    x, mu = (g.node(i) for i in d.inputs)
    if mu.op != "mean" or mu.inputs[0] != x.id or mu.attrs["axis"] != v.attrs["axis"]:
        return None
    if not x.dtype == mu.dtype == d.dtype == sq.dtype == v.dtype or x.shape != d.shape:
        return None
    if x.dtype not in SAFE_DTYPES:
        return None
    if int(np.prod(x.shape, dtype=np.int64)) // max(1, x.shape[v.attrs["axis"]]) > MAX_ROWS:
        return None
    return x.id, mu.id, sq.id


def one_pass_var(g: IRGraph) -> IRGraph:
    """g with every two-pass variance as mean(x * x) - mu * mu (g itself if none)."""
    cands = {n.id: m for n in g.nodes() if (m := _two_pass(g, n)) is not None}
    if not cands:
        return g
    squares = {c[2] for c in cands.values()}      # only the variance reads them: not copied

    def node(new, n, m):
        if n.id in squares:
            return DROP
        if n.id not in cands:
            return None
        x, mu = (g.node(i) for i in cands[n.id][:2])
        xx = new.add("mul", (m[x.id], m[x.id]), x.shape, n.dtype, {}, n.line, n.col)
        ex2 = new.add("mean", (xx,), n.shape, n.dtype, dict(n.attrs), n.line, n.col)
        mu2 = new.add("mul", (m[mu.id], m[mu.id]), mu.shape, n.dtype, {}, n.line, n.col)
        return new.add("sub", (ex2, mu2), n.shape, n.dtype, {}, n.line, n.col)
    return rebuild(g, node)


def _uneven_gemv(g: IRGraph, n, lanes: int, units: int, lw_cycles: int):
    """K split point of a few-row product a @ f16(w8) (an i8 weight widened on its way into
    the MXM) whose output chunks do not share the plane pairs evenly, else None. Only units + 1
    chunks (gpt2's 3: one pair loads two chunks' weights while the other idles for one): at 5
    and 13 (Llama-2-7B's tensor-parallel ranks: wg and wu, wo and wd) the halves' second result
    stream and their sum cost more than the balance gains (L=2 on 8 chips: 15,852 cycles with
    both splits, 15,111 with the 5-chunk ones, 14,994 with none)."""
    if n.op != "matmul" or len(n.shape) != 2 or n.shape[0] > FEW_ROWS:
        return None
    b = g.node(n.inputs[1])
    if b.op != "cast" or b.dtype != "f16" or g.node(b.inputs[0]).dtype != "i8" or g.users(b.id) != [n.id]:
        return None
    k = g.node(n.inputs[0]).shape[-1]
    ktiles, nchunks = -(-k // lanes), -(-n.shape[-1] // lanes)
    if nchunks % units == 0 or nchunks > units + 1 or (ktiles // 2) * lw_cycles < MIN_MOVED:
        return None
    return lanes * (ktiles // 2)


def split_gemv(g: IRGraph, machine) -> IRGraph:
    """g with every uneven few-row product of an i8 weight as the sum of two products over the
    halves of K: the odd output chunk's K-tiles then run on both plane pairs (g itself if none)."""
    lanes, units = machine.lanes, machine.mxm_planes // 2
    lw_cycles = lanes // machine.lw_ports_per_plane
    cands = {n.id: s for n in g.nodes() if (s := _uneven_gemv(g, n, lanes, units, lw_cycles)) is not None}
    if not cands:
        return g
    casts = {g.node(nid).inputs[1] for nid in cands}

    def node(new, n, m):
        if n.id in casts:
            return DROP
        if n.id not in cands:
            return None
        a, b = g.node(n.inputs[0]), g.node(n.inputs[1])
        w8 = g.node(b.inputs[0])
        rows, k, cols = a.shape[0], a.shape[1], n.shape[1]
        parts = []
        for k0, k1 in ((0, cands[n.id]), (cands[n.id], k)):
            ap = new.add("slice", (m[a.id],), (rows, k1 - k0), a.dtype, {"index": ((0, rows), (k0, k1))}, n.line, n.col)
            wp = new.add("slice", (m[w8.id],), (k1 - k0, cols), w8.dtype, {"index": ((k0, k1), (0, cols))}, n.line, n.col)
            bp = new.add("cast", (wp,), (k1 - k0, cols), b.dtype, dict(b.attrs), n.line, n.col)
            parts.append(new.add("matmul", (ap, bp), n.shape, n.dtype, dict(n.attrs), n.line, n.col))
        return new.add("add", tuple(parts), n.shape, n.dtype, {}, n.line, n.col)
    return rebuild(g, node)
