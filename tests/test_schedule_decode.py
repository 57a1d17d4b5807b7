"""Decode-side schedules (issue 13): lane reductions in few SXM round trips (lower_reduce's
lane plan and lower_common.gather_chain), lane assembly and rope in one chain per vector. Each
program is emulated and compared with the reference; the cycle bounds say what the chains are
for (one trip between the VXM and an SXM where the old ones took several)."""
from __future__ import annotations

import numpy as np
import pytest

from lpu.compiler.lower_lanes import lane_plan
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked


def _run_checked(src: str, machine: str, seed: int = 3):
    return run_checked(src, MachineConfig.load(machine), seed, "d.lpu")[0]


class _LW:                     # what lane_plan reads of a lowering
    def __init__(self, machine):
        from lpu.isa import opcodes as O
        self.m = MachineConfig.load(machine)
        self.ctx = type("C", (), {"lat": O.latency_table(self.m)})()


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("width", [2, 3, 5, 16, 17, 64, 100, 320])
@pytest.mark.parametrize("nrows", [1, 40])
def test_lane_plan_brings_every_lane_to_lane_0_exactly_once(machine, width, nrows):
    lw = _LW(machine)
    width = min(width, lw.m.lanes)
    plan = lane_plan(lw, width, nrows, "f32")
    offsets = np.zeros(1, np.int64)
    for shifts in plan:
        assert shifts and all(0 < s < width for s in shifts)
        offsets = (offsets[:, None] + np.asarray([0] + shifts)[None, :]).reshape(-1)
    inside = np.sort(offsets[offsets < width])
    assert np.array_equal(inside, np.arange(width)), (plan, inside)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("width", [2, 3, 5, 8, 64, 100, 160])
@pytest.mark.parametrize("nrows", [1, 40])
def test_window_lane_plan_leaves_the_sum_in_each_of_the_rows_lanes(machine, width, nrows):
    """lane_plan(window=True): rotations by -(w-1) .. w in all; each lane of the row sees every
    lane of the row exactly once, the other lanes it sees are past the row (its padding)."""
    lw = _LW(machine)
    lanes = lw.m.lanes
    if 2 * width > lanes + 1:
        pytest.skip("a window plan needs 2 width <= lanes + 1")
    plan = lane_plan(lw, width, nrows, "f32", exact=True, window=True)
    offsets = np.zeros(1, np.int64)
    for shifts in plan:
        assert shifts and 0 not in shifts
        offsets = (offsets[:, None] + np.asarray([0] + shifts)[None, :]).reshape(-1)
    assert np.array_equal(np.sort(offsets), np.arange(-(width - 1), width + 1))
    for lane in range(width):
        seen = (lane + offsets) % lanes
        assert np.array_equal(np.sort(seen[seen < width]), np.arange(width)), (plan, lane)


