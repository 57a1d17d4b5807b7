"""Parsing and elaboration: every construct, shapes and dtypes, the prelude, states, programs."""
from pathlib import Path

import numpy as np
import pytest

from lpu.compiler import ast as A
from lpu.compiler.frontend import elaborate_file, elaborate_source
from lpu.compiler.parse import parse

PROGRAMS = sorted((Path(__file__).parent.parent / "programs").glob("*.lpu"))
SRAM_BYTES = 220 * 2**20


def ops(g):
    return [n.op for n in g.nodes()]


def out(g, name="y"):
    return g.node(g.node(g.outputs[name]).inputs[0])


def elab(body, head="input x : f16[4, 8]\n", **params):
    return elaborate_source(head + body, params=params or None)


# ---- parsing -------------------------------------------------------------------------------

def test_parse_every_statement_with_positions():
    prog = parse("param D = 2 * 3  # comment\ninput x : f16[D]\nfn f(a, b=1e-5) { return a }\n"
                 "for i in 0..2 { y = x }\nkc[0:1] <- x\noutput y\noutput z = x; w = x\n")
    kinds = [type(s) for s in prog.stmts]
    assert kinds == [A.Param, A.Decl, A.FnDef, A.For, A.Store, A.Output, A.Output, A.Assign]
    assert [(s.line, s.col) for s in prog.stmts[:2]] == [(1, 7), (2, 1)]
    fn = prog.stmts[2]
    assert [p.name for p in fn.params] == ["a", "b"] and fn.params[1].default.value == 1e-5


def test_parse_expression_precedence_and_postfix():
    e = parse("y = -a + b * c @ d.T[0:2, :, i]\n").stmts[0].value
    assert isinstance(e, A.BinOp) and e.op == "+"
    assert isinstance(e.left, A.Neg)
    assert e.right.op == "@" and e.right.left.op == "*"
    idx = e.right.right
    assert isinstance(idx, A.Index) and isinstance(idx.value, A.Attr)
    assert [type(s) for s in idx.subs] == [A.Slice, A.Slice, A.Name]


def test_newlines_inside_brackets_and_semicolons():
    prog = parse("y = concat(\n  [a,\n   b],\n  axis=1)\nz = [f(i)\n  for i in 0..3]; w = z\n")
    assert len(prog.stmts) == 3
    assert prog.stmts[0].value.kwargs[0].name == "axis"
    assert isinstance(prog.stmts[1].value, A.ListComp)


# ---- elaboration -----------------------------------------------------------------------------

def test_params_and_overrides():
    g = elab("param A = 12\nparam B = A / 4 + A % 5 * 2 - 1\ninput x : f16[A, B]\noutput x\n", head="",)
    assert g.params == {"A": 12, "B": 6}
    g = elab("param A = 12\nparam B = A / 4\ninput x : f16[A, B]\noutput x\n", head="", A=8)
    assert g.params == {"A": 8, "B": 2} and g.node(g.decls["x"]).shape == (8, 2)


def test_decls_leaves_and_positions():
    g = elab("weight w : i8[2, 8, 8]\nstate s : f32[3]\noutput x\n")
    assert {k: g.node(v).op for k, v in g.decls.items()} == {"x": "input", "w": "weight", "s": "state"}
    assert g.node(g.decls["w"]).dtype == "i8" and g.final_states == {"s": g.decls["s"]}
    assert (g.node(g.decls["s"]).line, g.node(g.decls["s"]).col) == (3, 1)


@pytest.mark.parametrize("expr,shape,dtype", [
    ("x + x", (4, 8), "f16"),
    ("x + f32(x)", (4, 8), "f32"),
    ("x * 2", (4, 8), "f16"),
    ("x * 0.5", (4, 8), "f16"),
    ("i8(x) * 2", (4, 8), "i8"),
    ("i8(x) * 0.5", (4, 8), "f32"),
    ("i8(x) + i32(x)", (4, 8), "i32"),
    ("i32(x) / 2", (4, 8), "f32"),
    ("i8(x) + x", (4, 8), "f16"),
    ("x @ x.T", (4, 4), "f32"),
    ("f32(x) @ f32(x).T", (4, 4), "f32"),
    ("x @ f32(x).T", (4, 4), "f32"),
    ("i8(x) @ i8(x).T", (4, 4), "i32"),
    ("sum(x)", (4, 1), "f16"),
    ("sum(x, axis=0)", (1, 8), "f16"),
    ("sum(i8(x), -1)", (4, 1), "i32"),
    ("mean(i32(x))", (4, 1), "f32"),
    ("max(x, axis=-2)", (1, 8), "f16"),
    ("exp(i8(x))", (4, 8), "f32"),
    ("relu(i8(x))", (4, 8), "i8"),
    ("x[1]", (8,), "f16"),
    ("x[1:3, 2]", (2,), "f16"),
    ("x[-1, 0:-2]", (6,), "f16"),
    ("x.T", (8, 4), "f16"),
    ("transpose(x, [1, 0])", (8, 4), "f16"),
    ("reshape(x, [2, -1])", (2, 16), "f16"),
    ("concat([x, x, x], axis=1)", (4, 24), "f16"),
    ("concat([x[i] for i in 0..4], axis=0)", (32,), "f16"),
    ("causal(x, offset=1)", (4, 8), "f16"),
    ("rope(x, 3)", (4, 8), "f16"),
    ("maximum(x, 0.0)", (4, 8), "f16"),
    ("minimum(x, f32(x[0]))", (4, 8), "f32"),
    ("gelu(x) + silu(x) + sigmoid(x) + tanh(x) + abs(x) + log(x) + sqrt(x)", (4, 8), "f16"),
    ("reshape(x, [2, 2, 8]) @ reshape(x, [8, 4])", (2, 2, 4), "f32"),
    ("softmax(x)", (4, 8), "f16"),
    ("softmax(f32(x), axis=0)", (4, 8), "f32"),
])
def test_shapes_and_dtypes(expr, shape, dtype):
    n = out(elab(f"output y = {expr}\n"))
    assert (n.shape, n.dtype) == (shape, dtype)


