"""The jitted placement loop of the scheduler (see schedule.py for the rules it enforces).

Arrays in, arrays out; the machine enters only through the arrays' shapes and the arguments
(latency per opcode, streams per direction). Resource tables, all indexed by cycle:

  qbusy[t, q]     1 if queue q issues (or is held) in cycle t
  bbusy[t, b]     1 if MEM bank b is accessed in cycle t
                  (cycle-major: the instructions of one chain try neighbouring cycles, so one
                  try reads a few neighbouring rows instead of one far row per queue)
  streams[d, k]   bitmask of the streams of direction d in use on diagonal k (at k + DIAG0)
  slot_w, slot_r  last cycle each SRAM plane slot was written / read (-1: never)
  markers         unit-state order markers (NONE: not set)
  hints           the anchor of the last chain placed with each hint key (NONE: none yet)
  state           [last issue + latency, busy end, window rows lo, hi, stream keys lo, hi, stream end]

While a chain is tried, its own reservations are marked 2 in the tables and taken back
after the try, so that "busy" (1) and "taken by this chain" (2) stay apart: only the first
lets the search jump ahead to the next cycle at which that resource is free.

`place` returns (status, chain, need): OK after the last chain; GROW when chain `chain`
needs cycle tables of at least `need` columns (the caller grows them and calls again from
that chain: nothing of it was committed); WIDE when the chain needs more streams on one
diagonal than there are; STUCK when no anchor was found within a million cycles.

Per chain it gives its earliest anchor (out_e) and stream ids (out_sid), and widens the window
of cells the searches looked at (state[2:6], rows and stream keys). With `again` set, the batch
is one placed before (its twin's tw_e, tw_cycle, tw_queue, tw_sid) and the tables are known to
equal the twin's shifted by `delta` over the twin's window (segments.py): each chain goes where
its search would go, the twin's anchor + delta, with the twin's queues and streams, without the
search, as long as its earliest anchor lies in [twin's earliest, twin's anchor] + delta; else
`place` returns (FAR, chain, 0) and the caller searches from that chain on.
"""
from __future__ import annotations

import numpy as np
from numba import njit

DIAG0 = 1 << 16       # diagonal k is stored at k + DIAG0 (k = T + koff may be negative); defined here,
                      # in the jitted module that freezes it, so that Numba's cache follows a change

OK, GROW, WIDE, STUCK, FAR = 0, 1, 2, 3, 4
NONE = -(1 << 60)
SEARCH = 1_000_000


@njit(cache=True)
def _busy(tab, r, t):
    return t >= 0 and t < tab.shape[0] and tab[t, r] != 0


@njit(cache=True)
def _earliest(i0, i1, floor, off, r_ptr, r_data, w_ptr, w_data, a_ptr, a_data, slot_w, slot_r, markers):
    """The earliest anchor allowed by data (RAW, WAR, WAW on SRAM slots) and marker order."""
    T = floor
    for i in range(i0, i1):
        o = off[i]
        if -o > T:
            T = -o
        for j in range(r_ptr[i], r_ptr[i + 1]):
            v = slot_w[r_data[j]] + 1 - o
            if v > T:
                T = v
        for j in range(w_ptr[i], w_ptr[i + 1]):
            g = w_data[j]
            v = slot_w[g] + 1 - o
            if v > T:
                T = v
            v = slot_r[g] + 1 - o
            if v > T:
                T = v
        for j in range(a_ptr[i], a_ptr[i + 1]):
            m = markers[a_data[j, 0]]
            if m != NONE and m + a_data[j, 1] - o > T:
                T = m + a_data[j, 1] - o
    return T


@njit(cache=True, inline="always")
def earliest_of(c, ins_ptr, hint, hint_delta, off, r_ptr, r_data, w_ptr, w_data, a_ptr, a_data,
                slot_w, slot_r, markers, hints):
    """The earliest anchor chain c may have now (data, markers, its hint), as `place` finds it."""
    floor = 0
    h = hint[c]
    if h >= 0 and hints[h] != NONE and hints[h] + hint_delta[c] > floor:
        floor = hints[h] + hint_delta[c]
    return _earliest(ins_ptr[c], ins_ptr[c + 1], floor, off, r_ptr, r_data, w_ptr, w_data, a_ptr, a_data,
                     slot_w, slot_r, markers)


@njit(cache=True)
def rows_equal(now, a0, snap, s0, n):
    """now[a0:a0+n] == snap[s0:s0+n], rows past the end of snap (or of now) counting as zero."""
    both = max(0, min(n, now.shape[0] - a0, snap.shape[0] - s0))
    for r in range(both):
        for k in range(now.shape[1]):
            if now[a0 + r, k] != snap[s0 + r, k]:
                return False
    for r in range(both, n):
        for k in range(now.shape[1]):
            x = now[a0 + r, k] if a0 + r < now.shape[0] else 0
            y = snap[s0 + r, k] if s0 + r < snap.shape[0] else 0
            if x != y:
                return False
    return True


