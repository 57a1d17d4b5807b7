"""The op table (compiler/ops.py) as the one definition of each language op: every stage knows
every op from it, its formulas agree with the emulator's jitted VXM arithmetic, a new unary op
needs only a table entry when its VXM arithmetic exists, and comparisons and `where` (added
through the table, the VXM arithmetic and one lowering rule) compile, verify and run."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from benchmarks.bounds import lower_bounds
from lpu.compiler import builtins as B
from lpu.compiler import lower_ops, ops, semantics as S
from lpu.compiler.errors import SourceError
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.reference import run_reference
from lpu.emulator import arith
from lpu.emulator.run import _to_bits
from lpu.gpu_baseline import model as gpu_model
from lpu.isa import dtypes, opcodes as O
from lpu.isa.machine import MachineConfig
from tests.checked import run_checked

COMPUTED = [d for d in ops.OPS.values() if d.family not in ("leaf",) and d.name != "output"]
X32 = np.array([-1e30, -100.0, -3.5, -1.0, -0.5, -1e-20, -0.0, 0.0, 1e-20, 0.25, 1.0, 2.0, 7.5, 88.0,
                1e30, np.inf, -np.inf, np.nan], np.float32)
I32 = np.array([-2**31, -2**31 + 1, -1000, -7, -1, 0, 1, 3, 1000, 2**31 - 1], np.int64)


# ---- every stage reads the table ---------------------------------------------------------
def test_every_computed_op_has_a_lowering_a_gpu_cost_and_a_bound():
    for d in COMPUTED:
        assert d.name in lower_ops.LOWER, d.name
        assert d.name in gpu_model.FLOPS_PER_ELEMENT, d.name
        if d.bound in ("vxm", "reduce"):
            assert d.path, d.name
    assert {d.gpu for d in ops.OPS.values()} <= {"leaf", "elementwise", "reduction", "matmul", "view",
                                                 "concat", "store"}


def test_every_spelling_reaches_its_op():
    for d in ops.OPS.values():
        if d.spell.isidentifier():
            assert d.spell in B.BUILTINS, d.name
        elif d.spell:
            assert B.BINOP[d.spell] == d.name
    for dt in dtypes.DTYPES:             # one dtype table: every dtype is a cast and a declaration
        assert dt in B.BUILTINS
    assert S.DTYPES == dtypes.DTYPES and arith.DTYPE_NAMES == dtypes.DTYPES


def test_elementwise_ops_name_existing_vxm_opcodes_of_the_right_arity():
    for d in ops.OPS.values():
        if d.vxm:
            spec = O.BY_NAME[d.vxm]
            assert spec.unit == O.OPS[O.VXM_BINARY["ADD"]].unit
            assert (spec.code in O.VXM_BINARY.values()) == (d.arity == 2), d.name
            assert d.vxm in arith.CORE_OPS


# ---- one formula: reference, folding and the jitted VXM agree -----------------------------
def _same(a, b, rtol=2e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    close = np.isclose(a, b, rtol=rtol, atol=0) | (a == b)
    return bool(np.all(both_nan | close))


@pytest.mark.parametrize("op", sorted(ops.UNARY))
def test_unary_formula_matches_the_vxm(op):
    d = ops.OPS[op]
    code = arith.CORE_OPS.index(d.vxm)
    with np.errstate(all="ignore"):
        ref = d.fn(X32.copy())
    got = np.array([arith.f32_unary(code, x) for x in X32], np.float32)
    assert _same(got, ref), (op, got, ref)
    if d.result == "same":          # ops that keep integers: the VXM's i32 path too
        with np.errstate(all="ignore"):
            ref_i = d.fn(I32.astype(np.int32))
        got_i = np.array([arith.wrap32(arith.int_unary(code, x)) for x in I32])
        assert np.array_equal(got_i, ref_i.astype(np.int64)), op


@pytest.mark.parametrize("op", sorted(ops.BINARY | ops.COMPARE))
def test_binary_formula_matches_the_vxm(op):
    d = ops.OPS[op]
    code = arith.CORE_OPS.index(d.vxm)
    a, b = np.meshgrid(X32, X32)
    with np.errstate(all="ignore"):
        ref = d.fn(a.ravel(), b.ravel())
    got = np.array([arith.f32_binary(code, x, y) for x, y in zip(a.ravel(), b.ravel())], np.float32)
    assert _same(got, ref), op
    if op != "div":                 # integer division only exists for i32 results, never from `/`
        ai, bi = (v.ravel().astype(np.int32) for v in np.meshgrid(I32, I32))
        with np.errstate(all="ignore"):
            ref_i = d.fn(ai, bi).astype(np.int64)
        got_i = np.array([arith.int_binary(code, x, y) for x, y in zip(ai.astype(np.int64), bi.astype(np.int64))])
        assert np.array_equal(got_i, ref_i), op


def test_keep_drop_add_is_where_bit_for_bit():
    keep, drop, add = (arith.CORE_OPS.index(n) for n in ("KEEP", "DROP", "ADD"))
    for c in (0.0, 1.0, -0.0, np.nan, 2.0):
        for x in X32:
            for y in X32[::3]:
                got = arith.f32_binary(add, arith.f32_binary(keep, x, np.float32(c)),
                                       arith.f32_binary(drop, y, np.float32(c)))
                want = ops.OPS["where"].fn(np.float32(c), x, y)
                assert np.float32(got).tobytes() == np.float32(want).tobytes() or (np.isnan(got) and np.isnan(want))


def test_folding_uses_the_table_formulas():
    src = "input x : f32[2, 3]\noutput y = x * sigmoid(0.5) + gelu(1.25) + (3 < 4) + where(0, 7, 2)\n"
    g = elaborate_source(src, "t.lpu", {})
    consts = [float(n.attrs["value"]) for n in g.nodes() if n.op == "const"]
    assert consts[0] == pytest.approx(float(ops.OPS["sigmoid"].fn(np.float64(0.5))), rel=1e-7)
    assert consts[1] == pytest.approx(float(ops.OPS["gelu"].fn(np.float64(1.25))), rel=1e-7)
    assert consts[2:] == [1.0, 2.0]
    with pytest.raises(SourceError, match="undefined"):
        elaborate_source("input x : f32[2]\noutput y = x * log(-1.0)\n", "t.lpu", {})


# ---- a new unary op: one table entry ------------------------------------------------------
NEW_OP = textwrap.dedent("""
    import numpy as np
    from lpu.compiler import ops
    # a new op whose VXM arithmetic exists: nothing but this entry tells the stages about it
    ops.define(ops.OpDef("clamp0", "unary", 1, "clamp0", result="same", fn=lambda x: np.maximum(x, x.dtype.type(0)),
                         vxm="RELU", flops=1))
    from benchmarks.bounds import lower_bounds
    from lpu.api import check
    from lpu.compiler.driver import compile_source
    from lpu.compiler.reference import random_values
    from lpu.emulator.run import run
    from lpu.gpu_baseline.gpus import load_gpu
    from lpu.gpu_baseline.model import cost_graph
    from lpu.isa.machine import MachineConfig
    src = "input x : f16[3, 21]\\noutput y = clamp0(x) * 2.0\\n"
    m = MachineConfig.load("tiny")
    prog, g = compile_source(src, "new.lpu", {}, m)
    vals = random_values(g, 1)
    res = run(prog, vals)
    assert check(g, prog, vals, res)["ok"] and res.cycles == prog.predicted_cycles
    assert (res.outputs["y"] >= 0).all() and (res.outputs["y"] > 0).any()
    assert lower_bounds(g, m)["bound"] > 0
    assert cost_graph(g, load_gpu("h100-sxm")).total_us > 0
    print("ok")
