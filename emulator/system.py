"""Running a system of chips (compiler/system.py's `SystemProgram`): every chip runs its own
program (emulator/c2c.py); a vector sent on a link is delivered at its arrival cycle.

Conservative parallel simulation: every link's latency is at least W = system.min_latency
cycles, so a chip paused at cycle r sends nothing that arrives before r + W. The chips advance
window by window; after each window the vectors sent in it are delivered to their receivers,
and each chip may run next up to W past the earliest cycle at which another unfinished chip
waits (`_untils`): a pipeline's chips run one after another in a few windows. A chip may
compute (and send) past a window: only its RECVs wait for the others, so the result does not depend on how the
chips are grouped: all in this process (default), or in groups on `workers` local
processes (multiprocessing), or on Ray actors (emulator/cluster.py, the `cluster` extra).
"""
from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass

import numpy as np

from lpu.emulator import cluster
from lpu.emulator.system_group import Group, chip_values, full_index, part_index, rows_of, tile
from lpu.emulator.system_workers import ProcessGroup, Started, start
from lpu.isa.errors import LpuError
from lpu.isa.program import send_cycles

__all__ = ["SystemResult", "run_system", "start", "Started", "part_index", "chip_values"]


@dataclass
class SystemResult:
    outputs: dict
    states: dict
    cycles: int               # the system's: the last chip's
    chips: list               # [RunResult] per chip
    windows: int


def run_system(sp, values: dict, workers: int = 0, ray_address: str | None = None,
               trace: bool = False, started: Started | None = None) -> SystemResult:
    """Run the SystemProgram `sp` on `values` (every input, weight and state, by name); workers:
    0 = every chip in this process, N = groups of chips in N local processes, or with
    `ray_address` N Ray actors (emulator/cluster.py; 'local' starts Ray on this machine). With
    `trace`, every chip's RunResult keeps its trace (emulator/system_trace.py). `started`: the
    workers `start` made (closed here)."""
    system = sp.system
    if started is not None:
        try:
            return _drive(sp, started.give(values), values, parallel=True)
        finally:
            started.close()
    items = [(c, p, chip_values(p, values, rows_of(sp, c))) for c, p in enumerate(sp.chips)]
    if ray_address or (workers and workers > 1 and len(items) > 1):
        n = max(1, min(workers or len(items), len(items)))
        groups = []
        try:
            if ray_address:
                cluster.connect(ray_address)
                for g in range(n):
                    groups.append(cluster.RayGroup(Group, items[g::n], system.slot_cycles, trace))
            else:
                ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
                for g in range(n):
                    groups.append(ProcessGroup(items[g::n], system.slot_cycles, ctx, trace))
                for g in groups:
                    g.ready()
            return _drive(sp, groups, values, parallel=True)
        finally:
            for g in groups:
                g.close()
    return _drive(sp, [Group(items, system.slot_cycles, trace)], values, parallel=False)


def _routes(system, chip: int) -> np.ndarray:
    """int64[3, links]: per link of the chip, (peer chip, its link, latency); peer -1: no chip."""
    out = np.full((3, system.machine.c2c_links), -1, np.int64)
    for link in range(out.shape[1]):
        peer = system.peer(chip, link)
        if peer >= 0:
            out[:, link] = peer, system.link_between(chip, peer)[1], system.hop_between(chip, peer)
    return out


NEVER = 1 << 62


def _sends(sp) -> list:
    """Per chip: {peer: (the cycles of its SENDs to that peer, sorted; the link's latency)}, from
    its program alone (a chip has no stalls: an instruction issues at its static cycle)."""
    system, out = sp.system, []
    for c, p in enumerate(sp.chips):
        d = {}
        for link in range(system.machine.c2c_links):
            peer = system.peer(c, link)
            cycles = send_cycles(p, link) if peer >= 0 else []
            if cycles:
                d[peer] = (np.asarray(cycles, np.int64), system.hop_between(c, peer))
        out.append(d)
    return out


