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

import dataclasses
import mmap
import multiprocessing as mp
import os
from dataclasses import dataclass

import numpy as np

from lpu.emulator import blas, cluster
from lpu.emulator.c2c import H_LINK_UNREAD, ChipRun
from lpu.emulator.run import HazardError
from lpu.isa.dtypes import NP_DTYPE
from lpu.isa.errors import LpuError
from lpu.isa.program import send_cycles

LOADED = ("input", "weight", "state")


@dataclass
class SystemResult:
    outputs: dict
    states: dict
    cycles: int               # the system's: the last chip's
    chips: list               # [RunResult] per chip
    windows: int


def part_index(r) -> tuple:
    """The numpy index of a chip's part of a split tensor: `rows` holds (start, stop) of axis 0
    (a pipeline stage's rows) or ((start, stop) per axis) (a tensor-parallel rank's part)."""
    if len(r) == 2 and not isinstance(r[0], (tuple, list)):
        return (slice(int(r[0]), int(r[1])),)
    return tuple(slice(int(a), int(b)) for a, b in r)


def chip_values(program, values: dict, rows: dict) -> dict:
    """The values a chip loads: a split tensor's part (`rows`: name -> part_index's argument)."""
    out = {}
    for s in program.symbols:
        if s.kind in LOADED and s.name in values:
            v = values[s.name]
            out[s.name] = v[part_index(rows[s.name])] if s.name in rows else v
    return out


def _rows_of(sp, c: int) -> dict:
    return sp.rows[c] if getattr(sp, "rows", None) else {}


KEEP_BELOW = 20_000_000     # instructions in a group: above, a chip's emulator state is dropped when it ends


def _receives(program) -> bool:
    """A chip that waits for another before it computes: it receives a pipeline stage's input
    (a tensor-parallel rank's all-reduces, `@ar...`, come after its own work; a relay's buffer,
    `@<node>^`, may too: compiler/system_pp.py)."""
    return any(y.kind == "link" and not y.name.startswith("@ar") and not y.name.endswith("^")
               for y in program.symbols)


def _share_prepared(p, running) -> None:
    """A chip whose program is another running chip's (the same arrays: a tensor-parallel node's
    ranks) takes that chip's preparation (schedule, layout) with its own SRAM image and unit
    state, instead of preparing it again."""
    for q in running:
        hit = q.__dict__.get("_emulator_prepared")
        if q is not p and q.op is p.op and q.args is p.args and q.symbols is p.symbols and hit is not None:
            key = (p.queue, p.op, p.args, p.tables, p.symbols, p.machine)
            if all(a is b for a, b in zip(hit[0], key)):
                p.__dict__["_emulator_prepared"] = (key, dataclasses.replace(hit[1], workspace=None, mem=None))
            return


class Group:
    """Some chips of a system, run in this process. A chip that has run its last instruction is
    finished at once. In a group of more than KEEP_BELOW instructions a chip that receives starts
    when its first vector is delivered (before that it could only run ahead to its first RECV)
    and its prepared program and SRAM image are let go when it ends (a pipeline of 40 chips holds
    about two at a time); a smaller group prepares every chip at the start and keeps them for the
    next run, as a one-chip run keeps its own."""

    def __init__(self, items, slot_cycles: int, trace: bool = False):
        self.slot, self.trace = slot_cycles, trace
        self.chips = [c for c, _, _ in items]
        self.waiting = {c: (p, v) for c, p, v in items}
        self.keep = sum(len(p.op) for _, p, _ in items) < KEEP_BELOW
        self.runs, self.results = {}, {}
        for c, p, _ in items:                # a small group prepares every chip now (a worker
            if self.keep or not _receives(p):    # does so beside the others)
                self._start(c)

    def _start(self, c: int) -> None:
        p, v = self.waiting.pop(c)
        _share_prepared(p, [r.program for r in self.runs.values()])
        self.runs[c] = ChipRun(c, p, v, self.slot, trace=self.trace)

    def _end(self, c: int) -> None:
        r = self.runs.pop(c)
        self.results[c] = r.finish()
        if not self.keep:
            r.program.__dict__.pop("_emulator_prepared", None)

    def step(self, until: dict, deliveries: list):
        """Deliver [(chip, links, arrivals, payloads)], advance every chip c to until[c]. Returns
        (sent [(chip, links, cycles, payloads)], paused {chip: the cycle it waits at}, waiting:
        the chips not started)."""
        for c, links, arrivals, payloads in deliveries:
            if c in self.results:
                raise HazardError(f"hazard at cycle {int(arrivals[0])} on chip {c}: a vector delivered on link "
                                  f"{int(links[0])} after the chip's last instruction (no RECV took it)",
                                  int(arrivals[0]), "-", -1, "-", 0, H_LINK_UNREAD, "one RECV per vector sent")
            if c in self.waiting:
                self._start(c)
            self.runs[c].deliver(links, arrivals, payloads)
        sent, paused = [], {}
        for c, r in list(self.runs.items()):
            links, cycles, payloads = r.advance(until[c])
            if len(links):
                sent.append((c, links, cycles, payloads))
            if r.done:
                self._end(c)
            else:
                paused[c] = int(r.s.cycle[r.at])
        return sent, paused, list(self.waiting)

    def finish(self) -> dict:
        for c in list(self.waiting):          # never sent anything: it stops at its first RECV
            self._start(c)
            self.runs[c].advance(1 << 62)
        for c in list(self.runs):
            self._end(c)
        return self.results


def _worker(conn, items, slot_cycles, trace, shared=None, cores=1):
    try:
        blas.set_threads(cores)              # its share of the cores (ProcessGroup)
        if shared is not None:             # started ahead (`start`): items hold each chip's rows, not its values
            g = _ahead(conn, items, slot_cycles, trace, shared)
            if g is None:
                return
        else:
            g = Group(items, slot_cycles, trace)
        conn.send(("ok", None))
        while True:
            msg = conn.recv()
            if msg[0] == "step":
                conn.send(("ok", g.step(msg[1], msg[2])))
            elif msg[0] == "finish":
                conn.send(("ok", g.finish()))
                return
            else:
                return
    except LpuError as e:
        conn.send(("error", e))
    except Exception as e:  # noqa: BLE001  (an internal error: the parent raises it)
        conn.send(("crash", repr(e)))


def _ahead(conn, items, slot_cycles, trace, shared):
    """A worker started before the values exist makes its Group meanwhile (chips prepared, SRAM
    images allocated and their pages touched, the jitted core loaded: ChipRun.warm), makes its
    part of the integer values it is asked to (`Started.draw`), and loads the images when the
    values arrive. A group of KEEP_BELOW instructions or more, which starts its chips when they
    receive, only waits. None: the parent gave up."""
    ahead = sum(len(p.op) for _, p, _ in items) < KEEP_BELOW
    if ahead:
        g = Group([(c, p, None) for c, p, _ in items], slot_cycles, trace)
        for r in g.runs.values():
            r.warm()
    misplaced, drawn, scratch = [], {c: set() for c, _, _ in items}, {}
    while True:
        msg = conn.recv()
        if msg[0] == "draw":                 # (name, plan, k0, k1): values k0 .. k1 - 1 into the shared array
            name, plan, k0, k1 = msg[1:]
            if not plan.make(shared[name].reshape(-1), k0, k1):
                misplaced.append(name)
        elif msg[0] == "own":                # (name, plan, parts): each chip's part into its image
            name, plan, shape, parts = msg[1:]
            ok = True
            for c in g.runs:
                if c in parts:
                    ok &= g.runs[c].draw(name, plan, parts[c], shape, scratch)
                    drawn[c].add(name)
            if not ok:
                misplaced.append(name)
        elif msg[0] == "check":
            conn.send(("ok", misplaced))
        elif msg[0] == "values":
            break
        else:
            return None
    values = {**shared, **msg[1]}
    items = [(c, p, chip_values(p, values, rows)) for c, p, rows in items]
    if not ahead:
        return Group(items, slot_cycles, trace)
    for c, _, v in items:
        g.runs[c].reload(v, drawn[c] - set(v))
    return g


