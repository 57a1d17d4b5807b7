"""The INST section of a `.lpubin` (isa/encoding.py has the file layout): instructions column by
column, each delta-coded or not and zlib-compressed; the jitted loops are in encoding_core.py."""
from __future__ import annotations

import struct
import zlib

import numpy as np

from lpu.isa import encoding_core as C
from lpu.isa.opcodes import NARGS, OPS
from lpu.isa.program import Program

# Instructions are stored column by column, each column delta-coded or not (whichever a sample says
# is smaller) and compressed with zlib: runs of the same queue, opcode and stepping addresses shrink
# to a few bits each (bert_base: 156 MB of 19-byte records -> about 5.5 MB).
ZLIB_LEVEL = 3
_SAMPLE = 1 << 16


def _coded(src, order: np.ndarray, mode: int) -> tuple:
    """(width, bytes) of src[order] as values (mode 0) or deltas (mode 1), in the narrowest width."""
    d, lo, hi = C.column(src, order, mode == 1)
    w = next(w for w in (1, 2, 4, 8) if lo >= -2**(8 * w - 1) and hi < 2**(8 * w - 1))
    return w, d.astype(f"<i{w}").tobytes()


def _column_bytes(src, order: np.ndarray) -> tuple:
    """(mode, width, bytes) of src[order], coded the way four spread pieces of it compress better."""
    n = order.shape[0]
    if n > 4 * _SAMPLE:
        at = np.linspace(0, n - _SAMPLE, 4).astype(np.int64)
        sample = np.concatenate([order[a:a + _SAMPLE] for a in at])
    else:
        sample = order
    mode = min((0, 1), key=lambda m: len(zlib.compress(_coded(src, sample, m)[1], 1)))
    return (mode, *_coded(src, order, mode))


def _grouped(queue, op) -> np.ndarray:
    """The order that groups instructions by (queue, opcode), keeping their order within a group:
    the fields after queue and opcode are stored in it, so that a queue's READ addresses, say,
    follow each other and step evenly."""
    queue, op = np.asarray(queue), np.asarray(op)
    if queue.size and (queue.min() < 0 or queue.max() >= 2**16 or op.min() < 0 or op.max() >= len(OPS)):
        key = queue.astype(np.int64) * len(OPS) + op       # a damaged binary: its checks will say so
        return np.argsort(key, kind="stable")
    return C.grouped_order(queue, op, len(OPS))


def _columns(p: Program) -> list:
    """(column, order) pairs: queue and opcode in program order, then each arg, line and node in
    the grouped order."""
    args, order = np.asarray(p.args), _grouped(p.queue, p.op)
    ident = np.arange(len(order))
    rest = [args[:, j] for j in range(args.shape[1])] + [np.asarray(p.line), np.asarray(p.node)]
    return [(np.asarray(p.queue), ident), (np.asarray(p.op), ident)] + [(c, order) for c in rest]


def encode_columns(p: Program) -> list:
    """The section's bytes after its count, as a list of parts (the caller checked the fields)."""
    out = []
    for col, order in _columns(p):
        mode, width, raw = _column_bytes(col, order)
        z = zlib.compress(raw, ZLIB_LEVEL)
        out += [struct.pack("<BBI", mode, width, len(z)), z]
    return out


def decode_columns(take, fail, n: int) -> tuple:
    """(queue, op, args, line, node) int32 columns of n instructions; take(k) gives the next k
    bytes of the section, fail(message) raises the section's error."""
    names = ("queue", "opcode", *(f"arg {j}" for j in range(NARGS)), "line", "node")
    targets = None
    for k, what in enumerate(names):
        mode, width, size = struct.unpack("<BBI", take(6))
        if mode > 1 or width not in (1, 2, 4, 8):
            fail(f"column '{what}': bad mode {mode} or width {width}")
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(take(size), n * width)
        except zlib.error as e:
            fail(f"column '{what}': the compressed data is damaged ({e})")
        if len(raw) != n * width or not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
            fail(f"column '{what}': the compressed data does not hold {n} values of {width} bytes")
        if targets is None:      # the count is believed once the first column holds that many values
            queue, op, line, node = (np.empty(n, np.int32) for _ in range(4))
            args = np.empty((n, NARGS), np.int32)
            targets = [(queue, 0), (op, 0)] + [(args, j) for j in range(NARGS)] + [(line, 0), (node, 0)]
            order = np.arange(n)
        out, j = targets[k]
        if k == 2:
            order = _grouped(queue, op)
        bad = C.uncolumn(np.frombuffer(raw, f"<i{width}"), mode == 1, order, out[:, None] if out.ndim == 1 else out, j)
        if bad >= 0:
            fail(f"column '{what}': value {bad} is out of 32-bit range")
    return queue, op, args, line, node
