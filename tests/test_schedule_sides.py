"""Where a pass's vectors lie, and where the heads' products are summed (issue 13): a product's
rows on the slices of its plane pair's hemisphere, a tensor that the SXM transposes on that
SXM's side, and the heads' products at the end of a program summed in the MXM's accumulators.
Each keeps results within the reference's tolerance, predicted == emulated cycles and `verify`,
and pays on the case it was made for."""
from __future__ import annotations

import os

import pytest

from lpu.compiler import driver, lower_mxm, movement, placement, rewrite_pack
from lpu.compiler.driver import compile_graph, rewritten
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.plan import make_plan
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked

PROGRAMS = os.path.join(os.path.dirname(__file__), "..", "programs")


def _source(name: str) -> str:
    with open(os.path.join(PROGRAMS, name + ".lpu")) as f:
        return f.read()


def _attention(m: MachineConfig) -> str:
    hd = min(32, m.lanes // 2)
    return _source("attention_prefill").replace("param D = 128", f"param D = {4 * hd}") \
        .replace("param S = 64", f"param S = {min(64, 4 * hd)}")


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_the_heads_products_are_summed_in_the_accumulators(machine, monkeypatch):
    """concat(heads, axis=1) @ wo at the end of attention_prefill: each head's product after
    the first of its accumulator takes the one before as a third operand (a @ b + c), that one
    is left in the accumulators (plan kind acc: no ACC, no region), and the heads' sum needs one
    VXM add per output vector (two accumulators), not three. Two sums at once on one plane pair
    (tiny) hold different accumulator rows (verify finds no reset before a read). On tsp-v1 it
    is faster than the adds. (Pairs of heads made as one product, compiler/rewrite_pair.py, are
    left out here: on tsp-v1 they replace the sums, tests/test_pair_heads.py.)"""
    monkeypatch.setattr(driver, "pair_heads", lambda g, lanes: g)
    m = MachineConfig.load(machine)
    src = _attention(m)
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    summed = [n for n in g.nodes() if n.op == "matmul" and len(n.inputs) == 3]
    assert len(summed) == rewrite_pack.CHAINS
    kind = make_plan(g, m.lanes).kind
    assert all(kind[n.inputs[2]] == "acc" and g.node(n.inputs[2]).op == "matmul" for n in summed)
    prog, g, _, _ = run_checked(src, m, 16, "a.lpu")
    last = max(int(x) for x in prog.line)
    adds = int(((prog.op == O.BY_NAME["ADD"].code) & (prog.line == last)).sum())
    rows, cols = g.node(g.outputs["y"]).shape
    assert 0 < adds <= rows * -(-cols // m.lanes) * (rewrite_pack.CHAINS - 1)     # a vector each
    if machine == "tsp-v1":
        monkeypatch.setattr(rewrite_pack, "CHAINS", 4)        # one product per accumulator: adds
        assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


def test_a_products_rows_lie_on_its_plane_pairs_side(monkeypatch):
    """matmul.lpu (one 64-row product on one plane pair): every accumulator row is written to a
    slice of that pair's hemisphere, so the trip to the VXM (the f16 rounding) is the pair's
    distance to the VXM for every row; placed anywhere, it is slower."""
    m = MachineConfig.load("tsp-v1")
    seen = []
    real = lower_mxm._matmul2d

    def spy(lw, n, agrid, bgrid, ogrid, *rest):
        before = dict(lw.ctx.mxm_load)
        real(lw, n, agrid, bgrid, ogrid, *rest)
        units = [u for u in lw.ctx.mxm_load if lw.ctx.mxm_load[u] != before.get(u, 0)]
        seen.append(({int(u >= m.mxm_planes_per_hemisphere) for u in units},
                     {m.slice_hemisphere(int(s) % m.mem_slices) for s in ogrid.reshape(-1)}))

    monkeypatch.setattr(lower_mxm, "_matmul2d", spy)
    prog, g, _, _ = run_checked(_source("matmul"), m, 5, "matmul.lpu")
    assert seen and all(len(units) == 1 and units == sides for units, sides in seen)
    monkeypatch.setattr(placement, "side_of", lambda lw, n: None)
    assert prog.predicted_cycles < compile_graph(g, m).predicted_cycles


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_a_transposed_tensor_lies_on_its_sxms_side(machine, monkeypatch):
    """f16(exp(x @ w)).T through the SXM transpose buffers: the rounded rows lie on one
    hemisphere and that hemisphere's SXM transposes them (every TPIN and TPOUT on it)."""
    m = MachineConfig.load(machine)
    sides = []
    real = movement.transpose_grid

    def spy(lw, n, src, *rest):
        sides.append({m.slice_hemisphere(int(s) % m.mem_slices) for s in src.reshape(-1)})
        real(lw, n, src, *rest)

    monkeypatch.setattr(movement, "transpose_grid", spy)
    src = (f"input x : f16[{m.lanes // 2}, {m.lanes}]\nweight w : f16[{m.lanes}, {m.lanes}]\n"
           "output y = f16(exp(x @ w)).T * 2.0\n")      # (a product of rows: not a decode step)
    prog, _, _, _ = run_checked(src, m, 7, "t.lpu")
    tp = (prog.op == O.BY_NAME["TPIN"].code) | (prog.op == O.BY_NAME["TPOUT"].code)
    sxms = {m.queues[int(q)][0].split(".")[0] for q in prog.queue[tp]}
    assert sides == [{0}] or sides == [{1}]
    assert sxms == {f"sxm{next(iter(sides[0]))}"}


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_transposed_columns_go_straight_to_sram(machine):
    """Columns read out of a transpose buffer hold every buffer row: where an earlier, taller
    block left rows past this block's (the third transpose below, on the first's SXM), they are
    first filled from zero vectors (TPINs past the block's rows), so no column goes through the
    VXM (no CONV on the transposes' lines) and the results still agree with the reference."""
    m = MachineConfig.load(machine)
    n, h = m.lanes, m.lanes // 2
    src = (f"input x : f16[{n}, {n}]\nweight w : f16[{n}, {n}]\n"
           "t = f16(exp(x @ w))\n"
           "a = t.T\n"
           f"c = t[0:{h}, :].T\n"
           f"b = t[{h}:{n}, :].T\n"
           f"output y = a[:, 0:{h}] + b * 2.0 + c\n")
    prog, _, _, _ = run_checked(src, m, 9, "tp.lpu")
    lines = prog.line[prog.op == O.BY_NAME["CONV"].code]
    assert not ({4, 5, 6} & {int(x) for x in lines})
    tpin = int((prog.op == O.BY_NAME["TPIN"].code).sum())
    assert tpin > n + h + h                     # more than the rows transposed: stale rows zeroed
