"""A system's chips in local worker processes (`run_system(workers=N)`, `lpu run --workers N`):
`ProcessGroup` runs a Group (emulator/system_group.py) in a forked process and answers the
driver's step and finish (emulator/system.py `_drive`); `start` forks them before the values
exist, so that they prepare their chips while the values are made, and make the integer
values themselves (`Started`)."""
from __future__ import annotations

import dataclasses
import mmap
import multiprocessing as mp
import os
import signal

import numpy as np

from lpu.emulator import system_group
from lpu.emulator.system_group import Group, chip_values, full_index, part_index, rows_of, share_prepared, tile
from lpu.isa.dtypes import NP_DTYPE
from lpu.isa.errors import LpuError


def _worker(conn, items, slot_cycles, trace, shared=None, followers=()):
    forked = []                              # the pids of the followers it started (`_fork`)
    try:
        if shared is not None:             # started ahead (`start`): items hold each chip's rows, not its values
            g = _ahead(conn, items, slot_cycles, trace, shared, followers, forked)
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
    finally:
        for pid in forked:                   # (the parent kills one it gives up on)
            os.waitpid(pid, 0)


def _fork(conn, g, followers, slot_cycles, trace, shared, forked: list) -> None:
    """Start the other workers (`Started`) from this one, its chips prepared and the jitted core
    loaded: a chip whose program is one of these (a tensor-parallel node's ranks) takes that
    preparation (`share_prepared`, copy-on-write) instead of making it again. Each says its pid
    first (`Follower`); their pids go to `forked` (this process waits for them at its end)."""
    done = [r.program for r in g.runs.values()]
    for items, child in followers:
        for _, p, _ in items:
            share_prepared(p, done)
        pid = os.fork()
        if pid == 0:
            conn.close()
            try:
                child.send(("pid", os.getpid()))
                _worker(child, items, slot_cycles, trace, shared)
            finally:
                os._exit(0)
        forked.append(pid)
        child.close()


def _ahead(conn, items, slot_cycles, trace, shared, followers=(), forked=None):
    """A worker started before the values exist makes its Group meanwhile (chips prepared, SRAM
    images allocated and their pages touched, the jitted core loaded: ChipRun.warm), makes its
    part of the integer values it is asked to (`Started.draw`), and loads the images when the
    values arrive. A group of KEEP_BELOW instructions or more, which starts its chips when they
    receive, only waits. None: the parent gave up."""
    ahead = sum(len(p.op) for _, p, _ in items) < system_group.KEEP_BELOW
    if ahead:
        g = Group([(c, p, None) for c, p, _ in items], slot_cycles, trace)
        for r in g.runs.values():
            r.warm()
    if followers:
        _fork(conn, g, followers, slot_cycles, trace, shared, forked)
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

    def __init__(self, items, slot_cycles: int, ctx, trace: bool = False, shared=None, followers=()):
        self.conn, child = ctx.Pipe()
        if ctx.get_start_method() != "fork":       # pickled: without the parent's prepared state
            items = [(c, dataclasses.replace(p), v) for c, p, v in items]
        self.proc = ctx.Process(target=_worker, args=(child, items, slot_cycles, trace, shared,
                                                      [(f.items, f.child) for f in followers]),
                                daemon=True)
        self.proc.start()
        for f in followers:                  # the child's end is the worker's now (an EOF if it fails)
            f.child.close()

    def ready(self):
        """Wait until the worker has prepared its chips (every worker is started first, so
        that they prepare at the same time)."""
        self._get()

    def _recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError("system worker failed: it ended without an answer") from None

    def _get(self):
        kind, val = self._recv()
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
        return self._get()

    def join(self):
        """After every group's `finished` (a worker waits for those it started: `_fork`)."""
        self.proc.join()

    def close(self):
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Follower(ProcessGroup):
    """A worker that another one starts (`_fork`): the same answers, after its pid."""

    def __init__(self, items, ctx):
        self.conn, self.child = ctx.Pipe()
        self.items, self.pid, self.done = items, None, False

    def _recv(self):
        msg = super()._recv()
        if msg[0] == "pid":
            self.pid = msg[1]
            msg = super()._recv()
        return msg

    def finished(self):
        out = self._get()
        self.done = True                     # it exits now (reaped by the worker that started it)
        return out

    def join(self):
        pass

    def close(self):
        try:
            if self.pid is None and not self.done and self.conn.poll():
                msg = self.conn.recv()
                self.pid = msg[1] if msg[0] == "pid" else None
        except (EOFError, OSError):          # never started (the worker before it failed)
            pass
        if self.pid is not None and not self.done:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.conn.close()                    # one not yet heard from reads an EOF and ends


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
        parts = {}
        for c, p in enumerate(sp.chips):
            if any(q.name == y.name and q.kind == y.kind for q in p.symbols):
                rows = rows_of(sp, c)
                parts[c] = full_index(part_index(rows[y.name]) if y.name in rows else (), y.shape)
        if parts and tile(parts.values(), y.shape):
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
        items = [(c, p, rows_of(sp, c)) for c, p in enumerate(sp.chips)]
        ahead = all(sum(len(p.op) for _, p, _ in items[g::n]) < system_group.KEEP_BELOW for g in range(n))
        self.own = _boxes(sp, symbols) if own and ahead else {}
        self.shapes = {y.name: tuple(y.shape) for y in symbols}
        self.arrays = shared_arrays([y for y in symbols if y.name not in self.own])
        self.drawn = False
        followers = [Follower(items[g::n], ctx) for g in range(1, n)]
        self.groups = []
        try:
            self.groups.append(ProcessGroup(items[0::n], sp.system.slot_cycles, ctx, trace, self.arrays, followers))
            self.groups += followers
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