""")


def test_a_new_unary_op_needs_only_a_table_entry():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # lpu resolves from any cwd
    r = subprocess.run([sys.executable, "-c", NEW_OP], capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# ---- comparisons and where on the machine -------------------------------------------------
PROGRAM = """
input x : f16[5, 37]
input y : f32[5, 37]
input n : i32[5, 37]
weight g : f32[37]
m = x + 1.0 < y * 2.0          # precedence: comparisons below arithmetic
big = where(x > 0.5, x, -y)
clip = where(n != 3, n, 0)
mix = where(n >= 2, y, 1.5)
e = where(m, exp(x), g)
same = where(m, y, y * 3.0)    # two f32 values: more streams than tiny has for one chain
output o1 = big
output o2 = clip
output o3 = mix + sum(m, axis=-1)
output o4 = e + same
output o5 = (x == y) + (y <= g) + (n < 2.5) + (x != x) + (n > -1)
"""


def _run_checked(src, machine):
    return run_checked(src, machine, 3, "cmp.lpu")


@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_comparisons_and_where_run_checked(machine):
    prog, g, vals, res = _run_checked(PROGRAM, MachineConfig.load(machine))
    names = {O.OPS[int(op)].name for op in prog.op}
    assert {"LT", "GT", "GE", "LE", "EQ", "NE", "KEEP", "DROP"} <= names
    assert g.node(g.outputs["o5"]).dtype == "i8"        # masks add as i8
    assert res.outputs["o5"].max() > 0


def test_comparison_results_are_i8_masks_and_promote():
    g = elaborate_source("input x : f16[2, 3]\ninput n : i8[2, 3]\na = x < 1.0\noutput s = sum(a)\n"
                         "output p = a * x\noutput w = where(a, n, 2.5)\noutput q = where(x, n, n)\n", "t.lpu", {})
    dt = {k: g.node(g.node(v).inputs[0]).dtype for k, v in g.outputs.items()}
    assert dt == {"s": "i32", "p": "f16", "w": "f32", "q": "i8"}


@pytest.mark.parametrize("src,msg", [
    ("input x : f32[2]\noutput y = x < x < x\n", "do not chain"),
    ("input x : f32[2]\noutput y = where(1, x, x)\n", "needs a tensor"),
    ("input x : f32[2]\ninput z : f32[3]\noutput y = where(x > 0, x, z)\n", "do not broadcast"),
])
def test_comparison_and_where_errors(src, msg):
    with pytest.raises(SourceError, match=msg):
        elaborate_source(src, "t.lpu", {})


def test_store_arrow_still_lexes_beside_less_than():
    g = elaborate_source("input x : f32[2, 3]\nstate s : f32[2, 3]\ns[0:2, :] <-x\ny = x <-1.0\noutput o = y\n",
                         "t.lpu", {})
    assert {n.op for n in g.nodes()} >= {"store", "lt"}


def test_bounds_count_where_as_two_dependent_vxm_steps():
    m = MachineConfig.load("tsp-v1")
    one = elaborate_source("input x : f32[1, 8]\noutput y = x + 1.0\n", "t.lpu", {})
    two = elaborate_source("input x : f32[1, 8]\noutput y = where(x, x, 1.0)\n", "t.lpu", {})
    lat = m.latency
    assert lower_bounds(two, m)["critical_path"] - lower_bounds(one, m)["critical_path"] == lat["vxm"]


# ---- bf16: present everywhere -------------------------------------------------------------
def test_bf16_rounds_alike_in_reference_and_emulator_loader():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 100
    x[:3] = (np.nan, np.inf, 3.0e38)
    ref = S.convert(x, "bf16")
    bits = _to_bits("bf16", x).view("<u2")[..., 0]
    assert np.array_equal(ref.view(np.uint32) >> 16, bits.astype(np.uint32))


def test_a_bf16_program_runs_checked_on_tiny():
    src = ("input x : bf16[3, 21]\ninput y : f16[3, 21]\nweight w : bf16[21, 7]\n"
           "output a = x * 2.5 + y\noutput b = x @ w\noutput c = softmax(x)\noutput d = bf16(y) - x\n")
    prog, g, vals, res = _run_checked(src, MachineConfig.load("tiny"))
    assert g.node(g.outputs["a"]).dtype == "f32" and g.node(g.outputs["d"]).dtype == "bf16"
    outs, _ = run_reference(g, vals, k_tile=prog.machine.lanes)
    assert np.array_equal(S.convert(outs["d"], "bf16"), outs["d"])
