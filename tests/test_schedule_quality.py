"""Schedule quality levers (issue 13): layout choices made as graph rewrites (compiler/rewrite.py)
keep every result within the reference's tolerance, keep predicted == emulated cycles, pass
`verify`, and pay: attention scores computed transposed need no lane reductions."""
from __future__ import annotations

import numpy as np
import pytest

from lpu.api import check
from lpu.compiler.driver import compile_source
from lpu.compiler.reference import random_values
from lpu.compiler.rewrite import rewrite
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.verify import verify
from lpu.emulator.run import run
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig

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
    prog, g = compile_source(src, "a.lpu", {}, MachineConfig.load(machine))
    assert not verify(prog)
    vals = random_values(g, 3)
    res = run(prog, vals)
    assert res.cycles == prog.predicted_cycles
    assert check(g, prog, vals, res)["ok"]


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
        driver.rewrite = lambda x: x
        slow = driver.compile_graph(g, m).predicted_cycles
    finally:
        driver.rewrite = orig
    assert fast < 0.7 * slow, (fast, slow)


def test_a_region_with_another_tensor_operand_is_left_alone():
    src = _src().replace("s = (q @ k.T", "s = (q @ k.T + x[:, 0:S]")
    g = elaborate_source(src, "a.lpu", {})
    assert rewrite(g) is g
