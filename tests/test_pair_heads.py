"""compiler/rewrite_pair.py: two heads' products with p as rows made as one (op tfold)."""
from __future__ import annotations

import numpy as np

from lpu.compiler import driver, semantics
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.verify import _Expanded
from lpu.compiler.driver import compile_source, rewritten
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked
from tests.test_schedule_prefill import _program


def test_tfold_stacks_the_columns_step_apart_below_the_transpose():
    x = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    out = semantics.tfold(x, 3, 2, (0, 5), 2)
    want = np.zeros((4, 12), np.float32)
    for i, s in enumerate((0, 5)):
        for c in range(2):
            for j in range(2):
                for r in range(6):
                    want[i * 2 + c, j * 6 + r] = x[r, s + c + j * 3]
    assert np.array_equal(out, want)


def _count(prog, name) -> int:
    """Instructions `name` issued (REPEATs expanded)."""
    return int((_Expanded(prog).op == O.BY_NAME[name].code).sum())


def test_attention_prefill_pairs_its_heads_products_on_both_sxms(monkeypatch):
    """attention_prefill's four heads: p.T (64 keys x 4 heads' 64 queries) folded twice, heads
    0-1 and 2-3, each through its own SXM (64 rows rotated on their way in, 128 TPINs, 64
    columns out) into one product of K = 128 on the plane pair of its side, instead of two
    accumulated products of K = 64 a pair; the results agree with the reference, predicted ==
    emulated, and the program is faster than without the pass."""
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    folds = [n for n in g.nodes() if n.op == "tfold"]
    assert len(folds) == 2 and all(n.shape == (64, 128) and n.attrs["step"] == 64 for n in folds)
    assert sorted(n.attrs["starts"] for n in folds) == [(0,), (128,)]
    for n in folds:
        (u,) = g.users(n.id)
        assert g.node(u).op == "matmul" and len(g.node(u).inputs) == 2 and g.node(g.node(u).inputs[1]).shape == (128, 128)
    assert not [n for n in g.nodes() if n.op == "matmul" and len(n.inputs) > 2]
    prog, _, _, _ = run_checked(src, m, 5, "a.lpu")
    assert _count(prog, "ROTATE") == 2 * 64 and _count(prog, "TPIN") == 2 * 128 and _count(prog, "TPOUT") == 2 * 64
    sxms = {m.queues[int(q)][0].split(".")[0] for q, o in zip(prog.queue, prog.op) if o == O.BY_NAME["TPIN"].code}
    assert sxms == {"sxm0", "sxm1"}
    monkeypatch.setattr(driver, "pair_heads", lambda g, lanes: g)
    before, _ = compile_source(src, "a.lpu", {}, m)
    assert prog.predicted_cycles < before.predicted_cycles - 50


def test_shorter_prompts_fold_by_their_own_step():
    """S = 32: p.T is 32 keys x 4 heads' 32 queries, the heads 32 lanes apart (step 32, folds
    of columns 0-31 and 64-95); the results agree with the reference."""
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill").replace("param S = 64", "param S = 32")
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    folds = [n for n in g.nodes() if n.op == "tfold"]
    assert sorted((n.attrs["step"], n.attrs["starts"], n.shape) for n in folds) == [(32, (0,), (32, 64)), (32, (64,), (32, 64))]
    run_checked(src, m, 7, "a.lpu")


def test_a_causal_fold_reads_each_column_out_once_its_rows_are_in(monkeypatch):
    """p.T's zeros are known (rewrite_pair.live: the causal mask's dropped keys), so each fold
    reads a column out (TPOUT) as soon as the rows that column needs are in, not after all 128
    TPINs: on each SXM the first TPOUT comes before the last TPIN (every issue of a REPEAT
    counted), and the program is faster than with every column read after the whole buffer is in."""
    from lpu.compiler import movement
    from lpu.compiler.rewrite_pair import live
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    (pt,) = {n.inputs[0] for n in g.nodes() if n.op == "tfold"}
    q = np.arange(256) % 64
    assert np.array_equal(live(g, pt), np.arange(64)[:, None] <= q[None, :])
    assert live(g, g.node(pt).inputs[0]) is not None and live(g, g.users(pt)[0]) is None
    prog, _ = compile_source(src, "a.lpu", {}, m)
    e = _Expanded(prog)
    sxm = np.array([m.queues[int(x)][0].split(".")[0] for x in prog.queue])[e.src]
    for s in ("sxm0", "sxm1"):
        tin = e.cycle[(prog.op[e.src] == O.BY_NAME["TPIN"].code) & (sxm == s)]
        tout = e.cycle[(prog.op[e.src] == O.BY_NAME["TPOUT"].code) & (sxm == s)]
        assert len(tin) == 128 and len(tout) == 64 and tout.min() < tin.max() - 16
    monkeypatch.setattr(movement, "_fold_need", lambda *a: None)
    whole, _ = compile_source(src, "a.lpu", {}, m)
    assert prog.predicted_cycles < whole.predicted_cycles       # (793 against 843; 745 against 792)


def test_a_fold_whose_zeros_are_not_known_reads_its_columns_after_all_rows():
    """Without the causal mask p.T has no known zeros (rewrite_pair.live is None): each fold
    reads every column out after its 128 rows are in, and the results agree with the
    reference."""
    from lpu.compiler.rewrite_pair import live
    from tests.property.common import issue_cycles
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill").replace("causal(q @ k.T * (1.0 / sqrt(HD)))", "q @ k.T * (1.0 / sqrt(HD))")
    g = rewritten(elaborate_source(src, "a.lpu", {}), m)
    folds = [n for n in g.nodes() if n.op == "tfold"]
    assert len(folds) == 2 and live(g, folds[0].inputs[0]) is None
    prog, _, _, _ = run_checked(src, m, 3, "a.lpu")
    cyc = issue_cycles(prog)
    sxm = np.array([m.queues[int(x)][0].split(".")[0] for x in prog.queue])
    for s in ("sxm0", "sxm1"):
        tin = cyc[(prog.op == O.BY_NAME["TPIN"].code) & (sxm == s)]
        tout = cyc[(prog.op == O.BY_NAME["TPOUT"].code) & (sxm == s)]
        assert tout.min() > tin.max()


def test_a_streamed_fold_feeds_its_columns_straight_to_its_product(monkeypatch):
    """Each column a causal fold reads out (TPOUT) goes on the stream straight to the ABC of
    its product's row (movement.fold_feed: one chain, no trip through SRAM): no instruction
    of a tfold writes SRAM, each TPOUT is its product's, a few cycles before that row's ABC,
    and the program is faster than with the columns written to SRAM and read back."""
    from lpu.compiler import movement
    m = MachineConfig.load("tsp-v1")
    src = _program("attention_prefill")
    prog, _ = compile_source(src, "a.lpu", {}, m)
    e = _Expanded(prog)
    ops = np.array([prog.nodes[int(x)][0] for x in prog.node])[e.src]
    write, tpout, abc = (O.BY_NAME[x].code for x in ("WRITE", "TPOUT", "ABC"))
    assert not ((ops == "tfold") & (e.op == write)).any()
    assert set(ops[e.op == tpout]) == {"matmul"} and (e.op == tpout).sum() == 2 * 64
    assert e.cycle[e.op == abc].max() - e.cycle[e.op == tpout].max() <= 8
    monkeypatch.setattr(movement, "fed", lambda lw, n: False)
    through, _ = compile_source(src, "a.lpu", {}, m)
    assert prog.predicted_cycles < through.predicted_cycles
