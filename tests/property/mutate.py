"""Mutations of a valid program, for the property tests: each returns a new Program.

Issue cycles come from NOP padding, so moving one instruction by one cycle adjusts the NOPs
around it (the rest of its queue stays in place); removing a NOP moves the rest of the queue.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.machine import UNIT_ICU

UNIT = np.array([s.unit for s in O.OPS])
PRODUCERS = frozenset(s.code for s in O.OPS if s.unit != UNIT_ICU and any(n == "out" for n, _ in s.fields))


def _copy(p, **cols):
    base = {k: getattr(p, k).copy() for k in ("queue", "op", "args", "line", "node")}
    base.update(cols)
    return dataclasses.replace(p, **base)


def _insert_nop(p, at, n=1):
    row = np.zeros((1, p.args.shape[1]), np.int32)
    row[0, 0] = n
    return _copy(p, queue=np.insert(p.queue, at, p.queue[at]), op=np.insert(p.op, at, O.NOP),
                 args=np.insert(p.args, at, row, axis=0), line=np.insert(p.line, at, 0),
                 node=np.insert(p.node, at, -1))


def _same_q(p, i, j):
    return 0 <= j < len(p.op) and p.queue[j] == p.queue[i]


def can_move(p, i, delta) -> bool:
    """Instruction i can move by delta (+-1) without moving any other instruction (one that a
    REPEAT follows cannot: the NOP it leaves would split it from its repetitions)."""
    if _same_q(p, i, i + 1) and p.op[i + 1] == O.REPEAT:
        return False
    if delta < 0:
        return _same_q(p, i, i - 1) and p.op[i - 1] == O.NOP and p.args[i - 1, 0] >= 1
    return not _same_q(p, i, i + 1) or (p.op[i + 1] == O.NOP and p.args[i + 1, 0] >= 1)


def move(p, i, delta):
    assert can_move(p, i, delta)
    q = _copy(p)
    if delta < 0:
        q.args[i - 1, 0] -= 1
        if _same_q(q, i, i + 1) and q.op[i + 1] == O.NOP:
            q.args[i + 1, 0] += 1
        elif _same_q(q, i, i + 1):
            q = _insert_nop(q, i + 1)
        return q
    if _same_q(q, i, i + 1):
        q.args[i + 1, 0] -= 1
    if q.op[i - 1] == O.NOP:
        q.args[i - 1, 0] += 1
        return q
    return _insert_nop(q, i)


def swap_bank(p, i):
    q = _copy(p)
    q.args[i, 0] = (q.args[i, 0] + 1) % p.machine.banks_per_slice
    return q


def swap_stream(p, i):
    """Move a READ's output to the next stream of its direction."""
    assert p.op[i] == O.READ
    q = _copy(p)
    ref = int(q.args[i, 2])
    dt, d, s = O.split_ref(ref)
    q.args[i, 2] = O.make_ref(dt, d, (s + 1) % p.machine.streams_per_direction)
    return q


def remove(p, j):
    keep = np.ones(len(p.op), bool)
    keep[j] = False
    return _copy(p, **{k: getattr(p, k)[keep] for k in ("queue", "op", "args", "line", "node")})


def producers(p, delta=0):
    """Instructions whose result goes on a stream (movable by delta if given)."""
    idx = np.flatnonzero(np.isin(p.op, list(PRODUCERS)))
    return [int(i) for i in idx if not delta or can_move(p, int(i), delta)]


def nops_before_producers(p):
    """NOPs (n >= 1) directly followed, in their queue, by a producer."""
    j = np.flatnonzero((p.op[:-1] == O.NOP) & (p.args[:-1, 0] >= 1) & (p.queue[:-1] == p.queue[1:])
                       & np.isin(p.op[1:], list(PRODUCERS)))
    return [int(x) for x in j]


def bank_pairs(p, cycles):
    """MEM READ/WRITEs whose slice accesses its other bank in the same cycle (cycles: issue cycle per
    instruction, -1 for none)."""
    m = p.machine
    mem = np.flatnonzero(np.isin(p.op, (O.READ, O.WRITE)))
    key = {}
    for i in mem:
        key.setdefault((int(p.queue[i] - 1) // 2, int(cycles[i])), []).append(int(i))
    return [i for group in key.values() if len(group) > 1 for i in group
            if len({int(p.args[j, 0]) for j in group}) > 1] if m.banks_per_slice == 2 else []
