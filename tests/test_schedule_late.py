"""Late columns (compiler/rewrite_late.py): the v columns of a qkv product are computed after
the score products, filling the MXM while the softmax runs; the same results, fewer cycles."""
from __future__ import annotations

from lpu.compiler import driver
from lpu.compiler.driver import compile_graph, rewritten
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.plan import LATE_DEPTHS, make_plan
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked

QKV = """param S = 128
param D = 768
param H = 12
param HD = D / H
input  x    : f16[S, D]
weight wqkv : f16[D, 3*D]
weight bqkv : f16[3*D]
fn head(q, k, v) {
    s = q @ k.T * (1.0 / sqrt(HD))
    return f16(softmax(s) @ v)
}
qkv = f16(x @ wqkv + bqkv)
q = qkv[:, 0:D]
k = qkv[:, D:2*D]
v = qkv[:, 2*D:3*D]
output y = concat([head(q[:, i*HD:(i+1)*HD], k[:, i*HD:(i+1)*HD], v[:, i*HD:(i+1)*HD]) for i in 0..H], axis=1)
"""


def test_the_v_columns_of_qkv_are_computed_after_the_scores(monkeypatch):
    m = MachineConfig.load("tsp-v1")
    g = rewritten(elaborate_source(QKV, "qkv.lpu", {}), m)
    x = g.decls["x"]
    products = [n for n in g.nodes() if n.op == "matmul" and n.inputs[0] == x]
    # split at the first chunk boundary past k's columns (1536 -> 5 chunks of 320)
    assert [n.shape[1] for n in products] == [1600, 704]
    early, late = products
    assert "late" not in early.attrs and late.attrs["late"] > 0
    plan = make_plan(g, m.lanes)
    scores = [n.id for n in g.nodes() if n.op == "matmul" and n.id not in (early.id, late.id)
              and plan.depth[n.id] < plan.depth[late.id]]
    first = late.id + late.attrs["late"]
    assert first in scores
    assert plan.depth[late.id] == plan.depth[first] + LATE_DEPTHS
    pos = {nid: i for i, nid in enumerate(plan.order)}
    assert all(pos[s] < pos[late.id] for s in scores)
    # v.T: the transposes of v's columns on either side of the split, joined as rows
    cat = [n for n in g.nodes() if n.op == "concat" and n.attrs["axis"] == 0
           and all(g.node(i).op == "transpose" for i in n.inputs)]
    assert [tuple(g.node(i).shape) for i in cat[0].inputs] == [(64, 128), (704, 128)]
    prog, graph, _, _ = run_checked(QKV, m, 7, "qkv.lpu")
    monkeypatch.setattr(driver, "late_columns", lambda gr, lanes: gr)
    whole = compile_graph(graph, m)
    assert prog.predicted_cycles < whole.predicted_cycles
