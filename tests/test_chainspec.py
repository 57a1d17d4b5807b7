"""The chain contract (chainspec) and the array scheduler (schedule + place_core), on small
hand-made chains: each rule the scheduler enforces moves a chain by a known number of cycles."""
from __future__ import annotations

import numpy as np
import pytest

from lpu.compiler.chainspec import Chain, Ins, Registry, encode
from lpu.compiler.schedule import Scheduler
from lpu.isa import opcodes as O


def _placed(sched):
    parts = sched.take_placed().take_parts()
    return [int(c) for p in parts for c in p[0]], [int(q) for p in parts for q in p[1]]


def _ins(q, off=0, **kw):
    return Ins((q,) if isinstance(q, int) else q, off, O.TPIN, [0, 0, 0], **kw)


def test_encode_numbers_keys_in_order_of_first_use():
    reg = Registry()
    ch = Chain([Ins((3, 4), 2, O.READ, [1, 2], ((2, 0, 1, 3),), bank=5, reads=(7,),
                    after=((("iw", 0), 1),), mark=((("lw", 0), 0),), extra=((9, 3),)),
                Ins((3, 4), 0, O.WRITE, [0, 0, 0], writes=(8, 9), after=((("lw", 0), 2),))],
               [(1, -4, 2)], line=11, node=2, hint=("h", -7))
    a = encode([ch], reg)
    assert a.n_ins == 2 and a.ins_ptr.tolist() == [0, 2] and a.grp_ptr.tolist() == [0, 1]
    assert a.qg.tolist() == [0, 0] and reg.qgroups == {(3, 4): 0}
    assert a.args[0].tolist() == [1, 2] + [0] * (O.NARGS - 2)
    assert a.p_ptr.tolist() == [0, 1, 1] and a.p_data.tolist() == [[2, 0, 1, 3]]
    assert a.r_data.tolist() == [7] and a.w_ptr.tolist() == [0, 0, 2] and a.w_data.tolist() == [8, 9]
    assert reg.markers == {("iw", 0): 0, ("lw", 0): 1}
    assert a.a_data.tolist() == [[0, 1], [1, 2]] and a.m_data.tolist() == [[1, 0]]
    assert a.e_data.tolist() == [[9, 3]] and a.hint.tolist() == [0] and a.hint_delta.tolist() == [-7]
    assert (a.g_dir.tolist(), a.g_koff.tolist(), a.g_w.tolist()) == ([1], [-4], [2])
    ptr, qs = reg.qgroup_arrays()
    assert ptr.tolist() == [0, 2] and qs.tolist() == [3, 4]


def test_one_queue_one_instruction_per_cycle(tiny):
    s = Scheduler(tiny)
    q = tiny.sxm_queue(0, 0)
    for _ in range(3):
        s.place(Chain([_ins(q, 0), _ins(q, 2)], []))
    cyc, _ = _placed(s)
    assert cyc == [0, 2, 1, 3, 4, 6]          # third chain: 2 and 3 are taken at offset 0/2


def test_alternative_queues_are_taken_in_order(tiny):
    s = Scheduler(tiny)
    group = (tiny.sxm_queue(0, 0), tiny.sxm_queue(0, 1))
    for _ in range(3):
        s.place(Chain([_ins(group)], []))
    cyc, q = _placed(s)
    assert cyc == [0, 0, 1] and q == [group[0], group[1], group[0]]


def test_banks_slots_and_markers_order_chains(tiny):
    s = Scheduler(tiny)
    q0, q1, q2 = tiny.sxm_queue(0, 0), tiny.sxm_queue(1, 0), tiny.vxm_queue(0)
    s.place(Chain([_ins(q0, bank=3, writes=(40,))], []))                 # writes slot 40 at 0
    s.place(Chain([_ins(q1, bank=3)], []))                               # bank 3 busy at 0 -> 1
    s.place(Chain([_ins(q2, 0, reads=(40,))], []))                       # RAW: after cycle 0 -> 1
    s.place(Chain([_ins(q2, 0, mark=((("m",), 10),))], []))              # q2 free at 0: marker = 10
    s.place(Chain([_ins(q0, 0, after=((("m",), 3),))], []))              # >= 13
    cyc, _ = _placed(s)
    assert cyc == [0, 1, 1, 0, 13]