def test_slice_and_reduce_attrs_are_normalised():
    g = elab("y = sum(x[1, 2:4], axis=-1)\noutput y\n")
    sl = [n for n in g.nodes() if n.op == "slice"][0]
    assert sl.attrs["index"] == (1, (2, 4)) and out(g).attrs["axis"] == 0
    full = elab("output y = x[:, 0:8]\n")
    assert "slice" not in ops(full)


def test_literals_become_scalar_consts_and_scalars_fold():
    g = elab("param HD = 64\noutput y = x * (1.0 / sqrt(HD)) + 2\n")
    consts = [n for n in g.nodes() if n.op == "const"]
    assert [c.shape for c in consts] == [(), ()]
    assert float(consts[0].attrs["value"]) == pytest.approx(0.125)
    assert consts[0].attrs["value"].dtype == np.float32
    assert not any(n.op == "sqrt" for n in g.nodes())


def test_fn_inlining_defaults_keywords_and_globals():
    g = elab("param K = 3\nfn f(a, b=2, c=1) { t = a * b\n return t + c * K }\noutput y = f(x, c=5)\n")
    assert ops(g).count("mul") == 1 and ops(g).count("add") == 1
    assert [float(n.attrs["value"]) for n in g.nodes() if n.op == "const"] == [2.0, 15.0]


def test_axis_is_a_compile_time_function_argument():
    g = elab("fn f(a, axis) { return softmax(a, axis) }\noutput y = f(x, 0)\n")
    assert [n.attrs["axis"] for n in g.nodes() if n.op in ("max", "sum")] == [0, 0]


def test_prelude_ops_carry_the_call_site_line():
    g = elab("\n\ny = layernorm(x, x[0], x[1])\noutput y\n")
    lines = {n.line for n in g.nodes() if n.op not in ("input", "output", "slice")}
    assert lines == {4}
    assert ops(g).count("mean") == 2 and "rsqrt" in ops(g)
    g = elab("output y = rmsnorm(x, x[0])\n")
    assert [o for o in ops(g) if o not in ("input", "slice", "const", "output")] == \
        ["mul", "mean", "add", "rsqrt", "mul", "mul"]


def test_user_function_may_override_prelude():
    g = elab("fn softmax(a, axis=-1) { return a }\noutput y = softmax(x)\n")
    assert ops(g) == ["input", "output"]


def test_loops_unroll_and_rebind():
    g = elab("y = x\nfor i in 0..3 { y = y + x[i] }\noutput y\n")
    assert ops(g).count("add") == 3 and [n.attrs["index"] for n in g.nodes() if n.op == "slice"] == [(i, (0, 8)) for i in range(3)]


def test_nested_loops_and_comprehension_scope():
    g = elab("param N = 2\ny = x\nfor i in 0..N { for j in i..N { y = y * 1.5 } }\n"
             "z = concat([x[i:i+1] for i in 0..2], axis=0)\noutput y\noutput z\n")
    assert ops(g).count("mul") == 3 and out(g, "z").shape == (2, 8)


def test_list_index_and_literal_lists():
    g = elab("hs = [x[i] for i in 0..4]\noutput y = hs[-1] + hs[0]\n")
    assert out(g).shape == (8,)


def test_state_read_after_store_sees_stored_value():
    g = elab("state kc : f16[6, 8]\nkc[1:3, :] <- x[0:2]\ny = kc[0:3]\nkc[5] <- x[3]\noutput y\n")
    s1, s2 = [n for n in g.nodes() if n.op == "store"]
    assert s1.inputs[0] == g.decls["kc"] and s1.attrs == {"name": "kc", "index": ((1, 3), (0, 8))}
    assert g.node(out(g).inputs[0]).id == s1.id          # the slice reads the stored version
    assert s2.inputs[0] == s1.id and s2.attrs["index"] == ((5, 6), (0, 8))
    assert g.node(s2.inputs[1]).op == "reshape" and g.node(s2.inputs[1]).shape == (1, 8)
    assert g.final_states["kc"] == s2.id and s2.shape == (6, 8) and s2.dtype == "f16"


