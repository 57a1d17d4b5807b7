"""Lowering of matmul onto the MXM planes.

i8 @ i8 runs on single planes (4 units on tsp-v1); f16 @ f16 on plane pairs (2 units), the
even plane of a pair named in the instructions. Work is split into jobs, one per (output chunk
of lanes columns, block of up to `acc_rows` rows); each job runs on one unit:

    for each K-tile kt:
        LW  the tile's rows of B (lanes rows of one output chunk) into the weight buffer
        IW  install it (transposed when B is a transposed operand: rows of B.T are columns)
        ABC one per row of the block, accumulating into the row's accumulator (reset at kt=0)
    ACC + WRITE each row

matmul(a, b, c) = a @ b + c (compiler/rewrite_pack.split_joins: the heads' products summed):
c is a matmul left in the accumulators (plan kind `acc`: no ACC, no storage), and this one runs
c's jobs (units and rows) with every ABC accumulating, as further K-tiles of one product. Until
the sum's last product reads them out, its accumulator rows are held (`Ctx.acc_held`): a
product started meanwhile on that unit takes the rows past them.

The LWs of the next tile fill the buffer while the current tile computes (the scheduler's
markers order LW after the previous IW, and IW after the tile's LWs and the previous ABCs).
Operands that are f32 are rounded to f16 first (a CONV pass into a temporary).
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder, lw_rows
from lpu.compiler.lower_common import copy
from lpu.compiler.movement import fold_feed, tfold_sxm
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, dtype_width

SPLIT_WORK = 10   # a matmul's rows are split only if one column job has at least this many weight
#                   loads' worth of products (M x K-tiles x hold >= SPLIT_WORK x lanes / LW ports):
#                   smaller ones were measured slower split (gpt2_block_prefill's wo and wqkv, the
#                   extra weight loads), larger ones faster (bert_base, llama, mlp: w2's 3 or 1 chunks)


def _as_mxm_dtype(lw, n, nid, target):
    """Grid of operand nid in `target` dtype (converting into a temporary if needed)."""
    src = lw.g.node(nid)
    grid = lw.grid[nid]
    if src.dtype == target:
        return grid, None
    tgrid, region = lw.temp(src.shape, target)
    copy(lw, src, grid, tgrid, target, n)
    return tgrid, region


def lower_matmul(lw, n):
    g = lw.g
    a_id, b_id = n.inputs[:2]
    trans = lw.plan.kind[b_id] == "mxm_t"
    cvt = lw.plan.kind[b_id] == "mxm_cvt"
    b_src = g.node(b_id).inputs[0] if trans or cvt else b_id
    is_int = n.dtype == "i32"
    mdt = "i8" if is_int else "f16"
    agrid, ar = _as_mxm_dtype(lw, n, a_id, mdt)
    bgrid, br = (lw.grid[b_src], None) if cvt else _as_mxm_dtype(lw, n, b_src, mdt)
    an = g.node(a_id)
    K = an.shape[-1]
    N = n.shape[-1]
    M = an.shape[-2] if len(an.shape) >= 2 else 1
    if lw.plan.kind[n.id] == "acc" or len(n.inputs) > 2:      # 2-D (rewrite_pack.split_joins)
        _matmul2d(lw, n, agrid, bgrid, lw.grid.get(n.id), M, K, N, mdt, trans, cvt)
    else:
        out = lw.grid[n.id]
        o3 = out.reshape((-1,) + out.shape[-2:])

        def as3(grid):
            g3 = grid.reshape((-1,) + grid.shape[-2:])
            return np.broadcast_to(g3, (o3.shape[0],) + g3.shape[1:]) if g3.shape[0] == 1 else g3

        a3, b3 = as3(agrid), as3(bgrid)
        for bi in range(o3.shape[0]):
            _matmul2d(lw, n, a3[bi], b3[bi], o3[bi], M, K, N, mdt, trans, cvt)
    for r in (ar, br):
        if r is not None:
            lw.free_temp(r)


def _units(lw, mdt):
    m = lw.m
    if mdt == "i8":
        return list(range(m.mxm_planes)), 1, False
    return list(range(0, m.mxm_planes, 2)), m.f16_pair_cycles, True


def _weight_units(lw, n, units) -> list:
    """The units on the edge whose slices hold n's weights (placement.edge_weights), else units."""
    a = lw.g.node(n.inputs[0])
    side = tfold_sxm(lw.g, a) if a.op == "tfold" else lw.weight_side.get(n.id)
    near = [u for u in units if int(u >= lw.m.mxm_planes_per_hemisphere) == side]
    return near or units


