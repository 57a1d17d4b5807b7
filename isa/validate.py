"""Validation of a `Program` beyond its instruction fields (isa/checks.check_instructions):
its symbol table, constants, permutation tables and the size of its instruction stream, checked
against the machine and the limits (isa/limits.py) before anything is sized from them.

`program_problems(p)` lists what is wrong as (instruction index or -1, message); the decoder
refuses a binary with any (a BinaryError), the checker (compiler/verify.py) reports them as
violations of kind "structure", so that `lpu verify` refuses every program `lpu run` cannot run.
"""
from __future__ import annotations

import math

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.limits import how_to_raise, limit
from lpu.isa.machine import UNIT_SXM, UNIT_VXM
from lpu.isa.program import Program, vector_grid

KINDS = ("input", "weight", "state", "output", "const", "link")   # link: received over a C2C link (isa/system.py)
LAYOUT = ("slices", "banks", "addrs")


def program_problems(p: Program, first_only: bool = False) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for check in (_stream_size, _symbols, _tables):
        out += check(p)
        if out and first_only:
            break
    return out


def _symbols(p: Program) -> list[tuple[int, str]]:
    m = p.machine
    slots = m.mem_slices * m.banks_per_slice * m.addresses_per_bank
    bounds = dict(zip(LAYOUT, (m.mem_slices, m.banks_per_slice, m.addresses_per_bank)))
    out, names = [], {}
    for s in p.symbols:
        what = f"symbol '{s.name}'"
        if s.kind not in KINDS:
            out.append((-1, f"{what} has unknown kind '{s.kind}' (known: {', '.join(KINDS)})"))
            continue
        if s.dtype not in O.DTYPES:
            out.append((-1, f"{what} has unknown dtype '{s.dtype}'"))
            continue
        group = "output" if s.kind == "output" else "const" if s.kind == "const" else "value"
        if group != "const" and (group, s.name) in names:
            out.append((-1, f"{what} is declared twice (as {names[group, s.name]} and {s.kind})"))
        names[group, s.name] = s.kind
        shape = tuple(s.shape)
        if any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            out.append((-1, f"{what} has shape {list(shape)}: every dimension must be a positive integer"))
            continue
        rows, chunks, _ = vector_grid(shape, m.lanes) if math.prod(shape) <= slots * m.lanes else (slots + 1, 1, 0)
        nvec = rows * chunks
        if nvec * s.width > slots:
            out.append((-1, f"{what} of shape {list(shape)} needs more SRAM than machine '{m.name}' has"))
            continue
        for a in LAYOUT:
            v = np.asarray(getattr(s, a))
            if v.shape != (nvec, s.width):
                out.append((-1, f"{what}: layout '{a}' has shape {list(v.shape)}, expected {[nvec, s.width]} "
                                f"(one entry per byte plane of each of its {nvec} vectors)"))
                break
            if v.size and (v.min() < 0 or v.max() >= bounds[a]):
                out.append((-1, f"{what}: layout '{a}' holds {int(v.min() if v.min() < 0 else v.max())}, "
                                f"out of range 0..{bounds[a] - 1}"))
                break
        if s.kind == "const":
            data = getattr(s, "data", None)
            if data is None:
                out.append((-1, f"{what} is a constant without data"))
            elif np.asarray(data).dtype.kind not in "biuf" or np.asarray(data).size != math.prod(shape):
                d = np.asarray(data)
                out.append((-1, f"{what}: its data is {d.dtype} with {d.size} elements, the shape {list(shape)} "
                                f"holds {math.prod(shape)} numbers"))
    return out


