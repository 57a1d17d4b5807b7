"""End-to-end: DSL source -> compiled program -> emulated result, against the numpy reference,
with the compiler's predicted cycles equal to the emulator's."""
import os

import numpy as np
import pytest

from lpu.compiler.driver import compile_source
from lpu.emulator.run import HazardError, run
from lpu.isa.machine import MachineConfig
from lpu.isa.opcodes import BY_NAME, NOP
from lpu import api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "programs")


@pytest.fixture(scope="module")
def tsp():
    return MachineConfig.load("tsp-v1")


@pytest.fixture(scope="module")
def tiny():
    return MachineConfig.load("tiny")


def compile_run_check(src, machine, seed=0, params=None):
    prog, graph = compile_source(src, "t.lpu", params or {}, machine)
    values = api.inputs_for(graph, prog, seed)
    res = run(prog, values)
    chk = api.check(graph, prog, values, res)
    return prog, res, chk


@pytest.mark.parametrize("dt", ["f16", "i8"])
@pytest.mark.parametrize("mname", ["tsp-v1", "tiny"])
def test_matmul_odd_shapes_match_reference(dt, mname):
    m = MachineConfig.load(mname)
    src = f"input a : {dt}[3, 700]\nweight b : {dt}[700, 450]\noutput y = a @ b\n"
    prog, res, chk = compile_run_check(src, m)
    assert res.cycles == prog.predicted_cycles
    assert chk["ok"], chk
    if dt == "i8":
        assert chk["max_abs_err"] == 0.0


@pytest.mark.parametrize("mname", ["tsp-v1", "tiny"])
def test_mlp_checks_with_equal_cycles(mname):
    m = MachineConfig.load(mname)
    prog, graph = api.compile(os.path.join(PROGRAMS, "mlp.lpu"), {}, m)
    values = api.inputs_for(graph, prog, 0)
    res = run(prog, values)
    assert res.cycles == prog.predicted_cycles
    assert api.check(graph, prog, values, res)["ok"]
    assert res.utilization["mxm"] > 0


ELEMENTWISE = [
    ("f32", "exp(x) + sigmoid(x) * tanh(x)"),
    ("f32", "maximum(x, 0.5) - minimum(x, -0.25) / 2.0"),
    ("f16", "gelu(x) + silu(x) - relu(x)"),
    ("f32", "sqrt(abs(x)) + log(abs(x) + 1.0) + rsqrt(abs(x) + 1.0)"),
    ("f32", "x - mean(x, axis=-1)"),
    ("f32", "x / sum(x, axis=0)"),
    ("f16", "softmax(x)"),
    ("f32", "causal(x, offset=1)"),
    ("f32", "max(x, axis=-1) + max(x, axis=0)"),
    ("i8", "i8(x * 3) + x"),
    ("i32", "i32(x) * 7 - x"),
    ("f32", "f16(x) + 1.5"),
]


@pytest.mark.parametrize("dt,expr", ELEMENTWISE)
def test_elementwise_and_reductions_on_tiny(tiny, dt, expr):
    src = f"input x : {dt}[5, 37]\noutput y = {expr}\n"
    prog, res, chk = compile_run_check(src, tiny)
    assert res.cycles == prog.predicted_cycles
    assert chk["ok"], chk


MOVES = [
    "x[1:4, 3:30]",
    "concat([x[:, 0:5], x[:, 20:37], x[:, 5:7]], axis=1)",
    "concat([x, x], axis=0)",
    "reshape(x[:, 0:36], [5, 6, 6])",
    "x.T",
    "transpose(reshape(x[:, 0:36], [5, 4, 9]), [1, 0, 2])",
    "rope(x[:, 0:36], 3)",
    "x[2]",
    "x[:, 0:18] @ x[:, 18:36].T",
]


@pytest.mark.parametrize("expr", MOVES)
def test_data_movement_on_tiny(tiny, expr):
    src = f"input x : f16[5, 37]\noutput y = {expr}\n"
    prog, res, chk = compile_run_check(src, tiny)
    assert res.cycles == prog.predicted_cycles
    assert chk["ok"], chk