def test_streams_per_diagonal_and_too_wide_chains(tiny):
    s = Scheduler(tiny)
    ns = tiny.streams_per_direction
    q = (tiny.vxm_queue(0), tiny.vxm_queue(1))
    s.place(Chain([_ins(q)], [(0, 0, ns - 1)]))
    s.place(Chain([_ins(q)], [(0, 0, 2)]))        # one stream left on diagonal 0: next cycle
    cyc, _ = _placed(s)
    assert cyc == [0, 1]
    s = Scheduler(tiny)
    s.place(Chain([_ins(q)], [(1, 5, ns), (1, 5, 1)], line=7))
    with pytest.raises(AssertionError, match="line 7 needs"):
        s.flush()


def test_tables_grow_with_the_schedule(tiny):
    s = Scheduler(tiny)
    q = tiny.sxm_queue(0, 0)
    far, end = s.cap - 20_000, s.cap + 50_000        # past the tables' first size
    s.place(Chain([_ins(q, 0, mark=((("far",), far),))], []))
    s.place(Chain([_ins(q, 0, after=((("far",), 0),)), _ins(q, end - far)], []))
    assert s.predicted_cycles() == end + O.latency_table(tiny)[O.TPIN] + 1 + tiny.icu_skew
    assert np.all(s.qbusy[[0, far, end], q] == 1) and s.qbusy.shape[0] > end
    cyc, _ = _placed(s)
    assert cyc == [0, far, end]


@pytest.mark.parametrize("w,cvt", [(1, 0), (2, 0), (1, 1)])
def test_lw_rows_builds_the_chains_of_read_and_lw_row_by_row(tsp, w, cvt):
    from lpu.compiler.alloc import SlotAllocator
    from lpu.compiler.chains import ChainBuilder, Ctx, lw_rows
    from lpu.compiler.chainspec import FIELDS, Flat
    ctx = Ctx(tsp, SlotAllocator(tsp), Registry())
    srcs = [0, 8, 100, 3000, 7]
    pos = tsp.mxm_pos(2)
    after, mark = ((("iw", 2), 0),), ((("lw", 2), 0),)
    want = Flat()
    for r, src in enumerate(srcs):
        cb = ChainBuilder(ctx, 5, 9)
        gi = cb.read(src, w, pos, 0)
        cb.lw(2, 0, r, (gi, 3), after=after, mark=mark, cvt=cvt)
        want.extend(cb.chain())
    got = lw_rows(ctx, 5, 9, 2, srcs, w, pos, 3, cvt, after, mark)
    for f in FIELDS:
        assert np.array_equal(got.rows()[f], want.rows()[f]), f


@pytest.mark.parametrize("w", [1, 2, 4])
def test_sxm_rows_builds_the_chains_of_sxm_chain_one_by_one(tsp, w):
    from types import SimpleNamespace
    from lpu.compiler.alloc import SlotAllocator
    from lpu.compiler.chains import Ctx, sxm_rows
    from lpu.compiler.chainspec import FIELDS, Flat
    from lpu.compiler.lower_common import sxm_chain
    from lpu.isa.dtypes import DTYPE_CODE
    dtype = {1: "i8", 2: "f16", 4: "f32"}[w]
    ns = tsp.mem_slices
    srcs = [0, ns // 2 + 3, 100, 3000, ns - 1, 7 * ns + 1]    # both hemispheres, both directions
    dsts = [ns - 2, 5, 4000, 1, ns // 2, 9]
    params = [3, 0, 7, 3, 1, 2]
    want_ctx = Ctx(tsp, SlotAllocator(tsp), Registry())
    lw = SimpleNamespace(ctx=want_ctx, chains=[])
    node = SimpleNamespace(line=5, id=9)
    for s, d, p in zip(srcs, dsts, params):
        sxm_chain(lw, node, O.PERMUTE, s, d, dtype, p)
    want = Flat()
    for ch in lw.chains:
        want.extend(ch)
    ctx = Ctx(tsp, SlotAllocator(tsp), Registry())
    got = sxm_rows(ctx, 5, 9, O.PERMUTE, srcs, dsts, w, DTYPE_CODE[dtype], params)
    for f in FIELDS:
        assert np.array_equal(got.rows()[f], want.rows()[f]), f
    assert ctx.reg.hints == want_ctx.reg.hints


def test_builder_exposes_its_groups_and_takes_hand_built_instructions(tsp):
    from lpu.compiler.alloc import SlotAllocator
    from lpu.compiler.chains import ChainBuilder, Ctx
    ctx = Ctx(tsp, SlotAllocator(tsp), Registry())
    cb = ChainBuilder(ctx, 3, 4)
    gi = cb.read(8, 2, tsp.vxm_pos, 0)
    g2 = cb.link(tsp.vxm_pos, tsp.sxm_pos(0), 5, 4)
    assert (gi, g2) == (0, 1) and len(cb.groups) == 2 and cb.groups[1][2] == 4
    cb.ins.append(Ins((ctx.sxm_q[0][0],), 7, O.SHIFT, [0, 0, -1], ((0, g2, 0, 3),), after=((("m",), 1),)))
    a = encode([cb.chain()], ctx.reg)
    assert a.n_ins == 3 and a.op.tolist() == [O.READ, O.READ, O.SHIFT] and a.off[2] == 7
    assert a.a_data.tolist() == [[ctx.reg.markers[("m",)], 1]] and a.p_data[2].tolist() == [0, 1, 0, 3]


def test_encode_keeps_the_order_of_mixed_flat_and_rows_batches(tsp):
    from dataclasses import fields
    from types import SimpleNamespace
    from lpu.compiler.alloc import SlotAllocator
    from lpu.compiler.chains import Ctx, sxm_rows
    from lpu.compiler.lower_common import sxm_chain
    from lpu.isa.dtypes import DT_F16
    ctx = Ctx(tsp, SlotAllocator(tsp), Registry())
    lw = SimpleNamespace(ctx=ctx, chains=[])
    node = SimpleNamespace(line=2, id=3)
    srcs, dsts = [0, 40, 7, 90], [5, 6, 300, 2]
    for s, d in zip(srcs, dsts):
        sxm_chain(lw, node, O.PERMUTE, s, d, "f16", 1)
    flats = lw.chains
    mixed = [flats[0], sxm_rows(ctx, 2, 3, O.PERMUTE, srcs[1:3], dsts[1:3], 2, DT_F16, [1, 1]), flats[3]]
    a, b = encode(flats, ctx.reg), encode(mixed, ctx.reg)
    for f in fields(a):
        assert np.array_equal(getattr(a, f.name), getattr(b, f.name)), f.name


@pytest.mark.parametrize("dts,imm", [(("f32", "f32", "f32"), 0), (("f16", "f32", "f16"), 0), (("i8", None, "i8"), 7)])
def test_vxm_rows_builds_the_chains_of_vxm_chain_one_by_one(tsp, dts, imm, monkeypatch):
    """Plain vectors in batches; a shared READ and a bank collision (staged) one by one, in order."""
    from dataclasses import fields
    from lpu.compiler import lower_common
    monkeypatch.setattr(lower_common, "FEW", 0)          # the batch path even for a few vectors
    from lpu.compiler.alloc import SlotAllocator, layout
    from lpu.compiler.chains import Ctx
    from lpu.compiler.lower_common import vxm_chain, vxm_rows
    from lpu.isa.dtypes import dtype_width

    class LW:
        def __init__(self):
            self.alloc = SlotAllocator(tsp)
            self.alloc.alloc(50000, "operands")
            self.ctx, self.chains, self.lanes = Ctx(tsp, self.alloc, Registry()), [], tsp.lanes

        def temp(self, shape, dtype):
            n = shape[-1] // self.lanes * dtype_width(dtype)
            start = self.alloc.alloc(n, "t")
            return layout(start, shape, dtype_width(dtype), self.lanes, False), (start, n)

        def free_temp(self, region):
            self.alloc.release(*region)

    ns, nb = tsp.mem_slices, tsp.banks_per_slice
    a = [0, 8, 40, 100, 3000, 12]
    b = [16, 8, 40 + ns * nb, 200, 7, 900] if dts[1] else None      # row 1 shared (same width), row 2 collides
    outs = [20000, 20004, 20008, 20012, 20016, 20020]
    nvs = [tsp.lanes, 5, tsp.lanes, 1, 0, tsp.lanes]
    node = type("N", (), {"line": 4, "id": 2})()
    op = O.VXM_BINARY["ADD"]
    bimm = 1 if b is None else 0
    want, got = LW(), LW()
    for i in range(len(a)):
        vxm_chain(want, node, op, outs[i], dts[2], nvs[i], (a[i], dts[0]), (b[i], dts[1]) if b else None,
                  imm=imm, bimm=bimm)
    vxm_rows(got, node, op, outs, dts[2], nvs, (np.asarray(a), dts[0]), (np.asarray(b), dts[1]) if b else None,
             imm=imm, bimm=bimm)
    assert len(got.chains) > 1 or b is None
    x, y = encode(want.chains, want.ctx.reg), encode(got.chains, got.ctx.reg)
    assert len(x.ins_ptr) - 1 > len(a) or b is None                  # a collision was staged
    for f in fields(x):
        assert np.array_equal(getattr(x, f.name), getattr(y, f.name)), f.name