def operand_problems(p: Program) -> list[tuple[int, str]]:
    """Operand values the emulator refuses that the field encodings allow: a VXM lane count or
    immediate selector, an LW conversion, an SXM output of another dtype than its input."""
    op, args = np.asarray(p.op, np.int64), np.asarray(p.args, np.int64)
    out = []
    for code in np.unique(op).tolist():
        if not 0 <= code < len(O.OPS):
            continue
        spec = O.OPS[code]
        names = [n for n, _ in spec.fields]
        sel = np.flatnonzero(op == code)
        checks = []
        if spec.unit == UNIT_VXM and "nv" in names:
            nv = args[sel, names.index("nv")]
            checks.append(((nv < 0) | (nv > p.machine.lanes), lambda i: f"nv = {args[i, names.index('nv')]} lanes, "
                                                                        f"the machine has {p.machine.lanes}"))
        if "bimm" in names:
            b = args[sel, names.index("bimm")]
            checks.append(((b < 0) | (b > 2), lambda i: f"bimm = {args[i, names.index('bimm')]}, not 0, 1 or 2"))
        if spec.name == "LW":
            cvt, dt = args[sel, 2], args[sel, 1] >> 8
            plane = np.array([q[2] for q in p.machine.queues], np.int64)[np.asarray(p.queue, np.int64)[sel]]
            checks.append(((cvt != 0) & ((cvt != 1) | (dt != O.DT_I8) | (plane % 2 != 0)),
                           lambda i: f"cvt = {args[i, 2]}: 0, or 1 to widen an i8 row on an even plane"))
        if spec.unit == UNIT_SXM and "inp" in names and "out" in names:
            a, b = args[sel, names.index("inp")] >> 8, args[sel, names.index("out")] >> 8
            checks.append((a != b, lambda i: "its output's dtype differs from its input's"))
        for bad, what in checks:
            for i in sel[bad][:1]:
                out.append((int(i), f"{spec.name}: {what(int(i))}"))
    return out


def _tables(p: Program) -> list[tuple[int, str]]:
    t = np.asarray(p.tables)
    if t.ndim != 2 or t.shape[1] != p.machine.lanes or t.dtype.kind not in "iu":
        return [(-1, f"permutation tables have shape {list(t.shape)} ({t.dtype}), expected [n, {p.machine.lanes}] "
                     "integers")]
    op, args = np.asarray(p.op, np.int64), np.asarray(p.args, np.int64)
    out = []
    for code, field, hi, what in ((O.BY_NAME["PERMUTE"].code, 2, t.shape[0], "permutation table"),
                                  (O.BY_NAME["DISTRIBUTE"].code, 2, p.machine.lanes, "lane")):
        bad = np.flatnonzero((op == code) & ((args[:, field] < 0) | (args[:, field] >= hi)))
        for i in bad[:1]:
            out.append((int(i), f"{O.OPS[code].name} uses {what} {int(args[i, field])}, but there "
                                f"{'are' if hi != 1 else 'is'} {hi}"))
    return out


def _stream_size(p: Program) -> list[tuple[int, str]]:
    """The instruction stream expanded (REPEATs) stays within limits 'instructions' and 'cycles'."""
    op, q, args = (np.asarray(a, np.int64) for a in (p.op, p.queue, p.args))
    n = len(op)
    if not n:
        return []
    rep = op == O.REPEAT
    count, step = np.where(rep, args[:, 0], 0), np.where(rep, args[:, 1], 0)
    if np.any(count < 0) or np.any(rep & (step < 1)) or np.any((op == O.NOP) & (args[:, 0] < 0)):
        return []                   # the structure checks report these
    total = float(np.sum(count)) + n
    if total > limit("instructions"):
        i = int(np.argmax(count))
        return [(i, f"the program issues {int(total):,} instructions once REPEATs are expanded (the largest: "
                    f"REPEAT n={int(count[i]):,}); {how_to_raise('instructions')}")]
    # issue cycles, in floats (no int64 overflow): each queue's length in cycles
    unit = np.array([s.unit for s in O.OPS], np.int64)[np.clip(op, 0, len(O.OPS) - 1)]
    dur = np.where(op == O.NOP, args[:, 0].astype(np.float64),
                   np.where(rep, count.astype(np.float64) * step, (unit != 0).astype(np.float64)))
    per_queue = np.bincount(np.clip(q, 0, None), weights=dur)
    if per_queue.size and per_queue.max() > limit("cycles"):
        qi = int(np.argmax(per_queue))
        return [(int(np.flatnonzero(q == qi)[0]), f"queue {qi} issues until cycle {int(per_queue[qi]):,}; "
                 f"{how_to_raise('cycles')}")]
    return []
