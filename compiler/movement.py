"""Data movement between lanes: lane assembly (slices, concats, reshapes, rotate-half),
transposes through the SXM transpose buffers, and rope.

Lane assembly: every output vector is a sum of pieces, one per source vector it draws from;
a piece is SXM PERMUTE(source, table) with the table selecting exactly the lanes wanted (the
others 0), so the VXM adds are exact.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder, sxm_rows
from lpu.compiler.lower_common import gather_chain, sxm_vxm_chain, vxm_chain
from lpu.compiler.rewrite_pair import live
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, DTYPE_WIDTH, dtype_width
from lpu.isa.machine import EAST, WEST


def source_map(lw, n):
    """(input node ids, src_in, src_flat): for every output element (row-major), which input
    and which flat element of it it copies."""
    g = lw.g
    if n.op == "slice":
        x = g.node(n.inputs[0])
        idx = list(n.attrs["index"]) + [(0, d) for d in x.shape[len(n.attrs["index"]):]]
        axes = [np.arange(e % d, e % d + 1) if isinstance(e, int) else np.arange(*slice(*e).indices(d))
                for e, d in zip(idx, x.shape)]      # only the selected elements, not all of x
        flat = np.ravel_multi_index(np.ix_(*axes), x.shape).reshape(-1).astype(np.int64)
        return [x.id], np.zeros(flat.size, np.int64), flat
    if n.op == "reshape":
        x = g.node(n.inputs[0])
        return [x.id], np.zeros(x.size, np.int64), np.arange(x.size, dtype=np.int64)
    if n.op == "concat":
        ax = n.attrs["axis"]
        ids, flats = [], []
        for k, i in enumerate(n.inputs):
            x = g.node(i)
            ids.append(np.full(x.shape, k, np.int64))
            flats.append(np.arange(x.size, dtype=np.int64).reshape(x.shape))
        return list(n.inputs), np.concatenate(ids, axis=ax).reshape(-1), np.concatenate(flats, axis=ax).reshape(-1)
    raise AssertionError(n.op)


GATHER_MAX = 16    # (pieces beyond the first of their vector: see assemble)


def assemble(lw, n, smap, dst=None, dtype=None, shape=None):
    """Build every vector of `dst` (default: the node's own grid, of `shape`) from the source
    map; its sources are node ids, or (grid, shape, dtype) of regions that are not nodes.
    The pieces (output vector, source, source vector) and their tables are found with numpy
    for all vectors at once; runs of vectors of one piece become permute chains in one batch,
    a vector of several pieces one chain (permutes summed on the VXM as they arrive)."""
    ids, src_in, src_flat = smap
    lanes = lw.lanes
    dst = lw.grid[n.id] if dst is None else dst
    dtype = n.dtype if dtype is None else dtype
    shape = shape or (n.shape if n.shape else (1,))
    C = shape[-1]
    rows = dst.reshape(-1, dst.shape[-1])
    R, J = rows.shape
    srcs = []
    for i in ids:
        if isinstance(i, tuple):
            grid, xs, xdt = i
        else:
            x = lw.g.node(i)
            grid, xs, xdt = lw.grid[i], (x.shape if x.shape else (1,)), x.dtype
        srcs.append((grid.reshape(-1, grid.shape[-1]), xs[-1], xdt))
    p_ov, p_k, p_vec, tables = _pieces(lanes, R, J, C, src_in, src_flat, srcs)
    # every output vector in order: its pieces, or one empty piece (k = -1) if it has none
    empty = np.setdiff1d(np.arange(R * J), p_ov)
    if len(empty):
        o = np.argsort(np.concatenate([p_ov, empty]), kind="stable")
        p_ov = np.concatenate([p_ov, empty])[o]
        p_k = np.concatenate([p_k, np.full(len(empty), -1)])[o]
        p_vec = np.concatenate([p_vec, np.zeros(len(empty), np.int64)])[o]
        tables = np.concatenate([tables, np.full((len(empty), lanes), -1, np.int32)])[o]
    tid = _table_ids(lw.ctx, tables)
    p_src = np.zeros(len(p_ov), np.int64)
    for k, (sgrid, _, _) in enumerate(srcs):
        sel = p_k == k
        p_src[sel] = sgrid.reshape(-1)[p_vec[sel]]
    flat_rows = rows.reshape(-1)
    add = O.VXM_BINARY["ADD"]
    run, run_dt = [], None

    def flush():
        if run:
            c = lw.ctx
            idx = np.asarray(run, np.int64)
            srcv = p_src[idx]
            srcv[p_k[idx] < 0] = lw.zero_vector() if (p_k[idx] < 0).any() else 0
            lw.chains.append(sxm_rows(c, n.line, n.id, O.PERMUTE, srcv, flat_rows[p_ov[idx]],
                                      dtype_width(run_dt), DTYPE_CODE[run_dt], tid[idx]))
            run.clear()

    kl, ovl = p_k.tolist(), p_ov.tolist()
    # a chain per vector of several pieces pays where they are few (latency); many such
    # vectors keep the SXM busy either way, and rigid chains of several permutes place later
    few = len(kl) - len(np.unique(p_ov)) <= GATHER_MAX
    i = 0
    while i < len(kl):
        j = i + 1
        while j < len(kl) and ovl[j] == ovl[i]:
            j += 1
        k = kl[i]
        dt = srcs[k][2] if k >= 0 else dtype
        ov = ovl[i]
        out = int(flat_rows[ov])
        nv = max(0, min(lanes, C - (ov % J) * lanes))
        if j - i > 1 and few:             # pieces of one vector: permuted and summed in one chain
            flush()
            moved = [(int(p_src[x]), srcs[kl[x]][2], O.PERMUTE, int(tid[x])) for x in range(i, j)]
            if gather_chain(lw, n, [], moved, add, out, dtype, dtype, nv):
                i = j
                continue
        if j - i > 1:                     # the first piece permuted, each other one added in turn
            if dt != run_dt:
                flush()
                run_dt = dt
            run.append(i)
            flush()
            for x in range(i + 1, j):
                sxm_vxm_chain(lw, n, O.PERMUTE, int(tid[x]), int(p_src[x]), add, (out, dtype), out,
                              srcs[kl[x]][2], dtype, nv)
            i = j
            continue
        if dt != run_dt:
            flush()
            run_dt = dt
        run.append(i)
        i = j
    flush()


def _pieces(lanes, R, J, C, src_in, src_flat, srcs):
    """The pieces of lane assembly, ordered by output vector, then source, then source
    vector: (output vector, source, source vector, tables [pieces, lanes] int32)."""
    c = np.arange(C)
    c = c[c // lanes < J]
    e = (np.arange(R)[:, None] * C + c[None, :]).reshape(-1)
    ov = (np.arange(R)[:, None] * J + c[None, :] // lanes).reshape(-1)
    outl = np.broadcast_to(c % lanes, (R, len(c))).reshape(-1)
    ks, fs = src_in[e], src_flat[e]
    sc = np.asarray([s[1] for s in srcs], np.int64)[ks]
    wd = np.asarray([s[0].shape[1] for s in srcs], np.int64)[ks]
    vec = (fs // sc) * wd + (fs % sc) // lanes
    lane = (fs % sc) % lanes
    o = np.lexsort((vec, ks, ov))
    ov, ks, vec, lane, outl = ov[o], ks[o], vec[o], lane[o], outl[o]
    new = np.ones(len(ov), bool)
    new[1:] = (ov[1:] != ov[:-1]) | (ks[1:] != ks[:-1]) | (vec[1:] != vec[:-1])
    pid = np.cumsum(new) - 1
    tables = np.full((int(new.sum()), lanes), -1, np.int32)
    tables[pid, outl] = lane
    return ov[new], ks[new], vec[new], tables


def _table_ids(ctx, tables):
    """ctx.table of every row, registered in row order (each distinct table once)."""
    if len(tables) == 0:
        return np.zeros(0, np.int64)
    rows = np.ascontiguousarray(tables).view(np.dtype((np.void, tables.shape[1] * 4))).reshape(-1)
    _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
    ids = np.empty(len(first), np.int64)
    for u in np.argsort(first, kind="stable"):
        ids[u] = ctx.table(tables[first[u]])
    return ids[inv.reshape(-1)]


def transpose_any(lw, n):
    """y = transpose(x, perm) when perm moves the last axis: a view that brings the axis a that
    becomes last next to x's last axis, one pass through the SXM transpose buffers swapping
    them, and a view onto y's own grid (the buffers write straight into y's vectors)."""
    x = lw.g.node(n.inputs[0])
    nd = len(x.shape)
    perm = list(n.attrs["perm"])
    a = perm[-1]
    r = [i for i in range(nd - 1) if i != a] + [nd - 1, a]           # x axes in x2's order
    q1 = r[:-2] + [a, nd - 1]                                        # x1 = x.transpose(q1): a view
    x1_shape = tuple(x.shape[i] for i in q1)
    x1 = np.transpose(lw.grid[x.id], q1[:-1] + [nd - 1])
    q2 = [r.index(i) for i in perm]                                  # y = x2.transpose(q2), q2[-1] last
    inv = [q2.index(i) for i in range(nd)]
    x2_view_of_y = np.transpose(lw.grid[n.id], inv[:-1] + [nd - 1])
    transpose_grid(lw, n, x1, x1_shape, x2_view_of_y, x.dtype)


def tfold(lw, n):
    """Op `tfold` (compiler/rewrite_pair.py), x [R, W] in one chunk and parts * R rows at most
    the lanes: one block through the SXM transpose buffers whose rows are x's rows, then x's
    rows rotated by -step, -2 * step, ... on their way in (READ, ROTATE, TPIN in one chain: no
    copy in SRAM); buffer column col read out holds x[r, col + j * step] in lane j * R + r, and
    only the columns of the runs are read out. Where x's zeros are known (a causal softmax's p.T:
    rewrite_pair.live) and the SXM's buffer is clean, each column is read out as soon as the
    rows it needs are in (`_fold_streamed`), or, where its one user is a product reading it as
    rows (`fed`), by that product's ABC chains (`fold_feed`): this lowers nothing then."""
    x = lw.g.node(n.inputs[0])
    R, a = x.shape[0], n.attrs
    src = np.asarray(lw.grid[x.id]).reshape(R, -1)[:, 0]
    rows = np.tile(src, a["parts"]).reshape(1, a["parts"] * R, 1)
    rots = np.repeat(-a["step"] * np.arange(a["parts"]), R)
    cols = np.concatenate([np.arange(s, s + a["count"]) for s in a["starts"]])
    h = tfold_sxm(lw.g, n)
    dst = lw.grid[n.id].reshape(1, n.shape[0], -1)
    need = _fold_need(lw, n, x, cols)
    if need is not None and not lw.in_loop(n) and \
            not any(lw.ctx.tp_dirty.get((h, p), 0) for p in range(O.SXM_TRANSPOSE_BUFFERS)):
        if fed(lw, n):
            lw.fold_feeds[n.id] = (n, rows.reshape(-1), rots, cols, h, need, np.zeros(len(rots), bool))
            for p in range(dtype_width(x.dtype)):
                lw.ctx.tp_dirty[(h, p)] = int(np.flatnonzero(need.any(axis=1)).max()) + 1
            return
        _fold_streamed(lw, n, rows.reshape(-1), rots, cols, h, need, dst.reshape(-1), x.dtype)
        return
    transpose_grid(lw, n, rows, (a["parts"] * R, n.shape[0]), dst, x.dtype, rots, cols, h)


