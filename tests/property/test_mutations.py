"""Mutations of valid programs are caught by the checker (with the specific violation kind)
AND by the emulator (a HazardError, not merely a different result).

Targets are chosen where the emulator must see the hazard: a *producer* (an instruction that
puts a value on a stream, which some consumer reads in exactly one cycle) moved one cycle, a
NOP before a producer removed, a READ's stream swapped: the consumer then finds no value on its
diagonal. A bank swap is caught when the slice's other bank is accessed in the same cycle. Moving
a consumer instead can make it read a neighbouring value that is really there (e.g. an ABC
reading the previous row), and moving an IW changes no stream at all: the emulator cannot tell
those from a valid program, only the checker can (stream-unread, mxm-order), as the tests at the
end show.
"""
from __future__ import annotations

import pytest
from hypothesis import assume, given, note, strategies as st

from lpu.compiler.driver import compile_source
from lpu.compiler.verify import verify
from lpu.emulator.run import HazardError, run
from lpu.isa import opcodes as O
from lpu.isa.machine import MachineConfig
from tests.property import mutate as M
from tests.property.common import build, issue_cycles, values
from tests.strategies import programs

TINY = MachineConfig.load("tiny")
STREAMY = ("binary", "scalar", "unary", "cast", "matmul", "reduce", "softmax", "transpose")


def kinds(prog, noting=False):
    found = verify(prog)
    if noting:
        note("violations:\n" + "\n".join(map(str, found[:10])))
    return {v.kind for v in found}


def assert_caught(bad, vals, kind):
    assert kind in kinds(bad, noting=True)
    with pytest.raises(HazardError):
        run(bad, vals)


@given(programs(max_ops=4, ops=STREAMY), st.sampled_from((-1, 1)), st.data())
def test_moved_producer_is_caught(dsl, delta, data):
    prog, graph = build(dsl, TINY)
    targets = M.producers(prog, delta)
    assume(targets)                   # (a schedule can leave no producer free to move)
    i = data.draw(st.sampled_from(targets), label="instruction")
    note(f"move #{i} {O.OPS[prog.op[i]].name} by {delta}")
    assert_caught(M.move(prog, i, delta), values(graph), "stream-empty")


@given(programs(max_ops=4, ops=STREAMY), st.data())
def test_removed_nop_is_caught(dsl, data):
    prog, graph = build(dsl, TINY)
    nops = M.nops_before_producers(prog)
    assume(nops)                      # (a schedule with no gap before any producer has none to remove)
    j = data.draw(st.sampled_from(nops), label="nop")
    note(f"remove #{j} NOP {prog.args[j, 0]} before {O.OPS[prog.op[j + 1]].name}")
    assert_caught(M.remove(prog, j), values(graph), "stream-empty")


@given(programs(max_ops=4, ops=STREAMY), st.data())
def test_swapped_stream_is_caught(dsl, data):
    prog, graph = build(dsl, TINY)
    reads = [int(i) for i, o in enumerate(prog.op) if o == O.READ]
    assume(reads)
    i = data.draw(st.sampled_from(reads), label="read")
    note(f"swap the stream of #{i} READ")
    assert_caught(M.swap_stream(prog, i), values(graph), "stream-empty")


MLP = """input x : f16[4, 20]
weight w1 : f16[20, 24]
weight b1 : f16[24]
weight w2 : f16[24, 20]
h = f16(relu(x @ w1 + b1))
output y = f16(h @ w2) + x
"""


@pytest.fixture(scope="module")
def mlp():
    return compile_source(MLP, "mlp.lpu", {}, TINY)


@given(st.data())
def test_swapped_bank_is_caught(mlp, data):
    prog, graph = mlp
    pairs = M.bank_pairs(prog, issue_cycles(prog))
    i = data.draw(st.sampled_from(pairs), label="instruction")
    note(f"swap the bank of #{i} {O.OPS[prog.op[i]].name}")
    assert_caught(M.swap_bank(prog, i), values(graph), "bank-conflict")


# ---- what only the checker can see --------------------------------------------------------------
def test_moved_abc_reads_a_neighbour_only_the_checker_sees_it(mlp):
    prog, graph = mlp
    cyc = issue_cycles(prog)
    # an ABC after a NOP whose plane is free a cycle earlier (the ABC before it, if any, has let
    # go of the plane: one cycle for a half ABC, f16_pair_cycles for a full f16 one)
    hold = [TINY.abc_cycles(True, prog.args[i, 3] != 0) for i in range(len(prog.op))]
    abc = [int(i) for i, o in enumerate(prog.op) if o == O.ABC and M.can_move(prog, int(i), -1)
           and prog.op[i - 1] == O.NOP and prog.op[i - 2] == O.ABC and cyc[i] - cyc[i - 2] > hold[i - 2]]
    assert abc, "no ABC after a NOP that leaves its plane free a cycle earlier"
    bad = M.move(prog, abc[0], -1)
    assert {"stream-unread"} <= kinds(bad)


def test_moved_iw_is_caught_by_the_checker(mlp):
    prog, _ = mlp
    cyc = issue_cycles(prog)
    lw = {(int(prog.queue[i]), int(cyc[i])) for i, o in enumerate(prog.op) if o == O.LW}
    m = prog.machine
    for i in (int(i) for i, o in enumerate(prog.op) if o == O.IW):
        plane = m.queues[prog.queue[i]][2]
        lwq = {m.mxm_queue(plane, 0, k) for k in range(m.lw_ports_per_plane)}
        if M.can_move(prog, i, -1) and any((q, int(cyc[i]) - 1) in lw for q in lwq):
            assert "mxm-order" in kinds(M.move(prog, i, -1))
            return
    pytest.skip("no IW directly after an LW of its plane")


def test_unwritten_output_and_wrong_cycle_count_are_caught(mlp):
    prog, _ = mlp
    y = prog.symbol("y")

    def writes(v):      # program rows writing y's vector v's first plane
        t = (int(y.slices[v, 0]), int(y.banks[v, 0]), int(y.addrs[v, 0]))
        return [i for i in range(len(prog.op)) if prog.op[i] == O.WRITE and
                ((prog.queue[i] - 1) // 2, prog.args[i, 0], prog.args[i, 1]) == t]
    # a vector whose write no REPEAT repeats (a NOP there would be a structure error instead)
    rows = next(r for v in range(y.slices.shape[0]) if (r := writes(v)) and
                all(i + 1 == len(prog.op) or prog.op[i + 1] != O.REPEAT for i in r))
    bad = M._copy(prog)
    for i in rows:
        bad.op[i], bad.args[i] = O.NOP, 0
        bad.args[i, 0] = 1
    assert "output" in kinds(bad)
    bad = M._copy(prog)
    bad.predicted_cycles += 1
    assert "cycles" in kinds(bad)


def test_overwritten_live_slot_is_caught(mlp):
    """A WRITE retargeted onto a slot of a weight that is still read: sram-live."""
    prog, _ = mlp
    w = prog.symbol("w2")
    cyc = issue_cycles(prog)
    first = min(int(i) for i, o in enumerate(prog.op) if o == O.WRITE)
    bad = M._copy(prog)
    s = int(w.slices[-1, 0])
    # the same slice's queue keeps the instruction on its own slice: retarget bank/address only
    same = [int(i) for i, o in enumerate(prog.op) if o == O.WRITE and (prog.queue[i] - 1) // 2 == s]
    i = min(same, key=lambda k: cyc[k]) if same else first
    bad.args[i, 0], bad.args[i, 1] = int(w.banks[-1, 0]), int(w.addrs[-1, 0])
    assert "sram-live" in kinds(bad)
