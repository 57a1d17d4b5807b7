"""The `.lpubin` binary format: `encode`, `decode`, `save`, `load_binary`.

Layout (all integers little-endian):

    magic       8 bytes  b"\\x89LPUBIN\\n"
    version     u16      FORMAT_VERSION
    length      u32      bytes after this field, up to and including the checksum
    sections    each: tag (4 ASCII bytes), body length u32, body; in this order:
        HEAD    machine name (str), machine config (str, JSON), config hash (str), opcode table
                hash (str: isa.opcodes.TABLE_HASH)
        INST    count u32, then the instructions column by column: queue, opcode, each of the
                NARGS args (an unused arg is 0; an f32 field holds its 4 bytes of bits), line, node
                (-1: none); queue and opcode in program order, the others grouped by (queue,
                opcode) in a stable sort on queue x opcode count + opcode. Each column: mode u8
                (0: the values, 1: each value minus the one before it), width u8 (1, 2, 4 or 8
                bytes per signed value), length u32, then that many bytes of zlib data that
                inflate to exactly count x width bytes
        SYMS    u32 length, then zlib data that inflates to that many bytes: count, then per
                symbol: name, kind, dtype (str), shape (varints), slices, banks, addrs (int arrays)
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

from lpu.isa import inst_columns as IC
from lpu.isa.checks import I32 as _I32, check_instructions
from lpu.isa.errors import BinaryError, ConfigError
from lpu.isa.machine import MachineConfig
from lpu.isa.opcodes import DTYPES, TABLE_HASH
from lpu.isa.program import Program, Symbol, config_hash, source_hash
from lpu.isa.validate import program_problems

MAGIC = b"\x89LPUBIN\n"
FORMAT_VERSION = 4
SECTIONS = (b"HEAD", b"INST", b"SYMS", b"CNST", b"TABL", b"NODE", b"META")
_PREAMBLE = len(MAGIC) + 2 + 4

# ---- writing -----------------------------------------------------------------------------------
class _Writer:
    def __init__(self):
        self.parts = []

    def raw(self, b):
        self.parts.append(b if isinstance(b, (bytes, memoryview)) else bytes(b))

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


def _encode_instructions(p: Program, w: _Writer):
    bad = check_instructions(p.machine, p.queue, p.op, p.args, p.line, p.node, len(p.nodes))
    if bad:
        raise BinaryError(f"cannot encode: instruction {bad[0]}: {bad[1]}")
    w.raw(struct.pack("<I", len(p.op)))
    for part in IC.encode_columns(p):
        w.raw(part)


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
    return b"".join(_chunks(program))


def _chunks(program: Program) -> list:
    """The `.lpubin` file as a list of byte strings (no copy of the whole: a 14M-instruction
    program is ~250 MB), the checksum last."""
    out = []
    for tag, enc in zip(SECTIONS, _ENCODERS):
        w = _Writer()
        enc(program, w)
        if tag == b"SYMS":          # layouts: a few MB of runs for a large model
            body = b"".join(w.parts)
            w.parts = [struct.pack("<I", len(body)), zlib.compress(body, IC.ZLIB_LEVEL)]
        out.append(tag + struct.pack("<I", sum(len(p) for p in w.parts)))
        out.extend(w.parts)
    out.insert(0, MAGIC + struct.pack("<HI", FORMAT_VERSION, sum(len(p) for p in out) + 4))
    crc = 0
    for part in out:
        crc = zlib.crc32(part, crc)
    out.append(struct.pack("<I", crc))
    return out


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
    return IC.decode_columns(r.take, r.fail, n)


def _inflated(r: _Reader) -> _Reader:
    """A reader of a section stored as: u32 length, then zlib data inflating to that many bytes."""
    size = struct.unpack("<I", r.take(4))[0]
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(r.take(r.end - r.pos), size)
    except zlib.error as e:
        r.fail(f"the compressed data is damaged ({e})")
    if len(raw) != size or not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
        r.fail(f"the compressed data does not inflate to its {size} bytes")
    return _Reader(raw, 0, size, r.section)


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
            inner = _inflated(r)
            parts[tag] = _read_symbols(inner)
            if inner.pos != inner.end:
                r.fail(f"{inner.end - inner.pos} unread bytes at the end of the section")
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
    program = Program(machine, queue, op, args, line, node,
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
    write_parts(_chunks(program), path)


def write_parts(parts, path: str) -> None:
    """Write byte strings one after another to `path` atomically (a temporary file in the same
    folder, then a rename; nothing is left behind on an error)."""
    fd, tmp = tempfile.mkstemp(prefix=".lpubin-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
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
