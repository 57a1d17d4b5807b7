"""The one opcode table. Encoder, decoder, assembler, disassembler, emulator dispatch, the
scheduler's resource model and the checker all derive from it.

An instruction is (queue, opcode, args[NARGS]) plus its DSL source line and IR node. The unit
(MEM slice, VXM ALU, MXM plane, SXM hemisphere) is the queue's; args hold the rest, as plain
ints. Field kinds:

    int     a signed integer
    ref     a stream operand: dtype * 256 + dir * 64 + stream   (asm: `f16:E3`, or `E3` for raw
            bytes); a value of a w-byte dtype occupies streams stream .. stream+w-1 (byte plane b,
            little-endian, on stream+b), all on the same diagonal
    dtype   a dtype code (DTYPES)
    f32     32-bit pattern of an immediate (float32 bits when the op computes in f32, else int32)

Timing (all latencies are config values, `isa/machines/*.toml` [latency]): an instruction issued
at cycle t reads its stream operands at its unit's position in cycle t, and puts its result on a
stream at its position in cycle t + latency. A value on an eastward stream at position p in
cycle c is at p+1 in cycle c+1 (westward: p-1); it keeps the diagonal k = c - p (east) or
c + p (west). One value per (direction, stream, diagonal); a reader takes it only if its writer
is at or upstream of the reader.

Within one cycle, phase-0 instructions (those that read unit state) act before phase-1
instructions (those that write it): IW sees the LWs of earlier cycles, TPOUT the TPINs of
earlier cycles.
"""
from __future__ import annotations

from dataclasses import dataclass

from lpu.isa import dtypes as _dtypes
from lpu.isa.machine import UNIT_C2C, UNIT_ICU, UNIT_MEM, UNIT_MXM, UNIT_SXM, UNIT_VXM

NARGS = 6

# the dtype table is isa/dtypes.py; its codes and widths, as the encoder, assembler and decoder use them
DTYPES, DTYPE_CODE, DTYPE_WIDTH = _dtypes.DTYPES, _dtypes.DTYPE_CODE, _dtypes.DTYPE_WIDTH
DT_I8, DT_F16, DT_I32, DT_F32, DT_BF16 = _dtypes.DT_I8, _dtypes.DT_F16, _dtypes.DT_I32, _dtypes.DT_F32, _dtypes.DT_BF16
FLOAT_DTYPES = _dtypes.FLOAT_DTYPES
dtype_width = _dtypes.dtype_width


def make_ref(dtype: int, direction: int, stream: int) -> int:
    return dtype * 256 + direction * 64 + stream


def split_ref(ref: int) -> tuple[int, int, int]:
    return ref // 256, (ref // 64) % 4, ref % 64


@dataclass(frozen=True)
class OpSpec:
    code: int
    name: str
    unit: int          # UNIT_* of the queue it must be issued on
    fields: tuple      # ((field name, kind), ...) in args order
    latency: str       # key into MachineConfig.latency, or "" for none
    phase: int         # 0: reads unit state, 1: writes it (order within a cycle)
    role: int = -1     # for MXM: which queue role it runs on (machine.MXM_*); -1 any
    doc: str = ""

    def field_index(self, name: str) -> int:
        for i, (n, _) in enumerate(self.fields):
            if n == name:
                return i
        raise KeyError(name)


_TABLE = []


def _op(name, unit, fields, latency="", phase=1, role=-1, doc=""):
    spec = OpSpec(len(_TABLE), name, unit, tuple(fields), latency, phase, role, doc)
    _TABLE.append(spec)
    return spec.code


I, R, T, F = "int", "ref", "dtype", "f32"
# --- ICU (any queue) ---------------------------------------------------------------------------
NOP = _op("NOP", UNIT_ICU, [("n", I)], doc="the queue idles n cycles")
REPEAT = _op("REPEAT", UNIT_ICU, [("n", I), ("d", I)],
             doc="issue the previous instruction n more times, d cycles apart, its addr/row/acc/col field +1 each time")