def _untils(paused: dict, waiting: list, first: dict, win: int, chips, sends: list) -> dict:
    """The cycle each chip may run to (its first RECV at or after it waits): every vector that
    arrives before it is delivered. Another chip paused at cycle r sends nothing before its
    next SEND at or after r (its program's: `_sends`), which arrives a link's latency later; a
    chip not started (it waits for its first vector: Group) sends nothing before that vector
    arrives, at the earliest its pending delivery or win after the earliest paused chip.
    Finished chips send nothing more. The same for any grouping of the chips: every figure is
    the whole system's."""
    lo = min(paused.values(), default=NEVER - win)
    at = dict(paused)
    for c in waiting:
        at[c] = min(first.get(c, NEVER), lo + win)
    until = dict.fromkeys(chips, NEVER)
    for d, r in at.items():
        for c, (cycles, hop) in sends[d].items():
            k = int(np.searchsorted(cycles, r))
            if k < len(cycles):
                until[c] = min(until[c], int(cycles[k]) + hop)
    return until


def _drive(sp, groups, values: dict, parallel: bool) -> SystemResult:
    system = sp.system
    owner = {}
    for gi, g in enumerate(groups):
        for c in (g.chips if isinstance(g, Group) else range(gi, len(sp.chips), len(groups))):
            owner[c] = gi
    win = system.min_latency
    windows, everyone = 0, range(len(sp.chips))
    sends = _sends(sp)
    until = _untils(dict.fromkeys(everyone, 0), [], {}, win, everyone, sends)
    routes = [_routes(system, c) for c in everyone]
    pending = [[] for _ in groups]
    while True:
        if parallel:
            for g, d in zip(groups, pending):
                g.send_step(until, d)
            answers = [g._get() for g in groups]
        else:
            answers = [g.step(until, d) for g, d in zip(groups, pending)]
        windows += 1
        pending = [[] for _ in groups]
        paused, waiting, first = {}, [], {}
        for sent, p, wait in answers:
            paused.update(p)
            waiting += wait
            for c, links, cycles, payloads in sent:
                peer, back, hop = routes[c][:, links]
                if (peer < 0).any():
                    k = int(np.flatnonzero(peer < 0)[0])
                    raise LpuError(f"chip {c} sends on link {int(links[k])} at cycle {int(cycles[k])}, which leads to "
                                   f"no chip of this {system.chips}-chip system")
                for to in np.unique(peer):
                    sel = np.flatnonzero(peer == to)
                    if int((cycles[sel] + hop[sel]).min()) < until[int(to)]:
                        raise AssertionError(f"chip {c} sent to chip {int(to)} before the cycle its window assumed")
                    pending[owner[int(to)]].append((int(to), back[sel], cycles[sel] + hop[sel], payloads[sel]))
                    first[int(to)] = min(first.get(int(to), NEVER), int((cycles[sel] + hop[sel]).min()))
        if not paused and not any(pending):
            break
        until = _untils(paused, waiting, first, win, everyone, sends)
    results = {}
    if parallel:                          # every group finishes (and sends its results) at once
        for g in groups:
            g.send_finish()
        for g in groups:
            results.update(g.finished())
        for g in groups:                  # (a worker may wait for another's results to be read)
            g.join()
    else:
        results.update(groups[0].finish())
    chips = [results[c] for c in range(len(sp.chips))]
    outputs, states = {}, {}
    for name, c in sp.outputs.items():
        outputs[name] = chips[c].outputs[name]
    parts = {}
    for c, r in enumerate(chips):
        rows = rows_of(sp, c)
        for name, arr in r.states.items():
            if name in rows:
                parts.setdefault(name, []).append((part_index(rows[name]), arr))
            else:
                states[name] = arr
    for name, got in parts.items():          # a split state: each chip's rows put back in place
        v = values[name]                     # (into a copy of the values only where they leave a gap)
        got = [(full_index(i, v.shape), arr) for i, arr in got]
        whole = np.empty(v.shape, v.dtype) if tile([i for i, _ in got], v.shape) else np.array(v, copy=True)
        for i, arr in got:
            whole[i] = arr
        states[name] = whole
    return SystemResult(outputs, states, max(r.cycles for r in chips), chips, windows)