class ProcessGroup:
    """Some chips of a system, run in a local worker process."""

    def __init__(self, items, slot_cycles: int, ctx, trace: bool = False, shared=None, workers: int = 1):
        self.conn, child = ctx.Pipe()
        if ctx.get_start_method() != "fork":       # pickled: without the parent's prepared state
            items = [(c, dataclasses.replace(p), v) for c, p, v in items]
        cores = max(1, (os.cpu_count() or 1) // workers)      # BLAS threads: the workers share the cores
        self.proc = ctx.Process(target=_worker, args=(child, items, slot_cycles, trace, shared, cores), daemon=True)
        self.proc.start()

    def ready(self):
        """Wait until the worker has prepared its chips (every worker is started first, so
        that they prepare at the same time)."""
        self._get()

    def _get(self):
        kind, val = self.conn.recv()
        if kind == "error":
            raise val
        if kind == "crash":
            raise RuntimeError(f"system worker failed: {val}")
        return val

    def send_step(self, until, deliveries):
        self.conn.send(("step", until, deliveries))

    def step(self, until, deliveries):
        self.send_step(until, deliveries)
        return self._get()

    def send_finish(self):
        self.conn.send(("finish",))

    def finished(self):
        out = self._get()
        self.proc.join()
        return out

    def close(self):
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def shared_arrays(symbols) -> dict:
    """name -> a zeroed array of each symbol's dtype and shape, all in one anonymous shared
    mapping: what this process writes there after forking, its children read."""
    shapes = [(s.name, np.dtype(NP_DTYPE[s.dtype]), tuple(s.shape)) for s in symbols]
    sizes = [-(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // 64) * 64 for _, dt, shape in shapes]
    buf, out, at = mmap.mmap(-1, max(sum(sizes), 1)), {}, 0
    for (name, dt, shape), size in zip(shapes, sizes):
        out[name] = np.frombuffer(buf, dt, int(np.prod(shape, dtype=np.int64)), at).reshape(shape)
        at += size
    return out


def _boxes(sp, symbols) -> dict:
    """name -> {chip: its part, a full index of the whole} for the integer inputs and weights of
    which each chip holds a part and the parts tile the tensor (every value in one chip)."""
    out = {}
    for y in symbols:
        if y.kind not in ("input", "weight") or y.dtype not in ("i8", "i32"):
            continue
        shape, parts = tuple(y.shape), {}
        for c, p in enumerate(sp.chips):
            if any(q.name == y.name and q.kind == y.kind for q in p.symbols):
                rows = _rows_of(sp, c)
                part = part_index(rows[y.name]) if y.name in rows else ()
                parts[c] = tuple(slice(*sl.indices(d)[:2]) for sl, d in
                                 zip(part + (slice(None),) * (len(shape) - len(part)), shape))
        spans = [[(sl.start, sl.stop) for sl in part] for part in parts.values()]
        sizes = [int(np.prod([b - a for a, b in sp_], dtype=np.int64)) for sp_ in spans]
        apart = all(any(max(a0, b0) >= min(a1, b1) for (a0, a1), (b0, b1) in zip(u, v))
                    for i, u in enumerate(spans) for v in spans[:i])
        if parts and apart and sum(sizes) == int(np.prod(shape, dtype=np.int64)):
            out[y.name] = parts
    return out


class Started:
    """Local workers started before the values exist (`start`): `arrays` are where the values
    go (shared with the workers); `run_system(..., started=)` hands them over. With `own`, the
    integer tensors split across the chips (`_boxes`) are drawn by each worker straight into its
    chips' SRAM images (no shared copy, whose fresh pages cost more than the draws): this
    process never holds them (the values made for them are None)."""

    def __init__(self, sp, symbols, workers: int, trace: bool, own: bool = False):
        ctx, n = mp.get_context("fork"), min(workers, len(sp.chips))
        items = [(c, p, _rows_of(sp, c)) for c, p in enumerate(sp.chips)]
        ahead = all(sum(len(p.op) for _, p, _ in items[g::n]) < KEEP_BELOW for g in range(n))
        self.own = _boxes(sp, symbols) if own and ahead else {}
        self.shapes = {y.name: tuple(y.shape) for y in symbols}
        self.arrays = shared_arrays([y for y in symbols if y.name not in self.own])
        self.drawn = False
        self.groups = []
        try:
            for g in range(n):
                self.groups.append(ProcessGroup(items[g::n], sp.system.slot_cycles, ctx, trace, self.arrays, n))
        except BaseException:
            self.close()
            raise

    def takes(self, name: str, out) -> bool:
        """Whether the workers can make the value `name` (compiler/reference.py `integers`): a
        part each in its shared array `out`, or each its chips' parts (`own`; `out` None)."""
        return name in self.own if out is None else out is self.arrays.get(name)

    def draw(self, name: str, plan) -> None:
        """Ask the workers for the values of `plan`: with `own`, every chip's part; else an
        equal part each: plan.n values, of which a worker makes k0 .. k1 - 1 with plan.make(the
        flat shared array, k0, k1), False when they are not where the plan said
        (compiler/draw_core.py Plan)."""
        n, k = plan.n, len(self.groups)
        self.drawn = True
        for i, g in enumerate(self.groups):
            msg = ("own", name, plan, self.shapes[name], self.own[name]) if name in self.own else \
                ("draw", name, plan, n * i // k, n * (i + 1) // k)
            try:
                g.conn.send(msg)
            except OSError:                 # it has failed: check() reads why
                pass

    def check(self) -> bool:
        """After the draws asked for: whether every part ended where its plan said (no draw
        rejected: every value after them is in place)."""
        if not self.drawn:
            return True
        self.drawn = False
        for g in self.groups:
            try:
                g.conn.send(("check",))
            except OSError:
                pass
        return not any([g._get() for g in self.groups])

    def give(self, values: dict) -> list:
        """Hand every worker the values (those not written into `arrays` go by pipe)."""
        extra = {k: v for k, v in values.items() if v is not None and v is not self.arrays.get(k)}
        for g in self.groups:
            try:
                g.conn.send(("values", extra))
            except OSError:                 # it has failed: ready() reads why
                pass
        for g in self.groups:
            g.ready()
        return self.groups

    def close(self) -> None:
        for g in self.groups:
            g.close()


def start(sp, symbols, workers: int, trace: bool = False, own: bool = False) -> Started | None:
    """With `workers` > 1 local processes (and fork), start them now, before the values exist
    (`symbols`: every input, weight and state, whole): each prepares its chips while this
    process makes the values into the returned `Started.arrays`; with `own`, the split integer
    tensors only in the workers (`Started`). None: nothing to start."""
    if workers < 2 or len(sp.chips) < 2 or "fork" not in mp.get_all_start_methods():
        return None
    return Started(sp, symbols, workers, trace, own)


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
    items = [(c, p, chip_values(p, values, _rows_of(sp, c))) for c, p in enumerate(sp.chips)]
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
                    groups.append(ProcessGroup(items[g::n], system.slot_cycles, ctx, trace, workers=n))
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
    else:
        results.update(groups[0].finish())
    chips = [results[c] for c in range(len(sp.chips))]
    outputs, states = {}, {}
    for name, c in sp.outputs.items():
        outputs[name] = chips[c].outputs[name]
    for c, r in enumerate(chips):            # a split state: each chip's rows put back in place
        rows = _rows_of(sp, c)
        for name, arr in r.states.items():
            if name in rows:
                whole = states.setdefault(name, np.array(values[name], copy=True))
                whole[part_index(rows[name])] = arr
            else:
                states[name] = arr
    return SystemResult(outputs, states, max(r.cycles for r in chips), chips, windows)