def test_one_row_lane_reduction_is_one_sxm_round_trip():
    m = MachineConfig.load("tsp-v1")
    trip = 2 * abs(m.vxm_pos - m.sxm_pos(0))
    for op in ("max", "sum"):
        prog = _run_checked(f"input x : f32[1, 64]\noutput y = {op}(x, axis=1)\n", "tsp-v1")
        # one trip VXM -> SXM -> VXM for the 63 shifts, the input's read and the output's write
        assert prog.predicted_cycles < 2 * trip + 100, (op, prog.predicted_cycles)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("src", [
    "input x : f32[1, 64]\noutput a = max(x, axis=1)\noutput b = sum(x, axis=1)\noutput c = mean(x, axis=1)\n",
    "input x : f32[3, 700]\noutput a = max(x, axis=1)\noutput b = sum(x, axis=1)\noutput c = mean(x, axis=1)\n",
    "input x : f32[2, 5]\noutput a = max(x, axis=1)\noutput b = sum(x, axis=1)\n",
    "input x : i32[4, 37]\noutput a = max(x, axis=1)\noutput b = sum(x, axis=1)\n",
    "input x : f32[40, 200]\noutput a = max(x, axis=1)\noutput b = mean(x, axis=1)\n",
    "input x : f16[1, 64]\noutput y = softmax(x)\n",
])
def test_lane_reductions_match_the_reference(machine, src):
    _run_checked(src, machine)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_concat_of_head_slices_matches_and_is_one_trip(machine):
    m = MachineConfig.load(machine)
    w = m.lanes // 5 if m.lanes >= 20 else 4
    names = "abcdefgh"
    src = "".join(f"input {k} : f16[1, {w}]\n" for k in names)
    src += f"output y = concat([{', '.join(names)}], axis=1)\n"
    prog = _run_checked(src, machine)
    if machine == "tsp-v1":    # 5 and 3 pieces, each vector one chain (not one trip per piece)
        assert prog.predicted_cycles < 3 * 2 * abs(m.vxm_pos - m.sxm_pos(0)), prog.predicted_cycles


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("shape", ["1, 64", "3, 8", "2, 2, 16"])
def test_rope_in_one_chain_per_row_matches(machine, shape):
    _run_checked(f"input x : f16[{shape}]\noutput y = rope(x, 5)\n", machine)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("src", [
    # the new row assembled in the cache in place (no copy), old rows read after
    "state s : f16[4, 64]\ninput a : f16[1, 24]\ninput b : f16[1, 40]\n"
    "s[2:3, :] <- concat([a, b], axis=1)\noutput y = s[1:3, :] * 2.0\n",
    # an old row of the state read after the store, a stored row in a 3-D state
    "state s : f16[4, 64]\ninput a : f16[1, 24]\ninput b : f16[1, 40]\n"
    "s[3:4, :] <- concat([b, a], axis=1)\noutput y = s[0:4, :] + 1.0\n",
    "state s : f16[2, 3, 64]\ninput q : f16[1, 100]\n"
    "s[1, 0:1, :] <- q[:, 30:94]\noutput y = s[1, :, :] + 1.0\n",
])
def test_a_moved_row_stored_in_a_state_matches(machine, src):
    _run_checked(src, machine)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("rows,hd,heads", [(1, 8, 4), (3, 16, 2), (1, 64, 8), (2, 80, 4)])
def test_the_heads_ropes_of_a_row_are_one_rope_and_match(machine, rows, hd, heads):
    from lpu.compiler.frontend import elaborate_source
    from lpu.compiler.rewrite_rope import heads_rope
    m = MachineConfig.load(machine)
    src = (f"state s : f16[4, {hd * heads}]\ninput x : f16[{rows}, {hd * heads}]\n"
           f"r = concat([rope(x[:, i*{hd}:(i+1)*{hd}], 7) for i in 0..{heads}], axis=1)\n"
           f"s[0:{rows}, :] <- r\noutput y = r * 1.0\noutput z = s[0:4, :] + 0.0\n")
    _run_checked(src, machine)
    g = heads_rope(elaborate_source(src, "d.lpu", {}), m.lanes)
    one = [n for n in g.nodes() if n.op == "rope"]
    in_chunks = m.lanes % hd == 0
    assert len(one) == (1 if in_chunks else heads)
    if in_chunks:
        assert one[0].attrs["hd"] == hd and one[0].shape == (rows, hd * heads)



