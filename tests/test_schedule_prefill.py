"""Schedule quality levers for prefill (issue 13, the MXM side): every lever keeps results
within the reference's tolerance, predicted == emulated cycles and `verify`, and pays on the
case it was made for."""
from __future__ import annotations

import os

import numpy as np
import pytest

from lpu.compiler import lower_mxm
from lpu.compiler.driver import compile_graph, compile_source
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.plan import make_plan
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked

# one matmul alone at its depth, with 3 output chunks of lanes columns for 2 f16 plane pairs
ODD = """param S = {S}
param K = {K}
param N = {N}
input x : f16[S, K]
weight w : f16[K, N]
output y = f16(x @ w)
"""


def _odd(m: MachineConfig) -> str:
    return ODD.format(S=m.lanes // 2 * 2, K=2 * m.lanes, N=3 * m.lanes)


def _program(name: str) -> str:
    """The source of a bundled program."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs", name + ".lpu")) as f:
        return f.read()


def _spy(monkeypatch, module, name: str) -> list:
    """Every result of module.name while the test runs, in a list."""
    seen, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: seen.append(real(*a)) or seen[-1])
    return seen


def _count(prog, name) -> int:
    return int((prog.op == O.BY_NAME[name].code).sum())


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_a_lone_matmul_with_odd_chunks_splits_its_rows_over_both_pairs(machine, monkeypatch):
    """3 output chunks on 2 plane pairs: whole columns leave one pair idle for a third of the
    products; split in row blocks, both pairs share them and the program is faster (at the
    cost of loading each weight tile once per block)."""
    m = MachineConfig.load(machine)
    src = _odd(m)
    g = elaborate_source(src, "odd.lpu", {})
    plan = make_plan(g, m.lanes)
    assert [n.id for n in g.nodes() if n.op == "matmul"] == sorted(plan.alone)
    prog, g, _, _ = run_checked(src, m, 11, "odd.lpu")
    split = compile_graph(g, m, repeat=False)        # every instruction spelled out (no REPEAT)
    monkeypatch.setattr(lower_mxm, "SPLIT_WORK", 1 << 30)
    whole = compile_graph(g, m, repeat=False)
    assert _count(split, "ABC") == _count(whole, "ABC")        # the same products,
    assert _count(split, "LW") == 2 * _count(whole, "LW")      # each weight tile loaded per block
    assert split.predicted_cycles == prog.predicted_cycles < whole.predicted_cycles


def test_matmuls_side_by_side_are_not_split():
    """The heads of an attention share a depth: the units balance across them, rows stay whole."""
    m = MachineConfig.load("tsp-v1")
    src = "input a : f16[64, 64]\ninput b : f16[64, 64]\nweight w : f16[64, 960]\n" \
          "output y = f16(a @ w)\noutput z = f16(b @ w)\n"
    g = elaborate_source(src, "two.lpu", {})
    assert not make_plan(g, m.lanes).alone


ATTN = """param S = {S}
param D = 64
param H = 2
param HD = D / H
input x : f16[S, D]
weight wq : f16[D, D]
weight wk : f16[D, D]
weight wv : f16[D, D]
fn head(q, k, v) {{
    return f16(softmax(q @ k.T * (1.0 / sqrt(HD))) @ v)
}}
q = f16(x @ wq)
k = f16(x @ wk)
v = f16(x @ wv)
output y = concat([head(q[:, i*HD:(i+1)*HD], k[:, i*HD:(i+1)*HD], v[:, i*HD:(i+1)*HD]) for i in 0..H], axis=1)
"""


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_heads_computed_transposed_are_joined_as_rows_and_transposed_once(machine):
    """Each head's p @ v computed as (v.T @ pT).T (more query rows than P_BACK_Q): the heads'
    transposed results are joined along the rows and the join transposed once, instead of
    each transposed back and moved to its lanes; the result agrees with the reference."""
    from lpu.compiler.rewrite import P_BACK_Q, rewrite
    src = ATTN.format(S=P_BACK_Q + 16)
    t = rewrite(elaborate_source(src, "h.lpu", {}))
    cats = [n for n in t.nodes() if n.op == "concat"]
    assert len(cats) == 1 and cats[0].attrs["axis"] == 0
    assert [t.node(u).op for u in t.users(cats[0].id)] == ["transpose"]
    assert all(t.node(i).op == "cast" and t.node(t.node(i).inputs[0]).op == "matmul" for i in cats[0].inputs)
    m = MachineConfig.load(machine)
    run_checked(src, m, 12, "h.lpu")


CAUSAL = """param S = {S}
param D = {D}
param H = 4
param HD = D / H
input x : f16[S, D]
weight wq : f16[D, D]
weight wk : f16[D, D]
weight wv : f16[D, D]
fn head(q, k, v) {{
    return f16(softmax(causal(q @ k.T * (1.0 / sqrt(HD)))) @ v)
}}
q = f16(x @ wq)
k = f16(x @ wk)
v = f16(x @ wv)
output y = concat([head(q[:, i*HD:(i+1)*HD], k[:, i*HD:(i+1)*HD], v[:, i*HD:(i+1)*HD]) for i in 0..H], axis=1)
"""


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_heads_in_one_chunk_of_lanes_share_one_score_matmul_and_softmax(machine, monkeypatch):
    """4 heads of D / 4 columns in one chunk of lanes: one K @ Qm.T (Qm: Q's chunk masked per
    head, the heads' rows stacked) makes all their scores in one output chunk, and the mask,
    softmax and the transpose back run once on the packed scores; fewer MXM products than a
    score matmul per head, and the results agree with the reference."""
    from lpu.compiler import driver
    from lpu.compiler.rewrite import MIN_ROW, rewrite
    from lpu.compiler.rewrite_pack import pack_heads
    m = MachineConfig.load(machine)
    if m.lanes < 4 * MIN_ROW:     # (tiny: rows of a head too narrow to compute transposed)
        src = CAUSAL.format(S=MIN_ROW // 2, D=m.lanes)
        t = rewrite(elaborate_source(src, "c.lpu", {}))
        assert pack_heads(t, m.lanes) is t
        run_checked(src, m, 13, "c.lpu")
        return
    src = CAUSAL.format(S=m.lanes // 4, D=m.lanes)
    t = rewrite(elaborate_source(src, "c.lpu", {}))
    p = pack_heads(t, m.lanes)
    assert sum(n.op == "max" for n in t.nodes()) == 4
    assert sum(n.op == "max" for n in p.nodes()) == 1
    assert sum(n.op == "matmul" for n in p.nodes()) == sum(n.op == "matmul" for n in t.nodes()) - 3
    # Q = f16(x @ wq) masked a head each in f16: the rounding of the f32 product's row is made
    # in each head's chain (a cast broadcast over the heads, fused: test below)
    qm = [n for n in p.nodes() if n.op == "mul" and len(n.shape) == 3]
    assert len(qm) == 1 and qm[0].dtype == "f16" and [p.node(u).op for u in p.users(qm[0].id)] == ["reshape"]
    q3 = p.node(qm[0].inputs[0])
    assert q3.op == "cast" and q3.shape == (1,) + qm[0].shape[1:] and p.node(q3.inputs[0]).dtype == "f32"
    prog, g, _, _ = run_checked(src, m, 13, "c.lpu")
    monkeypatch.setattr(driver, "pack_heads", lambda gr, lanes: gr)
    unpacked = compile_graph(g, m)
    assert _count(prog, "ABC") < _count(unpacked, "ABC")


def test_packed_queries_are_rounded_and_masked_in_one_chain(monkeypatch):
    """attention_prefill: Q = f16(x @ wq) is read only by the heads' masks, so its rounding is a
    producer fused into the mask's chains (broadcast over the heads: computed again in each),
    no Q rows stored and read back between the product and the install of the masked queries;
    fewer cycles than the rounding as a pass of its own (a cast fused only into users of its
    own shape)."""
    from lpu.compiler import lower_fuse
    from lpu.compiler.driver import compile_source, rewritten
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    qm = [n for n in g.nodes() if n.op == "mul" and len(n.shape) == 3]
    assert len(qm) == 1
    plan = make_plan(g, m.lanes)
    assert plan.kind[qm[0].inputs[0]] == "fused"
    x = g.node(qm[0].inputs[0])
    while x.op != "matmul":             # cast <- reshape <- slice <- the f32 product x @ wq
        x = g.node(x.inputs[0])
    assert [g.node(u).op for u in g.users(x.id)] == ["slice"] and plan.kind[g.users(x.id)[0]] == "view"
    fused = compile_source(src, "a.lpu", machine=m)[0]
    monkeypatch.setattr(lower_fuse, "_fits", lambda ps, us: ps == us)
    alone = compile_source(src, "a.lpu", machine=m)[0]
    assert fused.predicted_cycles < alone.predicted_cycles
    assert _count(fused, "CONV") > _count(alone, "CONV")     # (the rounding in each head's chain)


def test_a_masked_score_rows_chains_make_their_max_first_level(monkeypatch):
    """gpt2_block_prefill's packed causal scores: where(mask, s, -inf) is read by a lone max
    across its vectors, so each chain of the where makes two rows and, from the same streams,
    their max, and the reduction starts from those maxima (not a tree over the rows read back
    from SRAM): MAX instructions in the where's chains, fewer in the max's own; the results
    agree with the reference (the staged conditions' copies kept apart), fewer cycles than
    without (lower_reduce.first_blocks)."""
    from lpu.compiler import lower_reduce
    from lpu.compiler.driver import compile_source, rewritten
    m = MachineConfig.load("tsp-v1")
    src = _program("gpt2_block_prefill")
    prog = run_checked(src, m, 19, "g.lpu")[0]
    g = rewritten(elaborate_source(src, "g.lpu", {}), m)      # (the graph prog.node indexes)
    assert [(n.op, n.line) for n in g.nodes()] == [tuple(x) for x in prog.nodes]
    where = [n.id for n in g.nodes() if n.op == "where"]
    red = [n.id for n in g.nodes() if n.op == "max" and n.attrs["axis"] == 0]
    assert len(where) == 1 and len(red) == 1
    mx = prog.op == O.BY_NAME["MAX"].code
    rows = g.node(where[0]).shape[0]
    assert int((mx & (prog.node == where[0])).sum()) == rows // lower_reduce.FIRST_ROWS * (lower_reduce.FIRST_ROWS - 1)
    assert int((mx & (prog.node == red[0])).sum()) < rows // lower_reduce.FIRST_ROWS
    monkeypatch.setattr(lower_reduce, "first_blocks", lambda *a: None)
    assert prog.predicted_cycles < compile_source(src, "g.lpu", machine=m)[0].predicted_cycles


def test_packed_heads_fold_a_power_of_two_scale_into_the_mask_and_hand_f16_weights():
    """Head width 64: the scores' scale 1/8 rides in Q's mask (exact), so no pass multiplies the
    packed scores; with more query rows than P_BACK_Q, each head's p @ v takes its lanes of the
    packed p as weights, rounded to f16 once for all heads (the MXM would round each)."""
    from lpu.compiler.rewrite import P_BACK_Q, rewrite
    from lpu.compiler.rewrite_pack import pack_heads
    m = MachineConfig.load("tsp-v1")
    src = CAUSAL.format(S=P_BACK_Q + 16, D=256)
    p = pack_heads(rewrite(elaborate_source(src, "c.lpu", {})), m.lanes)
    packed = [n for n in p.nodes() if n.op == "matmul" and n.shape[1] == 4 * (P_BACK_Q + 16)]
    assert len(packed) == 1
    assert not [u for u in p.users(packed[0].id) if p.node(u).op == "mul"]
    mask = [n for n in p.nodes() if n.op == "const" and n.dtype == "f16" and len(n.shape) == 3]
    assert set(np.unique(mask[0].attrs["value"])) == {0.0, 0.125}
    heads = [n for n in p.nodes() if n.op == "slice" and p.node(n.inputs[0]).op == "cast"
             and n.shape == (P_BACK_Q + 16,) * 2 and all(p.node(u).op == "matmul" for u in p.users(n.id))]
    assert len(heads) == 4 and all(n.dtype == "f16" for n in heads)
    run_checked(src, m, 14, "c.lpu")


def test_packed_heads_scale_the_softmax_exponent_when_the_scale_does_not_fold(monkeypatch):
    """Head width 80: the scale 1/sqrt(80) is not a power of two, so it cannot ride in Q's mask;
    the packed softmax takes exp(c * (s - max s)) (max commutes with c > 0) instead of a pass
    that multiplies the scores before the mask: the product joins the exp's chain, fewer
    cycles, and the results agree with the reference."""
    from lpu.compiler import rewrite_pack
    from lpu.compiler.rewrite import rewrite
    m = MachineConfig.load("tsp-v1")
    src = CAUSAL.format(S=m.lanes // 4, D=m.lanes)
    p = rewrite_pack.pack_heads(rewrite(elaborate_source(src, "c.lpu", {})), m.lanes)
    where = [n for n in p.nodes() if n.op == "where"]
    assert len(where) == 1 and p.node(where[0].inputs[1]).op == "matmul"     # no mul before the mask
    sub = [n for n in p.nodes() if n.op == "sub"]
    assert len(sub) == 1 and [p.node(u).op for u in p.users(sub[0].id)] == ["mul"]
    prog, g, _, _ = run_checked(src, m, 17, "c.lpu")
    monkeypatch.setattr(rewrite_pack, "_late_scale", lambda *a: None)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_packed_heads_share_their_masks_across_layers():
    """Every layer of bert_base packs its heads with the same masks: one constant per pack
    position serves all layers (they had been 10.6 MB of constants per 12 layers, in SRAM and
    in the binary), while a layer's packs keep their own."""
    from lpu.compiler.rewrite import rewrite
    from lpu.compiler.rewrite_pack import pack_heads
    m = MachineConfig.load("tsp-v1")
    src = _program("bert_base")
    sizes = []
    for layers in (1, 2, 3):
        g = pack_heads(rewrite(elaborate_source(src, "b.lpu", {"L": layers}), m.lanes), m.lanes)
        sizes.append(sum(n.nbytes for n in g.nodes() if n.op == "const" and len(n.shape) > 1))
    assert sizes[0] > 0 and sizes[0] == sizes[1] == sizes[2], sizes


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_heads_joined_as_rows_are_computed_in_their_rows_of_the_join(machine, monkeypatch):
    """The heads' transposed outputs, joined along the rows, are each written straight into
    their rows of the join's region (plan kinds 'part' and 'joined'): no copy per row, fewer
    SXM permutes, and the results agree with the reference."""
    from lpu.compiler import plan as plan_mod
    from lpu.compiler.rewrite import P_BACK_Q, rewrite
    m = MachineConfig.load(machine)
    src = ATTN.format(S=P_BACK_Q + 16)
    t = rewrite(elaborate_source(src, "h.lpu", {}))
    kinds = make_plan(t, m.lanes).kind
    cat = [n for n in t.nodes() if n.op == "concat"][0]
    assert kinds[cat.id] == "joined" and all(kinds[i] == "part" for i in cat.inputs)
    prog, g, _, _ = run_checked(src, m, 15, "h.lpu")
    monkeypatch.setattr(plan_mod, "_joins_rows", lambda *a: False)
    copied = compile_graph(g, m)
    assert _count(prog, "PERMUTE") < _count(copied, "PERMUTE")


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_heads_joined_along_the_lanes_at_the_end_feed_the_mxm_with_their_rows_of_w(machine, monkeypatch):
    """attention_prefill's concat(heads, axis=1) @ wo, heads narrower than the lanes and nothing
    after it: each head multiplies its rows of wo and the products are added, no lane moves; the
    results agree with the reference. Where wo is no wider than the lanes (tsp-v1), each head's
    f16(p @ v) @ wo_h is p @ f16(v @ wo_h): v @ wo_h is made off the path (after the
    softmax's max), and the path from p to the output has one product: fewer cycles."""
    from lpu.compiler import rewrite_pack
    m = MachineConfig.load(machine)
    src = _program("attention_prefill")
    hd = min(32, m.lanes // 2)
    src = src.replace("param D = 128", f"param D = {4 * hd}").replace("param S = 64", f"param S = {min(64, 4 * hd)}")
    g = elaborate_source(src, "a.lpu", {})
    s = rewrite_pack.split_joins(g, m.lanes)
    assert any(n.op == "concat" for n in g.nodes()) and not any(n.op == "concat" for n in s.nodes())
    assert sum(n.op == "matmul" for n in s.nodes()) == sum(n.op == "matmul" for n in g.nodes()) + 3
    absorbed = [n for n in s.nodes() if n.op == "matmul" and "after" in n.attrs]
    assert len(absorbed) == (4 if 4 * hd <= m.lanes else 0)
    for n in absorbed:       # v_h @ wo_h, lowered after its head's softmax max
        assert s.node(n.attrs["after"]).op == "max" and n.attrs["after"] < n.id
        assert make_plan(s, m.lanes).depth[n.id] > make_plan(s, m.lanes).depth[n.attrs["after"]]
    prog, g, _, _ = run_checked(src, m, 16, "a.lpu")
    if absorbed:
        monkeypatch.setattr(rewrite_pack, "_absorbed", lambda *a: None)
        assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_a_fused_vector_whose_operands_clash_copies_one_and_stays_one_chain(monkeypatch):
    """mlp's relu(x @ w1 + b1): where a row and the bias lie on one bank, the bias is copied to
    other slices and the row stays one fused chain (the op-by-op form made it a straggler,
    a trip per op behind the others): fewer cycles, results within the reference's tolerance."""
    from lpu.compiler import lower_fuse
    m = MachineConfig.load("tsp-v1")
    src = _program("mlp")
    calls = []
    staged = lower_fuse._staged_chain
    monkeypatch.setattr(lower_fuse, "_staged_chain", lambda *a: calls.append(a[3]) or staged(*a))
    prog, g, _, _ = run_checked(src, m, 18, "mlp.lpu")
    assert calls
    monkeypatch.setattr(lower_fuse, "_staged_chain", lambda *a: False)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_a_lone_reduction_across_vectors_keeps_its_partials_next_to_the_vxm(monkeypatch):
    """attention_prefill's packed softmax: the max's and the sum's block partials lie in the
    slices nearest the VXM, half of them west and half east (consecutive slots had put all
    32 planes on one side, up to 44 hops away), and so do their results (lower.new_region:
    first fit had put the max 16 hops away): fewer cycles, results within tolerance."""
    from lpu.compiler import lower_reduce
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    grids = _spy(monkeypatch, lower_reduce, "_partials")
    prog, g, _, _ = run_checked(src, m, 19, "a.lpu")
    hops = [abs(m.slice_pos(int(s) % m.mem_slices) - m.vxm_pos) for grid, _ in grids for s in grid.reshape(-1)]
    west = [int(s) % m.mem_slices < m.mem_slices_per_hemisphere for grid, _ in grids for s in grid.reshape(-1)]
    assert len(grids) == 2 and max(hops) <= 16 and sum(west) * 2 == len(west)
    from lpu.emulator.run import schedule
    s = schedule(prog)
    for name in ("max", "sum"):          # the result: the reduction's last write
        writes = [(int(s.cycle[i]), m.queues[int(s.queue[i])][-1]) for i in range(len(s.cycle))
                  if prog.nodes[int(prog.node[int(s.src[i])])][0] == name and s.op[i] == O.WRITE]
        last = max(c for c, _ in writes)
        assert max(abs(p - m.vxm_pos) for c, p in writes if c >= last - 3) <= 4, name
    monkeypatch.setattr(lower_reduce, "peers_across", lambda *a: 2)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


# a layernorm of f32 rows wider than the lanes (bert_base's x + a): its mean a rotated lane tree
LN_F32 = """param S = {S}
param D = {D}
input x : f16[S, D]
input a : f32[S, D]
weight g : f32[D]
weight b : f32[D]
output y = f16(layernorm(x + a, g, b))
"""


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_layernorm_mean_of_wide_f32_rows_is_a_splat_of_rotations(machine):
    from lpu.compiler.rewrite import rewrite
    m = MachineConfig.load(machine)
    src = LN_F32.format(S=6, D=2 * m.lanes + m.lanes // 3)
    g = rewrite(elaborate_source(src, "ln.lpu", {}), m.lanes)
    means = [n for n in g.nodes() if n.op == "mean"]
    assert [bool(n.attrs.get("splat")) for n in means] == [True, False]    # the variance's stays
    assert means[0].shape == (6, m.lanes)
    run_checked(src, m, 5, "ln.lpu")      # predicted == emulated, within the reference's tolerance


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_one_pass_variance_of_wide_f32_rows_is_a_splat_too(machine):
    """As one pass (mean(x * x) - mu * mu), the variance's mean of squares rotates like the mean:
    var, + eps and rsqrt are splats, and no DISTRIBUTE spreads the rsqrt over the lanes."""
    from lpu.compiler.driver import rewritten
    m = MachineConfig.load(machine)
    src = LN_F32.format(S=6, D=2 * m.lanes + m.lanes // 3)
    g = rewritten(elaborate_source(src, "ln.lpu", {}), m)
    means = [n for n in g.nodes() if n.op == "mean"]
    assert len(means) == 2 and all(n.attrs.get("splat") and n.shape == (6, m.lanes) for n in means)
    assert [n.shape for n in g.nodes() if n.op == "rsqrt"] == [(6, m.lanes)]
    prog, _, _, _ = run_checked(src, m, 5, "ln.lpu")
    assert int(np.sum(prog.op == O.DISTRIBUTE)) == 0


LN_F16 = """param S = {S}
param D = {D}
input x : f16[S, D]
weight g : f32[D]
weight b : f32[D]
output y = f16(layernorm(f16(x * {K}), g, b))
"""


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("scale", [1.0, 400.0])
def test_wide_f16_row_sums_are_folded_to_one_pass_pair_a_row(machine, scale):
    """A layernorm's two sums of f16 rows of 3 chunks: each row folded to f16 hi and lo halves
    of one vector (op lanefold) multiplied by a ones tile of lanes rows, not by C rows of ones;
    |x| ~ 400 makes d * d overflow in f16: the fold keeps the sum infinite, as the reference's
    (an unclamped hi would give inf - inf = NaN)."""
    from lpu.compiler.rewrite import FOLD_ROWS, rewrite
    m = MachineConfig.load(machine)
    src = LN_F16.format(S=FOLD_ROWS, D=2 * m.lanes + m.lanes // 3, K=scale)
    g = rewrite(elaborate_source(src, "ln.lpu", {}), m.lanes)
    folds = [n for n in g.nodes() if n.op == "lanefold"]
    assert len(folds) == 2 and all(n.shape == (FOLD_ROWS, m.lanes) and n.dtype == "f16" for n in folds)
    sums = [n for n in g.nodes() if n.op == "matmul"]
    assert [g.node(n.inputs[0]).op for n in sums] == ["lanefold"] * 2
    assert all(g.node(n.inputs[1]).shape == (m.lanes, m.lanes) for n in sums)
    prog, _, _, _ = run_checked(src, m, 5, "ln.lpu")     # predicted == emulated, within tolerance
    assert int(np.sum(prog.op == O.ROTATE)) > 0


def test_narrow_or_few_f16_rows_are_not_folded():
    from lpu.compiler.rewrite import FOLD_ROWS, rewrite
    lanes = MachineConfig.load("tsp-v1").lanes
    for rows, cols in ((FOLD_ROWS - 1, 3 * lanes), (FOLD_ROWS, 2 * lanes)):
        g = rewrite(elaborate_source(LN_F16.format(S=rows, D=cols, K=1.0), "ln.lpu", {}), lanes)
        assert not any(n.op == "lanefold" for n in g.nodes())


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_exact_lane_plan_rotations_bring_every_lane_to_every_lane_once(machine):
    from lpu.compiler.lower_lanes import lane_plan
    from tests.test_schedule_decode import _LW
    lw = _LW(machine)
    lanes = lw.m.lanes
    for nrows in (1, 128):
        plan = lane_plan(lw, lanes, nrows, "f32", exact=True)
        offsets = np.zeros(1, np.int64)
        for shifts in plan:
            offsets = (offsets[:, None] + np.asarray([0] + shifts)[None, :]).reshape(-1)
        assert np.array_equal(np.sort(offsets % lanes), np.arange(lanes)), plan


# a layernorm of f32 rows (lane trees of rotations and shifts through the SXM) feeding a matmul
NORM = """param S = 128
param D = 768
input x : f16[S, D]
input a : f32[S, D]
weight g : f32[D]
weight b : f32[D]
weight w : f16[D, 4 * D]
output y = f16(f16(layernorm(x + a, g, b)) @ w)
"""


def test_a_layernorm_runs_in_row_groups_and_the_matmul_starts_on_the_first(monkeypatch):
    """Group by group (compiler/rewrite_rows.py), the first rows are normalized while the later
    groups' lane trees run, and the matmul multiplies them (in row blocks matching the groups)
    instead of waiting for every row: the same results, fewer cycles."""
    from lpu.compiler import rewrite_rows
    m = MachineConfig.load("tsp-v1")
    g = elaborate_source(NORM, "norm.lpu", {})
    split = rewrite_rows.row_groups(g)
    groups = sorted({n.attrs["rows"] for n in split.nodes() if "rows" in n.attrs})
    assert groups == list(range(128 // rewrite_rows.GROUP))
    assert sum(1 for n in split.nodes() if n.op == "mean") == 2 * len(groups)
    prog, g, _, _ = run_checked(NORM, m, 5, "norm.lpu")
    monkeypatch.setattr(rewrite_rows, "GROUP", 1 << 20)        # (no region has two groups' rows)
    whole = compile_graph(g, m, repeat=False)
    assert rewrite_rows.row_groups(g) is g
    assert prog.predicted_cycles < whole.predicted_cycles


# a product read only by a layernorm in row groups, and that layernorm's rows multiplied again
BEFORE_NORM = """param S = 128
param D = 640
input x : f16[S, D]
weight g : f32[D]
weight b : f32[D]
weight w : f16[D, D]
weight w2 : f16[D, D]
output y = f16(f16(layernorm(x + x @ w, g, b)) @ w2)
"""


def test_a_product_read_by_row_groups_is_computed_block_by_block(monkeypatch):
    """x @ w read only by a layernorm's row groups (x + x @ w, sliced per group) is computed a
    group of rows at a time, every output chunk of a group before the next (lower_mxm.
    _departing_rows): the first group is normalized while the MXM makes the later ones, instead of
    every row ending with the product. The same products, each weight tile loaded once per group, fewer cycles."""
    from lpu.compiler import rewrite_rows
    m = MachineConfig.load("tsp-v1")
    prog, g, _, _ = run_checked(BEFORE_NORM, m, 5, "before_norm.lpu")
    blocked = compile_graph(g, m, repeat=False)
    monkeypatch.setattr(lower_mxm, "_departing_rows", lambda lw, n, M: None)
    whole = compile_graph(g, m, repeat=False)
    groups = len(rewrite_rows.row_bounds(128)) - 1
    assert groups == 2
    assert _count(blocked, "ABC") == _count(whole, "ABC")
    assert _count(blocked, "LW") > _count(whole, "LW")
    assert blocked.predicted_cycles == prog.predicted_cycles < whole.predicted_cycles


def test_a_packed_softmax_keeps_its_rows_next_to_the_vxm(monkeypatch):
    """attention_prefill's masked scores and exponentials, made on the VXM and read only there
    (by the reductions over the keys and the elementwise ops), lie in the NEAR_SLICES slices
    nearest the VXM on each side, alternating (placement.near_region; first fit spread them up to
    46 hops away): fewer cycles, results within tolerance."""
    from lpu.compiler import placement
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    made = []
    near = placement.near_region
    monkeypatch.setattr(placement, "near_region", lambda lw, *a: made.append((a[3], near(lw, *a))) or made[-1][1])
    prog, g, _, _ = run_checked(src, m, 19, "a.lpu")
    made = [(what, grid) for what, grid in made if what.split("'")[1] in ("exp", "where")]
    assert sorted(what.split("'")[1] for what, _ in made) == ["exp", "where"]
    for _, grid in made:
        planes = (grid.reshape(-1)[:, None] + np.arange(4)[None, :]) % m.mem_slices
        hops = np.abs(np.vectorize(m.slice_pos)(planes) - m.vxm_pos)
        west = planes < m.mem_slices_per_hemisphere
        assert hops.max() <= placement.NEAR_SLICES + 1 and 2 * west.sum() == west.size
        assert np.all(west.all(axis=1) | ~west.any(axis=1))          # no vector across the VXM
    gpt2 = lambda: compile_source(_program("gpt2_block_prefill"), "g.lpu", {}, m)[0].predicted_cycles
    placed = gpt2()
    monkeypatch.setattr(placement, "vxm_to_vxm", lambda *a: False)
    assert placed < gpt2()     # (attention_prefill alone: 816 near, 814 first fit, since the streamed folds)


def test_an_output_made_on_the_vxm_lies_next_to_it(monkeypatch):
    """mlp's output (its last op's rows, on the VXM) lies in the OUTPUT_SLICES slices a side
    nearest the VXM (placement.near_region; first fit had put rows up to 44 hops away, the
    program's last writes): fewer cycles, results within tolerance."""
    from lpu.compiler import placement
    m = MachineConfig.load("tsp-v1")
    src = _program("mlp")
    prog, g, _, _ = run_checked(src, m, 19, "mlp.lpu")
    out = [s for s in prog.symbols if s.kind == "output"]
    assert out and all(np.abs(np.vectorize(m.slice_pos)(s.slices) - m.vxm_pos).max() <= placement.OUTPUT_SLICES + 1
                       for s in out)
    monkeypatch.setattr(placement, "vxm_output", lambda *a: False)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_a_first_products_weights_lie_at_its_edge(monkeypatch):
    """attention_prefill's wq, wk and wv (one tile each, multiplied with the input x) lie in the
    EDGE_SLICES slices at one edge of the chip, west and east by turns, and each product runs
    on that edge's plane pair (first fit spread them over every slice: the first installs at
    cycle 94); wo (sliced by heads) does not: fewer cycles, results within tolerance."""
    from lpu.compiler import placement
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    prog, g, _, _ = run_checked(src, m, 19, "a.lpu")
    sides = []
    for name in ("wq", "wk", "wv"):
        sl = prog.symbol(name).slices
        west, east = sl < placement.EDGE_SLICES, sl >= m.mem_slices - placement.EDGE_SLICES
        assert west.all() or east.all(), name
        sides.append(int(east.all()))
    assert sides == [0, 1, 0] and prog.symbol("wo").slices.max() >= placement.EDGE_SLICES
    lines = {n.attrs["name"]: [u.line for u in g.nodes() if u.op == "matmul" and n.id in u.inputs][0]
             for n in g.nodes() if n.op == "weight" and n.attrs["name"] in ("wq", "wk", "wv")}
    for name, side in zip(("wq", "wk", "wv"), sides):    # its product's installs on that side's pair
        units = {m.queues[int(prog.queue[i])][0] for i in range(len(prog.op))
                 if prog.op[i] == O.IW and prog.line[i] == lines[name]}
        assert units == {f"mxm{2 * side}"}, (name, units)
    monkeypatch.setattr(placement, "EDGE_SHARE", 0.0)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_a_where_whose_constant_condition_clashes_stages_the_constant(monkeypatch):
    """A `where` whose condition (a constant, the causal mask) lies on a bank of its operand's
    row copies the condition (no dependency: any time before) and stays one chain; it had gone
    through three chains and two temporaries after the row was made (stragglers that held up
    the softmax's max): fewer cycles on attention_prefill, results within tolerance. (Its rows
    made one at a time: with the max's first level in the where's chains, those stage their
    conditions themselves, lower_ops._staged_conds.)"""
    from lpu.compiler import lower_ops, lower_reduce
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    monkeypatch.setattr(lower_reduce, "first_blocks", lambda *a: None)
    done = _spy(monkeypatch, lower_ops, "_where_staged")
    prog, g, _, _ = run_checked(src, m, 19, "a.lpu")
    assert any(done) and all(done)
    monkeypatch.setattr(lower_ops, "_where_staged", lambda *a: False)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles
