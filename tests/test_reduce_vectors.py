"""Reductions across vectors (any axis but the last): the pairwise order of the reference is
the order the compiled tree chains add in (results agree bit for bit), and such a reduction is
no slower than the lane reduction over the last axis of the same tensor."""
from __future__ import annotations

import os

import numpy as np
import pytest

from lpu.compiler import semantics as S
from lpu.compiler.driver import compile_source
from lpu.compiler.reference import run_reference
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked


def test_pairwise_order_is_adjacent_pairs_level_by_level():
    x = np.array([[1e8], [1.0], [-1e8], [1.0]], np.float32)
    assert S.reduce("sum", x, 0, "f32")[0, 0] == 0.0           # (1e8 + 1) + (-1e8 + 1) in f32
    assert np.float32(np.float32(np.float32(1e8) + 1) - np.float32(1e8)) + 1 == 1.0   # (a serial order)
    got = S.pairwise(np.arange(5.0)[:, None], 0, lambda a, b: 10 * a + b)
    assert got[0, 0] == 10 * (10 * (10 * 0 + 1) + (10 * 2 + 3)) + 4 == 334
    # ((0, 1), (2, 3)), 4: adjacent pairs, then pairs of pairs; the odd last one carried up


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("src", [
    "input x : f32[37, 200]\noutput s = sum(x, axis=0)\noutput m = mean(x, axis=0)\noutput x1 = max(x, axis=0)\n",
    "input x : f16[128, 128]\noutput s = sum(x, axis=0)\noutput m = mean(x, axis=0)\n",
    "input x : f32[3, 21, 40]\noutput s = sum(x, axis=1)\noutput t = mean(x, axis=0)\n",
    "input x : i8[9, 30]\noutput s = sum(x, axis=0)\noutput x1 = max(x, axis=0)\noutput m = mean(x, axis=0)\n",
    "input x : f32[1, 30]\noutput s = sum(x, axis=0)\noutput m = mean(x, axis=0)\n",
])
def test_reductions_across_vectors_match_the_reference_exactly(machine, src):
    prog, g, vals, res = run_checked(src, MachineConfig.load(machine), 5, "r.lpu")
    want = run_reference(g, vals)[0]
    for k in g.outputs:
        assert np.array_equal(np.asarray(res.outputs[k]), np.asarray(want[k])), k


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
@pytest.mark.parametrize("op,shape", [("mean", "37, 200"), ("sum", "128, 768"), ("max", "5, 1000")])
def test_axis0_reduction_costs_at_most_1_5x_the_last_axis_one(machine, op, shape):
    m = MachineConfig.load(machine)
    cyc = [compile_source(f"input x : f16[{shape}]\noutput y = {op}(x, axis={a})\n", "r.lpu", {}, m)[0]
           .predicted_cycles for a in (0, 1)]
    assert cyc[0] <= 1.5 * cyc[1], cyc



def test_a_lone_reduction_takes_leaves_from_both_sides_in_one_chain(monkeypatch):
    """A lone reduction across f32 vectors (alone at its depth: its rows and partials lie on
    both sides of the VXM) reduces 16 leaves a chain, half on each direction's streams, not 8:
    one level less after the last row (a packed softmax's sum), the same pairwise order (results
    equal to the reference bit for bit), fewer cycles than 8 a chain: gpt2_block_prefill without
    its exponentials' block chains 3,276 against 3,292 (attention_prefill's had been 917 against
    933, until its roundings of v_h @ W_h moved after the sum, rewrite_pack.ROUND_AFTER: 825
    against 817)."""
    from lpu.compiler import lower_reduce
    m = MachineConfig.load("tsp-v1")
    seen, real = [], lower_reduce._tree_leaves
    monkeypatch.setattr(lower_reduce, "_tree_leaves", lambda *a: seen.append(real(*a)) or seen[-1])
    prog, g, vals, res = run_checked("input x : f32[64, 256]\noutput s = sum(x * x, axis=0)\n", m, 7, "r.lpu")
    assert 16 in seen and np.array_equal(np.asarray(res.outputs["s"]), np.asarray(run_reference(g, vals)[0]["s"]))
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs", "gpt2_block_prefill.lpu")) as f:
        blk = f.read()
    from lpu.compiler import lower_fuse       # (its sum's first level made in the exp chains: no _tree_leaves both)
    monkeypatch.setattr(lower_fuse, "_block_chains", lambda *a: set())
    wide = compile_source(blk, "b.lpu", machine=m)[0].predicted_cycles
    monkeypatch.setattr(lower_reduce, "_tree_leaves", lambda lw, dt, both=False: real(lw, dt))
    assert wide < compile_source(blk, "b.lpu", machine=m)[0].predicted_cycles


def test_a_lone_sum_starts_in_its_sources_chains(monkeypatch):
    """The rows of a fused elementwise tree read by a lone sum across its vectors (a packed
    softmax's exponentials) make each aligned block's sum in the chains that make the rows
    (lower_fuse._block_chains): the sum's first level, in its own pairwise order (results equal
    to the reference bit for bit), and gpt2_block_prefill is faster than without (attention_prefill:
    816 against 821; its tail after the division is what bounds it now)."""
    from lpu.compiler import lower_fuse
    m = MachineConfig.load("tsp-v1")
    made, real = [], lower_fuse._block_chains
    def spy(*a):
        done = real(*a)
        made.append(len(done))
        return done
    monkeypatch.setattr(lower_fuse, "_block_chains", spy)
    for rows, blocked in ((64, 64), (12, 12), (66, 0)):     # (66: blocks of 4 would not be a level of its order)
        made.clear()
        src = f"input x : f32[{rows}, 256]\ninput b : f32[1, 256]\noutput s = sum((x - b) * 0.5, axis=0)\n"
        prog, g, vals, res = run_checked(src, m, 3, "r.lpu")
        assert made == [blocked] and np.array_equal(np.asarray(res.outputs["s"]), np.asarray(run_reference(g, vals)[0]["s"]))
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs", "gpt2_block_prefill.lpu")) as f:
        att = f.read()
    made.clear()
    fast = compile_source(att, "a.lpu", machine=m)[0].predicted_cycles
    assert 64 in made
    monkeypatch.setattr(lower_fuse, "_block_chains", lambda *a: set())
    assert fast < compile_source(att, "a.lpu", machine=m)[0].predicted_cycles


def test_a_lone_reductions_last_two_levels_take_two_chains(monkeypatch):
    """A lone reduction across vectors whose last level adds two partials makes the first in one
    chain and the second with its op on the first in another (lower_reduce._top), not three
    chains: the same pairwise order (results equal to the reference bit for bit), and
    gpt2_block_prefill (its softmax's sum) is faster than with three (attention_prefill: 816
    against 815, bound by its tail since the streamed folds)."""
    from lpu.compiler import lower_reduce
    m = MachineConfig.load("tsp-v1")
    made, real = [], lower_reduce._top
    monkeypatch.setattr(lower_reduce, "_top", lambda *a: made.append(real(*a)) or made[-1])
    for src in ("input x : f32[64, 256]\ninput b : f32[1, 256]\noutput s = sum((x - b) * 0.5, axis=0)\n",
                "input x : f32[24, 256]\noutput t = max(x, axis=0)\n", "input x : f32[24, 256]\noutput t = mean(x, axis=0)\n"):
        made.clear()
        prog, g, vals, res = run_checked(src, m, 3, "r.lpu")
        want = run_reference(g, vals)[0]
        assert True in made and all(np.array_equal(np.asarray(res.outputs[k]), np.asarray(want[k])) for k in g.outputs)
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs", "gpt2_block_prefill.lpu")) as f:
        att = f.read()
    made.clear()
    fast = compile_source(att, "a.lpu", machine=m)[0].predicted_cycles
    assert True in made
    monkeypatch.setattr(lower_reduce, "_top", lambda *a: False)
    assert fast < compile_source(att, "a.lpu", machine=m)[0].predicted_cycles


def test_a_max_takes_its_sources_last_blocks_raw_and_a_products_rows_lie_on_its_side(monkeypatch):
    """A max of two levels whose first level its source made (a packed softmax's masked scores)
    takes the last blocks as they are in its last chain (lower_reduce._raw_last: a max in any
    order is exact), and the rows a product takes from the VXM (the packed heads' keys) lie on
    its plane pair's hemisphere (placement.rows_of): gpt2_block_prefill is faster with each than
    without (attention_prefill, bound by its tail: 816 against 814 and 816), and they agree with the reference (tests/test_golden_cycles
    runs them checked). Since the where's chains make each four rows' max (lower_reduce.FIRST_ROWS
    4: 16 partials, not 32) the raw blocks no longer pay, nor cost (gpt2_block_prefill 3,225 and
    attention_prefill 745 either way); rows_of does (3,225 against 3,368; 745 against 754)."""
    from lpu.compiler import lower_reduce, placement
    m = MachineConfig.load("tsp-v1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    srcs = []
    for name in ("attention_prefill", "gpt2_block_prefill"):
        with open(os.path.join(root, "programs", f"{name}.lpu")) as f:
            srcs.append(f.read())
    raws, real = [], lower_reduce._raw_last
    monkeypatch.setattr(lower_reduce, "_raw_last", lambda *a: raws.append(real(*a)) or raws[-1])
    fast = [compile_source(s, "a.lpu", machine=m)[0].predicted_cycles for s in srcs]
    assert max(raws) > 0
    monkeypatch.setattr(lower_reduce, "_raw_last", lambda *a: 0)
    assert fast[1] <= compile_source(srcs[1], "a.lpu", machine=m)[0].predicted_cycles
    monkeypatch.setattr(lower_reduce, "_raw_last", real)
    monkeypatch.setattr(placement, "rows_of", lambda *a: None)
    assert fast[1] < compile_source(srcs[1], "a.lpu", machine=m)[0].predicted_cycles