@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("d", [48, 256, 700])
def test_decode_norms_broadcast_their_sums_without_the_sxm(machine, d):
    """A decode row's layernorm and rmsnorm: each f16 lane sum is x @ ones[D, lanes], the sum in
    every lane (a splat), and the ops on it (mean's division, + eps, rsqrt) run on whole
    vectors, so the normalisation reads it as it is: no DISTRIBUTE (no SXM at all); the values
    match the reference; a splat used other than elementwise is copied (output s)."""
    from lpu.isa.opcodes import OPS
    src = (f"input x : f16[1, {d}]\nweight g : f32[{d}]\nweight b : f32[{d}]\n"
           "output y = f16(layernorm(x, g, b))\noutput z = f16(rmsnorm(x, g))\n")
    prog = _run_checked(src, machine)
    used = {OPS[int(o)].name for o in np.unique(prog.op)}
    assert not {"DISTRIBUTE", "SHIFT", "ROTATE", "PERMUTE"} & used, used
    _run_checked(src + "weight w : f16[1, 8]\noutput s = mean(x)\noutput t = sum(x) @ w\n", machine)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_alloc_near_takes_the_slices_nearest_the_vxm_unless_first_fit_is_near_enough(machine):
    """compiler/alloc.py alloc_near: with the slices next to the VXM taken at the low addresses,
    a small region goes to the nearest free slices of a later row, not first fit's far ones; a
    first fit within the margin stays; each region is taken once (never overlapping)."""
    from lpu.compiler.alloc import SlotAllocator
    m = MachineConfig.load(machine)
    a = SlotAllocator(m)
    near = [abs(m.slice_pos(s) - m.vxm_pos) for s in range(m.mem_slices)]
    a.alloc(8)                                     # slices 0 .. 7: far from the VXM
    start = a.alloc_near(4, near, 0)
    got = max(near[(start + k) % m.mem_slices] for k in range(4))
    assert got == min(max(near[(p + k) % m.mem_slices] for k in range(4)) for p in range(0, m.mem_slices, 4))
    assert start >= 8
    first = a.free[0][0]                           # slices 8 .. 11: first fit, its cost as margin
    cost = max(near[(first + k) % m.mem_slices] for k in range(4))
    assert a.alloc_near(4, near, cost) == first
    assert a.alloc_near(4, near, 0) not in (start, first)


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("d,heads,roped,scale", [(64, 4, False, "0.125"), (64, 8, True, "0.125"),
                                                 (96, 3, False, "0.125"), (24, 3, False, "0.125"),
                                                 (64, 4, False, "(1.0 / (i + 1))")])