SYNC = _op("SYNC", UNIT_ICU, [], doc="first instruction of a queue: wait for NOTIFY (all queues start at cycle 0)")
NOTIFY = _op("NOTIFY", UNIT_ICU, [], doc="release every queue waiting in SYNC")
# --- MEM (queue of a slice; either port may address either bank) ------------------------------
READ = _op("READ", UNIT_MEM, [("bank", I), ("addr", I), ("out", R)], "mem_read", 0,
           doc="put mem[slice, bank, addr] (one byte plane) on stream out")
WRITE = _op("WRITE", UNIT_MEM, [("bank", I), ("addr", I), ("inp", R)], "", 1,
            doc="mem[slice, bank, addr] = the byte plane on stream inp")
GATHER = _op("GATHER", UNIT_MEM, [("bank", I), ("addr", I), ("idx", R), ("out", R)], "mem_read", 0,
             doc="out[l] = mem[slice, bank, addr + idx[l], l] (idx: one unsigned byte plane)")
SCATTER = _op("SCATTER", UNIT_MEM, [("bank", I), ("addr", I), ("idx", R), ("inp", R)], "", 1,
              doc="mem[slice, bank, addr + idx[l], l] = inp[l]")
# --- MXM (queues of a plane; f16 uses the even plane of a pair) -----------------------------
LW = _op("LW", UNIT_MXM, [("row", I), ("inp", R), ("cvt", I)], "", 1, role=0,
         doc="load weight buffer row from stream inp (i8, or f16 on an even plane); cvt=1: an i8 "
             "row is widened to f16 (exactly) into an even plane's f16 buffer")
IW = _op("IW", UNIT_MXM, [("dtype", T), ("trans", I)], "", 0, role=1,
         doc="install the weight buffer (transposed if trans) as the plane's weights")
ABC = _op("ABC", UNIT_MXM, [("inp", R), ("acc", I), ("accum", I), ("half", I)], "mxm_abc", 1, role=1,
          doc="acc[acc] (+)= inp @ weights: f64 dot rounded to f32 once (f16), or exact i32 (i8); "
              "half=1: inp lanes >= lanes/2 read as zero, and the ABC holds its plane(s) half the "
              "cycles, rounded up (f16: one [1x160]x[160x320] pass of the pair, P22)")
ACC = _op("ACC", UNIT_MXM, [("acc", I), ("out", R)], "mxm_acc", 0, role=2,
          doc="put accumulator row acc (f32 or i32) on stream out")
# --- VXM (queue of an ALU); compute in f32 if any operand or the result is a float, else i32
#     (wrapping; DIV truncates toward zero, x / 0 = 0); EXP .. GELU always compute in f32;
#     LT .. NE give 1 or 0; KEEP and DROP compute in f32 if a or the result is a float (b is
#     only tested against 0 in its own dtype; NaN is non-zero), their zero is -0.0 in f32 so
#     that x + zero == x for every x; lanes >= nv of the result are 0 ---------------------------
_BIN = [("a", R), ("b", R), ("out", R), ("nv", I), ("imm", F), ("bimm", I)]
_UN = [("a", R), ("out", R), ("nv", I)]
VXM_BINARY = {}
for _n, _doc in (("ADD", "a + b"), ("SUB", "a - b"), ("MUL", "a * b"), ("DIV", "a / b"),
                 ("MAX", "max(a, b)"), ("MIN", "min(a, b)"), ("LT", "a < b"), ("LE", "a <= b"),
                 ("GT", "a > b"), ("GE", "a >= b"), ("EQ", "a == b"), ("NE", "a != b"),
                 ("KEEP", "a if b != 0 else zero"), ("DROP", "a if b == 0 else zero")):
    VXM_BINARY[_n] = _op(_n, UNIT_VXM, _BIN, "vxm_transcendental" if _n == "DIV" else "vxm",
                         doc=f"out = {_doc}; bimm=1: b is imm, bimm=2: a is imm")