def _fold_need(lw, n, x, cols):
    """need[j, i]: buffer row j of tfold n holds a value that column cols[i] reads and that
    may be non-zero (x's known zeros: rewrite_pair.live), or None (not known, or a column
    that needs no row)."""
    lv = live(lw.g, x.id)
    if lv is None:
        return None
    R, W = x.shape
    a, lanes = n.attrs, lw.lanes
    j = np.arange(a["parts"] * R)
    src = (cols[None, :] + (j // R * a["step"])[:, None]) % lanes        # ROTATE by -k * step
    need = np.zeros(src.shape, bool)
    ok = src < W
    need[ok] = lv[np.broadcast_to((j % R)[:, None], src.shape)[ok], src[ok]]
    return need if need.any(axis=0).all() else None


def _fold_streamed(lw, n, rows, rots, cols, h, need, dst, dtype):
    """A tfold's chains in the order its columns can be read out: before each column (TPOUT)
    the rows it needs that are not in yet (TPIN), the TPOUT after those TPINs only (a fold
    marker, not the SXM's TPIN marker). The buffer is clean (no earlier transpose on this
    SXM: its TPINs wait for no TPOUT), so a row not in yet reads as 0 where the column reads
    it, which is x's value there. Rows no column needs are not filled."""
    c = lw.ctx
    w, dt = dtype_width(dtype), DTYPE_CODE[dtype]
    spos = c.m.sxm_pos(h)
    fold = ("tfold", h, n.id)
    done = np.zeros(len(rows), bool)
    for i, col in enumerate(cols):
        _fold_tpins(lw, n, h, spos, rows, rots, w, dt, np.flatnonzero(need[:, i] & ~done), ((("tpin", h), 0), (fold, 0)))
        done[need[:, i]] = True
        _tpout_chain(lw, n, h, spos, int(col), int(dst[i]), w, dt, ((fold, 1),))
    for p in range(w):
        c.tp_dirty[(h, p)] = int(np.flatnonzero(done).max()) + 1


def fed(lw, n) -> bool:
    """Streamed tfold n feeds its columns straight to its one user, a product with n as its
    left operand (one K-tile, one output chunk): each column's TPOUT in the chain of
    the ABC that reads it (`fold_feed`), no trip through SRAM. The product's install comes
    first (lowered with the product, after the fold: its chains placed before the TPINs).
    Measured on attention_prefill (tsp-v1): 816 -> 806 (TPOUT to ABC 4 cycles, were 11-24: the
    write, the read and the hops to and from the fold's slices; the last ABCs 729/732 ->
    716/723), with the products' rows out of p.T's slices (placement.temp_region; 921 without:
    their writes crowded the second fold's reads, placed after them now)."""
    us = lw.g.users(n.id)
    if len(us) != 1:
        return False
    u = lw.g.node(us[0])
    return u.op == "matmul" and n.dtype == "f16" and len(u.inputs) == 2 and u.inputs[0] == n.id and \
        u.inputs[1] != n.id and n.shape[-1] <= lw.lanes and u.shape[-1] <= lw.lanes


def fold_feed(lw, fid, cb, row, pos, dt) -> int:
    """The stream group of fed tfold fid's row `row` (buffer column cols[row]) arriving at MXM
    position pos at offset 0 of chain cb: the TPINs of the rows that column needs not in yet go
    first (their own chains), then the column's TPOUT joins cb."""
    n, rows, rots, cols, h, need, done = lw.fold_feeds[fid]
    c = lw.ctx
    w = dtype_width(n.dtype)
    spos = c.m.sxm_pos(h)
    fold = ("tfold", h, n.id)
    _fold_tpins(lw, n, h, spos, rows, rots, w, dt, np.flatnonzero(need[:, row] & ~done), ((("tpin", h), 0), (fold, 0)))
    done[need[:, row]] = True
    gl = cb.link(spos, pos, 0, w)
    cb.tpout(h, -(c.lat[O.TPOUT] + abs(pos - spos)), int(cols[row]), (gl, dt), ((fold, 1),), ((("tpout", h), 0),))
    return gl


def _fold_tpins(lw, n, h, spos, rows, rots, w, dt, js, mark):
    """The TPINs of a fold's buffer rows js: a row and its copy rotated by -step (the same
    source slot) in one chain, one READ feeding the plain row's TPIN and the ROTATE in the same
    cycle, the rotated row's TPIN the ROTATE's latency later; a row without its mate alone
    (`_tpin_chain`). Each had been a chain of its own with its own READ: 4 reads of each row of
    p.T, where the division writes the rest of its rows. Measured on attention_prefill (tsp-v1):
    793 -> 792."""
    c = lw.ctx
    js = [int(j) for j in js]
    rotated: dict = {}
    for j in js:
        if rots[j]:
            rotated.setdefault(int(rows[j]), []).append(j)
    paired = set()
    for j in js:
        mates = rotated.get(int(rows[j])) if not rots[j] else None
        if not mates:
            if j not in paired:
                _tpin_chain(lw, n, h, spos, int(rows[j]), int(rots[j]), w, dt, j, (), mark)
            continue
        mate = mates.pop(0)
        paired.add(mate)
        cb = ChainBuilder(c, n.line, n.id)
        t = -c.lat[O.ROTATE]
        gr = cb.read(int(rows[j]), w, spos, t)
        cb.tpin(h, t, (gr, dt), j, after=(), mark=mark)
        gi = cb.link(spos, spos, 0, w)
        cb.sxm(O.ROTATE, h, t, (gr, dt), (gi, dt), int(rots[mate]))
        cb.tpin(h, 0, (gi, dt), mate, after=(), mark=mark)
        lw.chains.append(cb.chain())


def _tpin_chain(lw, n, h, spos, slot, k, w, dt, row, after, mark):
    """READ slot (ROTATE it by k on the SXM where k), TPIN it as buffer row `row`."""
    c = lw.ctx
    cb = ChainBuilder(c, n.line, n.id)
    if k:
        t = -c.lat[O.ROTATE]
        gr = cb.read(slot, w, spos, t)
        gi = cb.link(spos, spos, 0, w)
        cb.sxm(O.ROTATE, h, t, (gr, dt), (gi, dt), k)
    else:
        gi = cb.read(slot, w, spos, 0)
    cb.tpin(h, 0, (gi, dt), row, after=after, mark=mark)
    lw.chains.append(cb.chain())


def _tpout_chain(lw, n, h, spos, col, out, w, dt, after):
    """TPOUT buffer column col straight to SRAM slot out."""
    cb = ChainBuilder(lw.ctx, n.line, n.id)
    go = cb.write(out, w, spos, lw.ctx.lat[O.TPOUT])
    cb.tpout(h, 0, col, (go, dt), after, ((("tpout", h), 0),))
    lw.chains.append(cb.chain())


def tfold_sxm(g, n) -> int:
    """The SXM of tfold n: the i-th tfold of a tensor takes SXM i % 2, its product the plane pair
    on that side (lower_mxm._weight_units) and its rows that side's slices (placement.side_of),
    so that two heads' pairs are folded side by side, each next to the pair that reads it."""
    return [u for u in g.users(n.inputs[0]) if g.node(u).op == "tfold"].index(n.id) % 2


def transpose_grid(lw, n, src, shape, dst, dtype, rots=None, cols=None, sxm=None):
    """dst[..., c, r] = src[..., r, c] through the SXM transpose buffers, one lanes x lanes
    block at a time, on the SXM of the block's side (its source all on one hemisphere:
    placement.side_of), else alternating the two SXMs. A column read out (TPOUT) holds every row of
    the buffer: rows past the block's may hold an earlier block's (`Ctx.tp_dirty`; the
    buffers start zeroed). Where none do, each column goes from the SXM
    straight to SRAM; where some do, they are first filled from zero vectors, except in the
    trips of a loop of several, where the VXM zeroes those lanes of each column on its way
    (zero rows: attention_prefill 1,445 -> 1,442, llama_block_prefill 6,239 -> 6,196,
    bert_base L=1 14,803 -> 14,796; in loops too: gpt2_small_prefill 182,368 -> 181,906 but
    bert_base 166,659 -> 167,602, L=3 42,306 -> 42,439, its trips replaying less)."""
    c = lw.ctx
    lanes = lw.lanes
    R, C = shape[-2], shape[-1]
    w, dt = dtype_width(dtype), DTYPE_CODE[dtype]
    s3 = src.reshape((-1,) + src.shape[-2:])
    d3 = dst.reshape((-1,) + dst.shape[-2:])
    vpos = c.m.vxm_pos
    conv = O.VXM_UNARY["CONV"]
    loop = lw.in_loop(n)
    for b in range(s3.shape[0]):
        for rb in range(-(-R // lanes)):
            for cbk in range(-(-C // lanes)):
                sides = {c.sxm_near(int(x)) for x in s3[b, rb * lanes:(rb + 1) * lanes, cbk].reshape(-1)}
                h = sxm if sxm is not None else sides.pop() if len(sides) == 1 else c.next_sxm()
                spos = c.m.sxm_pos(h)
                nr = min(lanes, R - rb * lanes)
                keys = [(h, p) for p in range(w)]
                stale = lanes if loop else max(c.tp_dirty.get(k, 0) for k in keys)
                rows = [int(s3[b, rb * lanes + r, cbk]) for r in range(nr)]
                if stale > nr and not loop:
                    zeros = lw.zero_vectors()
                    rows += [int(zeros[j % len(zeros)]) for j in range(stale - nr)]
                    stale = nr
                for r, slot in enumerate(rows):     # (tfold: rotated on the SXM on their way in)
                    k = int(rots[rb * lanes + r]) if rots is not None and rb * lanes + r < len(rots) else 0
                    _tpin_chain(lw, n, h, spos, slot, k, w, dt, r, ((("tpout", h), 1),), ((("tpin", h), 0),))
                for k in keys if not loop else [(x, p) for x in (0, 1) for p in range(max(DTYPE_WIDTH))]:
                    c.tp_dirty[k] = max(stale, nr)       # (a loop's: any, its trips replayed)
                for col in range(min(lanes, C - cbk * lanes)):
                    out = int(d3[b, cbk * lanes + col, rb])
                    after, mark = ((("tpin", h), 1),), ((("tpout", h), 0),)
                    if stale <= nr:
                        _tpout_chain(lw, n, h, spos, col if cols is None else int(cols[col]), out, w, dt, after)
                    else:   # stale buffer rows past nr: zero those lanes on the VXM
                        cb = ChainBuilder(c, n.line, n.id)
                        t0 = -(c.lat[O.TPOUT] + abs(vpos - spos))
                        gl = cb.link(spos, vpos, 0, w)
                        cb.tpout(h, t0, col if cols is None else int(cols[col]), (gl, dt), after, mark)
                        go = cb.write(out, w, vpos, c.lat[conv])
                        cb.vxm(conv, 0, (gl, dt), None, (go, dt), nv=nr)
                        lw.chains.append(cb.chain())


def rope_tables(shape, pos, theta):
    """cos and signed sin tables [R, HD] in f32, exactly as the reference computes them."""
    R, HD = shape[-2], shape[-1]
    half = HD // 2
    inv = theta ** (-(2.0 * np.arange(half, dtype=np.float64)) / HD)
    ang = np.arange(pos, pos + R, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.cos(ang).astype(np.float32)
    sin = np.sin(ang).astype(np.float32)
    return np.concatenate([cos, cos], axis=1), np.concatenate([-sin, sin], axis=1)


def rope(lw, n, out=None):
    """out = x * cos + rotate_half(x) * sin, rotate_half by lane assembly (its sign folded into
    the sin table), the products and the sum on the VXM in f32; with attr `hd`, per hd lanes
    (the heads' ropes of a row: rewrite_rope). Where a row's every head lies in one vector,
    one chain per vector: the SXM permutes x while the VXM multiplies x by cos, then the sum.
    `out`: the grid written (default the node's own)."""
    x = lw.g.node(n.inputs[0])
    W = x.shape[-1]
    HD = n.attrs.get("hd", W)             # even: the front end checks it
    key = (tuple(x.shape[-2:]), n.attrs.get("pos", 0), n.attrs.get("theta", 10000.0), HD)
    if key not in lw.rope_cache:
        cos, sin = rope_tables(key[0][:-1] + (HD,), *key[1:3])
        cos, sin = (np.tile(t, (1,) * (t.ndim - 1) + (W // HD,)) for t in (cos, sin))
        lw.rope_cache[key] = (lw.const_region(f"__rope_cos{n.id}", cos, "f32"),
                              lw.const_region(f"__rope_sin{n.id}", sin, "f32"))
    cg, sg = lw.rope_cache[key]
    xg = lw.grid[x.id]
    out = lw.grid[n.id] if out is None else out
    cgb, sgb = np.broadcast_to(cg, out.shape), np.broadcast_to(sg, out.shape)
    lanes = lw.lanes
    if HD <= lanes and all(h // lanes == (h + HD - 1) // lanes for h in range(0, W, HD)):
        tids = []
        for j in range(out.shape[-1]):
            c = j * lanes + np.arange(min(lanes, W - j * lanes))
            tab = np.full(lanes, -1, np.int32)
            tab[:len(c)] = (c // HD) * HD + (c % HD + HD // 2) % HD - j * lanes
            tids.append(lw.ctx.table(tab))
        rest = [ix for ix in np.ndindex(out.shape)
                if not _rope_chain(lw, n, x.dtype, int(xg[ix]), tids[ix[-1]], int(cgb[ix]), int(sgb[ix]),
                                   int(out[ix]), min(lanes, W - ix[-1] * lanes))]
        if rest:
            _rope_split(lw, n, x, cgb, sgb, rest, out)
        return
    _rope_split(lw, n, x, cgb, sgb, list(np.ndindex(out.shape)), out)


def _rope_chain(lw, n, xdt, xs, tid, cs, ss, dst, nv) -> bool:
    """One row of rope in one chain; False (nothing added) where it cannot be placed."""
    c = lw.ctx
    vpos = c.m.vxm_pos
    h = c.sxm_near(xs)
    spos = c.m.sxm_pos(h)
    w, dt, f32 = dtype_width(xdt), DTYPE_CODE[xdt], DTYPE_CODE["f32"]
    mul, add = O.VXM_BINARY["MUL"], O.VXM_BINARY["ADD"]
    cb = ChainBuilder(c, n.line, n.id)
    ts = -(c.lat[O.PERMUTE] + abs(vpos - spos))
    gi = cb.read(xs, w, spos, ts)
    g_r = cb.link(spos, vpos, 0, w)
    cb.sxm(O.PERMUTE, h, ts, (gi, dt), (g_r, dt), tid)
    g_x = cb.read(xs, w, vpos, 0)
    g_c = cb.read(cs, 4, vpos, 0)
    g_s = cb.read(ss, 4, vpos, 0)
    lm = c.lat[mul]
    l1 = cb.f.add_group(EAST, lm - vpos, 4)
    l2 = cb.f.add_group(WEST, lm + vpos, 4)
    cb.vxm(mul, 0, (g_x, dt), (g_c, f32), (l1, f32), nv=c.lanes)
    cb.vxm(mul, 0, (g_r, dt), (g_s, f32), (l2, f32), nv=c.lanes)
    odt = lw.g.node(n.id).dtype
    go = cb.write(dst, dtype_width(odt), vpos, lm + c.lat[add])
    cb.vxm(add, lm, (l1, f32), (l2, f32), (go, DTYPE_CODE[odt]), nv=nv)
    need = {}
    for d, koff, gw in cb.groups:
        need[d, koff] = need.get((d, koff), 0) + gw
    if cb.mem_conflict() or max(need.values()) > c.m.streams_per_direction:
        return False
    lw.chains.append(cb.chain())
    return True


def _rope_split(lw, n, x, cgb, sgb, where, out):
    """rope in four steps through SRAM: the rotation by lane assembly, two products, the sum
    (of the vectors at the indices `where`)."""
    W = x.shape[-1]
    HD = n.attrs.get("hd", W)
    idx = np.arange(x.size, dtype=np.int64).reshape(x.shape[:-1] + (W // HD, HD))
    rotated = np.concatenate([idx[..., HD // 2:], idx[..., :HD // 2]], axis=-1).reshape(-1)
    rot, rr = lw.temp(x.shape, x.dtype)
    assemble(lw, n, ([x.id], np.zeros(x.size, np.int64), rotated), dst=rot, dtype=x.dtype)
    xg = lw.grid[x.id]
    t1, r1 = lw.temp(x.shape, "f32")
    t2, r2 = lw.temp(x.shape, "f32")
    mul, add = O.VXM_BINARY["MUL"], O.VXM_BINARY["ADD"]
    for ix in where:
        nv = max(0, min(lw.lanes, W - ix[-1] * lw.lanes))
        vxm_chain(lw, n, mul, int(t1[ix]), "f32", nv, (int(xg[ix]), x.dtype), (int(cgb[ix]), "f32"))
        vxm_chain(lw, n, mul, int(t2[ix]), "f32", nv, (int(rot[ix]), x.dtype), (int(sgb[ix]), "f32"))
        vxm_chain(lw, n, add, int(out[ix]), n.dtype, nv, (int(t1[ix]), "f32"), (int(t2[ix]), "f32"))
    for r in (rr, r1, r2):
        lw.free_temp(r)
