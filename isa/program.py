"""`Program`: what the compiler produces and the emulator runs.

Instructions are kept as structure-of-arrays integer columns, grouped by queue (all of queue 0
in issue order, then queue 1, ...): `queue`, `op`, `args[:, NARGS]`, `line` (DSL source line, 0
if none) and `node` (index into `nodes`, the IR op it came from, -1 if none).

Symbols say where each named tensor lives. A tensor of shape [..., C] is stored as vectors: one
per index of the leading axes (row-major) and per chunk of `lanes` columns of the last axis
(a scalar is [1, 1], a 1-D tensor [1, C]). Vector v of a w-byte dtype has its byte plane b at
(slices[v, b], banks[v, b], addrs[v, b]); lanes past the last column hold 0.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.machine import UNIT_ICU, MachineConfig
from lpu.isa.opcodes import NARGS, dtype_width


def vector_grid(shape: tuple, lanes: int) -> tuple[int, int, int]:
    """(rows, chunks, cols): the vector layout of a tensor of `shape` on `lanes` lanes."""
    if len(shape) == 0:
        return 1, 1, 1
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return rows, max(1, -(-cols // lanes)), cols


@dataclass
class Symbol:
    name: str
    kind: str            # "input" | "weight" | "state" | "output" | "const"
    dtype: str
    shape: tuple
    slices: np.ndarray   # int32 [nvec, width]
    banks: np.ndarray
    addrs: np.ndarray
    data: np.ndarray | None = None   # constants only: the values

    @property
    def width(self) -> int:
        return dtype_width(self.dtype)

    def __eq__(self, other):
        if not isinstance(other, Symbol):
            return NotImplemented
        same_data = (self.data is None and other.data is None) or (
            self.data is not None and other.data is not None and np.array_equal(self.data, other.data))
        return (self.name, self.kind, self.dtype, tuple(self.shape)) == (
            other.name, other.kind, other.dtype, tuple(other.shape)) and same_data and all(
            np.array_equal(getattr(self, a), getattr(other, a)) for a in ("slices", "banks", "addrs"))


@dataclass
class Program:
    machine: MachineConfig
    queue: np.ndarray          # int32 [n]
    op: np.ndarray             # int32 [n]
    args: np.ndarray           # int32 [n, NARGS]
    line: np.ndarray           # int32 [n]
    node: np.ndarray           # int32 [n]
    symbols: list[Symbol] = field(default_factory=list)
    tables: np.ndarray = None  # int32 [ntables, lanes]: SXM permutation tables
    nodes: list = field(default_factory=list)   # [(ir op name, line)], indexed by `node`
    predicted_cycles: int = 0
    source_name: str = ""
    source_lines: list = field(default_factory=list)
    params: dict = field(default_factory=dict)   # the program's params as compiled (defaults and -p)

    def __post_init__(self):
        if self.tables is None:
            self.tables = np.zeros((0, self.machine.lanes), np.int32)

    @property
    def n_instructions(self) -> int:
        return int(self.op.shape[0])

    def symbol(self, name: str) -> Symbol:
        for s in self.symbols:
            if s.name == name:
                return s
        raise KeyError(name)

    def machine_hash(self) -> str:
        return config_hash(self.machine)

    def source_line(self, line: int) -> str:
        if 1 <= line <= len(self.source_lines):
            return self.source_lines[line - 1].strip()
        return ""

    def __eq__(self, other):
        if not isinstance(other, Program):
            return NotImplemented
        return (self.machine == other.machine and self.symbols == other.symbols
                and all(np.array_equal(getattr(self, a), getattr(other, a))
                        for a in ("queue", "op", "args", "line", "node", "tables"))
                and [tuple(n) for n in self.nodes] == [tuple(n) for n in other.nodes]
                and self.predicted_cycles == other.predicted_cycles
                and self.source_name == other.source_name and list(self.source_lines) == list(other.source_lines)
                and dict(self.params) == dict(other.params))

    def source_hash(self) -> str:
        """sha256 of the embedded source text (its lines joined by newlines), as hex."""
        return source_hash(self.source_lines)


def source_hash(lines) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()


def config_hash(machine: MachineConfig) -> str:
    return hashlib.sha256(json.dumps(machine.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def empty_columns(n: int):
    return (np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((n, NARGS), np.int32),
            np.zeros(n, np.int32), np.full(n, -1, np.int32))


def send_cycles(prog, link: int) -> list:
    """Issue cycles of the SENDs on a link, from its C2C queue's instructions alone (a queue's
    instructions are one run in the program; NOPs wait, REPEAT reissues the one before it)."""
    idx = np.flatnonzero(prog.queue == prog.machine.c2c_queue(link))
    if len(idx) == 0:
        return []
    assert idx[-1] - idx[0] + 1 == len(idx), "a queue's instructions are one run"
    op, args = prog.op[idx].astype(np.int64), prog.args[idx].astype(np.int64)
    icu = _ICU[op]
    dur = np.where(op == O.NOP, args[:, 0], np.where(op == O.REPEAT, args[:, 0] * args[:, 1], np.where(icu, 0, 1)))
    issue = np.cumsum(dur) - dur
    out = [int(c) for c in issue[op == O.SEND]]
    for r in np.flatnonzero((op == O.REPEAT)[1:]) + 1:
        if op[r - 1] == O.SEND:
            out += [int(issue[r - 1] + j * args[r, 1]) for j in range(1, int(args[r, 0]) + 1)]
    return sorted(out)


_ICU = np.array([s.unit == UNIT_ICU for s in O.OPS])
