"""Pass `lower` (with SRAM allocation): IR nodes, in program order, to chains of vector
instructions.

Each node gets its storage (a grid of base slots, see alloc.py) from the plan: persistent
regions first, then temporaries allocated as the walk reaches them and freed after their last
use. The chains for each node come from `lower_ops`, one function per op family.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_ops as L
from lpu.compiler.alloc import SlotAllocator, grid_shape, layout, period_stride
from lpu.compiler.chains import Ctx
from lpu.compiler.chainspec import Registry
from lpu.compiler.ir import IRGraph
from lpu.compiler.plan import make_plan
from lpu.compiler.replay import Replayer, periodic_leaves
from lpu.isa.errors import CapacityError, UnsupportedError
from lpu.isa.opcodes import dtype_width
from lpu.isa.program import Symbol


class Lowered:
    def __init__(self, n_chains, symbols, ctx, alloc, replayed=0):
        self.n_chains = n_chains
        self.replayed = replayed      # nodes whose chains were replayed from their twin (replay.py)
        self.symbols = symbols
        self.ctx = ctx
        self.alloc = alloc


def _index_grid(grid, idx, shape, lanes):
    """Apply a slice/int index (on tensor axes) to a vector grid (leading axes, chunks)."""
    sel = []
    for ax, e in enumerate(idx):
        if ax == len(shape) - 1:        # whole chunks (the plan makes other last-axis slices copies)
            sel.append(slice(e[0] // lanes, -(-e[1] // lanes)))
        else:
            sel.append(e if isinstance(e, int) else slice(e[0], e[1]))
    if len(shape) == 1:
        return grid[:, sel[0]] if sel else grid
    return grid[tuple(sel)]


class Lowerer:
    def __init__(self, graph: IRGraph, machine, reg: Registry, hooks=None):
        self.g = graph
        self.hooks = hooks or {}      # output name -> fn(lowerer): more chains after the output's
        self.m = machine
        self.lanes = machine.lanes
        self.alloc = SlotAllocator(machine)
        self.ctx = Ctx(machine, self.alloc, reg)
        self.plan = make_plan(graph, machine.lanes)
        self.grid: dict[int, np.ndarray] = {}
        self.regions: dict[int, tuple] = {}   # owning node -> (start, n)
        self.placed: dict[int, tuple] = {}    # the same, kept after the region is freed
        self.symbols: list[Symbol] = []
        self.chains: list = []
        self.pending_free: list = []
        self._zero = None
        self.rope_cache: dict = {}
        self.replayer = Replayer(self)

    # ---- storage -----------------------------------------------------------------------------
    def new_region(self, shape, dtype, what, chunk_major=False, owner=None, fresh=False, period=0):
        w = dtype_width(dtype)
        n = _region_size(shape, w, self.lanes, period)
        twin = self.placed.get(self.replayer.twin.get(owner, -1))
        if fresh:
            start = self.alloc.alloc_fresh(n, what)
        elif twin is not None and twin[1] == n and self.alloc.alloc_at(twin[0], n):
            start = twin[0]          # where the twin trip's node was: the trips converge sooner
        else:
            start = self.alloc.alloc(n, what)
        if owner is not None:
            self.regions[owner] = (start, n)
            self.placed[owner] = (start, n)
        return layout(start, shape, w, self.lanes, chunk_major, period)

    def temp(self, shape, dtype):
        """A scratch region for lowering; free it with `free_temp`."""
        w = dtype_width(dtype)
        n = int(np.prod(grid_shape(shape, self.lanes))) * w
        start = self.alloc.alloc(n, "a temporary")
        return layout(start, shape, w, self.lanes, False), (start, n)

    def free_temp(self, region):
        self.alloc.release(*region)

    def symbol(self, name, kind, dtype, shape, grid, data=None):
        w = dtype_width(dtype)
        flat = grid.reshape(-1)
        slots = flat[:, None] + np.arange(w)[None, :]
        s, b, a = self.alloc.where(slots)
        self.symbols.append(Symbol(name, kind, dtype, tuple(shape), s.astype(np.int32),
                                   b.astype(np.int32), a.astype(np.int32), data))

    def place_persistent(self):
        g, plan = self.g, self.plan
        persistent = [n for n in g.nodes() if plan.kind[n.id] == "persistent"]
        need = sum(int(np.prod(grid_shape(n.shape, self.lanes))) * dtype_width(n.dtype) for n in persistent)
        out_need = sum(int(np.prod(grid_shape(g.node(o).shape, self.lanes))) * dtype_width(g.node(o).dtype)
                       for o in g.outputs.values())
        total = (need + out_need) * self.lanes
        periodic = periodic_leaves(g, plan)
        period = self.replayer.period
        padded = sum(_region_size(n.shape, dtype_width(n.dtype), self.lanes, period if n.id in periodic else 0)
                     for n in persistent)
        if (padded + out_need) * self.lanes > self.m.sram_bytes:
            periodic = set()       # no room to pad: the trips are lowered one by one
        if total > self.m.sram_bytes:
            big = sorted(persistent, key=lambda n: -n.nbytes)[:3]
            names = ", ".join(f"{n.attrs.get('name', n.op)} {n.dtype}{list(n.shape)} ({n.nbytes:,} B)" for n in big)
            chips = -(-total // self.m.sram_bytes)
            raise CapacityError(
                f"program does not fit one chip: {total:,} bytes of weights, states, inputs and outputs "
                f"needed, {self.m.sram_bytes:,} bytes of SRAM on '{self.m.name}'; it would need {chips} chips "
                f"(largest tensors: {names})",
                bytes_needed=total, bytes_available=self.m.sram_bytes, chips_needed=chips)
        for n in persistent:
            name = n.attrs.get("name", f"const{n.id}")
            grid = self.new_region(n.shape, n.dtype, f"'{name}'", chunk_major=n.op == "weight",
                                   period=period if n.id in periodic else 0)
            self.grid[n.id] = grid
            data = None
            kind = n.op
            if n.op == "const":
                data = np.asarray(n.attrs["value"]).astype(L.NP_DTYPE[n.dtype]).reshape(n.shape)
            self.symbol(name, kind, n.dtype, n.shape, grid, data)

    def zero_vector(self) -> int:
        """Base slot of a persistent all-zero vector (4 planes: any dtype reads its first w)."""
        if self._zero is None:
            grid = self.const_region("__zero", np.zeros((1, self.lanes), np.float32), "f32")
            self._zero = int(grid.reshape(-1)[0])
        return self._zero

    def const_region(self, name, values: np.ndarray, dtype):
        grid = self.new_region(values.shape, dtype, name, fresh=True)
        self.symbol(name, "const", dtype, values.shape, grid, values.astype(L.NP_DTYPE[dtype]))
        return grid

    # ---- the walk ------------------------------------------------------------------------------
    def run(self, sink) -> Lowered:
        """Lower every node in order, handing each node's chains to `sink` (the scheduler) as
        soon as they exist, so that only one node's chains are ever held in memory."""
        self.place_persistent()
        n_chains = 0
        g, plan = self.g, self.plan
        free_after: dict[int, list[int]] = {}
        for owner, last in plan.last_use.items():
            if plan.kind.get(owner) == "temp":
                free_after.setdefault(last, []).append(owner)
        for nid in plan.order:
            n = g.node(nid)
            k = plan.kind[n.id]
            try:
                if k == "view":
                    self.grid[n.id] = self.view(n)
                elif k in ("mxm_t", "mxm_cvt"):
                    self.grid[n.id] = self.grid[n.inputs[0]]
                elif k == "alias":
                    self.grid[n.id] = self.grid[n.inputs[0]]
                    L.lower_store(self, n)
                elif k == "output":
                    self.lower_output(n)
                elif k == "temp":
                    aliased = any(plan.outputs_alias.get(o) and g.node(o).inputs[0] == n.id for o in g.outputs.values())
                    if not self.replayer.replay(n, aliased):
                        rec = self.replayer.begin(n)
                        self.grid[n.id] = self.new_region(n.shape, n.dtype, f"'{n.op}' at line {n.line}",
                                                          owner=None if aliased else n.id)
                        L.LOWER[n.op](self, n)
                        self.replayer.end(n, rec, aliased)
            except UnsupportedError as e:
                raise UnsupportedError(f"{g.source_name}:{n.line}:{n.col}: {n.op}: {e.message} is not supported yet") from None
            for ch in self.chains:
                sink(ch)
            n_chains += sum(ch.n_chains for ch in self.chains)
            self.chains = []
            for owner in free_after.get(n.id, ()):
                if owner in self.regions:
                    self.alloc.release(*self.regions.pop(owner))
        return Lowered(n_chains, self.symbols, self.ctx, self.alloc, self.replayer.replayed)

    def view(self, n):
        return self._view(n).reshape(grid_shape(n.shape, self.lanes))

    def _view(self, n):
        src = self.g.node(n.inputs[0])
        grid = self.grid[n.inputs[0]]
        if n.op == "slice":
            return _index_grid(grid, n.attrs["index"], src.shape, self.lanes)
        if n.op == "reshape":
            return grid.reshape(grid_shape(n.shape, self.lanes))
        if n.op == "transpose":
            perm = list(n.attrs["perm"])
            if len(perm) == 1:
                return grid
            return np.transpose(grid, perm[:-1] + [len(perm) - 1]) if len(grid.shape) == len(perm) else grid
        if n.op == "concat":
            ax = n.attrs["axis"]
            grids = [self.grid[i] for i in n.inputs]
            gax = ax if len(n.shape) > 1 else 1
            return np.concatenate(grids, axis=gax)
        raise AssertionError(n.op)

    def lower_output(self, n):
        src = n.inputs[0]
        name = n.attrs["name"]
        srcn = self.g.node(src)
        if self.plan.outputs_alias.get(n.id):
            grid = self.grid[src]
        else:
            grid = self.new_region(srcn.shape, srcn.dtype, f"output '{name}'")
            L.copy(self, srcn, self.grid[src], grid, srcn.dtype, n)
        self.grid[n.id] = grid
        self.symbol(name, "output", srcn.dtype, srcn.shape, grid)
        if name in self.hooks:               # a chip of a system: its all-reduce transfers
            self.hooks[name](self)


def _region_size(shape, width, lanes, period) -> int:
    if period:
        return shape[0] * period_stride(shape, width, lanes, period)
    return int(np.prod(grid_shape(shape, lanes))) * width


def lower(graph: IRGraph, machine, sink, reg: Registry, hooks=None) -> Lowered:
    return Lowerer(graph, machine, reg, hooks).run(sink)
