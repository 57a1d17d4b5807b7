"""Properties of every compiled program: the checker accepts it, the emulator agrees with the
reference and with the predicted cycle count, compiling and running are deterministic, and the
binary and assembly forms round-trip."""
from __future__ import annotations

import numpy as np
from hypothesis import given, note, strategies as st

from lpu.compiler.driver import compile_source
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


def test_a_machine_of_four_lanes_runs_a_short_f16_batch():
    """Found by Hypothesis: a machine narrower than mxm_direct's scratch (wbuf's rows, eight lanes'
    activations) multiplied an unconverted install from its bytes and failed inside the core; it
    converts the install (mxm_direct.DIRECT_MIN_LANES)."""
    machine = MachineConfig.from_dict({
        "name": "four lanes", "clock_mhz": 900, "superlanes": 1, "lanes_per_superlane": 4,
        "mem_slices_per_hemisphere": 4, "banks_per_slice": 2, "addresses_per_bank": 4096,
        "streams_per_direction": 8, "mxm_planes_per_hemisphere": 2, "lw_ports_per_plane": 1, "acc_rows": 64,
        "f16_pair_cycles": 1, "vxm_alus": 2, "sxm_queues_per_hemisphere": 1, "icu_skew": 0,
        "latency": {"mem_read": 1, "vxm": 1, "vxm_transcendental": 1, "sxm": 1, "mxm_abc": 1, "mxm_acc": 1},
        "c2c": {"links": 16, "link_gbytes_per_s": 14, "hop_cycles": 216}})
    prog, graph = compile_source("input x1 : f16[1, 1]\nweight w3 : f16[1, 1]\noutput y0 = x1 @ w3\n",
                                 "four_lanes.lpu", {}, machine)
    vals = values(graph)
    result = run(prog, vals)
    assert check(graph, prog, vals, result)["ok"] and result.cycles == prog.predicted_cycles

