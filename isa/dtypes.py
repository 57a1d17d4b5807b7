"""The one dtype table. The instruction set (dtype codes in refs, byte planes per value), the
emulator (encodings), the compiler (storage, promotion, conversion) and the reference (numpy
arrays) all read it; every dtype is available everywhere.

    name    code  bytes  kind   numpy array dtype   range (integers)
    i8      0     1      int    int8                [-128, 127]
    f16     1     2      float  float16
    i32     2     4      int    int32               [-2^31, 2^31 - 1]
    f32     3     4      float  float32
    bf16    4     2      float  float32 holding bf16 values (numpy has no bfloat16)

The codes are the instruction set's: a ref packs its dtype as code * 256 (isa/opcodes.py), and
the emulator's jitted arithmetic keeps the same codes as literal constants (Numba's cache
freezes globals), checked against this table when it is imported.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    code: int
    width: int          # bytes = stream planes / MEM slices a value occupies
    is_float: bool
    numpy: type         # numpy dtype of arrays holding values of this dtype
    lo: int = 0         # integer range (0, 0 for floats)
    hi: int = 0


TABLE: tuple[DType, ...] = (
    DType("i8", 0, 1, False, np.int8, -128, 127),
    DType("f16", 1, 2, True, np.float16),
    DType("i32", 2, 4, False, np.int32, -2**31, 2**31 - 1),
    DType("f32", 3, 4, True, np.float32),
    DType("bf16", 4, 2, True, np.float32),
)
assert [d.code for d in TABLE] == list(range(len(TABLE)))

BY_NAME = {d.name: d for d in TABLE}
DTYPES = tuple(d.name for d in TABLE)                     # names in code order
DTYPE_CODE = {d.name: d.code for d in TABLE}
DTYPE_WIDTH = tuple(d.width for d in TABLE)
NP_DTYPE = {d.name: d.numpy for d in TABLE}
FLOATS = frozenset(d.name for d in TABLE if d.is_float)
INT_RANGE = {d.name: (d.lo, d.hi) for d in TABLE if not d.is_float}
DT_I8, DT_F16, DT_I32, DT_F32, DT_BF16 = (DTYPE_CODE[n] for n in ("i8", "f16", "i32", "f32", "bf16"))
FLOAT_DTYPES = tuple(d.code for d in TABLE if d.is_float)


def is_float(dtype: str) -> bool:
    return BY_NAME[dtype].is_float


def dtype_width(dt: str | int) -> int:
    return DTYPE_WIDTH[dt if isinstance(dt, int) else DTYPE_CODE[dt]]
