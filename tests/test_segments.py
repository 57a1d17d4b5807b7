"""A loop's trips placed as the trip before, shifted, where that is provably the search's result
(compiler/segments.py): the program is the one the search alone gives, bit for bit, and each
condition of the proof turns the shortcut off when it fails."""
import numpy as np
import pytest

from lpu.compiler import schedule as S
from lpu.compiler import segments as SG
from lpu.compiler.chainspec import Chain, Ins, encode
from lpu.compiler.driver import CompileStats, compile_source
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig

from test_replay import LAYERS


def _compile(m, params, segments=True, monkeypatch=None):
    if not segments:
        monkeypatch.setattr(S.Scheduler, "begin_segment", lambda self, loop, trip, more=True: self.flush())
    stats = CompileStats()
    prog, _ = compile_source(LAYERS, "layers.lpu", params, m, stats)
    return prog, stats


def _same(a, b):
    return a.predicted_cycles == b.predicted_cycles and all(
        np.array_equal(getattr(a, f), getattr(b, f)) for f in ("queue", "op", "args", "line", "node"))


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_trips_placed_again_give_the_searched_program(machine, monkeypatch):
    m = MachineConfig.load(machine)
    fast, stats = _compile(m, {"L": 6})
    searched, plain = _compile(m, {"L": 6}, segments=False, monkeypatch=monkeypatch)
    assert plain.placed_again == 0
    assert _same(fast, searched)
    if machine == "tiny":        # its trips settle into one period: the later ones skip the search
        assert stats.placed_again > stats.chains // 3


def _batch(s, n, bank):
    return encode([Chain([Ins((0,), 0, O.NOP, [0] * O.NARGS, bank=bank)], []) for _ in range(n)], s.reg)


def test_tables_that_differ_in_one_cell_do_not_match(tiny):
    s = S.Scheduler(tiny)
    s.qbusy[10:20, 3] = 1
    s.state[1] = 20
    twin = SG.Segment(0, 0, None)
    twin.snap = SG.snapshot(s, 0, 0)
    twin.window = (10, 19, S.P.DIAG0 + 10, S.P.DIAG0 + 19)
    s.qbusy[100:110, 3] = 1                       # the same cells 90 cycles later
    assert SG.tables_match(s, twin, 90)
    s.qbusy[105, 4] = 1
    assert not SG.tables_match(s, twin, 90)
    s.qbusy[105, 4] = 0
    s.streams[0, S.P.DIAG0 + 101] = 1             # a stream in use on a diagonal of the window
    assert not SG.tables_match(s, twin, 90)
    twin.window = (5, 19, S.P.DIAG0 + 10, S.P.DIAG0 + 19)
    assert not SG.tables_match(s, twin, 95)        # a window the snapshot does not cover


def test_batches_that_differ_in_a_bank_are_not_alike(tiny):
    s = S.Scheduler(tiny)
    a, b, c = _batch(s, 3, 2), _batch(s, 3, 2), _batch(s, 3, 5)
    assert SG.same_chains(a, b) and not SG.same_chains(a, c) and not SG.same_chains(a, _batch(s, 2, 2))
