"""IR graphs of Llama-2-7B for validating the GPU model, built directly with `IRGraph.add` (no
DSL needed): one decode step, a prefill, and the four per-layer decode linears.

Llama-2-7B (Touvron et al. 2023, and its config.json): D=4096, H=32 heads of 128, FFN F=11008
(SwiGLU), 32 layers, vocabulary 32000, RMSNorm eps 1e-5 (we use 1e-6 as the DSL prelude does;
no effect on cost), rotary embeddings theta 10000. The embedding lookup is not in the IR (no
gather op): the graph's input is the embedded tokens, and the lookup reads S rows, which no
model counts. Prefill computes logits for the last position only, as TensorRT-LLM does by
default (gather_context_logits off) and as time to first token needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpu.compiler.ir import IRGraph


@dataclass(frozen=True)
class LlamaShape:
    d: int = 4096
    heads: int = 32
    ffn: int = 11008
    layers: int = 32
    vocab: int = 32000
    dtype: str = "f16"
    kv_heads: int = 0            # grouped-query attention: K/V heads (0: as many as heads)

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    @property
    def kvh(self) -> int:
        return self.kv_heads or self.heads


LLAMA2_7B = LlamaShape()
# Shapes from each model's config.json on the Hugging Face hub (hidden_size, num_attention_heads,
# num_key_value_heads, intermediate_size, num_hidden_layers, vocab_size).
MODELS = {
    "llama2-7b": LLAMA2_7B,
    "llama3.1-8b": LlamaShape(d=4096, heads=32, kv_heads=8, ffn=14336, layers=32, vocab=128256),
    "llama2-70b": LlamaShape(d=8192, heads=64, kv_heads=8, ffn=28672, layers=80, vocab=32000),
    "llama3.1-70b": LlamaShape(d=8192, heads=64, kv_heads=8, ffn=28672, layers=80, vocab=128256),
}

# the four per-layer decode linears: name -> (K, N) of [1,K] @ [K,N]
LLAMA2_7B_LINEARS = {
    "qkv": (4096, 12288),
    "o": (4096, 4096),
    "gate_up": (4096, 22016),
    "down": (11008, 4096),
}


class _Builder:
    """Small helpers over IRGraph.add that keep shapes and dtypes right."""

    def __init__(self, name: str):
        self.g = IRGraph(source_name=name)
        self.line = 0

    def add(self, op, inputs, out_shape, dtype, **attrs):
        return self.g.add(op, inputs, out_shape, dtype, attrs, line=self.line)

    def shape(self, nid):
        return self.g.node(nid).shape

    def dtype(self, nid):
        return self.g.node(nid).dtype

    def leaf(self, kind, name, shape, dtype):
        nid = self.add(kind, (), shape, dtype, name=name)
        self.g.decls[name] = nid
        if kind == "state":
            self.g.final_states[name] = nid
        return nid

    def const(self, value):
        return self.add("const", (), (), "f32", value=np.array(value, dtype=np.float32))

    def binary(self, op, a, b):
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        da, db = self.dtype(a), self.dtype(b)
        return self.add(op, (a, b), shape, da if da == db else "f32")

    def unary(self, op, a):
        return self.add(op, (a,), self.shape(a), self.dtype(a))

    def cast(self, a, to):
        return self.add("cast", (a,), self.shape(a), to, to=to)

    def matmul(self, a, b):
        sa, sb = self.shape(a), self.shape(b)
        lead = sa[:-2] or sb[:-2]
        out = "i32" if self.dtype(a) == "i8" else "f32"
        return self.add("matmul", (a, b), (*lead, sa[-2], sb[-1]), out)

    def slice(self, a, index):
        shape = tuple(hi - lo for lo, hi in index)
        return self.add("slice", (a,), shape, self.dtype(a), index=tuple(index))

    def transpose(self, a, perm):
        s = self.shape(a)
        return self.add("transpose", (a,), tuple(s[p] for p in perm), self.dtype(a), perm=tuple(perm))

    def reshape(self, a, shape):
        return self.add("reshape", (a,), shape, self.dtype(a), shape=tuple(shape))

    def reduce(self, op, a, axis):
        s = list(self.shape(a))
        s[axis] = 1
        return self.add(op, (a,), s, self.dtype(a), axis=axis)

    def output(self, name, a):
        nid = self.add("output", (a,), self.shape(a), self.dtype(a), name=name)
        self.g.outputs[name] = nid
        return nid

    def rmsnorm(self, x, g):
        sq = self.binary("mul", x, x)
        ms = self.reduce("mean", self.cast(sq, "f32"), 1)
        r = self.unary("rsqrt", self.binary("add", ms, self.const(1e-6)))
        return self.cast(self.binary("mul", self.binary("mul", x, r), g), "f16")


def _attention(b: _Builder, q, k, v, pos: int, s: int, g: int):
    """softmax(q k^T / sqrt(hd), causal) v for q [kvh, g*s, hd] and k, v [kvh, ctx, hd]."""
    dt, hd = b.dtype(q), b.shape(q)[-1]
    sc = b.matmul(q, b.transpose(k, (0, 2, 1)))                                # [kvh, g*s, ctx]
    sc = b.binary("mul", sc, b.const(1.0 / np.sqrt(hd)))
    sc = b.add("causal", (sc,), b.shape(sc), "f32", offset=pos, **({"period": s} if g > 1 else {}))
    e = b.unary("exp", b.binary("sub", sc, b.reduce("max", sc, 2)))
    p = b.cast(b.binary("div", e, b.reduce("sum", e, 2)), dt)
    return b.cast(b.matmul(p, v), dt)


def _layer(b: _Builder, x, l: int, s: int, pos: int, ctx: int, m: LlamaShape):
    """One transformer layer on x [s, d] with the KV cache holding positions [0, pos + s)."""
    d, h, hd, f, dt, kvh = m.d, m.heads, m.head_dim, m.ffn, m.dtype, m.kvh
    g = h // kvh                                  # query heads per K/V head
    w = lambda name, shape: b.leaf("weight", f"l{l}.{name}", shape, dt)  # noqa: E731
    b.line = 10 * l + 1
    hn = b.rmsnorm(x, w("attn_norm", (d,)))
    b.line += 1
    qkv = b.cast(b.matmul(hn, w("wqkv", (d, d + 2 * kvh * hd))), dt)
    b.line += 1
    heads = []
    for lo, nh in ((0, h), (d, kvh), (d + kvh * hd, kvh)):
        part = b.slice(qkv, ((0, s), (lo, lo + nh * hd)))
        heads.append(b.transpose(b.reshape(part, (s, nh, hd)), (1, 0, 2)))    # [nh, s, hd]
    q = b.add("rope", (heads[0],), (h, s, hd), dt, pos=pos, theta=10000.0)
    k = b.add("rope", (heads[1],), (kvh, s, hd), dt, pos=pos, theta=10000.0)
    if g > 1:      # a K/V head serves its g query heads: their rows batch together (GQA kernels)
        q = b.reshape(q, (kvh, g * s, hd))
    b.line += 1
    caches = []
    for name, val in (("k", k), ("v", heads[2])):
        c = b.leaf("state", f"l{l}.{name}cache", (kvh, ctx, hd), dt)
        new = b.add("store", (c, val), (kvh, ctx, hd), dt, name=f"l{l}.{name}cache",
                    index=((0, kvh), (pos, pos + s), (0, hd)))
        b.g.final_states[f"l{l}.{name}cache"] = new
        caches.append(b.slice(new, ((0, kvh), (0, pos + s), (0, hd))))
    b.line += 1
    o = _attention(b, q, caches[0], caches[1], pos, s, g)                    # [kvh, g*s, hd]
    o = b.reshape(b.transpose(b.reshape(o, (h, s, hd)), (1, 0, 2)), (s, d))
    b.line += 1
    x = b.binary("add", x, b.cast(b.matmul(o, w("wo", (d, d))), dt))
    b.line += 1
    hn = b.rmsnorm(x, w("ffn_norm", (d,)))
    b.line += 1
    gu = b.cast(b.matmul(hn, w("wgate_up", (d, 2 * f))), dt)
    act = b.binary("mul", b.unary("silu", b.slice(gu, ((0, s), (0, f)))), b.slice(gu, ((0, s), (f, 2 * f))))
    b.line += 1
    return b.binary("add", x, b.cast(b.matmul(act, w("wdown", (f, d))), dt))


def llama_graph(s: int, pos: int = 0, ctx: int | None = None, m: LlamaShape = LLAMA2_7B,
                layers: int | None = None) -> IRGraph:
    """s new tokens at positions [pos, pos + s), KV cache of ctx positions (default pos + s)."""
    ctx = ctx or pos + s
    assert pos + s <= ctx
    b = _Builder(f"llama-s{s}-pos{pos}")
    x = b.leaf("input", "x", (s, m.d), m.dtype)
    for l in range(m.layers if layers is None else layers):
        x = _layer(b, x, l, s, pos, ctx, m)
    b.line = 10 * m.layers + 1
    last = b.slice(x, ((s - 1, s), (0, m.d)))
    hn = b.rmsnorm(last, b.leaf("weight", "norm", (m.d,), m.dtype))
    b.line += 1
    b.output("logits", b.matmul(hn, b.leaf("weight", "lm_head", (m.d, m.vocab), m.dtype)))
    return b.g


def decode_step(context: int, m: LlamaShape = LLAMA2_7B, layers: int | None = None) -> IRGraph:
    """One batch-1 decode step: the token at position context-1 attends over `context` cached
    positions (the KV cache read)."""
    return llama_graph(1, pos=context - 1, m=m, layers=layers)


def prefill(tokens: int, m: LlamaShape = LLAMA2_7B, layers: int | None = None) -> IRGraph:
    """Prefill of `tokens` prompt tokens (batch 1) up to the logits of the last one."""
    return llama_graph(tokens, pos=0, m=m, layers=layers)


def linear(k: int, n: int, m_rows: int = 1, dtype: str = "f16") -> IRGraph:
    """[m_rows, k] @ [k, n] with the result cast back to dtype (a framework's linear layer)."""
    b = _Builder(f"linear-{m_rows}x{k}x{n}")
    b.line = 1
    x = b.leaf("input", "x", (m_rows, k), dtype)
    y = b.cast(b.matmul(x, b.leaf("weight", "w", (k, n), dtype)), dtype)
    b.output("y", y)
    return b.g


def decode_linear(name: str) -> IRGraph:
    """One of the four per-layer Llama-2-7B decode linears: qkv, o, gate_up, down."""
    k, n = LLAMA2_7B_LINEARS[name]
    return linear(k, n)


def elementwise(n: int, dtype: str = "f16") -> IRGraph:
    """out = a + b on two vectors of n elements (one memory-bound kernel)."""
    b = _Builder(f"add-{n}")
    b.line = 1
    b.output("y", b.binary("add", b.leaf("input", "a", (n,), dtype), b.leaf("input", "b", (n,), dtype)))
    return b.g


def softmax(rows: int, cols: int, dtype: str = "f16") -> IRGraph:
    """Row softmax of a [rows, cols] tensor, computed in f32 and cast back (one row kernel)."""
    b = _Builder(f"softmax-{rows}x{cols}")
    b.line = 1
    x = b.cast(b.leaf("input", "x", (rows, cols), dtype), "f32")
    e = b.unary("exp", b.binary("sub", x, b.reduce("max", x, 1)))
    b.output("y", b.cast(b.binary("div", e, b.reduce("sum", e, 1)), dtype))
    return b.g


def rmsnorm(rows: int, d: int, dtype: str = "f16") -> IRGraph:
    """RMSNorm of [rows, d] with a weight (one row kernel; a LayerNorm costs the same)."""
    b = _Builder(f"rmsnorm-{rows}x{d}")
    b.line = 1
    b.output("y", b.rmsnorm(b.leaf("input", "x", (rows, d), dtype), b.leaf("weight", "g", (d,), dtype)))
    return b.g


def silu_mul(rows: int, f: int, dtype: str = "f16") -> IRGraph:
    """The SwiGLU activation: silu(x[:, :f]) * x[:, f:] of x [rows, 2f] (one kernel)."""
    b = _Builder(f"silu-mul-{rows}x{f}")
    b.line = 1
    x = b.leaf("input", "x", (rows, 2 * f), dtype)
    b.output("y", b.binary("mul", b.unary("silu", b.slice(x, ((0, rows), (0, f)))),
                           b.slice(x, ((0, rows), (f, 2 * f)))))
    return b.g


def attention(s: int, ctx: int, heads: int, kv_heads: int, head_dim: int, dtype: str = "f16") -> IRGraph:
    """Fused causal attention of s query rows (positions ctx-s .. ctx-1) over ctx keys: prefill
    when s == ctx, one decode step over a KV cache when s == 1."""
    b = _Builder(f"attention-{s}x{ctx}")
    b.line = 1
    g = heads // kv_heads
    q = b.leaf("input", "q", (kv_heads, g * s, head_dim), dtype)
    k = b.leaf("input", "k", (kv_heads, ctx, head_dim), dtype)
    v = b.leaf("input", "v", (kv_heads, ctx, head_dim), dtype)
    b.output("o", _attention(b, q, k, v, ctx - s, s, g))
    return b.g
