"""The .lpubin format: exact round trips, determinism, and a BinaryError for every kind of damage."""
import os
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lpu.isa.encoding import FORMAT_VERSION, decode, encode, load_binary, save
from lpu.isa.errors import BinaryError
from lpu.isa.machine import UNIT_ICU, MachineConfig
from lpu.isa.opcodes import BY_NAME, DTYPE_WIDTH, DTYPES, NARGS, OPS, make_ref
from lpu.isa.program import Program, Symbol, empty_columns

TINY = MachineConfig.load("tiny")
TSP = MachineConfig.load("tsp-v1")


def valid_queues(machine, spec):
    """Queues on which `spec` may be issued (from OpSpec.unit/role and machine.queues)."""
    return [i for i, q in enumerate(machine.queues)
            if spec.unit == UNIT_ICU or (q[1] == spec.unit and spec.role in (-1, q[3]))]


def field_value(machine, kind, k):
    """A valid value of a field kind, varied by k."""
    if kind == "int":
        return (k * 37) % 1000 - 100
    if kind == "ref":
        dt = k % len(DTYPES)
        return make_ref(dt, k % 2, k % (machine.streams_per_direction - DTYPE_WIDTH[dt] + 1))
    if kind == "dtype":
        return k % len(DTYPES)
    return int(np.float32(k * 0.37 - 1).view(np.int32))


def every_opcode_program(machine=TINY, per_op=2):
    """Each opcode `per_op` times on each kind of queue it may run on, with lines, nodes, symbols."""
    rows = []
    for spec in OPS:
        qs = valid_queues(machine, spec)
        for k in range(per_op):
            args = [field_value(machine, kind, k + j) for j, (_, kind) in enumerate(spec.fields)]
            rows.append((qs[(k * 7) % len(qs)], spec.code, args + [0] * (NARGS - len(args)), k, k % 3 - 1))
    rows.sort(key=lambda r: r[0])
    queue, op, args, line, node = empty_columns(len(rows))
    for i, (q, o, a, ln, nd) in enumerate(rows):
        queue[i], op[i], args[i], line[i], node[i] = q, o, a, ln, nd
    lay = np.arange(12, dtype=np.int32).reshape(6, 2)
    symbols = [Symbol("x", "input", "f16", (3, 2 * machine.lanes), lay % 4, lay % 2, lay),
               Symbol("s", "const", "f32", (), lay[:1].repeat(2, 1), lay[:1].repeat(2, 1), lay[:1].repeat(2, 1),
                      data=np.array(2.5, np.float32)),
               Symbol("w", "const", "i8", (2, 3), lay[:2, :1], lay[:2, :1] % 2, lay[:2, :1] + 5,
                      data=np.arange(-3, 3, dtype=np.int8).reshape(2, 3))]
    tables = np.stack([np.arange(machine.lanes)[::-1], np.full(machine.lanes, -1)]).astype(np.int32)
    return Program(machine, queue, op, args, line, node, symbols=symbols, tables=tables,
                   nodes=[("matmul", 3), ("relu", 4)], predicted_cycles=1234, source_name="t.lpu",
                   source_lines=["x = input f16[3, 32]", "", "  y = x @ w   # é"])


def fix_header(data: bytes) -> bytes:
    """Rewrite the length and the checksum, so that only the damage inside the sections shows."""
    body = bytearray(data[:-4])
    body[10:14] = struct.pack("<I", len(body) + 4 - 14)
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


# ---- random programs (shared with test_asm) ----------------------------------------------------
_names = st.text(min_size=0, max_size=8)
_i32 = st.integers(-2**31, 2**31 - 1)


