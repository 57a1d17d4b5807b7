"""The chip-to-chip instructions inside the jitted core (emulator/core.py calls `c2c_exec`), so
that a chip of a system runs a whole window of cycles in one call (emulator/c2c.py).

A chip's link state is the tuple `links` = (ctl, last_send, out_link, out_cycle, out_pay,
in_arrival, in_pay, in_head, in_tail):
- ctl int64[8]: L_UNTIL (a RECV at or after this cycle pauses the run: hz[0] = H_C2C, the host
  delivers what the other chips sent and calls again from it), L_OUT (vectors in the outbox),
  L_SLOT (a link's cycles per vector), L_SENT, L_RECEIVED (counts), L_ON (0: no system; a C2C
  instruction hands itself to the host, which refuses it: a one-chip run of a system's chip).
- last_send int64[links]: each link's last SEND cycle (NEVER before the first).
- the outbox, in execution order: out_link, out_cycle int64[sends], out_pay uint8[sends, lanes]
  (the host takes it after each call and empties it).
- the inbox: every RECV of the program has a row of in_arrival int64[recvs] and
  in_pay uint8[recvs, lanes]; link j's rows are a block [in_base[j], in_base[j + 1]) (per-link
  RECV counts), filled by the host in arrival order from in_tail[j] and taken from in_head[j].

SEND reads its byte plane from the stream at the link's position in its cycle; it is the hazard
H_LINK_BUSY (x0 link, x1 the previous SEND's cycle) if the link still carries the previous
vector. RECV takes the oldest vector delivered to its link; H_LINK_EARLY (x0 link, x1 its
arrival, or -1 if none was delivered) if it has not arrived by its cycle; its payload goes on
the stream at the link's position in the same cycle.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import C_SEND
from lpu.emulator.core_streams import H_C2C, copy_run, operand_error, ref_ok, stream_read, stream_write

H_LINK_EARLY, H_LINK_BUSY = 20, 21
L_UNTIL, L_OUT, L_SLOT, L_SENT, L_RECEIVED, L_ON = range(6)
NEVER = -(1 << 62)


def links_state(lanes: int, n_links: int, sends: int, recv_per_link, slot: int, on: bool) -> tuple:
    """A chip's link state (above), empty: room for `sends` outgoing vectors and, per link, the
    number of vectors its RECVs take."""
    per = np.zeros(n_links, np.int64)
    per[:len(recv_per_link)] = recv_per_link
    base = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    ctl = np.zeros(8, np.int64)
    ctl[L_SLOT], ctl[L_ON] = slot, int(on)
    recvs = int(base[-1])
    return (ctl, np.full(max(n_links, 1), NEVER, np.int64), np.zeros(sends, np.int64), np.zeros(sends, np.int64),
            np.zeros((sends, lanes), np.uint8), np.zeros(recvs, np.int64), np.zeros((recvs, lanes), np.uint8),
            base[:-1].copy(), base[:-1].copy())


NO_LINKS = links_state(1, 0, 0, (), 0, False)


@njit(cache=True, inline="always")
def c2c_exec(op, ref, link, p, t, ex, spd, ring, ctl, last_send, out_link, out_cycle, out_pay, in_arrival, in_pay,
             in_head, in_tail, sa, hz):
    if op != C_SEND and t >= ctl[L_UNTIL]:     # the host delivers first
        hz[0] = H_C2C
        return False
    if not ref_ok(ref, 1, spd):
        return operand_error(hz, 0, ref)
    if op == C_SEND:
        last = last_send[link]
        if last != NEVER and t - last < ctl[L_SLOT]:
            hz[0], hz[3], hz[4] = H_LINK_BUSY, link, last
            return False
        if not stream_read(ref, 1, p, t, ring, sa, hz):
            return False
        n = ctl[L_OUT]
        out_link[n], out_cycle[n] = link, t
        copy_run(sa[0], out_pay[n])
        ctl[L_OUT] = n + 1
        ctl[L_SENT] += 1
        last_send[link] = t
        return True
    h = in_head[link]
    if h == in_tail[link] or in_arrival[h] > t:
        hz[0], hz[3], hz[4] = H_LINK_EARLY, link, in_arrival[h] if h < in_tail[link] else -1
        return False
    copy_run(in_pay[h], sa[0])
    in_head[link] = h + 1
    ctl[L_RECEIVED] += 1
    return stream_write(ref, 1, p, t, ex, ring, sa, hz)
