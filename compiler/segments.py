"""Trips of a loop placed again where the placement is provably the previous trip's, shifted.

Lowering replays a loop's trips (replay.py), so the scheduler receives, trip after trip, the
same chains (other SRAM slots of the same banks). Placing chains is the back end's largest cost
left per trip. A trip's chains are a *segment*: the batches placed between the start of that
trip and the start of the next (`Scheduler.begin_segment`). Segment k is placed as segment k-1
shifted by delta cycles, with no search, when that is where the search would put every chain:

  - its batches are the twin's, field by field, except SRAM slots, addresses, node and line
    (the only inputs of the search those leave out are the slots' last read and write cycles,
    which enter through each chain's earliest anchor, checked below);
  - the resource tables (queues, banks, streams) now, over every cell the twin's searches looked
    at, shifted by delta, equal the tables when the twin started (a snapshot taken then);
  - each chain's earliest anchor (data, markers, hint) lies between the twin's earliest anchor
    and its anchor, both shifted by delta (`place_core.place` with `again` set).

By induction over the chains in order the tables stay equal over that window, so each search
would look at the same cells, find the same ones busy, and stop at the same shifted anchor with
the same queues and streams. Where any condition fails, that chain and the rest of the segment
are searched as usual: the result is always the search's, only cheaper.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import place_core as P

BIG = 1 << 60
NO_WINDOW = (BIG, -BIG, BIG, -BIG)    # rows lo, hi, stream keys lo, hi before any chain widens them
REACH = 1 << 16    # cycles before a loop's first trip its snapshot starts (a later trip's: its twin's window)

# the fields of a ChainArrays batch the search reads (not slots, addresses, node, line)
SHAPE_FIELDS = ("ins_ptr", "grp_ptr", "hint", "hint_delta", "g_dir", "g_koff", "g_w", "qg", "off", "op",
                "bank", "p_ptr", "p_data", "r_ptr", "w_ptr", "a_ptr", "a_data", "m_ptr", "m_data",
                "e_ptr", "e_data")


class Segment:
    """One trip's placement: its batches (arrays, earliest anchors, cycles, queues, streams), the
    window of table cells its searches looked at, and the tables when it started."""

    def __init__(self, loop: int, trip: int, twin: "Segment | None"):
        self.loop, self.trip, self.twin = loop, trip, twin
        self.batches: list = []
        self.again = twin is not None      # still placing the twin's placement, shifted
        self.delta = 0
        self.window = None                 # (rows lo, hi, stream keys lo, hi), inclusive
        self.snap = None                   # (first row, qbusy rows, bbusy rows, first key, streams)
        self.more = True                   # another trip follows (else no snapshot is taken)


def same_chains(a, b) -> bool:
    """Whether two batches differ at most in slots, addresses, node and line."""
    if a.n_chains != b.n_chains or a.n_ins != b.n_ins:
        return False
    for f in SHAPE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is not y and (x.shape != y.shape or not np.array_equal(x, y)):
            return False
    return True


def snapshot(sched, first_row: int, first_key: int):
    """The tables from first_row (stream keys from first_key) to the last cell used so far."""
    first_row, first_key = max(0, first_row), max(0, first_key)
    end, kend = int(sched.state[1]), int(sched.state[6])
    return (first_row, sched.qbusy[first_row:max(end, first_row)].copy(),
            sched.bbusy[first_row:max(end, first_row)].copy(),
            first_key, sched.streams[:, first_key:max(kend, first_key)].copy())


def tables_match(sched, twin: Segment, delta: int) -> bool:
    """Whether the tables now equal the twin's snapshot, shifted by delta, over its window."""
    if twin.window is None or twin.snap is None:
        return False
    lo, hi, klo, khi = twin.window
    row0, qb, bb, key0, st = twin.snap
    if lo < row0 or klo < key0 or lo + delta < 0 or klo + delta < 0:
        return False
    n, kn = hi - lo + 1, khi - klo + 1
    return (P.rows_equal(sched.qbusy, lo + delta, qb, lo - row0, n)
            and P.rows_equal(sched.bbusy, lo + delta, bb, lo - row0, n)
            and P.rows_equal(sched.streams.T, klo + delta, st.T, klo - key0, kn))