@st.composite
def programs(draw, machine=None):
    m = machine or draw(st.sampled_from([TINY, TINY, TSP]))
    nodes = draw(st.lists(st.tuples(_names, st.integers(-5, 10**6)), max_size=4))
    n = draw(st.integers(0, 30))
    queue, op, args, line, node = empty_columns(n)
    rows = []
    for _ in range(n):
        spec = draw(st.sampled_from(OPS))
        q = draw(st.sampled_from(valid_queues(m, spec)))
        a = [0] * NARGS
        for j, (_, kind) in enumerate(spec.fields):
            if kind == "ref":
                dt = draw(st.integers(0, len(DTYPES) - 1))
                a[j] = make_ref(dt, draw(st.integers(0, 1)),
                                draw(st.integers(0, m.streams_per_direction - DTYPE_WIDTH[dt])))
            elif kind == "dtype":
                a[j] = draw(st.integers(0, len(DTYPES) - 1))
            elif kind == "f32":
                a[j] = draw(st.one_of(_i32, st.floats(width=32).map(lambda f: int(np.float32(f).view(np.int32)))))
            else:
                a[j] = draw(st.one_of(st.integers(-4, 300), _i32))
        rows.append((q, spec.code, a, draw(st.integers(0, 2**31 - 1)), draw(st.integers(-1, len(nodes) - 1))))
    rows.sort(key=lambda r: r[0])
    for i, (q, o, a, ln, nd) in enumerate(rows):
        queue[i], op[i], args[i], line[i], node[i] = q, o, a, ln, nd
    symbols = []
    for _ in range(draw(st.integers(0, 3))):
        dt = draw(st.sampled_from(DTYPES))
        nvec = draw(st.integers(0, 5))
        lay = [np.array(draw(st.lists(_i32 if k == 2 else st.integers(0, 9), min_size=nvec * DTYPE_WIDTH[DTYPES.index(dt)],
                                      max_size=nvec * DTYPE_WIDTH[DTYPES.index(dt)])), np.int32)
               .reshape(nvec, DTYPE_WIDTH[DTYPES.index(dt)]) for k in range(3)]
        data = None
        if draw(st.booleans()):
            shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
            ndt = draw(st.sampled_from(["<f2", "<f4", "<f8", "<i4", "|i1", "|u1", "<i8", "|b1", "<c8"]))
            data = (np.arange(int(np.prod(shape)), dtype=np.int64) * draw(st.integers(-3, 3))).astype(ndt).reshape(shape)
        symbols.append(Symbol(draw(_names), draw(_names), dt, tuple(draw(st.lists(st.integers(0, 70), max_size=3))),
                              *lay, data=data))
    ntab = draw(st.integers(0, 2))
    tables = np.array(draw(st.lists(st.integers(-1, m.lanes - 1), min_size=ntab * m.lanes, max_size=ntab * m.lanes)),
                      np.int32).reshape(ntab, m.lanes)
    return Program(m, queue, op, args, line, node, symbols=symbols, tables=tables, nodes=nodes,
                   predicted_cycles=draw(st.integers(0, 2**40)), source_name=draw(_names),
                   source_lines=draw(st.lists(st.text(max_size=20), max_size=4)))


# ---- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("machine", [TINY, TSP], ids=lambda m: m.name)
def test_every_opcode_round_trips(machine):
    p = every_opcode_program(machine)
    data = encode(p)
    q = decode(data, validate=False)    # a format test: its symbols are not a runnable layout
    assert q == p and q.machine_hash() == p.machine_hash()
    assert set(q.op.tolist()) == {s.code for s in OPS}
    assert encode(q) == data == encode(p)
    assert decode(data, machine=machine, validate=False).machine is machine


def test_empty_program_round_trips():
    p = Program(TINY, *empty_columns(0))
    assert decode(encode(p)) == p


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_round_trip(p):
    data = encode(p)
    q = decode(data, validate=False)
    assert q == p
    assert encode(q) == data


def test_instructions_are_compact():
    p = every_opcode_program(TINY, per_op=50)
    # queue + opcode + fields + line + node: READ is 2 + 1 + 4 + 4 + 2 + 8 = 21 bytes
    assert len(encode(p)) < 30 * p.n_instructions + 3000


def test_save_and_load(tmp_path):
    p = every_opcode_program()
    path = str(tmp_path / "p.lpubin")
    save(p, path)
    save(p, path)            # overwriting is fine, and leaves no temporary file behind
    assert os.listdir(tmp_path) == ["p.lpubin"]
    assert load_binary(path, validate=False) == p   # a format test
    assert load_binary(path, machine=TINY, validate=False) == p
    with pytest.raises(BinaryError, match="p.lpubin: built for machine 'tiny'"):
        load_binary(path, machine=TSP)
    with pytest.raises(BinaryError, match="cannot read"):
        load_binary(str(tmp_path / "missing.lpubin"))