def test_decode_heads_read_the_caches_in_place(machine, d, heads, roped, scale):
    """compiler/rewrite_decode.py: a decode step's heads take their scores from the query masked
    to their lanes and the cache chunk installed as it lies, the heads of a chunk as rows of one
    product each way, their outputs combined by masks: no lane moves (no PERMUTE but the one
    rope's), exactly the reference's values. Heads that straddle a chunk (96 / 3 = 32 lanes on a
    16-lane machine stay in one; 24 / 3 = 8 do; tiny's 16 lanes and 32-wide heads do not) are
    left as they were. Heads whose softmax chains differ (a scale per head) are not rows of one
    product but still read the caches in place. A row's max and sum land in each of its lanes
    (no DISTRIBUTE), and a power-of-two scale leaves the max no MASK."""
    from lpu.compiler.frontend import elaborate_source
    from lpu.compiler.rewrite_decode import decode_heads
    from lpu.isa.opcodes import OPS
    m = MachineConfig.load(machine)
    hd = d // heads
    q = f"rope(q[:, i*{hd}:(i+1)*{hd}], 9)" if roped else f"q[:, i*{hd}:(i+1)*{hd}]"
    src = (f"input x : f16[1, {d}]\nweight wq : f16[{d}, {d}]\nstate kc : f16[16, {d}]\nstate vc : f16[16, {d}]\n"
           f"q = f16(x @ wq)\n"
           f"hs = [f16(softmax({q} @ kc[0:10, i*{hd}:(i+1)*{hd}].T * {scale}) @ vc[0:10, i*{hd}:(i+1)*{hd}]) "
           f"for i in 0..{heads}]\noutput y = concat(hs, axis=1) * 1.0\n")
    prog = _run_checked(src, machine)
    g = decode_heads(elaborate_source(src, "d.lpu", {}), m.lanes)
    in_place = hd < m.lanes and m.lanes % hd == 0
    stacked = [n for n in g.nodes() if n.op == "matmul" and "heads" in n.attrs]
    assert bool(stacked) == (in_place and scale == "0.125")
    if in_place:
        assert sum(n.attrs["heads"] for n in stacked) == (2 * heads if stacked else 0)
        assert all(n.shape[-1] % m.lanes == 0 or n.shape[-1] == d % m.lanes
                   for n in g.nodes() if n.op == "slice" and g.node(n.inputs[0]).op == "state")
        code = {o.name: o.code for o in OPS}
        permutes = int(np.sum(prog.op == code["PERMUTE"]))
        assert permutes <= (-(-d // m.lanes) if roped else 0), permutes
        if 2 * 10 <= m.lanes + 1:      # each row's max and sum in the row's own lanes: no broadcast
            assert not np.any(prog.op == code["DISTRIBUTE"])
            if scale == "0.125":        # the scale in the queries' masks, the score rows filled
                #                         past their end with their own scores: no MASK to -inf
                assert all(n.attrs.get("fill") for n in stacked if n.shape[-1] == 10)
                assert not np.any(prog.op == code["MASK"])


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_layernorm_variance_is_lowered_from_two_independent_sums(machine, monkeypatch):
    """compiler/rewrite_latency.py: layernorm's mean(d * d), d = x - mean(x), is lowered as
    mean(x * x) - mu * mu (no sum waits for another), which matches the two-pass reference and
    is faster on a decode row; a square of x minus something else than its mean stays, and so
    does an f16 row's variance (x * x overflows f16 from |x| = 256 on)."""
    from lpu.compiler import driver
    from lpu.compiler.frontend import elaborate_source
    from lpu.compiler.rewrite_latency import one_pass_var
    src = ("input x : f32[1, 768]\ninput y : f32[3, 50]\nweight g : f32[768]\nweight b : f32[768]\n"
           "output u = f16(layernorm(x, g, b))\noutput v = layernorm(y, y[0], y[1])\n"
           "e = y - y[2]\noutput w = mean(e * e)\n")
    g = elaborate_source(src, "n.lpu", {})
    t = one_pass_var(g)
    f16 = elaborate_source(src.replace("x : f32", "x : f16").replace("y : f32", "y : f16"), "h.lpu", {})
    assert one_pass_var(f16) is f16

    def feeds_a_mean(n, graph):       # n reads (through other nodes) a mean
        todo = list(n.inputs)
        while todo:
            i = graph.node(todo.pop())
            if i.op == "mean":
                return True
            todo.extend(i.inputs)
        return False

    assert sum(feeds_a_mean(n, g) for n in g.nodes() if n.op == "mean") == 2   # the source's two-pass
    assert len([n for n in t.nodes() if n.op == "mean"]) == 5
    assert not any(feeds_a_mean(n, t) for n in t.nodes() if n.op == "mean")
    w = t.node(t.node(t.outputs["w"]).inputs[0])
    sq = t.node(w.inputs[0])
    assert w.op == "mean" and sq.op == "mul" and sq.inputs[0] == sq.inputs[1] and t.node(sq.inputs[0]).op == "sub"
    prog = _run_checked(src, machine)
    monkeypatch.setattr(driver, "one_pass_var", lambda graph: graph)
    two_pass = _run_checked(src, machine)
    assert prog.predicted_cycles < two_pass.predicted_cycles


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_an_uneven_decode_product_of_i8_weights_is_split_over_k(machine, monkeypatch):
    """compiler/rewrite_latency.py split_gemv: a one-row product with f16(i8 weights) of 3 output
    chunks (2 plane pairs) and 10 K-tiles (gpt2's w2) is the sum of two products over K's
    halves, which matches the reference and is faster; 2 chunks (even) stay one product."""
    from lpu.compiler import driver
    from lpu.compiler.frontend import elaborate_source
    from lpu.compiler.rewrite_latency import split_gemv
    m = MachineConfig.load(machine)
    k, n3 = 10 * m.lanes, 3 * m.lanes
    src = f"input x : f16[1, {k}]\nweight w : i8[{k}, {n3}]\noutput y = f16(x @ f16(w))\n"
    even = f"input x : f16[1, {k}]\nweight v : i8[{k}, {2 * m.lanes}]\noutput z = f16(x @ f16(v))\n"
    t = split_gemv(elaborate_source(src, "g.lpu", {}), m)
    mm = [n for n in t.nodes() if n.op == "matmul"]
    assert sorted(t.node(n.inputs[0]).shape[-1] for n in mm) == [5 * m.lanes, 5 * m.lanes]
    e = elaborate_source(even, "e.lpu", {})
    assert split_gemv(e, m) is e
    prog = _run_checked(src, machine)
    monkeypatch.setattr(driver, "split_gemv", lambda graph, machine: graph)
    whole = _run_checked(src, machine)
    assert prog.predicted_cycles < whole.predicted_cycles
