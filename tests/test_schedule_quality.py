"""Schedule quality levers (issue 13): layout choices made as graph rewrites (compiler/rewrite.py)
keep every result within the reference's tolerance, keep predicted == emulated cycles, pass
`verify`, and pay: attention scores computed transposed need no lane reductions."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lpu.api import check
from lpu.compiler.driver import compile_source
from lpu.compiler.reference import random_values
from lpu.compiler.rewrite import rewrite
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.verify import _Expanded, verify
from lpu.emulator.run import run
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked

ATTN = """param S = {S}
param D = {D}
param H = {H}
param HD = D / H
input x : f16[S, D]
weight wq : f16[D, D]
weight wk : f16[D, D]
weight wv : f16[D, D]
fn head(q, k, v) {{
    s = {mask}(q @ k.T * (1.0 / sqrt(HD)))
    return f16(softmax(s) @ v)
}}
q = f16(x @ wq)
k = f16(x @ wk)
v = f16(x @ wv)
output y = concat([head(q[:, i*HD:(i+1)*HD], k[:, i*HD:(i+1)*HD], v[:, i*HD:(i+1)*HD]) for i in 0..H], axis=1)
"""


def _src(S=48, D=64, H=2, mask=""):
    return ATTN.format(S=S, D=D, H=H, mask=mask)


def _ops(prog) -> set:
    return {O.OPS[int(o)].name for o in np.unique(prog.op)}


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("mask", ["", "causal"])
@pytest.mark.parametrize("rows", [48, 80])      # p transposed back (<= P_BACK_Q rows), or v and the result
def test_transposed_scores_agree_with_the_reference(machine, mask, rows):
    src = _src(S=rows, mask=mask)
    g0 = elaborate_source(src, "a.lpu", {})
    assert rewrite(g0) is not g0
    prog, g, vals, res = run_checked(src, MachineConfig.load(machine), 3, "a.lpu")


def test_row_softmax_of_scores_needs_no_lane_reduction():
    g = elaborate_source(_src(), "a.lpu", {})
    t = rewrite(g)
    red = [n for n in t.nodes() if n.op in ("max", "sum")]
    assert red and all(n.attrs["axis"] == 0 for n in red)
    assert [n.shape for n in t.nodes() if n.op == "output"] == [n.shape for n in g.nodes() if n.op == "output"]
    prog, _ = compile_source(_src(), "a.lpu", {}, MachineConfig.load("tsp-v1"))
    assert not {"SHIFT", "ROTATE"} & _ops(prog)      # no lane tree anywhere


def test_transposed_scores_are_faster():
    m = MachineConfig.load("tsp-v1")
    g = elaborate_source(_src(S=128, D=512, H=8), "a.lpu", {})
    from lpu.compiler import driver
    fast = driver.compile_graph(g, m).predicted_cycles
    orig = driver.rewrite
    try:
        driver.rewrite = lambda x, lanes=None: x
        slow = driver.compile_graph(g, m).predicted_cycles
    finally:
        driver.rewrite = orig
    assert fast < 0.7 * slow, (fast, slow)


def test_a_region_with_another_tensor_operand_is_left_alone():
    src = _src().replace("s = (q @ k.T", "s = (q @ k.T + x[:, 0:S]")
    g = elaborate_source(src, "a.lpu", {})
    assert rewrite(g) is g


FUSE = """input x : f16[3, 700]
input g : f32[700]
input m : f32[3, 1]
output y = f16((x - m) * 0.5 * g + 1.0)
output z = exp(x * 2.0) - x
"""


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_fused_elementwise_chains_are_bit_exact_and_write_once(machine):
    """(x - m) * 0.5 * g + 1.0, cast: one chain per output vector, no intermediate WRITEs, the
    same bits as the reference (each op keeps its dtype and rounding on the links)."""
    from lpu.compiler.plan import make_plan
    from lpu.compiler.reference import run_reference
    m = MachineConfig.load(machine)
    g = elaborate_source(FUSE, "f.lpu", {})
    plan = make_plan(g, m.lanes)
    assert sum(k == "fused" for k in plan.kind.values()) >= 3
    prog, g = compile_source(FUSE, "f.lpu", {}, m)
    assert not verify(prog)
    vals = random_values(g, 4)
    res = run(prog, vals)
    assert res.cycles == prog.predicted_cycles
    want = run_reference(g, vals, k_tile=m.lanes)[0]
    for k in g.outputs:
        assert np.array_equal(np.asarray(res.outputs[k]), np.asarray(want[k]), equal_nan=True), k
    from lpu.compiler import plan as P
    orig = P.fusable
    try:
        P.fusable = lambda graph, kind, lanes: set()
        unfused, _ = compile_source(FUSE, "f.lpu", {}, m)
    finally:
        P.fusable = orig
    writes = [int((p.op == O.BY_NAME["WRITE"].code).sum()) for p in (prog, unfused)]
    assert writes[0] < 0.6 * writes[1], writes
    assert prog.predicted_cycles < unfused.predicted_cycles


def test_a_small_producer_of_two_users_is_computed_in_each():
    """layernorm's d = x - mean(x) feeds d * d and d * rsqrt(..): on one row it is fused into
    both (computed twice, never stored) and the result still agrees with the reference."""
    from lpu.compiler.plan import make_plan
    src = "input x : f16[1, 40]\ninput g : f32[40]\ninput b : f32[40]\noutput y = f16(layernorm(x, g, b))\n"
    for machine in ("tiny", "tsp-v1"):
        m = MachineConfig.load(machine)
        g = elaborate_source(src, "l.lpu", {})
        plan = make_plan(g, m.lanes)
        subs = [n.id for n in g.nodes() if n.op == "sub"]
        assert subs and all(plan.kind[s] == "fused" and len(g.users(s)) == 2 for s in subs)
        run_checked(src, m, 6, "l.lpu")


@pytest.mark.parametrize("fallback", [False, True])
def test_small_ops_spread_their_broadcast_operands_in_chain(fallback, monkeypatch):
    """A [1, 1] operand spread over the lanes inside the op's chain (or, where a chain cannot be
    placed, op by op through temporaries): the same bits as the reference either way."""
    from lpu.compiler import lower_fuse
    from lpu.compiler.reference import run_reference
    if fallback:
        monkeypatch.setattr(lower_fuse, "_fused_chain", lambda *a: False)
    src = "input x : f16[2, 40]\ninput m : f32[2, 1]\noutput y = f16(exp(x - m) * 3.0)\noutput z = x * m\n"
    for machine in ("tiny", "tsp-v1"):
        mc = MachineConfig.load(machine)
        prog, g = compile_source(src, "s.lpu", {}, mc)
        assert not verify(prog)
        assert fallback or "DISTRIBUTE" in _ops(prog)
        vals = random_values(g, 7)
        res = run(prog, vals)
        assert res.cycles == prog.predicted_cycles
        want = run_reference(g, vals, k_tile=mc.lanes)[0]
        for k in g.outputs:
            assert np.array_equal(np.asarray(res.outputs[k]), np.asarray(want[k]), equal_nan=True), k


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_f16_lane_sums_go_through_the_mxm(machine):
    """sum and mean over the lanes of f16 tensors: x @ ones, no SXM lane tree; within the
    reference's tolerance (f32 sums in another order); an f32 tensor keeps its lane tree."""
    src = "input x : f16[3, 700]\ninput y : f32[2, 50]\noutput s = sum(x, axis=1)\noutput m = mean(x)\n"
    g0 = elaborate_source(src, "s.lpu", {})
    t = rewrite(g0)
    assert [n.attrs["axis"] for n in t.nodes() if n.op in ("sum", "mean")] == []
    assert sum(n.op == "matmul" for n in t.nodes()) == 2
    src2 = src + "output z = mean(y)\n"
    prog, g = compile_source(src2, "s.lpu", {}, MachineConfig.load(machine))
    assert not verify(prog)
    vals = random_values(g, 8)
    res = run(prog, vals)
    assert res.cycles == prog.predicted_cycles
    assert check(g, prog, vals, res)["ok"]
    assert "SHIFT" in _ops(prog)         # the f32 mean's lane tree


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_a_short_last_k_tile_takes_half_abcs(machine):
    """K = 2.4 chunks (768 on 320 lanes): the last K-tile (0.4 of a chunk) is one f16 pass of the
    pair (ABC half=1, one cycle, not two); the result is exact, verify accepts it, and the same
    binary with the flag cleared is refused by verify and by the emulator (the next ABC meets a
    busy pair). A product of few rows (a decode step's) keeps full holds."""
    from lpu.compiler.lower_mxm import FEW_ROWS
    mc = MachineConfig.load(machine)
    K, N, R = mc.lanes * 12 // 5, mc.lanes, 2 * FEW_ROWS
    prog, g, vals, res = run_checked(f"input x : f16[{R}, {K}]\nweight w : f16[{K}, {N}]\noutput y = x @ w\n", mc)
    e = _Expanded(prog)
    assert sorted(e.args[e.op == O.ABC, 3].tolist()) == [0] * (2 * R) + [1] * R   # rows x K-tiles
    abc = np.flatnonzero(prog.op == O.ABC)
    half = prog.args[abc, 3]
    assert res.counters["mxm"] == 2 * mc.f16_pair_cycles * (2 * R) + 2 * mc.abc_cycles(True, True) * R
    bad = prog.args.copy()
    bad[abc[half == 1], 3] = 0
    p2 = dataclasses.replace(prog, args=bad)
    assert any(v.kind == "unit-busy" for v in verify(p2))
    with pytest.raises(Exception, match="unit-busy|busy"):
        run(p2, vals)
    few, *_ = run_checked(f"input x : f16[{FEW_ROWS}, {K}]\nweight w : f16[{K}, {N}]\noutput y = x @ w\n", mc)
    assert not _Expanded(few).args[_Expanded(few).op == O.ABC, 3].any()
