"""The reference interpreter: numeric rules op by op, and whole programs against independent
numpy implementations."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lpu.compiler import semantics as S
from lpu.compiler.frontend import elaborate_file, elaborate_source
from lpu.compiler.reference import random_values, run_reference
from lpu.isa.errors import LpuError

PROGRAMS = Path(__file__).parent.parent / "programs"
BIG = {"bert_base", "gpt2_small_decode", "gpt2_small_prefill"}


def run(text, values, **kw):
    g = elaborate_source(text)
    return run_reference(g, values, **kw)[0]


def f16(a):
    return np.asarray(a, dtype=np.float64).astype(np.float16)


# ---- conversion and elementwise rules ------------------------------------------------------

def test_convert_rules():
    x = np.array([1.5, 2.5, -0.5, 300.0, -1e9, np.nan, np.inf], dtype=np.float32)
    assert S.convert(x, "i8").tolist() == [2, 2, 0, 127, -128, 0, 127]
    assert S.convert(np.array([70000, -5], dtype=np.int32), "i8").tolist() == [127, -5]
    assert S.convert(np.float32(1 + 2**-11), "f16") == np.float16(1)   # ties to even


def test_elementwise_formulas_in_f32_rounded_to_dtype():
    rng = np.random.default_rng(1)
    x = f16(rng.standard_normal((4, 8)) * 3)
    got = run("input x : f16[4, 8]\noutput g = gelu(x)\noutput s = silu(x)\noutput r = rsqrt(abs(x))\n"
              "output q = sigmoid(x)\n", {"x": x})
    x32 = x.astype(np.float32)
    sig = np.float32(1) / (np.float32(1) + np.exp(-x32))
    gelu = np.float32(0.5) * x32 * (1 + np.tanh(np.float32(0.7978845608) * (x32 + np.float32(0.044715) * x32 ** 3)))
    np.testing.assert_array_equal(got["q"], sig.astype(np.float16))
    np.testing.assert_array_equal(got["s"], (x32 * sig).astype(np.float16))
    np.testing.assert_array_equal(got["g"], gelu.astype(np.float16))
    np.testing.assert_array_equal(got["r"], (1 / np.sqrt(np.abs(x32))).astype(np.float16))


def test_integer_arithmetic_wraps_in_i32_then_saturates():
    a = np.array([100, -100, 7], dtype=np.int8)
    got = run("input a : i8[3]\noutput s = a + a\noutput w = i32(a) * 30000000\noutput d = a / 2\n", {"a": a})
    assert got["s"].tolist() == [127, -128, 14]
    assert got["w"].tolist() == (np.array([100, -100, 7], np.int32) * np.int32(30000000)).tolist()
    assert got["d"].dtype == np.float32 and got["d"].tolist() == [50.0, -50.0, 3.5]


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float16, (3, 5), elements=st.floats(-100, 100, width=16)),
       hnp.arrays(np.float16, (5,), elements=st.floats(-100, 100, width=16)))
def test_binary_broadcast_property(a, b):
    got = run("input a : f16[3, 5]\ninput b : f16[5]\noutput y = a * b - a\n", {"a": a, "b": b})
    t = (a.astype(np.float32) * b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got["y"], (t.astype(np.float32) - a.astype(np.float32)).astype(np.float16))


def test_reductions():
    x = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    got = run("input x : i8[3, 4]\noutput s = sum(x)\noutput m = mean(x, axis=0)\noutput x1 = max(x, 0)\n", {"x": x})
    assert got["s"].dtype == np.int32 and got["s"].ravel().tolist() == x.sum(1).tolist()
    assert got["m"].dtype == np.float32 and np.allclose(got["m"], x.mean(0, keepdims=True))
    assert got["x1"].dtype == np.int8 and got["x1"].tolist() == [x.max(0).tolist()]


# ---- matmul --------------------------------------------------------------------------------

def test_matmul_tiles_k_in_f64_rounded_to_f32_and_accumulates_in_k_order():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 40)).astype(np.float32), f16(rng.standard_normal((40, 5)))
    got = run("input a : f32[3, 40]\ninput b : f16[40, 5]\noutput y = a @ b\n", {"a": a, "b": b}, k_tile=16)["y"]
    a16, b64 = a.astype(np.float16).astype(np.float64), b.astype(np.float64)
    want = np.zeros((3, 5), np.float32)
    for k0 in (0, 16, 32):
        want = want + (a16[:, k0:k0 + 16] @ b64[k0:k0 + 16]).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_i8_matmul_is_exact_and_batched_matmul_broadcasts():
    rng = np.random.default_rng(3)
    a, b = rng.integers(-128, 128, (2, 3, 700)).astype(np.int8), rng.integers(-128, 128, (700, 4)).astype(np.int8)
    got = run("input a : i8[2, 3, 700]\ninput b : i8[700, 4]\noutput y = a @ b\n", {"a": a, "b": b})["y"]
    assert got.dtype == np.int32 and got.tolist() == (a.astype(np.int64) @ b.astype(np.int64)).tolist()


# ---- masks, rope, shapes, states -----------------------------------------------------------

def test_causal_mask():
    x = np.ones((3, 4), np.float16)
    y = run("input x : f16[3, 4]\noutput y = causal(x, offset=1)\n", {"x": x})["y"]
    assert np.isneginf(y).tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]


def test_rope_against_direct_formula():
    rng = np.random.default_rng(4)
    x = f16(rng.standard_normal((5, 8)))
    y = run("input x : f16[5, 8]\noutput y = rope(x, 7, theta=100.0)\n", {"x": x})["y"]
    want = np.zeros((5, 8))
    for i in range(5):
        for j in range(4):
            ang = (7 + i) * 100.0 ** (-2 * j / 8)
            c, s = np.float32(np.cos(ang)), np.float32(np.sin(ang))
            x1, x2 = np.float32(x[i, j]), np.float32(x[i, j + 4])
            want[i, j] = x1 * c - x2 * s
            want[i, j + 4] = x2 * c + x1 * s
    np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float16).astype(np.float64), atol=1e-3)


def test_shape_ops_and_store():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    text = ("input x : f32[2, 3, 4]\nstate c : f16[4, 4]\nc[1:3, :] <- x[0, 0:2]\nc[0] <- x[1, 2]\n"
            "output t = transpose(x, [2, 0, 1])\noutput r = reshape(x, [4, 6])\noutput k = concat([x, x], axis=1)\n"
            "output s = x[1, :, 2]\noutput v = c[0:3]\n")
    g = elaborate_source(text)
    outs, states = run_reference(g, {"x": x, "c": np.zeros((4, 4), np.float16)})
    np.testing.assert_array_equal(outs["t"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(outs["r"], x.reshape(4, 6))
    np.testing.assert_array_equal(outs["k"], np.concatenate([x, x], 1))
    np.testing.assert_array_equal(outs["s"], x[1, :, 2])
    want = np.zeros((4, 4), np.float16)
    want[1:3], want[0] = x[0, 0:2], x[1, 2]
    assert states["c"].dtype == np.float16 and np.array_equal(states["c"], want)
    np.testing.assert_array_equal(outs["v"], want[0:3])


def test_bad_values_are_user_errors():
    g = elaborate_source("input x : f16[2, 3]\noutput x\n")
    with pytest.raises(LpuError, match="no value given for input `x`"):
        run_reference(g, {})
    with pytest.raises(LpuError, match="has shape \\[3, 2\\]"):
        run_reference(g, {"x": np.zeros((3, 2))})


def test_random_values_deterministic_and_scaled():
    g = elaborate_file(PROGRAMS / "gpt2_small_decode.lpu", {"L": 1, "D": 64, "H": 2, "C": 16, "T": 3})
    a, b = random_values(g, 7), random_values(g, 7)
    assert a.keys() == g.decls.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert a["wqkv"].dtype == np.int8 and a["wqkv"].min() >= -8 and a["wqkv"].max() <= 8
    assert a["x"].dtype == np.float16 and 0.5 < a["x"].std() < 2
    assert a["sqkv"].std() < 0.2


# ---- whole programs ------------------------------------------------------------------------

def gpt2_block_numpy(v, p, k_tile=320):
    """GPT-2 pre-LN block written directly in numpy (f32 math, f16 where the program rounds)."""
    D, H = p["D"], p["H"]
    HD = D // H

    def mm(a, b):
        return np.matmul(np.asarray(a, np.float16).astype(np.float64), np.asarray(b, np.float16).astype(np.float64))

    def ln(x, g, b):
        x = x.astype(np.float32)
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    x = v["x"].astype(np.float32)
    h = f16(ln(x, v["ln1_g"], v["ln1_b"]))
    qkv = f16(mm(h, v["wqkv"]) + v["bqkv"])
    S_ = x.shape[0]
    heads = []
    for i in range(H):
        q, k, w = (qkv[:, j * D + i * HD: j * D + (i + 1) * HD] for j in range(3))
        s = mm(q, k.T) / np.sqrt(HD)
        s[np.triu(np.ones((S_, S_), bool), 1)] = -np.inf
        heads.append(f16(mm(softmax(s), w)))
    x1 = f16(x + mm(np.concatenate(heads, 1), v["wo"]) + v["bo"])
    m = f16(0.5 * (z := mm(f16(ln(x1, v["ln2_g"], v["ln2_b"])), v["w1"]) + v["b1"]) *
            (1 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3))))
    return f16(x1 + mm(m, v["w2"]) + v["b2"]), qkv


def test_gpt2_block_matches_direct_numpy():
    params = {"S": 16, "D": 64, "H": 4, "C": 32}
    g = elaborate_file(PROGRAMS / "gpt2_block_prefill.lpu", params)
    v = random_values(g, 0)
    outs, states = run_reference(g, v)
    want, qkv = gpt2_block_numpy(v, {**g.params})
    atol, rtol = S.TOLERANCE["f16"]
    np.testing.assert_allclose(outs["y"].astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol)
    np.testing.assert_allclose(states["kc"][:16].astype(np.float64), qkv[:, 64:128].astype(np.float64), atol=atol, rtol=rtol)
    assert np.array_equal(states["kc"][16:], v["kc"][16:])


def test_decode_block_agrees_with_prefill_on_the_last_row():
    """Prefill of S tokens and a decode step at position S-1 over a cache filled from the
    prefill give the same last row."""
    p = {"D": 64, "H": 4, "C": 16}
    pre = elaborate_file(PROGRAMS / "gpt2_block_prefill.lpu", {**p, "S": 8})
    dec = elaborate_file(PROGRAMS / "gpt2_block_decode.lpu", {**p, "T": 7})
    v = random_values(pre, 1)
    outs, states = run_reference(pre, v)
    dv = {**v, "x": v["x"][7:8], "kc": states["kc"], "vc": states["vc"]}
    douts, dstates = run_reference(dec, dv)
    assert S.close(douts["y"], outs["y"][7:8], "f16")
    assert S.close(dstates["kc"], states["kc"], "f16")


@pytest.mark.parametrize("name", sorted(p.stem for p in PROGRAMS.glob("*.lpu") if p.stem not in BIG))
def test_small_programs_run(name):
    g = elaborate_file(PROGRAMS / f"{name}.lpu")
    outs, states = run_reference(g, random_values(g, 0))
    for k, y in outs.items():
        assert y.shape == g.node(g.outputs[k]).shape and np.isfinite(y.astype(np.float64)).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BIG))
def test_big_programs_run(name):
    g = elaborate_file(PROGRAMS / f"{name}.lpu")
    outs, _ = run_reference(g, random_values(g, 0))
    assert all(np.isfinite(y.astype(np.float64)).all() for y in outs.values())


def test_integer_draws_equal_numpys():
    """compiler/draw_core.py: the jitted bounded draws are numpy's own (the same values, the same
    state after them), in chunks, with a half of a 64-bit output kept, and with rejections (a
    range near 2**32 rejects about one draw in three)."""
    from lpu.compiler import draw_core
    for lo, hi, sizes in ((-8, 9, (1, 2, 7, draw_core.CHUNK + 3, 0, 5)), (0, 3_000_000_000, (5, 6, 70_001))):
        a, b = np.random.default_rng(11), np.random.default_rng(11)
        for n in sizes:
            out = np.empty(n, np.int64)
            draw_core.draw(b.bit_generator, lo, hi, out)
            assert np.array_equal(out, a.integers(lo, hi, size=n))
            assert np.array_equal(a.standard_normal(3), b.standard_normal(3)) and a.integers(0, 5) == b.integers(0, 5)


def test_draws_made_in_parts_from_their_plan():
    """compiler/draw_core.py Plan: the parts of a run of draws made each from its place (`seek`,
    after a kept half too) are numpy's draws; a part with a rejected draw says so (it ends
    elsewhere), and so may every part after it."""
    from lpu.compiler import draw_core
    for lo, hi, n, half in ((-8, 9, 10_001, 0), (-8, 9, 10_001, 1), (0, 3_000_000_000, 1_000, 0)):
        a, b = np.random.default_rng(3), np.random.default_rng(3)
        if half:                                  # a 32-bit draw keeps the other half of its output
            a.integers(0, 5, dtype=np.int32), b.integers(0, 5, dtype=np.int32)
        assert b.bit_generator.state["has_uint32"] == half
        want = a.integers(lo, hi, size=n)
        p = draw_core.plan(b.bit_generator, lo, hi, n)
        out = np.zeros(n, np.int64)
        cuts = (0, 1, 2, 777, 5_000, n)
        ok = [draw_core.draw_range(p, out, k0, k1) for k0, k1 in zip(cuts, cuts[1:])]
        if lo == -8:                              # 17 values: a draw is rejected once in 2**32
            assert all(ok) and np.array_equal(out, want)
            assert draw_core.same_place(b.bit_generator.state, a.bit_generator.state)
            assert a.standard_normal() == b.standard_normal()
        else:                                     # a third rejected: parts misplaced, and said so
            assert not all(ok) and np.array_equal(out[:1], want[:1]) and not np.array_equal(out, want)


def test_draws_made_in_scattered_rows():
    """compiler/draw_core.py draw_rows: runs of a plan's draws made from their place by PCG64
    itself (jumps forward, back to the start, into a kept half, from a high half) are numpy's
    draws; a run with a rejected draw says so."""
    from lpu.compiler import draw_core
    starts = np.array([0, 1, 2, 5, 1000, 999, 77_777, 3, 100_003 - 41, 4096 * 7 + 1024])
    for lo, hi, half in ((-8, 9, 0), (-8, 9, 1), (0, 3_000_000_000, 0)):
        a, b = np.random.default_rng(5), np.random.default_rng(5)
        if half:
            a.integers(0, 5, dtype=np.int32), b.integers(0, 5, dtype=np.int32)
        want = a.integers(lo, hi, size=100_003)
        p = draw_core.plan(b.bit_generator, lo, hi, 100_003)
        for w in (41, 40, 1):
            out = np.zeros((len(starts), w), np.int64)
            ok = draw_core.draw_rows(p, starts, out)
            if lo == -8:
                assert ok and np.array_equal(out, np.stack([want[k:k + w] for k in starts]))
            else:                                 # a third rejected
                assert not ok


def test_normals_in_chunks_are_one_draws():
    """reference.normals: made CHUNK values at a time, the values of one draw of the whole, and
    the generator left in the same place."""
    from lpu.compiler.reference import CHUNK, normals
    for shape, scale, dtype in (((2, CHUNK // 2 + 3), 0.1, "f16"), ((5,), 1 / np.sqrt(7), "f32"), ((3,), 1.0, "bf16")):
        a, b = np.random.default_rng(2), np.random.default_rng(2)
        want = S.convert(a.standard_normal(shape) * scale, dtype)
        got = normals(b, shape, scale, lambda x: S.convert(x, dtype), np.empty(shape, S.NP_DTYPE[dtype]))
        assert got.dtype == want.dtype and np.array_equal(got, want) and a.standard_normal() == b.standard_normal()
