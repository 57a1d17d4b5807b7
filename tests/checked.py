"""One compiled program taken through every check the tests share: the schedule checker
finds nothing, the emulator's cycles equal the prediction, and the outputs match the reference."""
from __future__ import annotations

from lpu.api import check
from lpu.compiler.driver import compile_source
from lpu.compiler.reference import random_values
from lpu.compiler.verify import verify
from lpu.emulator.run import run


def run_checked(src: str, machine, seed: int = 3, name: str = "t.lpu", compare: bool = True):
    """(prog, graph, values, result) of `src` compiled for `machine` (a MachineConfig) and run
    on random values from `seed`; with `compare`, the outputs are checked against the reference."""
    prog, g = compile_source(src, name, {}, machine)
    assert not verify(prog)
    vals = random_values(g, seed)
    res = run(prog, vals)
    assert res.cycles == prog.predicted_cycles
    if compare:
        got = check(g, prog, vals, res)
        assert got["ok"], got
    return prog, g, vals, res