VXM_UNARY = {}
for _n in ("NEG", "ABS", "RELU", "CONV", "EXP", "LOG", "SQRT", "RSQRT", "TANH", "SIGMOID", "SILU", "GELU"):
    VXM_UNARY[_n] = _op(_n, UNIT_VXM, _UN,
                        "vxm" if _n in ("NEG", "ABS", "RELU", "CONV") else "vxm_transcendental",
                        doc="out = f(a) (CONV: conversion only; GELU: tanh form)")
MASK = _op("MASK", UNIT_VXM, [("a", R), ("out", R), ("nv", I), ("cut", I), ("imm", F)], "vxm",
           doc="out[l] = a[l] for l < cut, imm for cut <= l < nv, 0 for l >= nv")
# --- SXM (queues of a hemisphere's SXM); byte-plane-wise, out has inp's dtype --------------
SHIFT = _op("SHIFT", UNIT_SXM, [("inp", R), ("out", R), ("k", I)], "sxm",
            doc="out[l] = inp[l - k], 0 outside")
ROTATE = _op("ROTATE", UNIT_SXM, [("inp", R), ("out", R), ("k", I)], "sxm",
             doc="out[l] = inp[(l - k) mod lanes]")
PERMUTE = _op("PERMUTE", UNIT_SXM, [("inp", R), ("out", R), ("table", I)], "sxm",
              doc="out[l] = inp[tables[table][l]], 0 where the entry is negative")
DISTRIBUTE = _op("DISTRIBUTE", UNIT_SXM, [("inp", R), ("out", R), ("lane", I)], "sxm",
                 doc="out[l] = inp[lane]")
TPIN = _op("TPIN", UNIT_SXM, [("inp", R), ("buf", I), ("row", I)], "", 1,
           doc="transpose buffer buf+b row = byte plane b of inp")
TPOUT = _op("TPOUT", UNIT_SXM, [("buf", I), ("col", I), ("out", R)], "sxm", 0,
            doc="byte plane b of out = column col of transpose buffer buf+b")
# --- C2C (the queue of a chip-to-chip link; isa/system.py, docs/system.md): one 320-byte vector
#     (one byte plane) per instruction; a link carries one vector per slot (`slot_cycles`) and
#     delivers it `hop_cycles` after the SEND; vectors arrive in the order sent -------------------
SEND = _op("SEND", UNIT_C2C, [("inp", R)], "", 1,
           doc="send the byte plane on stream inp over the queue's link (it arrives hop_cycles later)")
RECV = _op("RECV", UNIT_C2C, [("out", R)], "", 0,
           doc="put the oldest vector that arrived on the queue's link on stream out (issue + 0)")

OPS: tuple[OpSpec, ...] = tuple(_TABLE)
# fingerprint of the instruction set: binaries record it, so one built before the table changed
# is refused by name rather than decoded into other instructions
TABLE_HASH = __import__("hashlib").sha256(repr([(s.name, s.unit, s.fields, s.latency, s.phase, s.role)
                                                for s in OPS]).encode()).hexdigest()[:16]
BY_NAME = {s.name: s for s in OPS}
TRANSCENDENTAL = frozenset(s.code for s in OPS if s.latency == "vxm_transcendental")
SXM_TRANSPOSE_BUFFERS = 4   # one per byte plane of the widest dtype

# which field of an op is bumped by REPEAT (address, row, accumulator or column), -1 none
REPEAT_FIELD = tuple(
    next((i for i, (n, _) in enumerate(s.fields) if n in ("addr", "row", "acc", "col")), -1) for s in OPS
)


def latency_of(op: int, machine) -> int:
    key = OPS[op].latency
    return machine.latency[key] if key else 0


def latency_table(machine):
    """Latency per opcode, as a list of ints (for Numba code and the scheduler)."""
    return [latency_of(op, machine) for op in range(len(OPS))]
