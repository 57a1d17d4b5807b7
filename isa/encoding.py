"""The `.lpubin` binary format: `encode`, `decode`, `save`, `load_binary`.

Layout (all integers little-endian):

    magic       8 bytes  b"\\x89LPUBIN\\n"
    version     u16      FORMAT_VERSION
    length      u32      bytes after this field, up to and including the checksum
    sections    each: tag (4 ASCII bytes), body length u32, body; in this order:
        HEAD    machine name (str), machine config (str, JSON), config hash (str), opcode table
                hash (str: isa.opcodes.TABLE_HASH)
        INST    count u32, then per instruction: queue u16, opcode u8, each field of the opcode
                (kinds from isa/opcodes.py: int -> i32, ref -> u16, dtype -> u8, f32 -> 4 bytes of
                bits), line u32, node i32 (-1: none)
        SYMS    count, then per symbol: name, kind, dtype (str), shape (varints), slices, banks,
                addrs (int arrays)
        CNST    count, then per constant: symbol index, numpy dtype (str), shape, raw bytes
        TABL    the permutation tables (int array)
        NODE    count, then per IR node: op name (str), line
        META    predicted cycles, source name, count, source lines, source hash (str: sha256
                hex of the lines joined by newlines), count, then per param (sorted by name):
                name (str), value (signed varint): the params the program was compiled with
    checksum    u32      CRC-32 of everything before it

    str         varint byte length, UTF-8 bytes
    int array   ndim, dims (varints), width w (1, 2 or 4), then the deltas x[i] - x[i-1] (x[-1] = 0)
                as signed w-byte ints: layouts and tables are mostly runs, so mostly 1 byte each
    varint      unsigned LEB128; signed values are zigzagged

Field encodings are derived from the opcode table, so a new opcode needs no change here.
Every error is a `BinaryError` with a message that says what is wrong and where.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib

import numpy as np

from lpu.isa.errors import BinaryError, ConfigError
from lpu.isa.machine import UNIT_ICU, UNIT_NAMES, MachineConfig
from lpu.isa.opcodes import DTYPE_WIDTH, DTYPES, NARGS, OPS, TABLE_HASH
from lpu.isa.program import Program, Symbol, config_hash, source_hash
from lpu.isa.validate import program_problems

MAGIC = b"\x89LPUBIN\n"
FORMAT_VERSION = 3
SECTIONS = (b"HEAD", b"INST", b"SYMS", b"CNST", b"TABL", b"NODE", b"META")
_PREAMBLE = len(MAGIC) + 2 + 4

# ---- the per-opcode record layout, derived from the opcode table ------------------------------
KIND_CODES = {"int": 1, "ref": 2, "dtype": 3, "f32": 4}      # 0: the arg is unused
_KIND_FORMAT = {"int": "<i4", "ref": "<u2", "dtype": "u1", "f32": "<i4"}
OP_KINDS = np.zeros((len(OPS), NARGS), np.int8)
OP_UNIT = np.array([s.unit for s in OPS], np.int64)
OP_ROLE = np.array([s.role for s in OPS], np.int64)
_FIELD_OFFSETS = []                    # per opcode: [(arg index, byte offset, numpy dtype)]
_REC_SIZE = np.zeros(len(OPS), np.int64)
for _s in OPS:
    _off, _layout = 3, []
    for _j, (_, _kind) in enumerate(_s.fields):
        OP_KINDS[_s.code, _j] = KIND_CODES[_kind]
        _layout.append((_j, _off, np.dtype(_KIND_FORMAT[_kind])))
        _off += np.dtype(_KIND_FORMAT[_kind]).itemsize
    _FIELD_OFFSETS.append(_layout)
    _REC_SIZE[_s.code] = _off + 8      # + line u32 + node i32
_I32 = (-2**31, 2**31 - 1)


# ---- validation shared by the encoder, the decoder and the assembler ---------------------------
def check_instructions(machine: MachineConfig, queue, op, args, line=None, node=None, n_nodes=None):
    """The first invalid instruction as (index, message), or None if all are valid."""
    queue, op, args = (np.asarray(a, np.int64) for a in (queue, op, args))
    n = op.shape[0]
    if queue.shape != (n,) or args.shape != (n, NARGS):
        return 0, f"columns have shapes {queue.shape}, {op.shape}, {args.shape}; expected ({n},), ({n}, {NARGS})"
    first = None

    def flag(bad, message):
        nonlocal first
        idx = np.flatnonzero(bad)
        if idx.size and (first is None or idx[0] < first[0]):
            first = (int(idx[0]), message)

    flag((op < 0) | (op >= len(OPS)), lambda i: f"unknown opcode {op[i]}")
    nq = len(machine.queues)
    flag((queue < 0) | (queue >= nq), lambda i: f"queue {queue[i]} does not exist (machine '{machine.name}' has {nq})")
    if first is not None:
        return first[0], first[1](first[0])
    q_unit = np.array([q[1] for q in machine.queues], np.int64)[queue]
    q_role = np.array([q[3] for q in machine.queues], np.int64)[queue]
    unit, role = OP_UNIT[op], OP_ROLE[op]
    flag((unit != UNIT_ICU) & (unit != q_unit), lambda i: (
        f"{OPS[op[i]].name} runs on a {UNIT_NAMES[unit[i]]} queue, not on {machine.queues[queue[i]][0]}"))
    flag((unit != UNIT_ICU) & (unit == q_unit) & (role >= 0) & (role != q_role), lambda i: (
        f"{OPS[op[i]].name} does not run on queue {machine.queues[queue[i]][0]} (wrong MXM queue role)"))
    kinds = OP_KINDS[op]

    def name(i, j):
        return f"{OPS[op[i]].name} field '{OPS[op[i]].fields[j][0]}'"

    for j in range(NARGS):
        k, v = kinds[:, j], args[:, j]
        flag((k == 0) & (v != 0), lambda i, j=j: f"{OPS[op[i]].name} uses {len(OPS[op[i]].fields)} "
             f"fields but arg {j} is {args[i, j]}, not 0")
        flag(((k == 1) | (k == 4)) & ((v < _I32[0]) | (v > _I32[1])),
             lambda i, j=j: f"{name(i, j)} = {args[i, j]} does not fit in 32 bits")
        flag((k == 3) & ((v < 0) | (v >= len(DTYPES))), lambda i, j=j: f"{name(i, j)} = {args[i, j]} is not a dtype code")
        dt, d, st = np.clip(v // 256, 0, len(DTYPES) - 1), (v // 64) % 4, v % 64
        width = np.asarray(DTYPE_WIDTH)[dt]
        flag((k == 2) & ((v < 0) | (v // 256 >= len(DTYPES)) | (d > 1)
                         | (st + width > machine.streams_per_direction)),
             lambda i, j=j: f"{name(i, j)} = {args[i, j]} is not a stream ref on a machine with "
             f"{machine.streams_per_direction} streams per direction")
    if line is not None:
        line = np.asarray(line, np.int64)
        flag((line < 0) | (line > _I32[1]), lambda i: f"line {line[i]} out of range")
    if node is not None:
        node = np.asarray(node, np.int64)
        top = _I32[1] if n_nodes is None else n_nodes - 1
        flag((node < -1) | (node > top), lambda i: f"node {node[i]} out of range (program has {n_nodes} nodes)")
    return None if first is None else (first[0], first[1](first[0]))


# ---- writing -----------------------------------------------------------------------------------
class _Writer:
    def __init__(self):
        self.parts = []

    def raw(self, b: bytes):
        self.parts.append(bytes(b))

    def uvar(self, v: int):
        if v < 0:
            raise BinaryError(f"cannot encode: negative value {v} where a count or size is expected")
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | (0x80 if v else 0))
            if not v:
                break
        self.parts.append(bytes(out))

    def svar(self, v: int):
        self.uvar(2 * v if v >= 0 else -2 * v - 1)

    def str(self, s):
        if not isinstance(s, str):
            raise BinaryError(f"cannot encode: expected a string, got {s!r}")
        b = s.encode("utf-8", "surrogatepass")
        self.uvar(len(b))
        self.raw(b)

    def ints(self, a, what):
        a = np.asarray(a)
        if a.dtype.kind not in "iub" or (a.size and (a.min() < _I32[0] or a.max() > _I32[1])):
            raise BinaryError(f"cannot encode: {what} must hold 32-bit integers")
        self.uvar(a.ndim)
        for d in a.shape:
            self.uvar(d)
        flat = a.reshape(-1).astype(np.int64)
        delta = np.diff(flat, prepend=0)
        w = next(w for w in (1, 2, 4, 8) if not delta.size or (
            delta.min() >= -2**(8 * w - 1) and delta.max() < 2**(8 * w - 1)))
        self.uvar(w)
        self.raw(delta.astype(f"<i{w}").tobytes())

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


def _encode_instructions(p: Program, w: _Writer):
    op = np.asarray(p.op, np.int64)
    n = op.shape[0]
    bad = check_instructions(p.machine, p.queue, op, p.args, p.line, p.node, len(p.nodes))
    if bad:
        raise BinaryError(f"cannot encode: instruction {bad[0]}: {bad[1]}")
    sizes = _REC_SIZE[op]
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    buf = np.zeros(int(sizes.sum()), np.uint8)

    def put(at, values, dt):
        b = np.asarray(values).astype(dt).view(np.uint8).reshape(len(at), dt.itemsize)
        buf[at[:, None] + np.arange(dt.itemsize)] = b

    put(offs, p.queue, np.dtype("<u2"))
    put(offs + 2, op, np.dtype("u1"))
    put(offs + sizes - 8, p.line, np.dtype("<u4"))
    put(offs + sizes - 4, p.node, np.dtype("<i4"))
    args = np.asarray(p.args, np.int64)
    for code in np.unique(op):
        idx = np.flatnonzero(op == code)
        for j, off, dt in _FIELD_OFFSETS[code]:
            put(offs[idx] + off, args[idx, j], dt)
    w.raw(struct.pack("<I", n))
    w.raw(buf.tobytes())


def _encode_symbols(p: Program, w: _Writer):
    w.uvar(len(p.symbols))
    for s in p.symbols:
        for t in (s.name, s.kind, s.dtype):
            w.str(t)
        w.uvar(len(s.shape))
        for d in s.shape:
            w.uvar(int(d))
        for a in ("slices", "banks", "addrs"):
            w.ints(getattr(s, a), f"symbol '{s.name}' {a}")


def _encode_consts(p: Program, w: _Writer):
    consts = [(i, s) for i, s in enumerate(p.symbols) if s.data is not None]
    w.uvar(len(consts))
    for i, s in consts:
        data = np.asarray(s.data)
        if data.dtype.kind not in "biufc":
            raise BinaryError(f"cannot encode: symbol '{s.name}' data has dtype {data.dtype}")
        data = np.asarray(data, data.dtype.newbyteorder("<"), order="C")
        w.uvar(i)
        w.str(data.dtype.str)
        w.uvar(data.ndim)
        for d in data.shape:
            w.uvar(d)
        w.raw(data.tobytes())


def _encode_tables(p: Program, w: _Writer):
    t = np.asarray(p.tables)
    if t.ndim != 2 or t.shape[1] != p.machine.lanes:
        raise BinaryError(f"cannot encode: tables have shape {t.shape}, expected (n, {p.machine.lanes})")
    w.ints(t, "tables")


def _encode_nodes(p: Program, w: _Writer):
    w.uvar(len(p.nodes))
    for nd in p.nodes:
        if len(nd) != 2:
            raise BinaryError(f"cannot encode: node {nd!r} is not (op name, line)")
        w.str(nd[0])
        w.svar(int(nd[1]))


def _encode_meta(p: Program, w: _Writer):
    w.svar(int(p.predicted_cycles))
    w.str(p.source_name)
    w.uvar(len(p.source_lines))
    for s in p.source_lines:
        w.str(s)
    w.str(p.source_hash())
    w.uvar(len(p.params))
    for name in sorted(p.params):
        w.str(name)
        w.svar(int(p.params[name]))


def _encode_head(p: Program, w: _Writer):
    w.str(p.machine.name)
    w.str(json.dumps(p.machine.to_dict(), sort_keys=True, separators=(",", ":")))
    w.str(config_hash(p.machine))
    w.str(TABLE_HASH)


_ENCODERS = (_encode_head, _encode_instructions, _encode_symbols, _encode_consts, _encode_tables,
             _encode_nodes, _encode_meta)


def encode(program: Program) -> bytes:
    """The `.lpubin` bytes of `program` (deterministic)."""
    body = bytearray()
    for tag, enc in zip(SECTIONS, _ENCODERS):
        w = _Writer()
        enc(program, w)
        part = w.getvalue()
        body += tag + struct.pack("<I", len(part)) + part
    head = MAGIC + struct.pack("<HI", FORMAT_VERSION, len(body) + 4)
    data = head + bytes(body)
    return data + struct.pack("<I", zlib.crc32(data))


# ---- reading -----------------------------------------------------------------------------------
class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes, pos: int, end: int, section: str):
        self.data, self.pos, self.end, self.section = data, pos, end, section

    def fail(self, message):
        raise BinaryError(f"corrupt .lpubin: section {self.section}: {message}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise _Truncated(self.section)
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def uvar(self, limit: int = 2**40) -> int:
        v = shift = 0
        while True:
            b = self.take(1)[0]
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift > 63:
                self.fail("varint too long")
        if v > limit:
            self.fail(f"value {v} out of range (at most {limit})")
        return v

    def svar(self) -> int:
        v = self.uvar(2**64)
        return v // 2 if v % 2 == 0 else -(v + 1) // 2

    def str(self) -> str:
        b = self.take(self.uvar(2**40))
        try:
            return b.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            self.fail(f"a string is not valid UTF-8 ({e.reason})")

    def shape(self, what) -> tuple:
        nd = self.uvar(32)
        dims = tuple(self.uvar(2**31) for _ in range(nd))
        if int(np.prod(dims, dtype=object)) > 2**31:
            self.fail(f"{what} shape {dims} is too large")
        return dims

    def ints(self, what) -> np.ndarray:
        dims = self.shape(what)
        w = self.uvar(8)
        if w not in (1, 2, 4, 8):
            self.fail(f"{what}: bad element width {w}")
        count = int(np.prod(dims, dtype=object))
        flat = np.cumsum(np.frombuffer(self.take(count * w), f"<i{w}").astype(np.int64))
        if flat.size and (flat.min() < _I32[0] or flat.max() > _I32[1]):
            self.fail(f"{what}: value out of 32-bit range")
        return flat.astype(np.int32).reshape(dims)


def _read_head(r: _Reader, machine):
    name, cfg_json, stored, table = r.str(), r.str(), r.str(), r.str()
    if table != TABLE_HASH:
        raise BinaryError(f"built by another version of lpu: its instruction set differs (opcode table "
                          f"{table}, this lpu has {TABLE_HASH}); recompile it from its source")
    try:
        cfg = MachineConfig.from_dict(json.loads(cfg_json), source=f"<lpubin:{name}>")
    except (ValueError, TypeError, AttributeError, ConfigError) as e:
        r.fail(f"the machine config is not valid: {e}")
    if config_hash(cfg) != stored or cfg.name != name:
        r.fail(f"the machine config does not match its hash {stored}")
    if machine is not None:
        mine = config_hash(machine)
        if mine != stored:
            same = " (same name, different config)" if machine.name == name else ""
            raise BinaryError(f"built for machine '{name}' (hash {stored}), not '{machine.name}' "
                              f"(hash {mine}){same}; recompile for this machine")
        return machine
    return cfg


def _read_instructions(r: _Reader, machine):
    n = struct.unpack("<I", r.take(4))[0]
    if n * int(_REC_SIZE.min()) > r.end - r.pos:
        raise _Truncated(f"{r.section} ({n} instructions do not fit in its {r.end - r.pos} bytes)")
    data, pos, offs = r.data, r.pos, np.zeros(n, np.int64)
    nops, sizes = len(OPS), _REC_SIZE.tolist()
    for i in range(n):
        if pos + 3 > r.end:
            raise _Truncated(f"{r.section} (instruction {i} of {n})")
        code = data[pos + 2]
        if code >= nops:
            r.fail(f"instruction {i}: unknown opcode {code}")
        offs[i] = pos
        pos += sizes[code]
    if pos > r.end:
        raise _Truncated(f"{r.section} (instruction {n - 1} of {n})")
    buf = np.frombuffer(data, np.uint8, count=pos - r.pos, offset=r.pos)
    offs -= r.pos
    r.pos = pos

    def get(at, dt):
        return buf[at[:, None] + np.arange(dt.itemsize)].copy().view(dt).reshape(-1).astype(np.int64)

    op = get(offs + 2, np.dtype("u1"))
    sizes = _REC_SIZE[op]
    queue = get(offs, np.dtype("<u2"))
    line, node = get(offs + sizes - 8, np.dtype("<u4")), get(offs + sizes - 4, np.dtype("<i4"))
    args = np.zeros((n, NARGS), np.int64)
    for code in np.unique(op):
        idx = np.flatnonzero(op == code)
        for j, off, dt in _FIELD_OFFSETS[code]:
            args[idx, j] = get(offs[idx] + off, dt)
    return queue, op, args, line, node


def _read_symbols(r: _Reader):
    syms = []
    for _ in range(r.uvar(r.end)):
        name, kind, dtype = r.str(), r.str(), r.str()
        if dtype not in DTYPES:
            r.fail(f"symbol '{name}' has unknown dtype '{dtype}'")
        shape = r.shape(f"symbol '{name}'")
        lay = [r.ints(f"symbol '{name}' {a}") for a in ("slices", "banks", "addrs")]
        syms.append(Symbol(name, kind, dtype, shape, *lay))
    return syms


def _read_consts(r: _Reader, syms):
    for _ in range(r.uvar(len(syms))):
        i = r.uvar(2**31)
        if i >= len(syms):
            r.fail(f"constant data for symbol {i}, but there are {len(syms)} symbols")
        dts = r.str()
        try:
            dt = np.dtype(dts)
        except (TypeError, ValueError):
            r.fail(f"constant '{syms[i].name}' has bad dtype {dts!r}")
        if dt.kind not in "biufc" or dt.str != dts:
            r.fail(f"constant '{syms[i].name}' has bad dtype {dts!r}")
        shape = r.shape(f"constant '{syms[i].name}'")
        count = int(np.prod(shape, dtype=object))
        syms[i].data = np.frombuffer(r.take(count * dt.itemsize), dt).reshape(shape).copy()


def _read_tables(r: _Reader, machine):
    t = r.ints("tables")
    if t.ndim != 2 or t.shape[1] != machine.lanes:
        r.fail(f"tables have shape {t.shape}, expected (n, {machine.lanes})")
    return t


def _read_nodes(r: _Reader):
    return [(r.str(), r.svar()) for _ in range(r.uvar(r.end))]


def _read_meta(r: _Reader):
    cycles, name = r.svar(), r.str()
    lines = [r.str() for _ in range(r.uvar(r.end))]
    if r.str() != source_hash(lines):
        r.fail("the embedded source does not match its recorded hash")
    params = {}
    for _ in range(r.uvar(r.end)):
        key = r.str()
        params[key] = r.svar()
    return cycles, name, lines, params


def _check_preamble(data: bytes) -> int:
    """The declared total size, after checking magic and version."""
    if data[:len(MAGIC)] != MAGIC[:len(data)] or not data:
        raise BinaryError("not an .lpubin file (bad magic bytes)")
    if len(data) < _PREAMBLE:
        raise BinaryError(f"truncated .lpubin: {len(data)} bytes, shorter than the {_PREAMBLE}-byte preamble")
    version, length = struct.unpack_from("<HI", data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise BinaryError(f".lpubin format version {version}, but this lpu reads version {FORMAT_VERSION}; "
                          "recompile the program")
    return _PREAMBLE + length


def decode(data: bytes, machine: MachineConfig | None = None, validate: bool = True) -> Program:
    """The Program in `.lpubin` bytes. With `machine`, the binary must have been built for it.
    With `validate` (the default) its symbols, constants, tables and expanded size are checked
    too (isa/validate.py): what the emulator and the checker can take; without, only the format."""
    data = bytes(data)
    total = _check_preamble(data)
    truncated = len(data) < total
    if len(data) > total:
        raise BinaryError(f"corrupt .lpubin: {len(data) - total} unexpected bytes after the checksum")
    if not truncated and struct.unpack_from("<I", data, total - 4)[0] != zlib.crc32(data[:total - 4]):
        raise BinaryError("corrupt .lpubin: checksum mismatch (the file was damaged)")
    try:
        program = _decode_sections(data, min(total - 4, len(data)), machine)
    except _Truncated as t:
        if truncated:
            raise BinaryError(f"truncated .lpubin: {len(data)} of {total} bytes, cut off in section {t.args[0]}") from None
        raise BinaryError(f"corrupt .lpubin: section {t.args[0]} runs past its end") from None
    except BinaryError as e:
        if truncated:
            raise BinaryError(f"truncated .lpubin: {len(data)} of {total} bytes ({e.message})") from None
        raise
    if truncated:
        raise BinaryError(f"truncated .lpubin: {len(data)} of {total} bytes, cut off in the checksum")
    if validate:
        _validate(program)
    return program


def _decode_sections(data: bytes, end: int, machine) -> Program:
    pos, parts = _PREAMBLE, {}
    for tag in SECTIONS:
        name = tag.decode()
        if pos + 8 > end:
            raise _Truncated(name)
        if data[pos:pos + 4] != tag:
            raise BinaryError(f"corrupt .lpubin: expected section {name} at byte {pos}, found {data[pos:pos + 4]!r}")
        size = struct.unpack_from("<I", data, pos + 4)[0]
        r = _Reader(data, pos + 8, min(pos + 8 + size, end), name)
        if tag == b"HEAD":
            machine = _read_head(r, machine)
            parts[tag] = machine
        elif tag == b"INST":
            parts[tag] = _read_instructions(r, machine)
        elif tag == b"SYMS":
            parts[tag] = _read_symbols(r)
        elif tag == b"CNST":
            _read_consts(r, parts[b"SYMS"])
        elif tag == b"TABL":
            parts[tag] = _read_tables(r, machine)
        elif tag == b"NODE":
            parts[tag] = _read_nodes(r)
        else:
            parts[tag] = _read_meta(r)
        if pos + 8 + size > end:
            raise _Truncated(name)
        if r.pos != r.end:
            r.fail(f"{r.end - r.pos} unread bytes at the end of the section")
        pos = r.end
    if pos != end:
        raise BinaryError(f"corrupt .lpubin: {end - pos} bytes after the last section")
    queue, op, args, line, node = parts[b"INST"]
    nodes = parts[b"NODE"]
    bad = check_instructions(machine, queue, op, args, line, node, len(nodes))
    if bad:
        raise BinaryError(f"corrupt .lpubin: instruction {bad[0]}: {bad[1]}")
    cycles, source_name, source_lines, params = parts[b"META"]
    program = Program(machine, queue.astype(np.int32), op.astype(np.int32), args.astype(np.int32),
                      line.astype(np.int32), node.astype(np.int32),
                      symbols=parts[b"SYMS"], tables=parts[b"TABL"], nodes=nodes,
                      predicted_cycles=cycles, source_name=source_name, source_lines=source_lines,
                      params=params)
    return program


def _validate(program: Program) -> None:
    """Symbols, constants, tables and the expanded size, before anything is sized from them."""
    bad = program_problems(program, first_only=True)
    if bad:
        i, message = bad[0]
        raise BinaryError(f"corrupt .lpubin: {f'instruction {i}: ' if i >= 0 else ''}{message}")


# ---- files -------------------------------------------------------------------------------------
def save(program: Program, path: str) -> None:
    """Write `program` to `path` atomically (a temporary file in the same folder, then a rename)."""
    data = encode(program)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".lpubin-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_binary(path: str, machine: MachineConfig | None = None, validate: bool = True) -> Program:
    """Read a `.lpubin` file; errors name the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BinaryError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return decode(data, machine, validate)
    except BinaryError as e:
        raise BinaryError(f"{path}: {e.message}") from None
