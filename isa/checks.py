"""Validation of instruction fields, shared by the encoder, the decoder and the assembler:
every opcode known, on a queue of its unit (and MXM role), unused args zero, ints in 32 bits,
dtype codes and stream refs valid for the machine, lines and nodes in range. Large programs
are checked by one jitted pass (checks_core.first_invalid), small ones by numpy rules; the
message always comes from the numpy rules."""
from __future__ import annotations

import numpy as np

from lpu.isa import checks_core as C
from lpu.isa.machine import UNIT_ICU, UNIT_NAMES, MachineConfig
from lpu.isa.opcodes import DTYPE_WIDTH, DTYPES, NARGS, OPS

KIND_CODES = {"int": 1, "ref": 2, "dtype": 3, "f32": 4}      # 0: the arg is unused
OP_KINDS = np.zeros((len(OPS), NARGS), np.int8)
for _s in OPS:
    for _j, (_, _kind) in enumerate(_s.fields):
        OP_KINDS[_s.code, _j] = KIND_CODES[_kind]
OP_UNIT = np.array([s.unit for s in OPS], np.int64)
OP_ROLE = np.array([s.role for s in OPS], np.int64)
I32 = (-2**31, 2**31 - 1)

JIT_MIN = 20_000       # instructions from which the jitted pass pays for itself


def check_instructions(machine: MachineConfig, queue, op, args, line=None, node=None, n_nodes=None):
    """The first invalid instruction as (index, message), or None if all are valid."""
    queue, op, args = (np.asarray(a) for a in (queue, op, args))
    n = op.shape[0]
    if queue.shape != (n,) or args.shape != (n, NARGS):
        return 0, f"columns have shapes {queue.shape}, {op.shape}, {args.shape}; expected ({n},), ({n}, {NARGS})"
    if n >= JIT_MIN and all(a.dtype in (np.int32, np.int64) for a in (queue, op, args)):
        # one jitted pass finds it (no int64 copies of the columns); the message comes from its row
        i = _first_invalid(machine, queue, op, args, line, node, n_nodes)
        if i < 0:
            return None
        one = _first_numpy(machine, queue[i:i + 1], op[i:i + 1], args[i:i + 1],
                           None if line is None else np.asarray(line)[i:i + 1],
                           None if node is None else np.asarray(node)[i:i + 1], n_nodes)
        return i, one[1]
    return _first_numpy(machine, queue, op, args, line, node, n_nodes)


def _first_invalid(machine, queue, op, args, line, node, n_nodes) -> int:
    nq = len(machine.queues)
    q_unit = np.array([q[1] for q in machine.queues], np.int64)
    q_role = np.array([q[3] for q in machine.queues], np.int64)
    zeros = np.zeros(0, np.int32)
    line = zeros if line is None else np.asarray(line)
    node = zeros if node is None else np.asarray(node)
    top = I32[1] if n_nodes is None else n_nodes - 1
    return int(C.first_invalid(queue, op, args, line, node, nq, q_unit, q_role, OP_UNIT, OP_ROLE,
                               OP_KINDS.astype(np.int64), np.asarray(DTYPE_WIDTH, np.int64),
                               machine.streams_per_direction, top, UNIT_ICU, len(line) > 0, len(node) > 0))


def _first_numpy(machine, queue, op, args, line, node, n_nodes):
    queue, op, args = (np.asarray(a, np.int64) for a in (queue, op, args))
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
        flag(((k == 1) | (k == 4)) & ((v < I32[0]) | (v > I32[1])),
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
        flag((line < 0) | (line > I32[1]), lambda i: f"line {line[i]} out of range")
    if node is not None:
        node = np.asarray(node, np.int64)
        top = I32[1] if n_nodes is None else n_nodes - 1
        flag((node < -1) | (node > top), lambda i: f"node {node[i]} out of range (program has {n_nodes} nodes)")
    return None if first is None else (first[0], first[1](first[0]))