def test_store_inside_function_updates_the_global_state():
    g = elab("state c : f16[4, 8]\nfn put(v) { c[0:1, :] <- v\n return c[0:2] }\noutput y = put(x[0:1])\n")
    st = [n for n in g.nodes() if n.op == "store"][0]
    assert g.final_states["c"] == st.id and g.node(out(g).inputs[0]).id == st.id


def test_program_with_only_a_store_needs_no_output():
    g = elab("state c : f16[4, 8]\nc[:, :] <- x\n")
    assert g.outputs == {} and g.node(g.final_states["c"]).op == "store"


def test_graph_is_in_program_order():
    g = elaborate_file(PROGRAMS[0])
    for n in g.nodes():
        assert all(i < n.id for i in n.inputs)


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_programs_elaborate_and_fit_one_chip(path):
    text = path.read_text()
    assert text.startswith("#"), "each program starts with comments saying what it is"
    g = elaborate_file(path)
    resident = sum(n.nbytes for n in g.nodes() if n.op in ("weight", "state"))
    assert resident < SRAM_BYTES
    assert g.outputs and all(n.line > 0 for n in g.nodes())
    assert set(g.params) >= {"D"}


@pytest.mark.parametrize("name", ["llama_block_prefill", "llama_block_decode"])
def test_llama_scales_to_7b_sizes(name):
    g = elaborate_file(Path(PROGRAMS[0]).parent / f"{name}.lpu", {"D": 4096, "H": 32, "F": 11008})
    assert g.params["HD"] == 128
    assert sum(n.nbytes for n in g.leaves("weight")) == 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 2 * 4 * 4096


DESIGN_EXAMPLE = """
# comments start with '#'
param S = 128              # compile-time integer; `-p S=256` on the command line overrides it
param D = 768
param H = 12
param HD = D / H           # integer arithmetic: + - * / % ; '/' must divide exactly

input  x    : f16[S, D]    # supplied per run
weight wqkv : f16[D, 3*D]  # resident in SRAM
weight bqkv : f16[3*D]
weight ln_g : f32[D]
weight ln_b : f32[D]
state  kc   : f16[512, D]  # persists in SRAM between runs (KV cache)

fn attend(q, k, v) {       # inlined at every call
    s = causal(q @ k.T * (1.0 / sqrt(HD)))
    return softmax(s) @ v
}

h    = layernorm(x, ln_g, ln_b)
qkv  = h @ wqkv + bqkv
q    = qkv[:, 0:D]
k    = qkv[:, D:2*D]
v    = qkv[:, 2*D:3*D]
heads = [attend(q[:, i*HD:(i+1)*HD], k[:, i*HD:(i+1)*HD], v[:, i*HD:(i+1)*HD]) for i in 0..H]
a    = concat(heads, axis=1)
kc[0:S, :] <- f16(k)       # store into a state tensor (fill the KV cache)
for l in 0..2 { a = a + x }   # compile-time loop; names may be rebound
output a
"""


def test_design_example_elaborates():
    g = elaborate_source(DESIGN_EXAMPLE, "design.lpu", {"S": 64})
    a = g.node(g.node(g.outputs["a"]).inputs[0])
    assert (a.shape, a.dtype, a.line) == ((64, 768), "f32", 28)   # the last `a = a + x`
    assert ops(g).count("matmul") == 1 + 2 * 12 and g.params["HD"] == 64
    assert g.node(g.final_states["kc"]).attrs["index"] == ((0, 64), (0, 768))


def test_graph_views_agree_and_pass_copies_share_unchanged_nodes():
    """users() and the networkx view (.g, built on first use) give the same edges; a rewrite
    pass's copy reuses the Nodes it leaves as they are, and a changed node gets a new Node."""
    from lpu.compiler.rewrite import rebuild
    g = elaborate_file(next(p for p in PROGRAMS if p.stem == "mlp"))
    for n in g.nodes():
        assert g.users(n.id) == sorted(g.g.successors(n.id))
        assert g.g.nodes[n.id]["n"] is n
    same = rebuild(g, lambda new, n, m: None)
    assert all(a is b for a, b in zip(same.nodes(), g.nodes()))
    mm = next(n.id for n in g.nodes() if n.op == "matmul")

    def note(new, n, m):     # the first matmul copied with one more attribute
        if n.id != mm:
            return None
        return new.add(n.op, [m[i] for i in n.inputs], n.shape, n.dtype, {"note": 1}, n.line, n.col)
    changed = rebuild(g, note)
    assert changed.node(mm) is not g.node(mm) and changed.node(mm).attrs == {"note": 1}
    assert "note" not in g.node(mm).attrs
    assert changed.node(mm - 1) is g.node(mm - 1)
    assert changed.users(mm) and all(changed.node(u) is g.node(u) for u in changed.users(mm))
    assert changed.users(mm) == sorted(changed.g.successors(mm))
