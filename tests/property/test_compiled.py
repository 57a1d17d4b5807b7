"""Properties of every compiled program: the checker accepts it, the emulator agrees with the
reference and with the predicted cycle count, compiling and running are deterministic, and the
binary and assembly forms round-trip."""
from __future__ import annotations

import numpy as np
from hypothesis import given, note, strategies as st

from lpu.compiler.verify import verify
from lpu.emulator.run import run
from lpu.isa.asm import assemble, disassemble
from lpu.isa.encoding import decode, encode
from lpu.isa.machine import MachineConfig
from lpu.api import check
from tests.property.common import build, values
from tests.strategies import machines, programs

TINY = MachineConfig.load("tiny")
any_machine = st.one_of(st.just(TINY), machines())


@given(programs(), any_machine)
def test_checker_accepts_compiled_programs(dsl, machine):
    prog, _ = build(dsl, machine)
    found = verify(prog)
    assert not found, "\n".join(map(str, found[:20]))


@given(programs(), any_machine)
def test_emulator_matches_reference_and_prediction(dsl, machine):
    prog, graph = build(dsl, machine)
    vals = values(graph)
    result = run(prog, vals)
    res = check(graph, prog, vals, result)
    note(f"check: {res}")
    assert res["ok"], res
    assert result.cycles == prog.predicted_cycles


@given(programs(max_ops=4), any_machine)
def test_compile_and_run_are_deterministic(dsl, machine):
    prog, graph = build(dsl, machine)
    again, _ = build(dsl, machine)
    assert encode(prog) == encode(again)
    vals = values(graph)
    r1, r2 = run(prog, vals, trace=True), run(prog, vals, trace=True)
    for a in ("cycle", "index", "repeat"):
        assert np.array_equal(getattr(r1.trace, a), getattr(r2.trace, a))
    assert r1.cycles == r2.cycles
    for k, v in r1.counters.items():
        assert np.array_equal(v, r2.counters[k]), k
    for name in r1.outputs:
        assert np.array_equal(r1.outputs[name], r2.outputs[name], equal_nan=True)


@given(programs(max_ops=4), any_machine)
def test_binary_and_assembly_round_trip(dsl, machine):
    prog, _ = build(dsl, machine)
    data = encode(prog)
    assert decode(data) == prog
    text = disassemble(prog)
    back = assemble(text, "generated.s")
    assert back == prog
    assert encode(back) == data


MASK_OPS = ("compare", "where", "where", "binary", "scalar", "cast", "reduce", "unary", "slice", "matmul")


@given(programs(ops=MASK_OPS), any_machine)
def test_masks_and_where_match_reference_and_verify(dsl, machine):
    """Comparisons and `where` among the ops they meet most (the one-chain and the SRAM forms of
    `where`, integer and float conditions, numbers as values)."""
    prog, graph = build(dsl, machine)
    found = verify(prog)
    assert not found, "\n".join(map(str, found[:20]))
    vals = values(graph)
    result = run(prog, vals)
    res = check(graph, prog, vals, result)
    assert res["ok"], res
    assert result.cycles == prog.predicted_cycles