@njit(cache=True)
def _has_run(used, w, nstreams):
    """Whether the streams not in the bitmask `used` include w consecutive ones."""
    free = ~used & ((1 << nstreams) - 1)
    run = free
    for k in range(1, w):
        run &= free >> k
    return run != 0


@njit(cache=True)
def _alone_fails(i, t, bank, qg, qg_ptr, qg_q, qbusy, bbusy):
    """Instruction i cannot issue in cycle t even with the rest of its chain elsewhere."""
    b = bank[i]
    if b >= 0 and _busy(bbusy, b, t):
        return True
    for j in range(qg_ptr[qg[i]], qg_ptr[qg[i] + 1]):
        if not _busy(qbusy, qg_q[j], t):
            return False
    return True


@njit(cache=True)
def place(c0, ins_ptr, grp_ptr, hint, hint_delta, g_dir, g_koff, g_w,
          qg, off, op, bank, args, p_ptr, p_data, r_ptr, r_data, w_ptr, w_data,
          a_ptr, a_data, m_ptr, m_data, e_ptr, e_data, qg_ptr, qg_q, lat, nstreams,
          qbusy, bbusy, streams, slot_w, slot_r, markers, hints, out_cycle, out_queue, out_e, out_sid, state,
          again, delta, tw_e, tw_cycle, tw_queue, tw_sid):
    cap = qbusy.shape[0]
    scap = streams.shape[1]
    nch = len(ins_ptr) - 1
    most = 1
    for c in range(c0, nch):
        k = 2 * (ins_ptr[c + 1] - ins_ptr[c]) + e_ptr[ins_ptr[c + 1]] - e_ptr[ins_ptr[c]]
        if k > most:
            most = k
    undo_r = np.empty(most, np.int64)        # (row, cycle, table) of this try's marks
    undo_t = np.empty(most, np.int64)
    undo_k = np.empty(most, np.int64)
    gmax = 1
    for c in range(c0, nch):
        if grp_ptr[c + 1] - grp_ptr[c] > gmax:
            gmax = grp_ptr[c + 1] - grp_ptr[c]
    sid = np.empty(gmax, np.int64)
    smask = np.empty(gmax, np.int64)
    for c in range(c0, nch):
        i0, i1, g0, g1 = ins_ptr[c], ins_ptr[c + 1], grp_ptr[c], grp_ptr[c + 1]
        for a in range(g0, g1 if not again else g0):
            need = 0
            for b in range(g0, g1):
                if g_dir[b] == g_dir[a] and g_koff[b] == g_koff[a]:
                    need += g_w[b]
            if need > nstreams:
                return WIDE, c, need
        maxoff, minoff, minkoff, maxkoff = 0, 0, 0, 0
        for i in range(i0, i1):
            maxoff = max(maxoff, off[i])
            minoff = min(minoff, off[i])
            for j in range(e_ptr[i], e_ptr[i + 1]):
                maxoff = max(maxoff, e_data[j, 1])
                minoff = min(minoff, e_data[j, 1])
        for a in range(g0, g1):
            maxkoff = max(maxkoff, g_koff[a])
            minkoff = min(minkoff, g_koff[a])
        h = hint[c]
        T = earliest_of(c, ins_ptr, hint, hint_delta, off, r_ptr, r_data, w_ptr, w_data, a_ptr, a_data,
                        slot_w, slot_r, markers, hints)
        E = T
        limit = T + SEARCH
        placed = False
        if again:        # the twin's anchor, queues and streams, where the search would find them
            lo, A = tw_e[c] + delta, tw_cycle[i0] - off[i0] + delta
            if E < lo or E > A:
                return FAR, c, 0
            E, T = lo, A
            if T + maxoff >= cap or T + maxkoff + DIAG0 >= scap:
                return GROW, c, T + max(maxoff, maxkoff + DIAG0) + 1
            for i in range(i0, i1):
                out_queue[i] = tw_queue[i]
            for a in range(g0, g1):
                sid[a - g0] = tw_sid[a]
                smask[a - g0] = ((1 << g_w[a]) - 1) << tw_sid[a]
            placed = True
        while not placed and T < limit:
            # skip ahead while an instruction with one possible queue finds it busy
            moved = True
            while moved:
                moved = False
                for i in range(i0, i1):
                    q0 = qg_ptr[qg[i]]
                    if qg_ptr[qg[i] + 1] - q0 != 1:
                        continue
                    while _busy(qbusy, qg_q[q0], T + off[i]):
                        T += 1
                        moved = True
                    for j in range(e_ptr[i], e_ptr[i + 1]):
                        while _busy(qbusy, e_data[j, 0], T + e_data[j, 1]):
                            T += 1
                            moved = True
            if T + maxoff >= cap or T + maxkoff + DIAG0 >= scap:
                return GROW, c, T + max(maxoff, maxkoff + DIAG0) + 1
            # try anchor T: queues (first free of each group), extra queue cycles, banks
            nu = 0
            ok = True
            fail = -1
            for i in range(i0, i1):
                t = T + off[i]
                b = bank[i]
                if b >= 0:
                    v = bbusy[t, b]
                    if v != 0:
                        if v == 1:
                            fail = i
                        ok = False
                        break
                    bbusy[t, b] = 2
                    undo_r[nu], undo_t[nu], undo_k[nu] = b, t, 1
                    nu += 1
                chosen = -1
                mine = False
                for j in range(qg_ptr[qg[i]], qg_ptr[qg[i] + 1]):
                    v = qbusy[t, qg_q[j]]
                    if v == 0:
                        chosen = qg_q[j]
                        break
                    if v == 2:
                        mine = True
                if chosen < 0:
                    if not mine:
                        fail = i
                    ok = False
                    break
                qbusy[t, chosen] = 2
                undo_r[nu], undo_t[nu], undo_k[nu] = chosen, t, 0
                nu += 1
                out_queue[i] = chosen
                for j in range(e_ptr[i], e_ptr[i + 1]):
                    eq, et = e_data[j, 0], T + e_data[j, 1]
                    if qbusy[et, eq] != 0:
                        ok = False
                        break
                    qbusy[et, eq] = 2
                    undo_r[nu], undo_t[nu], undo_k[nu] = eq, et, 0
                    nu += 1
                if not ok:
                    break
            for u in range(nu):
                if undo_k[u] == 0:
                    qbusy[undo_t[u], undo_r[u]] = 0
                else:
                    bbusy[undo_t[u], undo_r[u]] = 0
            if not ok:
                T += 1
                if fail >= 0:        # jump to where the failing instruction fits on its own
                    while _alone_fails(fail, T + off[fail], bank, qg, qg_ptr, qg_q, qbusy, bbusy):
                        T += 1
                continue
            # streams: w consecutive free streams per group on its diagonal (first fit)
            for a in range(g0, g1):
                d, key, w = g_dir[a], T + g_koff[a] + DIAG0, g_w[a]
                used = streams[d, key]
                for b in range(g0, a):
                    if g_dir[b] == d and g_koff[b] == g_koff[a]:
                        used |= smask[b - g0]
                full = (1 << w) - 1
                s = -1
                for x in range(nstreams - w + 1):
                    if (used >> x) & full == 0:
                        s = x
                        break
                if s < 0:
                    ok = False
                    fail = a
                    break
                sid[a - g0] = s
                smask[a - g0] = full << s
            if not ok:
                T += 1       # jump to where the failing group finds a run of free streams on its own
                while T + g_koff[fail] + DIAG0 < scap and not _has_run(
                        streams[g_dir[fail], T + g_koff[fail] + DIAG0], g_w[fail], nstreams):
                    T += 1
                continue
            placed = True
            break
        if not placed:
            return STUCK, c, T
        # commit; the window of cells this chain's search looked at: anchors E..T
        out_e[c] = E
        for a in range(g0, g1):
            streams[g_dir[a], T + g_koff[a] + DIAG0] |= smask[a - g0]
            out_sid[a] = sid[a - g0]
        state[1] = max(state[1], T + maxoff + 1)
        state[2] = min(state[2], E + minoff)
        state[3] = max(state[3], T + maxoff)
        state[4] = min(state[4], E + minkoff + DIAG0)
        state[5] = max(state[5], T + maxkoff + DIAG0)
        state[6] = max(state[6], T + maxkoff + DIAG0 + 1)
        for i in range(i0, i1):
            t = T + off[i]
            qbusy[t, out_queue[i]] = 1
            for j in range(e_ptr[i], e_ptr[i + 1]):
                qbusy[T + e_data[j, 1], e_data[j, 0]] = 1
            if bank[i] >= 0:
                bbusy[t, bank[i]] = 1
            for j in range(r_ptr[i], r_ptr[i + 1]):
                if slot_r[r_data[j]] < t:
                    slot_r[r_data[j]] = t
            for j in range(w_ptr[i], w_ptr[i + 1]):
                slot_w[w_data[j]] = t
            for j in range(m_ptr[i], m_ptr[i + 1]):
                v = t + m_data[j, 1]
                if markers[m_data[j, 0]] < v:
                    markers[m_data[j, 0]] = v
            for j in range(p_ptr[i], p_ptr[i + 1]):
                gl = p_data[j, 1]
                args[i, p_data[j, 0]] = p_data[j, 3] * 256 + g_dir[g0 + gl] * 64 + sid[gl] + p_data[j, 2]
            out_cycle[i] = t
            end = t + lat[op[i]]
            if end > state[0]:
                state[0] = end
        if h >= 0:
            hints[h] = T
    return OK, nch, 0
