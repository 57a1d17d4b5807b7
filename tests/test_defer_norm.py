"""compiler/rewrite_defer.py: a masked packed softmax normalized after its heads' products."""
from __future__ import annotations

from lpu.compiler.driver import rewritten
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.rewrite import P_BACK_Q
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked
from tests.test_schedule_prefill import CAUSAL


def _sums(g):
    return [n for n in g.nodes() if n.op == "sum" and n.attrs.get("axis") == 0]


def test_a_masked_packed_softmax_sums_on_the_mxm_and_divides_after_p_at_v():
    """Each head's p @ v is [vT_h; 1] @ f16(e)_h: one more row of the product is the softmax's
    sum (no VXM sum across vectors is left), the other rows are divided by it; the ones row is
    joined at the end of the heads' transposed v, so [vT_h; 1] is a view, not a copy; the
    results agree with the reference and predicted == emulated."""
    m = MachineConfig.load("tsp-v1")
    src = CAUSAL.format(S=P_BACK_Q + 16, D=256)
    g = rewritten(elaborate_source(src, "c.lpu", {}), m)
    assert not _sums(g)
    pv = [n for n in g.nodes() if n.op == "matmul" and n.shape == (65, P_BACK_Q + 16)]
    assert len(pv) == 4
    for n in pv:
        a = g.node(n.inputs[0])
        assert a.op == "concat" and {g.node(i).inputs[0] for i in a.inputs} == {g.node(a.inputs[0]).inputs[0]}
        assert sorted(g.node(u).op for u in g.users(n.id)) == ["slice", "slice"]
    run_checked(src, m, 19, "c.lpu")


def test_an_unmasked_softmax_keeps_its_sum():
    """No mask (bert_base's heads): measured slower deferred, so the sum stays."""
    m = MachineConfig.load("tsp-v1")
    src = CAUSAL.replace("causal(", "(").format(S=P_BACK_Q + 16, D=256)
    g = rewritten(elaborate_source(src, "c.lpu", {}), m)
    assert _sums(g)
    run_checked(src, m, 20, "c.lpu")
