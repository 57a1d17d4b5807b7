"""Jitted once-per-program set-up (emulator/run.py `schedule`, emulator/prepare.py
`by_reference`): arrays in, arrays out, every table and constant an argument. Each is one or two
linear passes that write their results once, in place: the numpy versions (lexsort of five
keys, searchsorted over every READ) cost seconds and hundreds of MB of fresh temporaries on a
12-layer program (bert_base: 4.9M executed instructions)."""
import numpy as np
from numba import njit


@njit(cache=True)
def places(queue, op, args, issue, is_unit, repeat_op, phase, cycles):
    """The schedule's counting sort (see `expand`): int64[cycles * phases + 1], entry
    c * phases + p the place of the first executed instruction of cycle c and phase p, the
    last entry the number of executed instructions (`cycles`: above every cycle)."""
    nphase = phase.max() + 1
    at = np.zeros(cycles * nphase + 1, np.int64)
    for i in range(op.shape[0]):
        if op[i] == repeat_op:
            for j in range(1, args[i, 0] + 1):
                at[(issue[i - 1] + j * args[i, 1]) * nphase + phase[op[i - 1]] + 1] += 1
        elif is_unit[op[i]]:
            at[issue[i] * nphase + phase[op[i]] + 1] += 1
    for c in range(cycles * nphase):
        at[c + 1] += at[c]
    return at


@njit(cache=True)
def expand(queue, op, args, issue, is_unit, repeat_op, phase, field, latency, at, dense, cyc, src, rep, que, ops,
           eargs, lat):
    """The schedule into (cyc, src, rep, que, ops, eargs, lat), as run.Schedule holds it: every
    unit instruction once, at its issue cycle, and the REPEAT copies of the instruction before
    each REPEAT (copy j at issue + j * d, its addr/row/acc field `field[op]` + j), sorted by
    (cycle, phase, queue, index, repetition). The program's instructions are in queue order, so
    visiting them in index order (each REPEAT's copies right after the instruction they copy)
    meets them in (queue, index, repetition) order: a stable counting sort by (cycle, phase)
    (`at`, from `places`, consumed) finishes the order, each instruction written once at its
    place. Not `dense` (a program whose cycles are mostly empty, e.g. a NOP of 2^31 cycles, whose
    table `at` would not fit): in visit order, for the caller's stable sort."""
    nphase = phase.max() + 1
    nf = args.shape[1]
    for i in range(op.shape[0]):
        if op[i] == repeat_op:
            s, copies, d = i - 1, args[i, 0], args[i, 1]
        elif is_unit[op[i]]:
            s, copies, d = i, 1, 0
        else:
            continue
        o = op[s]
        for j in range(copies):
            jj = j + 1 if d else 0
            c = issue[s] + jj * d
            if dense:
                t = at[c * nphase + phase[o]]
                at[c * nphase + phase[o]] = t + 1
            else:
                t = at[0]
                at[0] = t + 1
            cyc[t] = c
            src[t] = s
            rep[t] = jj
            que[t] = queue[s]
            ops[t] = o
            lat[t] = latency[o]
            for f in range(nf):
                eargs[t, f] = args[s, f]
            if field[o] >= 0:
                eargs[t, field[o]] += jj


@njit(cache=True)
def safe_reads(cycle, op, args, latency, uidx, is_mem, read_op, write_op, scatter_op, base, lo, nb, na, reach,
               ring_size, nrows):
    """bool[n]: the READs (of `cycle`-sorted instructions) whose row no WRITE (same row) or SCATTER
    (same slice and bank, an address in addr .. addr + reach - 1) changes from the READ's cycle
    to its cycle + latency + ring_size, both ends included. One backward pass: next_change[row]
    is the earliest cycle >= the current one in which the row may change; a cycle's WRITEs and
    SCATTERs are entered before its READs are judged."""
    n = cycle.shape[0]
    nxt = np.full(max(nrows, 1), np.iinfo(np.int64).max, np.int64)
    safe = np.zeros(n, np.bool_)
    i = n - 1
    while i >= 0:
        g = i
        while g > 0 and cycle[g - 1] == cycle[i]:
            g -= 1
        c = cycle[i]
        for e in range(g, i + 1):
            o = op[e]
            if not is_mem[o] or (o != write_op and o != scatter_op):
                continue
            bank, addr = args[e, 0], args[e, 1]
            if bank < 0 or bank >= nb or addr < 0 or addr >= na:
                continue
            pair = uidx[e] * nb + bank
            row = base[pair] + addr - lo[pair]
            top = addr + 1 if o == write_op else min(addr + reach, na)
            for r in range(row, row + top - addr):
                nxt[r] = c
        for e in range(g, i + 1):
            o = op[e]
            if o != read_op or not is_mem[o]:
                continue
            bank, addr = args[e, 0], args[e, 1]
            if bank < 0 or bank >= nb or addr < 0 or addr >= na:
                continue
            pair = uidx[e] * nb + bank
            safe[e] = nxt[base[pair] + addr - lo[pair]] > c + latency[e] + ring_size
        i = g - 1
    return safe
