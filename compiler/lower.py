"""Pass `lower` (with SRAM allocation): IR nodes, in program order, to chains of vector
instructions.

Each node gets its storage (a grid of base slots, see alloc.py) from the plan: persistent
regions first, then temporaries allocated as the walk reaches them and freed after their last
use. The chains for each node come from `lower_ops`, one function per op family.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_ops as L
from lpu.compiler import placement
from lpu.compiler.alloc import SlotAllocator, grid_shape, layout, period_stride
from lpu.compiler.chains import Ctx
from lpu.compiler.chainspec import Registry
from lpu.compiler.ir import IRGraph
from lpu.compiler.lower_mxm import score_unit
from lpu.compiler.plan import make_plan
from lpu.compiler.replay import Replayer, periodic_leaves
from lpu.isa.errors import CapacityError, UnsupportedError
from lpu.isa.opcodes import dtype_width
from lpu.isa.program import Symbol


# A decode step's temporaries (up to NEAR_SHARE of the MEM slices' worth of plane slots) are
# placed near the VXM: most of their trips are VXM -> MEM -> VXM, two hops per slice of distance,
# and first fit puts them wherever the weights left room (up to 44 slices away on tsp-v1). First
# fit stays where it is within NEAR_MARGIN hops of the best (a group of 4 slices): on a small
# machine (tiny: 8 slices a side) the few near slices crowd (bank conflicts) for little gain.
# Measured: a margin of 0 is faster still on tsp-v1 (gpt2_block_decode 2,234 against 2,308) but
# slower on tiny (attention_decode 1,590 against 1,457); prefill programs (not near-placed)
# were some faster, some slower (gpt2_block_prefill 4,875 -> 4,913).
ZERO_COPIES = 4      # all-zero vectors (Lowerer.zero_vectors): a transposed install clearing a
#                      buffer's stale rows reads one per row, and one vector's slices issue one
#                      READ a cycle (llama_block_prefill's score products: 256 zero rows a head).
#                      Measured: 1 -> 6,557, 2 -> 6,376, 4 (and 8, 16) -> 6,343 cycles
NEAR_SHARE = 0.5
NEAR_MARGIN = 4
SCRATCH_LAG = 4      # depths a decode lane reduction's scratch is held (Lowerer.free_scratch;
#                      measured: 1 to 4 and holding it to the end within noise of each other)


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
        self.held: dict[int, tuple] = {}      # node -> (start, n) allocated for it ahead (hold_carried)
        self.symbols: list[Symbol] = []
        self.chains: list = []
        self.pending_free: list = []
        self._zero = None
        self.rope_cache: dict = {}
        self.replayer = Replayer(self)
        self.deferred: list = []             # (depth, scratch region) freed SCRATCH_LAG depths later
        self.in_rows = False                 # lowering a row group (compiler/rewrite_rows.py): its
        self.row_held: list = []             # temporaries are held to the region's end, so that
        #                                      the next group's take other slots (no WAR waits)
        self.depth = 0
        self.across_at_depth = None          # plan depth -> reductions across vectors there (lower_reduce)
        # hops from each MEM slice to the VXM, in a decode step (every matmul of one row): its
        # small temporaries go where their trips are short (None: first fit)
        decode = all(int(np.prod(graph.node(n.inputs[0]).shape[:-1])) == 1 for n in graph.nodes()
                     if n.op == "matmul" and "heads" not in n.attrs and "hilo" not in n.attrs)   # (rewrite_decode's rows)
        self.near_vxm = [abs(machine.slice_pos(s) - machine.vxm_pos) for s in range(machine.mem_slices)] if decode else None
        far = 2 * machine.n_positions            # (the other hemisphere's slices: never nearer)
        self.near_side = [[d + (far if machine.slice_hemisphere(s) != h else 0) for s, d in enumerate(self.near_vxm)]
                          for h in range(2)] if decode else None
        self._edge_cost: dict = {}
        self.weight_side: dict = {}              # product -> the hemisphere of its weights (placement.edge_weights)
        self.fold_feeds: dict = {}               # tfold -> its columns' feed to its product (movement.fold_feed)
        self.first_level: dict = {}              # reduction -> its first level made by its source (lower_reduce.first_blocks)
        self.sxm_rows = [0, 0]                   # decode heads' row reductions on each SXM (lower_reduce)

    # ---- storage -----------------------------------------------------------------------------
    def new_region(self, shape, dtype, what, chunk_major=False, owner=None, fresh=False, period=0):
        w = dtype_width(dtype)
        n = _region_size(shape, w, self.lanes, period)
        twin = self.placed.get(self.replayer.twin.get(owner, -1))
        if owner in self.held and self.held[owner][1] == n:
            start = self.held.pop(owner)[0]
            self.alloc.take_held(start, n)
        elif fresh:
            start = self.alloc.alloc_fresh(n, what)
        elif twin is not None and twin[1] == n and self.alloc.alloc_at(twin[0], n):
            start = twin[0]          # where the twin trip's node was: the trips converge sooner
        elif owner is not None and self.near_vxm and n <= self.m.mem_slices * NEAR_SHARE:
            start = self.alloc.alloc_near(n, self._near_cost(owner), NEAR_MARGIN, what)
        elif owner is not None and placement.reduced_across(self, owner) and n <= self.m.mem_slices * NEAR_SHARE:
            hops = [abs(self.m.slice_pos(s) - self.m.vxm_pos) for s in range(self.m.mem_slices)]
            start = self.alloc.alloc_near(n, hops, 0, what)
        else:
            start = self.alloc.alloc(n, what)
        if owner is not None:
            self.regions[owner] = (start, n)
            self.placed[owner] = (start, n)
        return layout(start, shape, w, self.lanes, chunk_major, period)

    def in_loop(self, n) -> bool:
        """n is in a trip of a loop of several (whose trips replay their twins: replay.py)."""
        return any(s <= n.id < e for trips in self.g.loops if len(trips) > 1 for s, e in trips)

    def _near_cost(self, owner):
        """Hops by slice that a decode step's temporary is placed near: the VXM's, but for a
        score product whose rows are filled past their end (rewrite_decode, attr `fill`: its max
        rotates the rows where the product writes them, with no MASK on the VXM first) the SXM's
        next to the plane pair that computes it (lower_mxm.score_unit): the rows' trip to the
        SXM is a few hops, not the VXM's distance twice. Measured: llama_block_decode 1,917 ->
        1,860, gpt2_block_decode 1,977 -> 1,965, gpt2_small_decode 31,390 -> 30,626."""
        n = self.g.node(owner)
        if n.op != "matmul" or not n.attrs.get("fill"):
            return self.near_vxm
        h = 0 if score_unit(self, n) < self.m.mxm_planes_per_hemisphere else 1
        key = ("sxm", h)
        if key not in self._edge_cost:
            self._edge_cost[key] = [abs(self.m.slice_pos(s) - self.m.sxm_pos(h)) for s in range(self.m.mem_slices)]
        return self._edge_cost[key]

    def hold_carried(self, pairs):
        """At a loop's start: for each value o its first trip carries into the second in place of
        p (`Replayer.carried`), allocate o's region now, congruent to p's modulo the period, so
        the second trip finds its input shifted by a multiple of the period and every other
        region where the first trip had it: then it replays the first. Not in a decode step,
        whose small temporaries go near the VXM instead (measured: gpt2_small_decode 38,284 ->
        39,213 cycles with it, also with its input placed near; bert_base 246,811 -> 246,001,
        gpt2_small_prefill 247,949 -> 245,521)."""
        if self.near_vxm is not None:
            return
        period = self.replayer.period
        for o, p in pairs:
            node, grid = self.g.node(o), self.grid.get(p)
            if grid is None or o in self.held or node.dtype != self.g.node(p).dtype:
                continue
            w = dtype_width(node.dtype)
            base = int(grid.reshape(-1)[0]) if grid.size else 0
            if grid.shape != grid_shape(node.shape, self.lanes) or np.any(grid - layout(base, node.shape, w, self.lanes, False) != 0):
                continue
            n = _region_size(node.shape, w, self.lanes, 0)
            start = self.alloc.alloc_congruent(n, base % period, period)
            if start is not None:
                self.held[o] = (start, n)

    def temp(self, shape, dtype, hemisphere=None):
        """A scratch region for lowering; free it with `free_temp`. In a decode step, near the
        VXM, on the given hemisphere's side if one is given (the SXM its lane steps use)."""
        w = dtype_width(dtype)
        n = int(np.prod(grid_shape(shape, self.lanes))) * w
        if self.near_vxm is not None and n <= self.m.mem_slices * NEAR_SHARE:     # (as new_region's)
            cost = self.near_vxm if hemisphere is None else self.near_side[hemisphere]
            start = self.alloc.alloc_near(n, cost, NEAR_MARGIN, "a temporary")
        else:
            start = self.alloc.alloc(n, "a temporary")
        return layout(start, shape, w, self.lanes, False), (start, n)

    def free_temp(self, region):
        if self.in_rows:
            self.row_held.append(region)
        else:
            self.alloc.release(*region)

    def free_scratch(self, region):
        """Free a lane reduction's scratch; in a decode step, only once the walk leaves the
        node's depth: the next head's reduction (a peer at that depth) would otherwise take the
        same slots and wait for this one's last read (the heads' reductions ran one after another)."""
        if self.near_vxm is None:
            self.free_temp(region)
        else:
            self.deferred.append((self.depth, region))

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
        edge = placement.edge_weights(self, persistent)
        for n in persistent:
            name = n.attrs.get("name", f"const{n.id}")
            if n.id in edge:
                grid = placement.window_region(self, n.shape, n.dtype, (edge[n.id],), None, f"'{name}'")
            else:
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
        return self.zero_vectors()[0]

    def zero_vectors(self) -> np.ndarray:
        """Base slots of ZERO_COPIES persistent all-zero vectors on different slices, so that
        many zero rows (a transposed install clearing stale weight rows) are read in parallel."""
        if self._zero is None:
            grid = self.const_region("__zero", np.zeros((ZERO_COPIES, self.lanes), np.float32), "f32")
            self._zero = np.asarray(grid.reshape(-1), np.int64)
        return self._zero

    def const_region(self, name, values: np.ndarray, dtype):
        grid = self.new_region(values.shape, dtype, name, fresh=True)
        self.symbol(name, "const", dtype, values.shape, grid, values.astype(L.NP_DTYPE[dtype]))
        return grid

    # ---- the walk ------------------------------------------------------------------------------
    def run(self, sink, segment=None) -> Lowered:
        """Lower every node in order, handing each node's chains to `sink` (the scheduler) as
        soon as they exist, so that only one node's chains are ever held in memory."""
        self.place_persistent()
        n_chains = 0
        g, plan = self.g, self.plan
        free_after: dict[int, list[int]] = {}
        for owner, last in plan.last_use.items():
            if plan.kind.get(owner) in ("temp", "joined"):
                free_after.setdefault(last, []).append(owner)
        depth = None
        carried = list(self.replayer.carried)
        trip_of = {nid: (li, t) for li, trips in enumerate(g.loops) for t, (s, e) in enumerate(trips)
                   for nid in range(s, e)} if segment is not None else {}
        trip = None
        for nid in plan.order:
            n = g.node(nid)
            k = plan.kind[n.id]
            t = trip_of.get(nid)
            if t is not None and k in CHAINED and (trip is None or t[0] != trip[0] or t[1] > trip[1]):
                trip = t
                segment(*t, t[1] + 1 < len(g.loops[t[0]]))
            while carried and carried[0][0][0] <= nid < carried[0][0][1]:
                self.hold_carried(carried.pop(0)[1])
            if plan.depth[nid] != depth:
                depth = plan.depth[nid]
                keep = [(d, r) for d, r in self.deferred if d > depth - SCRATCH_LAG]
                for d, r in self.deferred:
                    if d <= depth - SCRATCH_LAG:
                        self.alloc.release(*r)
                self.deferred = keep
                self.depth = depth
            rows = "rows" in n.attrs
            if not rows and self.in_rows and k in ("temp", "joined"):
                for r in self.row_held:
                    self.alloc.release(*r)
                self.row_held = []
            self.in_rows = rows or (self.in_rows and k not in ("temp", "joined"))
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
                elif k == "part":           # computed into its rows of the concat's region
                    self.grid[n.id] = self.part_grid(n)
                    if not self.replayer.replay(n, True, self.grid[n.id]):
                        rec = self.replayer.begin(n)
                        L.LOWER[n.op](self, n)
                        self.replayer.end(n, rec, True)
                elif k == "joined":
                    pass
                elif k == "acc":            # left in the MXM's accumulators for its user
                    L.LOWER[n.op](self, n)
                elif k == "temp":
                    aliased = any(plan.outputs_alias.get(o) and g.node(o).inputs[0] == n.id for o in g.outputs.values())
                    if not self.replayer.replay(n, aliased):
                        rec = self.replayer.begin(n)
                        grid = placement.temp_region(self, n, aliased)
                        self.grid[n.id] = grid if grid is not None else self.new_region(
                            n.shape, n.dtype, f"'{n.op}' at line {n.line}", owner=None if aliased else n.id)
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
                    self.free_temp(self.regions.pop(owner))
        return Lowered(n_chains, self.symbols, self.ctx, self.alloc, self.replayer.replayed)

    def part_grid(self, n):
        cid = self.plan.base[n.id]
        cat = self.g.node(cid)
        if cid not in self.grid:
            grid = placement.joined_region(self, cat)
            self.grid[cid] = grid if grid is not None else self.new_region(
                cat.shape, cat.dtype, f"'concat' at line {cat.line}", owner=cid)
        ax = 0 if cat.attrs["axis"] in (0, -2) else 1
        off = 0
        for i in cat.inputs:
            if i == n.id:
                break
            off += self.g.node(i).shape[ax]
        if ax:              # whole chunks of the lanes
            return self.grid[cid][:, off // self.lanes:off // self.lanes + grid_shape(n.shape, self.lanes)[-1]]
        return self.grid[cid][off:off + n.shape[0]]

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


CHAINED = ("temp", "part", "alias", "output", "acc")   # kinds of node that lower to chains


def lower(graph: IRGraph, machine, sink, reg: Registry, hooks=None, segment=None) -> Lowered:
    """segment(loop, trip, more): called before the first chain of each trip of a top-level loop,
    more: whether another trip follows (the scheduler places a trip like the one before where
    it provably may, segments.py)."""
    return Lowerer(graph, machine, reg, hooks).run(sink, segment)
