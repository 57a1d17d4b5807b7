"""Tensor parallel over the chips of a node (compiler/tensor_split.py, compiler/system_tp.py):
the split, the all-reduces on the links, and the system emulator's agreement with the
reference and with the compiler's predictions, on the tiny machine."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from lpu import api
from lpu.cli import main
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.reference import random_values
from lpu.compiler.system import compile_system
from lpu.compiler.tensor_split import TpError, split_graph
from lpu.emulator.run import HazardError
from lpu.emulator.system import run_system
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import MachineConfig
from lpu.isa.system import SystemConfig

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
LLAMA = os.path.join(ROOT, "programs", "systems", "llama2_7b_decode.lpu")
SMALL_LLAMA = {"L": 2, "D": 64, "H": 4, "F": 128, "T": 5, "C": 16}


def graph_of(path, params):
    with open(path) as f:
        return elaborate_source(f.read(), path, params)


def tiny_system(chips):
    return SystemConfig.load("node", MachineConfig.load("tiny"), chips)


@pytest.fixture(scope="module")
def llama4():
    g = graph_of(LLAMA, SMALL_LLAMA)
    return g, compile_system(g, tiny_system(4), parallel="tp")


def test_the_split_is_megatron_style():
    tp = split_graph(graph_of(LLAMA, SMALL_LLAMA), 4)
    # QKV, gate and up by columns (their last axis), out and down by rows; the KV cache by heads
    assert {k: tp.split[k] for k in ("wq", "wk", "wv", "wg", "wu", "wo", "wd", "kc", "vc", "sq")} == \
        {"wq": 2, "wk": 2, "wv": 2, "wg": 2, "wu": 2, "wo": 1, "wd": 1, "kc": 2, "vc": 2, "sq": 1}
    assert "g1" not in tp.split and "so" not in tp.split        # norms and row-split scales stay whole
    assert len(tp.allreduce) == 2 * SMALL_LLAMA["L"]            # one after wo, one after wd, per layer
    wq = tp.graph.node(tp.graph.decls["wq"])
    assert wq.shape == (2, 64, 16)                              # a quarter of the columns
    assert tp.part("wq", (2, 64, 64), 3) == ((0, 2), (0, 64), (48, 64))


def test_four_ranks_match_the_reference_and_their_predictions(llama4):
    g, sp = llama4
    assert sp.parallel == "tp" and len(sp.chips) == 4
    # rank-symmetric: every chip runs the same instructions (its weights differ)
    assert all(np.array_equal(p.op, sp.chips[0].op) and np.array_equal(p.args, sp.chips[0].args) for p in sp.chips)
    assert np.count_nonzero(sp.chips[0].op == O.SEND) == np.count_nonzero(sp.chips[0].op == O.RECV) > 0
    vals = random_values(g, 3)
    r = run_system(sp, vals)
    assert [c.cycles for c in r.chips] == [p.predicted_cycles for p in sp.chips]
    assert api.check(g, sp.chips[0], vals, r)["ok"]
    sent = [c.counters["link_vectors_sent"] for c in r.chips]
    assert sent == [c.counters["link_vectors_received"] for c in r.chips] and sent[0] > 0


def test_workers_give_the_same_result(llama4):
    g, sp = llama4
    vals = random_values(g, 4)
    one, two = run_system(sp, vals), run_system(sp, vals, workers=2)
    assert one.cycles == two.cycles
    assert all(np.array_equal(one.outputs[k], two.outputs[k]) for k in one.outputs)
    assert all(np.array_equal(one.states[k], two.states[k]) for k in one.states)


@pytest.mark.parametrize("misplaced", [False, True])
def test_workers_started_before_the_values(llama4, monkeypatch, misplaced):
    """lpu run --workers: the workers start (and prepare) while the values are made in the shared
    arrays, the integers by the workers, a part each; a value made elsewhere (given) goes by pipe.
    The same values and result as one process; also when a worker's part ends elsewhere than
    planned (a rejected draw: every value is then made again in this process)."""
    from lpu.cmd_system import declared
    from lpu.compiler import draw_core
    from lpu.emulator.system import start
    g, sp = llama4
    asked = []
    if misplaced:                     # the first part of each run made wrong, and said so (forked: the workers see it)
        def make(plan, out, k0, k1, real=draw_core.Plan.make):
            real(plan, out, k0, k1)
            out[k0:k1] = 99 if k0 == 0 else out[k0:k1]
            return k0 > 0
        monkeypatch.setattr(draw_core.Plan, "make", make)
    started = start(sp, declared(sp).symbols, 2)
    assert started is not None and len(started.groups) == 2
    monkeypatch.setattr(started, "draw", lambda name, plan, draw=started.draw: asked.append(name) or draw(name, plan))
    vals = api.inputs_for(g, declared(sp), 5, into=started.arrays, defer=started)
    assert asked == ["wq", "wk", "wv", "wo", "wg", "wu", "wd"]
    assert vals["wq"] is started.arrays["wq"] and vals["kc"] is started.arrays["kc"]
    ref = random_values(g, 5)
    assert all(np.array_equal(vals[k], ref[k]) for k in ref)
    vals["x"] = vals["x"] + np.float16(0.5)              # not in the shared arrays: sent
    two = run_system(sp, vals, started=started)
    one = run_system(sp, {k: np.array(v) for k, v in vals.items()})
    assert [c.cycles for c in one.chips] == [c.cycles for c in two.chips] == [p.predicted_cycles for p in sp.chips]
    assert all(np.array_equal(one.outputs[k], two.outputs[k]) for k in one.outputs)
    assert all(np.array_equal(one.states[k], two.states[k]) for k in one.states)
    assert one.windows == two.windows
    assert api.check(g, sp.chips[0], vals, two)["ok"]


def test_a_receive_moved_before_its_arrival_is_a_hazard(llama4):
    g, sp = llama4
    p = sp.chips[1]
    first = int(np.flatnonzero(p.op == O.RECV)[0])
    nop = first - 1                              # the wait before the first receive of a link
    assert p.op[nop] == O.NOP and p.queue[nop] == p.queue[first] and p.args[nop, 0] > 5
    args = p.args.copy()
    args[nop, 0] -= 5                            # that link's receives 5 cycles early
    bad = dataclasses.replace(sp, chips=[*sp.chips[:1], dataclasses.replace(p, args=args), *sp.chips[2:]])
    with pytest.raises(HazardError, match=r"chip 1 c2c\d+ .*RECV.*receive before arrival") as e:
        run_system(bad, random_values(g, 0))
    assert e.value.kind == "link-early"


def test_mlp_on_two_ranks_and_auto_picks_the_faster():
    g = graph_of(os.path.join(ROOT, "programs", "mlp.lpu"), {"S": 8, "D": 32, "F": 64})
    tp = compile_system(g, tiny_system(2), parallel="tp")
    pp = compile_system(g, tiny_system(2), parallel="pp")
    auto = compile_system(g, tiny_system(2), parallel="auto")
    assert auto.predicted_cycles == min(tp.predicted_cycles, pp.predicted_cycles)
    vals = random_values(g, 1)
    r = run_system(tp, vals)
    assert r.cycles == tp.predicted_cycles and api.check(g, tp.chips[0], vals, r)["ok"]


def test_what_does_not_split_says_so_and_auto_falls_back():
    g = graph_of(os.path.join(ROOT, "programs", "mlp.lpu"), {"S": 8, "D": 32, "F": 30})
    with pytest.raises(TpError, match="does not split 4 ways"):
        split_graph(g, 4)
    one = elaborate_source("input x : f16[4, 16]\nweight w : f16[16, 32]\noutput y = f16(x @ w)\n", "c.lpu", {})
    with pytest.raises(TpError, match="c.lpu:3: output: an output that is not whole"):
        split_graph(one, 2)
    with pytest.raises(LpuError, match="tensor parallel"):
        compile_system(one, tiny_system(2), parallel="tp")
    assert compile_system(one, tiny_system(2), parallel="auto").parallel == "pp"
    with pytest.raises(LpuError, match="a multiple of 8 chips"):
        compile_system(graph_of(LLAMA, SMALL_LLAMA), tiny_system(12), parallel="tp")


def test_cli_bundle_round_trip(tmp_path, capsys):
    out = str(tmp_path / "l2.lpubin")
    args = [LLAMA, *[x for k, v in SMALL_LLAMA.items() for x in ("-p", f"{k}={v}")], "--machine", "tiny"]
    assert main(["compile", *args, "--chips", "2", "--parallel", "tp", "-o", out]) == 0
    assert "2 chips (tp)" in capsys.readouterr().out
    assert main(["run", out, "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out
    assert main(["run", out, "--check", "--workers", "2"]) == 0     # workers started before the inputs
    assert "check: ok" in capsys.readouterr().out
    assert main(["verify", out]) == 0


def test_two_nodes_of_eight_ranks_form_a_pipeline():
    params = dict(SMALL_LLAMA, H=8)
    g = graph_of(LLAMA, params)
    sp = compile_system(g, tiny_system(16), parallel="tp")
    s = sp.system
    assert len(sp.chips) == 16 and sp.outputs == {"y": 8}
    assert s.link_between(3, 11) == (s.rank_out, s.rank_in) and s.peer(11, s.rank_in) == 3
    assert s.route(3, 11) == list(range(3, 12))          # a pipeline keeps its path (relays)
    # the second node's ranks receive the residual from the same rank of the first, over their global link
    first, second = sp.chips[0], sp.chips[8]
    assert not np.any(first.queue[first.op == O.RECV] == first.machine.c2c_queue(s.rank_in))
    assert np.any(second.queue[second.op == O.RECV] == second.machine.c2c_queue(s.rank_in))
    assert sp.rows[9]["wq"] == ((1, 2), (0, 64), (8, 16))       # node 1 holds layer 1; rank 1 its columns
    vals = random_values(g, 5)
    r = run_system(sp, vals)
    assert r.cycles == sp.predicted_cycles and api.check(g, sp.chips[8], vals, r)["ok"]
    assert sp.chips[8].predicted_cycles > sp.chips[0].predicted_cycles + s.global_hop_cycles


@pytest.mark.parametrize("rejected", [False, True])
def test_workers_draw_their_chips_parts(llama4, monkeypatch, rejected):
    """lpu run --workers without --check (`start(..., own=True)`): the integer weights split
    across the chips are drawn by each worker straight into its chips' SRAM images, never made
    here (None); a given value of one is loaded instead; the same result as one process, also
    when a draw is rejected (every value is then made here and sent)."""
    from lpu.cmd_system import declared
    from lpu.compiler import draw_core
    from lpu.emulator.system import start
    g, sp = llama4
    if rejected:                      # forked: the workers see it
        monkeypatch.setattr(draw_core.Plan, "make_rows", lambda p, starts, out, real=draw_core.draw_rows:
                            real(p, starts, out) and p.n != 2 * 64 * 128)     # wg, wu, wd
    started = start(sp, declared(sp).symbols, 2, own=True)
    assert sorted(started.own) == ["wd", "wg", "wk", "wo", "wq", "wu", "wv"]
    assert started.own["wo"][1] == (slice(0, 2), slice(16, 32), slice(0, 64))
    given = {"wq": np.ones((2, 64, 64), np.int8)}
    vals = api.inputs_for(g, declared(sp), 6, given, into=started.arrays, defer=started)
    ref = random_values(g, 6)
    ref["wq"] = given["wq"]
    made = [k for k in ref if k != "wq" and vals[k] is None]
    assert made == ([] if rejected else ["wk", "wv", "wo", "wg", "wu", "wd"])
    two = run_system(sp, vals, started=started)
    one = run_system(sp, ref)
    assert [c.cycles for c in one.chips] == [c.cycles for c in two.chips] == [p.predicted_cycles for p in sp.chips]
    assert all(np.array_equal(one.outputs[k], two.outputs[k]) for k in one.outputs)
    assert all(np.array_equal(one.states[k], two.states[k]) for k in one.states)


def test_compare_names_how_the_chips_share_the_program(llama4):
    """`lpu compare --chips`: tensor parallel is not called a pipeline (it was, for every system)."""
    from types import SimpleNamespace
    from lpu.cmd_system import _layout
    _, sp = llama4
    assert _layout(sp, 4)["bound"] == "4 chips in tensor parallel"
    nodes = SimpleNamespace(parallel="tp", system=SimpleNamespace(chips_per_node=8))
    assert _layout(nodes, 40)["bound"] == "40 chips: a pipeline of 5 nodes of 8 in tensor parallel"
    assert _layout(SimpleNamespace(parallel="pp"), 3)["bound"] == "a pipeline of 3 chips"
