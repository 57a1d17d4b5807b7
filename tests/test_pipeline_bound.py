"""compiler/pipeline_bound.py: no compiled pipeline beats its bound, the bound counts what a
decode step must stream, and `--parallel auto` skips compiling a pipeline only when that
pipeline would lose."""
from __future__ import annotations

import os

import pytest

from lpu.compiler import pipeline_bound as PB
from lpu.compiler import system as S
from lpu.compiler.frontend import elaborate_file
from lpu.compiler.system import compile_system
from lpu.isa.machine import MachineConfig
from lpu.isa.system import SystemConfig

ROOT = os.path.dirname(os.path.dirname(__file__))
LLAMA = os.path.join(ROOT, "programs", "systems", "llama2_7b_decode.lpu")
WIDE = {"L": 4, "D": 256, "H": 4, "F": 1024, "T": 5, "C": 16}      # streaming weights dominates


def tiny(chips):
    return SystemConfig.load("node", MachineConfig.load("tiny"), chips)


def bound(g, s):
    return PB.pipeline_bound(g, s, S.pipeline_cuts(g, s))


@pytest.mark.parametrize("path, params, chips", [
    (LLAMA, {"L": 2, "D": 64, "H": 4, "F": 128, "T": 5, "C": 16}, 2),
    (LLAMA, {"L": 4, "D": 128, "H": 4, "F": 256, "T": 5, "C": 32}, 4),
    (os.path.join(ROOT, "programs", "systems", "bert_large.lpu"), {"L": 2, "D": 64, "H": 2, "S": 16}, 2),
    (os.path.join(ROOT, "programs", "gpt2_small_decode.lpu"), {"L": 2, "D": 64, "H": 2, "C": 16, "T": 5}, 2),
    (os.path.join(ROOT, "programs", "mlp.lpu"), {"S": 8, "D": 32, "F": 64}, 2),
])
def test_no_compiled_pipeline_beats_its_bound(path, params, chips):
    g = elaborate_file(path, params)
    s = tiny(chips)
    b = bound(g, s)
    assert 0 < b <= compile_system(g, s, parallel="pp").predicted_cycles


def test_a_decode_step_streams_every_weight_and_the_cache_rows_it_reads():
    """On one chip with nothing held off SRAM, a decode step takes at least its i8 weights and
    the cache rows 0..T-1 of every layer (row T is the new key) over the streams."""
    params = {"L": 2, "D": 64, "H": 4, "F": 128, "T": 5, "C": 16}
    g = elaborate_file(LLAMA, params)
    s = tiny(1)
    m = s.machine
    weights = sum(n.nbytes for n in g.nodes() if n.op == "weight" and n.dtype == "i8")
    cache = 2 * params["L"] * params["T"] * params["D"] * 2
    held = PB.held_bytes
    try:
        PB.held_bytes = lambda m: 0
        b = PB.pipeline_bound(g, s, [])
    finally:
        PB.held_bytes = held
    assert b >= (weights + cache) / m.stream_bytes_per_cycle()
    assert PB.pipeline_bound(g, s, []) < b          # what the chip may hold is taken off


def test_volume_and_regions():
    assert PB._volume([((0, 4), (0, 4)), ((2, 6), (2, 6))]) == 16 + 16 - 4
    assert PB._minus(((0, 4), (0, 8)), ((3, 4), (0, 8))) == [((0, 3), (0, 8))]
    assert PB._minus(((0, 2),), ((2, 3),)) == [((0, 2),)]


def test_auto_skips_only_a_pipeline_that_loses(monkeypatch):
    g = elaborate_file(LLAMA, WIDE)
    s = tiny(4)
    tp = compile_system(g, s, parallel="tp")
    assert bound(g, s) > tp.predicted_cycles
    real = S.compile_stages
    monkeypatch.setattr(S, "compile_stages", lambda *a: pytest.fail("the pipeline was compiled"))
    auto = compile_system(g, s, parallel="auto")
    assert auto.parallel == "tp" and auto.predicted_cycles == tp.predicted_cycles
    monkeypatch.setattr(S, "compile_stages", real)
    # what compiling both would have chosen: the pipeline is slower, as its bound says
    assert compile_system(g, s, parallel="pp").predicted_cycles >= bound(g, s) > tp.predicted_cycles


def test_auto_compiles_the_pipeline_when_it_could_win():
    g = elaborate_file(LLAMA, {"L": 2, "D": 64, "H": 4, "F": 128, "T": 5, "C": 16})
    s = tiny(2)
    tp, pp = (compile_system(g, s, parallel=p) for p in ("tp", "pp"))
    assert bound(g, s) <= tp.predicted_cycles
    auto = compile_system(g, s, parallel="auto")
    assert auto.parallel == "pp" and auto.predicted_cycles == pp.predicted_cycles < tp.predicted_cycles