def test_state_store_then_read_sees_new_value(tiny):
    src = ("input x : f16[2, 20]\nstate c : f16[8, 20]\n"
           "a = c[0:2, :]\nc[2:4, :] <- x\nb = c[1:4, :]\noutput y = b + 1.0\noutput z = a * 2.0\n")
    prog, res, chk = compile_run_check(src, tiny)
    assert chk["ok"], chk


@pytest.mark.parametrize("value", ["a", "concat([a[:, 0:24], a[:, 24:64]], axis=1)"])
@pytest.mark.parametrize("mname", ["tiny", "tsp"])
def test_old_state_read_then_stored_over(mname, value, request):
    """A row read before a store to it keeps its old value, also where the read is fused into
    an elementwise user that comes after the store (plan._keep_old_reads)."""
    src = (f"state s : f16[4, 64]\ninput a : f16[1, 64]\nold = s[2:3, :] * 2.0\n"
           f"s[2:3, :] <- {value}\noutput y = old + s[2:3, :]\n")
    prog, res, chk = compile_run_check(src, request.getfixturevalue(mname))
    assert res.cycles == prog.predicted_cycles
    assert chk["ok"], chk


def _shift_first(prog, opname, delta):
    """A copy of prog with the first `opname` instruction issued `delta` cycles later (by the
    NOP in front of it)."""
    op = BY_NAME[opname].code
    idx = int(np.nonzero(prog.op == op)[0][0])
    assert prog.op[idx - 1] == NOP, "expected a NOP in front"
    args = prog.args.copy()
    args[idx - 1, 0] += delta
    return type(prog)(**{**prog.__dict__, "args": args})


@pytest.mark.parametrize("opname,delta", [("READ", -1), ("READ", 1), ("ACC", -1)])
def test_moved_instruction_is_reported_not_run(tsp, opname, delta):
    prog, graph = compile_source("input a : f16[3, 40]\nweight b : f16[40, 30]\noutput y = a @ b\n",
                                 "t.lpu", {}, tsp)
    bad = _shift_first(prog, opname, delta)
    with pytest.raises(HazardError) as e:
        run(bad, api.inputs_for(graph, prog, 0))
    assert e.value.line == 3 and e.value.cycle >= 0


def test_compile_is_deterministic(tiny):
    from lpu.isa.encoding import encode
    src = open(os.path.join(PROGRAMS, "attention_decode.lpu")).read()
    a, _ = compile_source(src, "a.lpu", {}, tiny)
    b, _ = compile_source(src, "a.lpu", {}, tiny)
    assert encode(a) == encode(b)


def test_compile_leaves_no_reference_cycles_per_chain(tsp):
    """Lowering builds chains through recursive closures; left as reference cycles they held
    every fused chain until a GC pass (25,965 objects for gpt2_block_prefill, 0.2 s of GC
    after a bert_base compile). Now only the graph's own cycles remain."""
    import gc
    src = open(os.path.join(PROGRAMS, "gpt2_block_prefill.lpu")).read()
    gc.collect()
    gc.disable()
    try:
        prog, graph = compile_source(src, "g.lpu", {}, tsp)
        del prog, graph
        assert gc.collect() < 10_000
    finally:
        gc.enable()


def test_i8_weights_widened_by_the_mxm(tiny):
    src = "input x : f16[3, 40]\nweight w : i8[40, 21]\noutput y = f16(x @ f16(w))\n"
    prog, res, chk = compile_run_check(src, tiny)
    from lpu.isa.opcodes import LW
    assert (prog.args[prog.op == LW, 2] == 1).all()      # widened on load, no f16 copy of w
    assert chk["ok"] and res.cycles == prog.predicted_cycles


@pytest.mark.parametrize("cols", [3, 37, 700])
@pytest.mark.parametrize("expr", ["softmax(x)", "x - mean(x, axis=-1)", "max(x, axis=-1)", "sum(x, axis=-1)"])
def test_lane_reductions_on_tsp(tsp, expr, cols):
    prog, res, chk = compile_run_check(f"input x : f32[3, {cols}]\noutput y = {expr}\n", tsp)
    assert chk["ok"], chk


