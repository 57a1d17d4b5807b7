"""Assembly text: exact round trips through disassemble/assemble, and AsmError with name:line."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from lpu.isa.asm import assemble, disassemble
from lpu.isa.encoding import encode
from lpu.isa.errors import AsmError
from lpu.isa.opcodes import BY_NAME, OPS, make_ref
from lpu.isa.program import Program, empty_columns
from test_encoding import TINY, TSP, every_opcode_program, programs


@pytest.mark.parametrize("machine", [TINY, TSP], ids=lambda m: m.name)
def test_every_opcode_round_trips(machine):
    p = every_opcode_program(machine)
    text = disassemble(p)
    q = assemble(text)
    assert q == p
    assert encode(q) == encode(p)
    assert disassemble(q) == text
    for spec in OPS:
        assert f"\n    {spec.name}" in text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_round_trip(p):
    q = assemble(disassemble(p))
    assert q == p
    assert encode(q) == encode(p)


def _program(*rows, machine=TINY):
    """rows: (queue name, op name, [field values]) with line k+1 and node 0."""
    queue, op, args, line, node = empty_columns(len(rows))
    for i, (qn, name, fields) in enumerate(rows):
        queue[i], op[i], line[i], node[i] = machine.queue_index[qn], BY_NAME[name].code, i + 1, 0
        args[i, :len(fields)] = fields
    return Program(machine, queue, op, args, line, node, nodes=[("add", 1)], source_name="a.lpu",
                   source_lines=["y = x + 1.5", "z = y"])


def f32(x):
    return int(np.float32(x).view(np.int32))


def test_readable_text():
    p = _program(("mem3.0", "READ", [0, 17, make_ref(0, 0, 3)]),
                 ("vxm0", "ADD", [make_ref(1, 0, 0), 0, make_ref(1, 1, 2), 16, f32(1.5), 1]),
                 ("vxm1", "ADD", [make_ref(2, 0, 0), 0, make_ref(2, 1, 4), 16, -7, 1]))
    text = disassemble(p)
    assert "queue mem3.0:\n    READ bank=0 addr=17 out=E3" in text
    assert "ADD a=f16:E0 b=E0 out=f16:W2 nv=16 imm=1.5 bimm=1" in text      # f16 operands: a float
    assert "ADD a=i32:E0 b=E0 out=i32:W4 nv=16 imm=-7 bimm=1" in text       # i32 operands: an integer
    assert "; line 2 node=0 | z = y" in text
    assert assemble(text) == p


def test_f32_immediates_round_trip_exactly():
    vals = [0.1, -0.0, 1e-45, 3.4028235e38, float("inf"), float("-inf"), float("nan")]
    rows = [("vxm0", "MASK", [make_ref(3, 0, 0), make_ref(3, 0, 4), 16, 3, f32(v)]) for v in vals]
    rows.append(("vxm0", "MASK", [make_ref(3, 0, 0), make_ref(3, 0, 4), 16, 3, 0x7FC00001]))  # a NaN payload
    p = _program(*rows)
    q = assemble(disassemble(p))
    assert q == p
    assert "imm=0x7fc00001" in disassemble(p)


HEAD = ".machine tiny\n"


def test_hand_written_text():
    text = HEAD + """
; a comment
queue mem0.1:
    read bank=1 addr=0x10 out=f32:W0     ; line 0
queue vxm2:
    ADD a=f32:W0 b=W0 out=f32:E0 nv=16 imm=2 bimm=1
    MASK a=i8:E0 out=E1 nv=16 cut=3 imm=0x3f800000