# ---- every kind of damage ----------------------------------------------------------------------
GOOD = encode(every_opcode_program())


def test_wrong_magic():
    for data in (b"", b"hello, world, this is text", b"\x7fELF" + GOOD[4:]):
        with pytest.raises(BinaryError, match="not an .lpubin file"):
            decode(data)


def test_other_version():
    data = GOOD[:8] + struct.pack("<H", FORMAT_VERSION + 1) + GOOD[10:]
    with pytest.raises(BinaryError, match=f"version {FORMAT_VERSION + 1}.*version {FORMAT_VERSION}"):
        decode(data)


def test_bad_checksum():
    data = bytearray(GOOD)
    data[len(data) // 2] ^= 0x10
    with pytest.raises(BinaryError, match="checksum"):
        decode(bytes(data))


@pytest.mark.parametrize("cut", [1, 7, 13, 20, 600, len(GOOD) // 2, len(GOOD) - 5, len(GOOD) - 1])
def test_truncated(cut):
    with pytest.raises(BinaryError, match=rf"truncated .lpubin: .*{cut}"):
        decode(GOOD[:cut])


def test_truncation_names_the_section():
    inst = GOOD.index(b"INST")
    with pytest.raises(BinaryError, match="cut off in section INST"):
        decode(GOOD[:inst + 40])
    with pytest.raises(BinaryError, match="cut off in the checksum"):
        decode(GOOD[:-2])


def test_trailing_garbage():
    with pytest.raises(BinaryError, match="unexpected bytes after the checksum"):
        decode(GOOD + b"\0")


def _single(name, fields):
    spec = BY_NAME[name]
    queue, op, args, line, node = empty_columns(1)
    queue[0], op[0] = valid_queues(TINY, spec)[0], spec.code
    args[0, :len(fields)] = fields
    return Program(TINY, queue, op, args, line, node)


def _encode_unchecked(p, monkeypatch):
    """The bytes of `p` without the encoder's own field check: a binary some other writer damaged."""
    import lpu.isa.encoding as E
    with monkeypatch.context() as m:
        m.setattr(E, "check_instructions", lambda *a, **k: None)
        return encode(p)


def test_unknown_opcode(monkeypatch):
    p = _single("NOP", [3])
    p.op[0] = 200
    with pytest.raises(BinaryError, match="instruction 0: unknown opcode 200"):
        decode(_encode_unchecked(p, monkeypatch))


def test_field_out_of_range(monkeypatch):
    p = _single("READ", [0, 17, make_ref(1, 0, 7)])     # an f16 on streams 7..8 of 8
    with pytest.raises(BinaryError, match="field 'out' = .* is not a stream ref"):
        decode(_encode_unchecked(p, monkeypatch))
    p = _single("IW", [9, 0])
    with pytest.raises(BinaryError, match="field 'dtype' = 9 is not a dtype code"):
        decode(_encode_unchecked(p, monkeypatch))


def test_instruction_on_the_wrong_queue(monkeypatch):
    p = _single("READ", [0, 17, 3])
    p.queue[0] = TINY.vxm_queue(0)
    with pytest.raises(BinaryError, match="READ runs on a mem queue, not on vxm0"):
        decode(_encode_unchecked(p, monkeypatch))


def test_damaged_column():
    data = bytearray(encode(every_opcode_program()))
    at = data.index(b"INST") + 8 + 4 + 6          # the first byte of the queue column's zlib data
    data[at + 3] ^= 0xFF
    with pytest.raises(BinaryError, match="section INST: column 'queue'"):
        decode(fix_header(bytes(data)))


def test_damaged_symbols():
    data = bytearray(encode(every_opcode_program()))
    at = data.index(b"SYMS") + 8 + 4             # the zlib data of the layouts
    data[at + 4] ^= 0xFF
    with pytest.raises(BinaryError, match="section SYMS: the compressed data"):
        decode(fix_header(bytes(data)))


def test_instructions_compress():
    """Runs of queues, opcodes and stepping addresses take a few bits each, not a record each."""
    n = 20000
    queue, op, args, line, node = empty_columns(n)
    queue[:], op[:] = valid_queues(TINY, BY_NAME["READ"])[0], BY_NAME["READ"].code
    args[:, 1], args[:, 2] = np.arange(n) % 4096, 3
    line[:] = 7
    data = encode(Program(TINY, queue, op, args, line, node))
    assert len(data) < n       # under a byte an instruction (a record was 19)
    assert np.array_equal(decode(data).args, args)


def test_machine_mismatch():
    with pytest.raises(BinaryError, match=r"built for machine 'tiny' \(hash [0-9a-f]+\), not 'tsp-v1' \(hash"):
        decode(GOOD, machine=TSP)
    other = MachineConfig.from_dict({**TINY.to_dict(), "clock_mhz": 1000})
    with pytest.raises(BinaryError, match="same name, different config"):
        decode(GOOD, machine=other)


def test_encode_rejects_invalid_programs():
    p = _single("READ", [0, 17, 3])
    p.queue[0] = TINY.vxm_queue(0)
    with pytest.raises(BinaryError, match="cannot encode: instruction 0: READ runs on a mem queue"):
        encode(p)
    p = _single("NOP", [1])
    p.args[0, 3] = 5
    with pytest.raises(BinaryError, match="arg 3 is 5"):
        encode(p)
    p = _single("NOP", [1])
    p.node[0] = 0
    with pytest.raises(BinaryError, match="node 0 out of range"):
        encode(p)


@st.composite
def damaged(draw):
    data = bytearray(GOOD)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        if how == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "set":
            data[at] = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
        if not data:
            break
    return bytes(data), draw(st.booleans())


@settings(max_examples=400, deadline=None)
@given(damaged())
def test_damage_gives_a_program_or_a_binary_error(case):
    data, fix = case
    if fix and len(data) > 18:
        data = fix_header(data)      # get past the checksum, into the section parsers
    try:
        p = decode(data)
    except BinaryError as e:
        assert str(e)
    else:
        assert isinstance(p, Program)
        assert decode(encode(p)) == p


def test_binary_of_another_instruction_set_is_refused_by_name():
    from lpu.isa.opcodes import TABLE_HASH
    data = encode(every_opcode_program())
    assert TABLE_HASH.encode() in data
    other = fix_header(data.replace(TABLE_HASH.encode(), b"0" * len(TABLE_HASH)))
    with pytest.raises(BinaryError, match="another version of lpu"):
        decode(other)


@pytest.mark.parametrize("damage", ["opcode", "queue", "unit", "unused arg", "ref", "dtype", "line", "node", "none"])
def test_jitted_check_finds_what_numpy_finds(damage):
    """Large programs are checked by one jitted pass (checks_core.first_invalid); it must
    name the same instruction, with the same message, as the numpy rules."""
    from lpu.isa import checks as E
    p = every_opcode_program(TINY, per_op=3)
    reps = -(-E.JIT_MIN // len(p.op)) + 1
    q, o, a = np.tile(p.queue, reps), np.tile(p.op, reps), np.tile(p.args, (reps, 1))
    line, node = np.tile(p.line, reps), np.tile(p.node, reps)
    rng = np.random.default_rng(len(damage))
    i = int(rng.integers(len(o) // 2, len(o)))
    read = np.flatnonzero(o == BY_NAME["READ"].code)
    iw = np.flatnonzero(o == BY_NAME["IW"].code)
    if damage == "opcode":
        o[i] = len(OPS) + 3
    elif damage == "queue":
        q[i] = len(TINY.queues)
    elif damage == "unit":
        i = int(read[-1]); q[i] = TINY.vxm_queue(0)
    elif damage == "unused arg":
        i = int(read[-2]); a[i, NARGS - 1] = 5
    elif damage == "ref":
        i = int(read[-3]); a[i, 2] = make_ref(1, 0, TINY.streams_per_direction - 1)
    elif damage == "dtype":
        i = int(iw[-1]); a[i, 0] = len(DTYPES)
    elif damage == "line":
        line[i] = -4
    elif damage == "node":
        node[i] = 2
    got = E.check_instructions(TINY, q, o, a, line, node, 2)
    want = E._first_numpy(TINY, q, o, a, line, node, 2)
    assert len(o) >= E.JIT_MIN and got == want
    assert (got is None) == (damage == "none")