BUNDLED_PROGRAMS = ["matmul", "mlp", "attention_prefill", "attention_decode", "gpt2_block_prefill",
                  "gpt2_block_decode", "llama_block_decode",
                  pytest.param("llama_block_prefill", marks=pytest.mark.slow),
                  # the 12-layer models: a rewrite exact on few layers can drift past the tolerance
                  # on twelve (a one-pass f16 variance did: gpt2_small_prefill's kc off by 8.0)
                  pytest.param("gpt2_small_prefill", marks=pytest.mark.slow),
                  pytest.param("gpt2_small_decode", marks=pytest.mark.slow),
                  pytest.param("bert_base", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", BUNDLED_PROGRAMS)
def test_bundled_program_checks_on_tsp(tsp, name):
    prog, graph = api.compile(os.path.join(PROGRAMS, f"{name}.lpu"), {}, tsp)
    values = api.inputs_for(graph, prog, 0)
    res = run(prog, values)
    assert res.cycles == prog.predicted_cycles
    assert api.check(graph, prog, values, res)["ok"]


def test_disasm_then_asm_gives_the_same_bytes(tmp_path):
    from lpu.cli import main
    b1, s, b2 = tmp_path / "a.lpubin", tmp_path / "a.s", tmp_path / "b.lpubin"
    assert main(["compile", os.path.join(PROGRAMS, "attention_decode.lpu"), "-o", str(b1)]) == 0
    assert main(["disasm", str(b1), "-o", str(s)]) == 0
    assert main(["asm", str(s), "-o", str(b2)]) == 0
    assert b1.read_bytes() == b2.read_bytes()


def test_emulated_gpt2_block_matches_independent_numpy(tsp):
    """The emulator against a GPT-2 block written directly in numpy (not the IR interpreter)."""
    from lpu.compiler.semantics import TOLERANCE
    from test_reference import gpt2_block_numpy
    params = {"S": 16, "D": 64, "H": 4, "C": 32}
    prog, graph = api.compile(os.path.join(PROGRAMS, "gpt2_block_prefill.lpu"), params, tsp)
    values = api.inputs_for(graph, prog, 0)
    res = run(prog, values)
    want, qkv = gpt2_block_numpy(values, graph.params)
    atol, rtol = TOLERANCE["f16"]
    np.testing.assert_allclose(res.outputs["y"].astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol)
    np.testing.assert_allclose(res.states["kc"][:16].astype(np.float64), qkv[:, 64:128].astype(np.float64),
                               atol=atol, rtol=rtol)


def test_emulated_i8_weight_model_checks(tsp):
    prog, graph = api.compile(os.path.join(PROGRAMS, "gpt2_small_decode.lpu"),
                              {"L": 2, "D": 128, "H": 2, "C": 32, "T": 5}, tsp)
    values = api.inputs_for(graph, prog, 0)
    res = run(prog, values)
    assert res.cycles == prog.predicted_cycles
    assert api.check(graph, prog, values, res)["ok"]


@pytest.mark.parametrize("expr", ["transpose(x, [2, 0, 1])", "transpose(x, [1, 2, 0])", "transpose(x, [2, 1, 0])",
                                  "x[:, :, 3]", "x[1, 2, 30]"])
def test_any_transpose_and_last_axis_index_on_tiny(tiny, expr):
    prog, res, chk = compile_run_check(f"input x : f32[3, 5, 37]\noutput y = {expr}\n", tiny)
    assert chk["ok"], chk


@pytest.mark.parametrize("store", ["c[1:3, 5:12] <- x", "c[2, 3:40] <- f32(z)", "c[1:2, 17:18] <- x[0:1, 0:1]"])
def test_store_into_part_of_a_chunk(tiny, store):
    src = (f"input x : f16[2, 7]\ninput z : f32[37]\nstate c : f16[6, 40]\n{store}\n"
           "output y = c[0:4, :] * 2.0\n")
    prog, res, chk = compile_run_check(src, tiny)
    assert chk["ok"], chk              # the final state is compared too