"""
    p = assemble(text, name="h.s")
    assert p.machine == TINY and p.n_instructions == 3
    assert p.args[0, 1] == 16 and p.queue[0] == TINY.mem_queue(0, 1)
    assert p.args[1, 4] == f32(2.0)
    assert p.args[2, 4] == 0x3F800000 and p.line.tolist() == [0, 0, 0] and p.node.tolist() == [-1] * 3


@pytest.mark.parametrize("body, message", [
    ("queue vxm0:\n    ADDD a=E0 b=E0 out=E0 nv=1 imm=0 bimm=0", r"h.s:3: unknown opcode 'ADDD' \(did you mean 'ADD'\?\)"),
    ("queue mem0.0:\n    READ bank=0 adr=1 out=E0", r"h.s:3: READ has no field 'adr' \(did you mean 'addr'\?\)"),
    ("queue mem0.0:\n    READ bank=0 out=E0", "h.s:3: READ is missing field"),
    ("queue mem0.0:\n    READ bank=0 bank=0 addr=1 out=E0", "h.s:3: field 'bank' given twice"),
    ("queue mem0.0:\n    READ bank=0 addr=1 out=X9", "h.s:3: bad ref 'X9'"),
    ("queue mem0.0:\n    READ bank=0 addr=1 out=f17:E0", "h.s:3: bad ref 'f17:E0': unknown dtype 'f17'"),
    ("queue mem0.0:\n    READ bank=0 addr=1 out=f32:E6", r"h.s:3: READ field 'out' = .* is not a stream ref"),
    ("queue mem0.0:\n    READ bank=0 addr=x out=E0", "h.s:3: field 'addr': expected an integer"),
    ("queue mem99.0:\n    NOP n=1", r"h.s:2: unknown queue 'mem99.0' \(did you mean"),
    ("queue vxm0:\n    NOP n=1\n    READ bank=0 addr=1 out=E0", "h.s:4: READ runs on a mem queue, not on vxm0"),
    ("queue mxm0:\n    LW row=0 inp=E0 cvt=0", "h.s:3: LW does not run on queue mxm0"),
    ("    NOP n=1", "h.s:2: instruction outside a queue section"),
    ("queue vxm0:\n    MASK a=E0 out=E0 nv=1 cut=1 imm=1.5", "h.s:3: field 'imm': '1.5' is not an integer"),
    ("queue icu:\n    NOP n=99999999999", "h.s:3: NOP field 'n' = 99999999999 does not fit in 32 bits"),
    ("queue icu:\n    NOP n=1   ; line 1 node=3", "h.s:3: node 3 out of range"),
    ("queue icu:\n    IW dtype=f8 trans=0", "h.s:3: unknown dtype 'f8'"),
    (".table 0 1,2", "h.s:2: .table 0 has 2 entries, the machine has 16 lanes"),
    (".node 1 add 3", r"h.s:2: .node 1 out of order \(expected 0\)"),
    (".srcline 2 x", r"h.s:2: .srcline 2 out of order \(expected 1\)"),
    (".symbl x input f16 [1] slices=1x2:0,0 banks=1x2:0,0 addrs=1x2:0,0", r"unknown directive '.symbl' \(did you mean '.symbol'\?\)"),
    (".symbol x input f16 [1] slices=1x2:0 banks=1x2:0,0 addrs=1x2:0,0", "h.s:2: slices: 1 values for dimensions 1x2"),
    (".symbol x input f16 [1] slices=1x2:0,0 banks=1x2:0,0 addrs=1x2:0,0\n.const y <f4 - AAAAAA==",
     "h.s:3: .const y must follow .symbol y"),
])
def test_asm_errors(body, message):
    with pytest.raises(AsmError, match=message):
        assemble(HEAD + body, name="h.s")


def test_machine_errors():
    with pytest.raises(AsmError, match="no .machine directive"):
        assemble("queue icu:\n  NOP n=1\n", name="m.s")
    with pytest.raises(AsmError, match="m.s:1: unknown machine 'nope'"):
        assemble(".machine nope\n", name="m.s")
    with pytest.raises(AsmError, match="a second .machine directive"):
        assemble(".machine tiny\n.machine tsp-v1\n", name="m.s")
    cfg = disassemble(Program(TINY, *empty_columns(0))).split("\n")[2]
    with pytest.raises(AsmError, match="but .config describes machine 'tiny'"):
        assemble(".machine other\n" + cfg + "\nqueue icu:\n  NOP n=1\n", name="m.s")


def test_all_errors_are_reported_together():
    with pytest.raises(AsmError) as e:
        assemble(HEAD + "queue icu:\n    NOPE n=1\n    NOP m=1\n", name="e.s")
    assert str(e.value).splitlines() == [
        "e.s:3: unknown opcode 'NOPE' (did you mean 'NOP'?)",
        "e.s:4: NOP has no field 'm' (fields: n)"]
    assert len(e.value.info["errors"]) == 2