def _row_block(M, nchunks, nunits, hold, lw_cycles, acc_rows) -> int:
    """Rows per job of a matmul that has the MXM to itself (no other matmul at its depth in the
    plan's level order to balance the units with). Whole columns (all M rows) when the output
    chunks share the units evenly; else the rows are split in blocks so that every unit gets the
    same work (w2 of a 768-wide model has 3 chunks for 2 plane pairs: one pair would idle for a
    third of it), as long as a block's products per K-tile (rows x hold cycles) outlast the
    next tile's weight load."""
    rb = min(M, acc_rows)
    if nchunks % nunits == 0 and -(-M // rb) * nchunks >= nunits:
        return rb
    for nb in range(2, nunits * 4 + 1):
        r = -(-M // nb)
        if r * hold < 2 * lw_cycles:
            break
        if (nb * nchunks) % nunits == 0:
            return min(r, acc_rows)
    return rb


FEW_ROWS = 16     # a product of at most this many rows (a decode step's) waits on its weight
#                   installs, not on its ABCs: it keeps full holds and runs on the pair nearest
#                   its newest operand row (a transposed operand's last row)


def _nearest_last_row(lw, units, last_row) -> int:
    """The unit nearest the slices of a transposed operand's last row (a decode step's score
    product: the cache row the step has just written; the older rows were in place long before).
    Measured against the least-loaded unit, once the stale rows' zeros came from several slices:
    llama_block_decode 2,126 -> 2,095, attention_decode 1,177 -> 1,127 (tiny 1,390 -> 1,377),
    gpt2_small_decode 33,944 -> 33,202, gpt2_block_decode 2,098 either way; the sum of all rows'
    distances instead: attention_decode 1,181; load + last row's distance: tiny 1,392."""
    c, m = lw.ctx, lw.m
    pos = c.slice_pos_a[np.asarray(last_row, np.int64) % c.nslices]
    return min(units, key=lambda x: (int(np.abs(m.mxm_pos(x) - pos).max()), x))


def _arriving_rows(lw, a_id) -> list | None:
    """Rows per group of a left operand computed group by group (compiler/rewrite_rows.py: a
    layernorm's result, joined from its groups; a value received over a link, attr `arrives`:
    compiler/system_pp.py), else None: its rows arrive a group at a time, and a block of that
    many rows can start as soon as its group is done."""
    g, plan = lw.g, lw.plan
    b = g.node(plan.base.get(a_id, a_id))
    if b.op == "input" and b.attrs.get("arrives"):     # received over a link a group at a time
        return [tuple(r) for r in b.attrs["arrives"]]
    if b.op != "concat" or plan.kind.get(b.id) != "joined" or b.attrs["axis"] not in (0, -2):
        return None
    parts = [g.node(i) for i in b.inputs]
    if not all("rows" in p.attrs for p in parts):
        return None
    out, r0 = [], 0
    for p in parts:
        out.append((r0, r0 + p.shape[0]))
        r0 += p.shape[0]
    return out


def _one_install(lw, b_id, K, M) -> bool:
    """A few-row product with a constant B whose K-tiles are alike (a lane sum's ones, rewrite.py):
    the first tile is installed once and every K-tile's ABCs accumulate through it (rows of the
    last tile past K meet zero activation lanes), not a load and install per tile between the
    ABCs of a decode row's trip (each K-tile's ABCs after the previous tile's, as the IW kept
    them). Measured: gpt2_small_decode 28,005 -> 27,785 (the variance's trip: ABCs 12 cycles
    apart -> 2), llama_block_decode 1,701 -> 1,691; no other bundled program moves."""
    b, lanes = lw.g.node(b_id), lw.lanes
    if b.op != "const" or M > FEW_ROWS or K <= lanes or len(b.shape) != 2:
        return False
    v = b.attrs["value"]
    return all(np.array_equal(v[kt:kt + lanes][:K - kt], v[:lanes][:K - kt]) for kt in range(lanes, K, lanes))


def _tile_rows(lw, n, bgrid, zeros, trans, u, nt, kt, N, K):
    """The vectors LW loads for K-tile kt of output chunk nt on unit u (its weight buffer's rows)."""
    c, lanes = lw.ctx, lw.lanes
    dirty = c.lw_dirty.get(u, 0)   # buffer rows >= dirty are known to hold zeros
    if trans:      # B = X.T with X [N, K]: buffer row r = X row nt*lanes + r, chunk kt;
        #            rows past N must be zero (they become output lanes): zero the stale ones
        nrows = min(lanes, N - nt * lanes)
        if n.attrs.get("fill"):
            c.lw_dirty[u] = lanes
            return bgrid[nt * lanes + np.arange(lanes) % nrows, kt]
        c.lw_dirty[u] = nrows
        return np.concatenate([bgrid[nt * lanes:nt * lanes + nrows, kt], np.resize(zeros, max(0, dirty - nrows))])
    # B [K, N]: buffer row r = B row kt*lanes + r, chunk nt; stale rows past K meet zero activation lanes
    nrows = min(lanes, K - kt * lanes)
    c.lw_dirty[u] = max(dirty, nrows)
    return bgrid[kt * lanes:kt * lanes + nrows, nt]


def _departing_rows(lw, n, M) -> list | None:
    """Row ranges of a product read only as row groups of a row-wise region (compiler/
    rewrite_rows.py: the slices of a layernorm's input), in group order, else None: computed block
    by block (every output chunk of a block before the next block), a group's rows are complete
    while the later blocks are still in the MXM, and its layernorm runs meanwhile (whole columns
    would finish every row only at the product's end)."""
    g = lw.g
    out = []
    for u in g.users(n.id):
        s = g.node(u)
        ix = s.attrs.get("index") if s.op == "slice" else None
        if ix is None or "rows" not in s.attrs or len(ix) != 2 or isinstance(ix[0], int) \
                or tuple(ix[1]) != (0, n.shape[-1]):
            return None
        out.append(tuple(ix[0]))
    out.sort()
    if len(out) < 2 or out[0][0] != 0 or out[-1][1] != M or any(a[1] != b[0] for a, b in zip(out, out[1:])):
        return None
    return out


def score_unit(lw, n) -> int:
    """The unit a decode step's score product (a transposed operand, few rows, one output chunk)
    runs on: _nearest_last_row of its operand's last row, as _matmul2d chooses it."""
    b = lw.g.node(n.inputs[1])
    bgrid = lw.grid[b.inputs[0]]
    units = _units(lw, "i8" if n.dtype == "i32" else "f16")[0]
    return _nearest_last_row(lw, units, bgrid.reshape(-1, bgrid.shape[-1])[min(n.shape[-1], lw.lanes) - 1])


def _jobs(lw, n, M, ktiles, nchunks, units, hold) -> list:
    """[(output chunk, (first row, end row))]: the jobs a 2-D product is split into."""
    m = lw.m
    lw_cycles = lw.lanes // m.lw_ports_per_plane
    rb = min(M, m.acc_rows)
    if n.id in lw.plan.alone and M * ktiles * hold >= SPLIT_WORK * lw_cycles and not _lane_sum(lw, n, ktiles):
        rb = _row_block(M, nchunks, len(units), hold, lw_cycles, m.acc_rows)
    blocks = _arriving_rows(lw, n.inputs[0]) or [(m0, min(M, m0 + rb)) for m0 in range(0, M, rb)]
    if len(blocks) == 1:      # (rows already in blocks keep them: bert_base's 128-row w2 and wo in
        #                       two blocks of 64, as the groups, went 166,659 -> 167,876 as 63 + 65)
        blocks = _departing_rows(lw, n, M) or blocks
    cap = m.acc_rows              # a group of more rows than the accumulators in several blocks
    blocks = [(a, min(r1, a + cap)) for r0, r1 in blocks for a in range(r0, r1, cap)]
    return [(nt, b) for b in blocks for nt in range(nchunks)]


def _lane_sum(lw, n, ktiles) -> bool:
    """A lane sum as a product with a constant of one K-tile (a layernorm's folded row @ ones,
    compiler/rewrite.py): its rows stay one job on one plane pair, never split in row blocks over
    both. Its rows arrive at the pace of the layernorm's VXM and SXM chains, so a pair holding
    half of them waits as long as one holding all; the other pair stays free for the next
    product's first rows. Measured on gpt2_small_prefill (the only bundled program whose lane sums
    have the MXM to themselves): 178,885 -> 178,077 cycles (L=1 15,485 -> 15,421, L=2 30,511 ->
    30,265); every other golden figure unchanged."""
    return ktiles == 1 and lw.g.node(n.inputs[1]).op == "const"


def _free_row(c, u) -> int:
    """The first accumulator row of unit u past those the sums in progress hold."""
    return max((b + r for b, r in c.acc_held.get(u, ())), default=0)


def _pick(c, units, load, rows) -> int:
    """The least-loaded unit with `rows` accumulator rows free past the held ones (any unit
    if none has)."""
    room = [x for x in units if _free_row(c, x) + rows <= c.m.acc_rows] or units
    return min(room, key=lambda x: (load.get(x, 0), x))


def _charge(lw, load, u, pair, ktiles, rows, hold):
    """Add a job's work to its unit's (and pair's) balance: every K-tile at the full hold (counting
    half tiles at theirs moved gpt2_block_decode's heads to other pairs: 2,308 -> 2,334 cycles)."""
    work = ktiles * (rows * hold + lw.lanes // lw.m.lw_ports_per_plane)
    for x in (u, u + 1) if pair else (u,):
        load[x] = load.get(x, 0) + work


def output_side(lw, n):
    """The hemisphere of the unit a 2-D product of more than FEW_ROWS rows will run all its
    jobs on (as _matmul2d chooses them: the least-loaded unit per job), else None: its
    accumulator rows are written to that side's slices (placement.side_region), so that each row's
    trip from the MXM through SRAM to the VXM is the MXM's distance to the VXM, never the
    far side's slices (up to three times that)."""
    g = lw.g
    a = g.node(n.inputs[0])
    if len(n.shape) != 2 or len(a.shape) != 2 or a.shape[0] <= FEW_ROWS or \
            any(g.node(u).op in ("max", "sum", "mean") and g.node(u).attrs["axis"] in (0, -2) for u in g.users(n.id)):
        return None
    if len(n.inputs) > 2:                    # c's jobs (see above)
        sides = {int(u >= lw.m.mxm_planes_per_hemisphere) for _, _, u, _ in lw.ctx.acc_jobs[n.inputs[2]]}
        return sides.pop() if len(sides) == 1 else None
    units, hold, pair = _units(lw, "i8" if n.dtype == "i32" else "f16")
    units = _weight_units(lw, n, units)
    load = dict(lw.ctx.mxm_load)
    ktiles = -(-a.shape[1] // lw.lanes)
    sides = set()
    for nt, (m0, m1) in _jobs(lw, n, a.shape[0], ktiles, -(-n.shape[1] // lw.lanes), units, hold):
        u = _pick(lw.ctx, units, load, m1 - m0)
        _charge(lw, load, u, pair, ktiles, m1 - m0, hold)
        sides.add(int(u >= lw.m.mxm_planes_per_hemisphere))
    return sides.pop() if len(sides) == 1 else None


def _matmul2d(lw, n, agrid, bgrid, ogrid, M, K, N, mdt, trans, cvt):
    c, m = lw.ctx, lw.m
    lanes = lw.lanes
    units, hold, pair = _units(lw, mdt)
    units = _weight_units(lw, n, units)
    w = dtype_width(mdt)
    dt = DTYPE_CODE[mdt]
    odt = DTYPE_CODE["i32" if mdt == "i8" else "f32"]
    wb, bdt = (1, DTYPE_CODE["i8"]) if cvt else (w, dt)     # weight planes read per row
    ktiles = -(-K // lanes)
    nchunks = -(-N // lanes)
    zeros = lw.zero_vectors() if trans else None
    into = n.inputs[2] if len(n.inputs) > 2 else None       # a @ b + c: c's jobs, accumulating
    jobs = c.acc_jobs.pop(into) if into is not None else \
        [(nt, b, None, None) for nt, b in _jobs(lw, n, M, ktiles, nchunks, units, hold)]
    if ogrid is None:
        c.acc_jobs[n.id] = []
    # a K-tile of at most lanes/2 rows takes half an f16 product (one [1x160]x[160x320] pass),
    # past FEW_ROWS rows (half holds in the decode heads' products moved gpt2_small_decode's
    # heads to other pairs: 35,151 -> 35,328 cycles)
    khalf = [int(pair and M > FEW_ROWS and K - kt * lanes <= lanes // 2) for kt in range(ktiles)]
    khold = [m.abc_cycles(pair, h != 0) for h in khalf]
    load = c.mxm_load
    feed = n.inputs[0] in lw.fold_feeds
    once = not trans and not cvt and _one_install(lw, n.inputs[1], K, M)
    for nt, (m0, m1), u, base in jobs:
        if u is None:
            u = _pick(c, units, load, m1 - m0)
        if trans and M <= FEW_ROWS:
            u = _nearest_last_row(lw, units, bgrid[min(N, (nt + 1) * lanes) - 1])
        held = c.acc_held.setdefault(u, [])
        if base is None:     # accumulator rows past those a sum in progress holds on u
            base = _free_row(c, u)
            base = base if base + m1 - m0 <= m.acc_rows else 0
            if ogrid is None:
                held.append((base, m1 - m0))
        elif ogrid is not None:
            held.remove((base, m1 - m0))
        if ogrid is None:
            c.acc_jobs[n.id].append((nt, (m0, m1), u, base))
        rows = range(m0, m1)
        _charge(lw, load, u, pair, ktiles, m1 - m0, hold)
        pos = m.mxm_pos(u)
        for kt in range(ktiles):
            if not (once and kt):      # (once: the first tile's install serves every K-tile)
                srcs = _tile_rows(lw, n, bgrid, zeros, trans, u, nt, kt, N, K)
                lw.chains.append(lw_rows(c, n.line, n.id, u, srcs, wb, pos, bdt, int(cvt),
                                         after=((("iw", u), 0),), mark=((("lw", u), 0),)))
                cb = ChainBuilder(c, n.line, n.id)
                cb.iw(u, 0, dt, 1 if trans else 0, after=((("lw", u), 1), (("abc", u), hold)),
                      mark=((("iw", u), 0),), pair=pair)
                lw.chains.append(cb.chain())
            for mi, row in enumerate(rows):
                cb = ChainBuilder(c, n.line, n.id, hint=(("abc", u), hold - c.m.n_positions))
                gi = fold_feed(lw, n.inputs[0], cb, row, pos, dt) if feed else cb.read(int(agrid[row, kt]), w, pos, 0)
                after = [(("iw", u), 1)]
                if kt == 0 and into is None:
                    after.append((("acc", u, base + mi), 1))
                elif kt and once:     # no IW between the tiles: the ABCs keep their order themselves
                    after.append((("abc", u), hold))
                # the plane mark sits `hold` before the end of this ABC's hold (the next IW's wait)
                cb.abc(u, 0, (gi, dt), base + mi, int(kt > 0 or into is not None), khalf[kt], after=tuple(after),
                       mark=((("abc", u), khold[kt] - hold), (("abcrow", u, base + mi), c.lat[O.ABC])),
                       hold=khold[kt], pair=pair)
                lw.chains.append(cb.chain())
        for mi, row in enumerate(rows if ogrid is not None else ()):
            cb = ChainBuilder(c, n.line, n.id, hint=(("acc", u), 1 - c.m.n_positions))
            go = cb.write(int(ogrid[row, nt]), 4, pos, c.lat[O.ACC])
            cb.acc(u, 0, base + mi, (go, odt), after=((("abcrow", u, base + mi), 0),), mark=((("acc", u, base + mi), 0),))
            lw.chains.append(cb.chain())
