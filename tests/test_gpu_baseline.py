"""The analytical GPU baseline: configs, the per-kernel cost model, and validation against
published measurements."""
import math
import os

import pytest

from lpu.gpu_baseline import validate, workloads
from lpu.gpu_baseline.gpus import gpu_from_dict, known_gpus, load_gpu
from lpu.gpu_baseline.model import cost_graph, gemm_plan, is_decode, summarize
from lpu.gpu_baseline.tensor_parallel import allreduce_us
from lpu.gpu_baseline.validate import format_summary, format_table, median_abs_error, validation_table
from lpu.isa.errors import ConfigError, LpuError

A100 = load_gpu("a100-80gb")
GPUS = ["a100-80gb", "h100-sxm", "h200"]


# ---- configs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GPUS)
def test_configs_load(name):
    g = load_gpu(name)
    assert g.name == name and g.hbm_gbs > 1000 and g.tensor_f16_tflops > 100
    assert 0 < g.hbm_efficiency <= 1 and g.sm_count > 0
    assert name in known_gpus()


def test_load_by_path():
    path = os.path.join(os.path.dirname(workloads.__file__), "gpus", "h200.toml")
    assert load_gpu(path).hbm_gbs == 4800


def _toml_without(tmp_path, drop=None, set_=None):
    src = open(A100.source).read().splitlines()
    out = []
    for line in src:
        key = line.split("=")[0].strip()
        if key == drop:
            continue
        if set_ and key == set_[0]:
            line = f"{key} = {set_[1]}"
        out.append(line)
    p = tmp_path / "bad.toml"
    p.write_text("\n".join(out))
    return str(p)


def test_missing_field_names_field_and_file(tmp_path):
    p = _toml_without(tmp_path, drop="l2_gbs")
    with pytest.raises(ConfigError) as e:
        load_gpu(p)
    assert "l2_gbs" in str(e.value) and "bad.toml" in str(e.value)
    assert isinstance(e.value, LpuError)


@pytest.mark.parametrize("field,value", [("hbm_gbs", -2039), ("hbm_gbs", 0), ("sm_count", 1.5),
                                         ("hbm_efficiency", 1.5), ("launch_graph_us", '"fast"')])
def test_invalid_value_names_field(tmp_path, field, value):
    with pytest.raises(ConfigError) as e:
        load_gpu(_toml_without(tmp_path, set_=(field, value)))
    assert field in str(e.value) and "bad.toml" in str(e.value)


def test_unknown_gpu_and_field():
    with pytest.raises(ConfigError, match="unknown GPU"):
        load_gpu("v100")
    d = {k: getattr(A100, k) for k in A100.__dataclass_fields__ if k != "source"}
    with pytest.raises(ConfigError, match="bogus"):
        gpu_from_dict({**d, "bogus": 1})
    with pytest.raises(ConfigError, match="launch mode"):
        A100.launch_us("async")


# ---- cost model --------------------------------------------------------------------------------
def test_times_sum_to_total_and_every_op_has_a_bound():
    c = cost_graph(workloads.decode_step(64, layers=2), A100)
    assert math.isclose(sum(o.time_us for o in c.ops), c.total_us)
    assert all(o.bound in {"compute", "hbm", "latency", "launch"} and o.time_us > 0 for o in c.ops)
    assert math.isclose(sum(c.by_bound().values()), c.total_us)
    assert math.isclose(sum(c.by_line().values()), c.total_us)


@pytest.mark.parametrize("dim", ["m", "k", "n"])
def test_cost_monotonic_in_sizes(dim):
    prev = 0.0
    for size in (64, 256, 1024, 4096, 16384):
        shape = {"m": 256, "k": 1024, "n": 1024, dim: size}
        t = cost_graph(workloads.linear(shape["k"], shape["n"], shape["m"]), A100).total_us
        assert t >= prev
        prev = t


def test_cost_monotonic_in_context_and_prompt():
    dec = [cost_graph(workloads.decode_step(c, layers=1), A100).total_us for c in (16, 256, 4096)]
    pre = [cost_graph(workloads.prefill(s, layers=1), A100).total_us for s in (16, 256, 2048)]
    assert dec == sorted(dec) and pre == sorted(pre)


def test_decode_is_hbm_bound_and_big_prefill_compute_bound():
    dec = cost_graph(workloads.decode_step(512, layers=2), A100)
    bounds = dec.by_bound()
    assert bounds["hbm"] > 0.8 * dec.total_us
    assert is_decode(workloads.decode_step(512, layers=1))
    pre = cost_graph(workloads.prefill(2048, layers=2), A100)
    assert pre.by_bound()["compute"] > 0.8 * pre.total_us
    assert not is_decode(workloads.prefill(2048, layers=1))
    for name in workloads.LLAMA2_7B_LINEARS:
        assert cost_graph(workloads.decode_linear(name), A100).ops[0].bound == "hbm"


def test_fusion_reduces_time_and_kernels():
    g = workloads.decode_step(128, layers=2)
    fused, unfused = cost_graph(g, A100, fuse=True), cost_graph(g, A100, fuse=False)
    assert fused.total_us < unfused.total_us
    assert len(fused.ops) < len(unfused.ops)
    assert any(o.op == "attention" for o in fused.ops)
    sm = workloads.softmax(4096, 4096)
    assert len(cost_graph(sm, A100).ops) == 1
    assert cost_graph(sm, A100).total_us < cost_graph(sm, A100, fuse=False).total_us


def test_eager_keeps_attention_fused_and_splits_everything_else():
    g = workloads.prefill(256, layers=2)
    fused, eager, unfused = (cost_graph(g, A100, fuse=f) for f in (True, "eager", False))
    assert len(fused.ops) < len(eager.ops) < len(unfused.ops)
    assert fused.total_us < eager.total_us < unfused.total_us
    assert sum(o.op == "attention" for o in eager.ops) == sum(o.op == "attention" for o in fused.ops) == 2
    assert all(len(o.fused) == 1 for o in eager.ops if o.op != "attention")
    with pytest.raises(ConfigError, match="fuse must be one of"):
        cost_graph(g, A100, fuse="inductor")


def test_graph_launch_is_cheaper_than_stream():
    g = workloads.decode_step(128, layers=2)
    assert cost_graph(g, A100, launch="graph").total_us <= cost_graph(g, A100, launch="stream").total_us
    import dataclasses
    slow_host = dataclasses.replace(A100, launch_stream_us=20.0)        # host-bound: graphs pay off
    assert cost_graph(g, slow_host, launch="graph").total_us < cost_graph(g, slow_host, launch="stream").total_us


def test_faster_gpu_is_faster():
    g = workloads.decode_step(1024, layers=2)
    t = [cost_graph(g, load_gpu(n)).total_us for n in GPUS]
    assert t[0] > t[1] > t[2]


def test_linear_costs_match_roofline():
    # decode GEMV: weight bytes at HBM x efficiency plus the GEMM's fixed cost (kernel duration)
    c = cost_graph(workloads.decode_linear("gate_up"), A100, "none")
    bw = A100.hbm_gbs * 1e9 * A100.hbm_efficiency
    expect = 4096 * 22016 * 2 / bw * 1e6 + A100.gemm_fixed_us
    assert c.total_us == pytest.approx(expect, rel=0.02)
    assert c.ops[0].flops == pytest.approx(2 * 4096 * 22016, rel=0.01)
    # launches: a graph adds its gap; a stream costs at least one host launch
    assert cost_graph(workloads.decode_linear("gate_up"), A100, "graph").total_us == pytest.approx(
        c.total_us + A100.launch_graph_us)
    import dataclasses
    slow_host = dataclasses.replace(A100, launch_stream_us=50.0)
    tiny = cost_graph(workloads.elementwise(64), slow_host, "stream")
    assert tiny.total_us == pytest.approx(50.0) and tiny.ops[0].bound == "launch"


def test_summarize():
    s = summarize(workloads.decode_step(64, layers=1), A100, launch="graph")
    assert s["phase"] == "decode" and s["tokens_per_s"] > 0
    s = summarize(workloads.prefill(128, layers=1), A100)
    assert s["phase"] == "prefill" and s["ttft_ms"] > 0


# ---- GEMM tile heuristic, attention, tensor-parallel groups -----------------------------------
H200 = load_gpu("h200")


def test_gemm_plan_picks_small_tiles_and_split_k_for_narrow_shapes():
    peak = H200.tensor_f16_tflops * 1e12
    # one token: the 8-row tiles cuBLAS ran on the H200 (data/gemm-kernels-h200.json), memory-bound
    p = gemm_plan(H200, 1, 1, 4096, 22016, peak)
    assert p.tile_m <= 16 and p.memory_us > p.compute_us
    # narrow N at one token: split-K fills the SMs (cuBLAS used splitK for 1x8192x1280 on the H200)
    p = gemm_plan(H200, 1, 1, 8192, 1280, peak)
    assert p.split_k > 1 and 2 * p.ctas >= H200.sm_count
    # 512 x 4096 x 4096: about one block per SM (cuBLAS ran 128 blocks of 128x128 on the 132 SMs,
    # data/gemm-kernels-h200.json), not a 64x64 grid of 512 blocks that L2 cannot feed
    p = gemm_plan(H200, 1, 512, 4096, 4096, peak)
    assert 0.9 * H200.sm_count <= p.ctas <= 2 * H200.sm_count and p.tile_m <= 128
    # a big GEMM: whole waves, at the fitted tensor efficiency
    p = gemm_plan(H200, 1, 8192, 8192, 8192, peak)
    achieved = 2 * 8192 ** 3 / (p.compute_us * 1e-6) / peak
    assert achieved == pytest.approx(H200.tensor_efficiency, rel=0.05)


def test_h100_gemm_rule_from_its_config():
    """The H100's GEMM rule (gpus/h100-sxm.toml): 64-row tiles only up to 64 rows, split-K up to 512
    rows, and the plan's whole time (HBM share, L2 feed) in the kernel's cost; each switch is the
    config's, so the same code with the H200's fields keeps the H200's rule."""
    import dataclasses
    h100 = load_gpu("h100-sxm")
    peak = h100.tensor_f16_tflops * 1e12
    assert gemm_plan(h100, 1, 64, 11008, 4096, peak).tile_m == 64
    assert gemm_plan(h100, 1, 72, 11008, 4096, peak).tile_m == 128      # not 64-row tiles past 64 rows
    loose = dataclasses.replace(h100, gemm_narrow_tiles_own_rows=False)
    assert gemm_plan(loose, 1, 72, 11008, 4096, peak).tile_m == 64
    # split-K: allowed at 512 rows on the H100, never past 256 on the H200
    assert gemm_plan(h100, 1, 512, 11008, 4096, peak).split_k > 1
    assert gemm_plan(dataclasses.replace(h100, gemm_split_k_max_rows=256), 1, 512, 11008, 4096, peak).split_k == 1
    # the plan's whole time: a narrow GEMM whose few blocks cannot pull HBM at full rate costs more with it
    g = workloads.linear(4096, 4096, m_rows=64)
    bound = cost_graph(g, h100, "none").total_us
    steer = cost_graph(g, dataclasses.replace(h100, gemm_plan_bound=False), "none").total_us
    assert bound > steer
    plan = gemm_plan(h100, 1, 64, 4096, 4096, peak)
    assert bound == pytest.approx(max(plan.compute_us, plan.memory_us) + h100.gemm_fixed_us, rel=0.05)
    for bad in (1, "yes"):
        d = {k: getattr(h100, k) for k in h100.__dataclass_fields__ if k != "source"}
        with pytest.raises(ConfigError, match="gemm_plan_bound"):
            gpu_from_dict({**d, "gemm_plan_bound": bad})


def test_row_kernel_model():
    from lpu.gpu_baseline.model import REREAD_LATENCY
    # one row of 4,096 with Sarathi's kernel (one block of 1,024 threads, one element per load):
    # 4 steps per pass, a re-read pass, each step a DRAM latency; 16 KB moved is next to nothing
    one = cost_graph(workloads.rmsnorm(1, 4096), A100, "none", row_style="scalar")
    chain = A100.hbm_latency_us * (1 + REREAD_LATENCY) * 4
    assert one.total_us == pytest.approx(A100.kernel_fixed_us + chain, rel=0.02)
    assert one.ops[0].bound == "latency"
    # 16-byte loads: one step per pass (512 threads x 8 elements), so far less waiting
    vec = cost_graph(workloads.rmsnorm(1, 4096), A100, "none")
    assert vec.total_us == pytest.approx(A100.kernel_fixed_us + chain / 4, rel=0.02)
    # many rows: waves of blocks over the SMs, plus the bytes at the HBM peak; scalar is slower
    big_s = cost_graph(workloads.rmsnorm(4096, 4096), A100, "none", row_style="scalar").total_us
    big_v = cost_graph(workloads.rmsnorm(4096, 4096), A100, "none").total_us
    bytes_us = 2 * 4096 * 4096 * 2 / (A100.hbm_gbs * 1e3)
    assert big_s > big_v > bytes_us + A100.kernel_fixed_us
    # an unfused KV-cache store writes one row: its chain does not grow with the cache
    stores = [[o.time_us for o in cost_graph(workloads.decode_step(ctx, layers=1), A100, "none", fuse=False).ops
               if o.op == "store"] for ctx in (256, 32768)]
    assert stores[0] == pytest.approx(stores[1]) and max(stores[1]) < 2 * A100.kernel_fixed_us
    with pytest.raises(ConfigError, match="row kernel style"):
        cost_graph(workloads.rmsnorm(1, 4096), A100, row_style="wide")


def test_inputs_in_l2_by_name():
    g = workloads.elementwise(512 * 4096)
    t = {k: cost_graph(g, A100, "none", inputs_in_l2=k).total_us for k in (False, ("b",), True)}
    assert t[False] > t[("b",)] > t[True]


def test_gemm_plan_beats_a_fixed_128_tile_on_narrow_prefill():
    import dataclasses
    fixed = dataclasses.replace(A100, gemm_tiles=((128, 128),))
    peak = A100.tensor_f16_tflops * 1e12
    for m in (128, 256, 512):
        assert gemm_plan(A100, 1, m, 4096, 4096, peak).time_us <= gemm_plan(fixed, 1, m, 4096, 4096, peak).time_us


def test_flash_attention_prefill_and_decode():
    pre = cost_graph(workloads.attention(2048, 2048, 32, 32, 128), H200, "none")
    assert [o.op for o in pre.ops] == ["attention"] and pre.ops[0].bound == "compute"
    dec = cost_graph(workloads.attention(1, 32768, 32, 32, 128), H200, "none")
    assert dec.ops[0].bound == "hbm"
    kv = 2 * 32 * 32768 * 128 * 2
    assert dec.ops[0].hbm_bytes == pytest.approx(kv, rel=0.01)


def test_tensor_parallel_splits_weights_and_adds_two_allreduces_per_layer():
    m = workloads.MODELS["llama2-70b"]
    g = workloads.decode_step(256, m=m, layers=2)
    one = cost_graph(g, A100, "graph")
    assert not any(o.op == "all_reduce" for o in one.ops)
    for n in (2, 4, 8):
        c = cost_graph(g, A100, "graph", gpus=n)
        ars = [o for o in c.ops if o.op == "all_reduce"]
        assert len(ars) == 2 * 2                           # attention output and FFN output, per layer
        assert all(o.bytes == 8192 * 2 for o in ars)       # one token's hidden state in f16
        # layer weights split n ways; the LM head (no row-parallel partner) stays whole
        w_one = sum(o.hbm_bytes for o in one.ops if o.op == "matmul")
        w_n = sum(o.hbm_bytes for o in c.ops if o.op == "matmul")
        head = 8192 * 32000 * 2
        assert w_n == pytest.approx((w_one - head) / n + head, rel=0.02)
    t = [cost_graph(g, A100, "graph", gpus=n).total_us for n in (1, 2, 4, 8)]
    assert t == sorted(t, reverse=True)


I8_MLP = """input x : f16[1, 1024]
weight w1 : i8[1024, 4096]
weight s1 : f16[4096]
weight w2 : i8[4096, 1024]
weight s2 : f16[1024]
h = f16(relu(f16((x @ f16(w1)) * s1)))
output y = f16((h @ f16(w2)) * s2)
"""


def test_weight_only_int8_is_read_as_int8_and_split():
    """x @ f16(w) with an i8 weight: the compiled matmul reads the stored bytes (the widening is
    its prologue, as gpt-fast's int8 kernels do), and a tensor-parallel group splits it."""
    from lpu.compiler.frontend import elaborate_source
    g = elaborate_source(I8_MLP, "q.lpu", {})
    one = cost_graph(g, A100, "graph")
    assert not any(o.op == "cast" for o in one.ops)       # no kernel widens a weight on its own
    assert sum(o.hbm_bytes for o in one.ops if o.op == "matmul") >= 2 * 1024 * 4096
    assert sum(o.hbm_bytes for o in one.ops if o.op == "matmul") < 2 * 2 * 1024 * 4096
    two = cost_graph(g, A100, "graph", gpus=2)
    assert [o.op for o in two.ops].count("all_reduce") == 1
    assert sum(o.hbm_bytes for o in two.ops if o.op == "matmul") < 0.6 * sum(o.hbm_bytes for o in one.ops if o.op == "matmul")


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "h200"])
def test_weight_only_int8_gemv_takes_less_than_f16(gpu):
    """A decode row times an i8 weight streams half the bytes of an f16 weight of the same shape:
    on every GPU, and under every GEMM rule (the H100's plan-bound rule had costed the dequantized
    operand at 2 bytes, so Llama-2-7B's i8 decode took as long as f16's)."""
    from lpu.compiler.frontend import elaborate_source
    g = load_gpu(gpu)
    f16 = "input x : f16[1, 4096]\nweight w : f16[4096, 11008]\noutput y = f16(x @ w)\n"
    i8 = ("input x : f16[1, 4096]\nweight w : i8[4096, 11008]\nweight s : f16[1, 11008]\n"
          "output y = f16((x @ f16(w)) * s)\n")
    t16, t8 = (cost_graph(elaborate_source(src, "g.lpu", {}), g, "none").total_us for src in (f16, i8))
    assert t8 < 0.75 * t16


def test_heads_written_as_a_loop_run_as_one_attention_kernel():
    """Per-head attention (a loop over heads joined by a concat) is one flash kernel over all the
    heads, as a framework runs it, not one kernel a head."""
    from lpu.compiler.frontend import elaborate_source
    src = open(os.path.join(os.path.dirname(__file__), "..", "programs", "attention_decode.lpu")).read()
    g = elaborate_source(src, "a.lpu", {})
    h100 = load_gpu("h100-sxm")
    c = cost_graph(g, h100, "graph")
    assert [o.op for o in c.ops].count("attention") == 1
    eager = cost_graph(g, h100, "graph", fuse="eager")
    assert [o.op for o in eager.ops].count("attention") == 1


def test_allreduce_cost_latency_plus_bandwidth():
    assert allreduce_us(A100, 1, 1e6) == 0.0
    bus = A100.nvlink_gbs * 1e9 * A100.nvlink_efficiency
    for g, nbytes in ((2, 16e3), (8, 16e3), (8, 64e6)):
        assert allreduce_us(A100, g, nbytes) == pytest.approx(
            A100.allreduce_latency_us + 1e6 * 2 * (g - 1) / g * nbytes / bus, rel=1e-9)
    assert allreduce_us(A100, 8, 64e6) > 100 * allreduce_us(A100, 8, 16e3) / 10     # bandwidth-bound when big


def test_bad_group_size():
    with pytest.raises(ConfigError, match="GPU group"):
        cost_graph(workloads.decode_step(16, layers=1), A100, gpus=3)


# ---- validation ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows():
    return validation_table()


def test_validation_set_is_broad_and_split_before_fitting(rows):
    import hashlib
    assert len(rows) >= 60
    assert {r["gpu"] for r in rows} >= set(GPUS)
    assert {r["kind"] for r in rows} >= {"prefill op", "decode op", "end to end", "TP decode"}
    for r in rows:      # the split is the recorded hash rule, not a choice made after fitting
        held = int(hashlib.sha256(r["case"].encode()).hexdigest(), 16) % 3 == 0
        assert r["set"] == ("held-out" if held else "fit")
    print("\n" + format_summary(rows))


# Issue 16's targets (validate.HELD_OUT_MEDIAN, WORST, TP_DECODE) on the A100 and the H100, asserted
# as they hold today. The A100 and H100 cases beyond WORST, each with the most it may miss by (so that
# a regression fails); a case may leave this list, none may join it: a plain model miss, at the bound.
KNOWN_MISSES = {"vidur h100 Llama-2-7b TP1 mlp_up_proj T=256": 0.39}     # cuBLAS's kernel choice (its note)
# Rows their own source contradicts (validation.toml `exclude`): in no median, target or fit.
EXCLUDED = {"gpt-fast llama3.1-70b TP2": "contradicts its own table"}
HELD_OUT_MEDIAN_BY_GPU = {"a100-80gb": validate.HELD_OUT_MEDIAN, "h100-sxm": validate.HELD_OUT_MEDIAN,
                          "h200": 0.06}      # h200: not a target GPU; what it holds today


@pytest.mark.parametrize("gpu", GPUS)
def test_held_out_median(rows, gpu):
    held = [r for r in validate.included(rows) if r["gpu"] == gpu and r["set"] == "held-out"]
    assert median_abs_error(held) <= HELD_OUT_MEDIAN_BY_GPU[gpu], format_table(held)


def test_every_a100_and_h100_case_within_25_percent_but_the_known_misses(rows):
    mine = [r for r in validate.included(rows) if r["gpu"] in validate.TARGET_GPUS]
    assert len(mine) >= 150
    missed = {r["case"]: abs(r["error"]) for r in mine if abs(r["error"]) > validate.WORST}
    assert set(missed) <= set(KNOWN_MISSES), validate.format_targets(rows)
    for case, err in missed.items():
        assert err <= KNOWN_MISSES[case], (case, err)
    assert {r["case"] for r in rows if r["note"]} == {"vidur h100 Llama-2-7b TP1 mlp_up_proj T=256"}


def test_excluded_rows_are_the_contradicted_ones_and_count_nowhere(rows):
    gone = {r["case"]: r for r in rows if r["excluded"]}
    assert set(gone) == set(EXCLUDED)
    for case, reason in EXCLUDED.items():
        assert gone[case]["excluded"].startswith(reason)
        assert abs(gone[case]["error"]) > validate.WORST          # each would be a miss: kept visible
    # every summary row and target leaves them out; the listing names each with its reason
    assert not any(s["worst_case"] in gone for s in validate.summary(rows))
    misses = validate.target_misses(rows)
    assert not any(r["case"] in gone for t in misses.values() for r in t["beyond_worst"] + t["tp_beyond"])
    assert misses["a100-80gb"]["n"] == sum(r["gpu"] == "a100-80gb" for r in rows) - 1
    text = validate.format_targets(rows)
    for case in EXCLUDED:
        assert case in text.split("excluded, in no median or target")[1]
    # ... and fit.py never reads them
    from lpu.gpu_baseline import fit
    cases = [c for p in validate.default_paths() for c in validate.load_cases(p)]
    fitted = {c["id"] for g in GPUS for c in fit.fit_cases(g, cases)}
    assert "vidur h100 Llama-2-7b TP1 mlp_down_proj T=128" in fitted
    assert not fitted & set(EXCLUDED)


def test_excluded_row_leaves_the_medians_unchanged():
    base = [{"case": f"c{i}", "gpu": "h100-sxm", "set": "held-out", "kind": "prefill op", "error": 0.01 * i,
             "note": "", "excluded": ""} for i in range(1, 6)]
    bad = dict(base[0], case="bad", error=0.9, excluded="a reason")
    assert validate.summary(base + [bad]) == validate.summary(base)
    assert validate.target_misses(base + [bad])["h100-sxm"]["beyond_worst"] == []
    assert validate.target_misses(base + [dict(bad, excluded="")])["h100-sxm"]["beyond_worst"][0]["case"] == "bad"


def test_exclude_needs_a_reason(tmp_path):
    p = tmp_path / "rows.toml"
    p.write_text('[[case]]\nid = "x"\nworkload = "gemm:1,2,3"\nmetric = "kernel_us"\nmeasured = 1.0\nunit = "us"\n'
                 'source = "s"\nmodel = "m"\ngpu = "h100-sxm"\ndtype = "f16"\nbatch = 1\nprompt_len = 1\n'
                 'output_len = 1\nlaunch = "none"\nexclude = " "\n')
    with pytest.raises(ConfigError, match="exclude"):
        validate.load_cases(str(p))


def test_tensor_parallel_decode_within_target(rows):
    tp = [r for r in validate.included(rows) if r["kind"] == "TP decode"]
    assert len(tp) >= 10
    beyond = [r for r in tp if abs(r["error"]) > validate.TP_DECODE]
    assert beyond == [], format_table(tp)


def test_gpt_fast_table_bound_singles_out_the_excluded_row(rows):
    """Halving a tensor-parallel group doubles only each GPU's share of the split weights, so a
    group of g GPUs takes at most twice the time of 2g. In gpt-fast's table exactly one row breaks
    that bound, the one excluded for it; the model keeps within the bound there too."""
    cases = [c for c in validate.load_cases() if c["id"].startswith("gpt-fast")]
    ms = {(c["model"], c["gpus"]): 1.0 / c["measured"] for c in cases}
    ratios = {(m, g): t / (2 * ms[(m, 2 * g)]) for (m, g), t in ms.items() if (m, 2 * g) in ms}
    assert len(ratios) == 10
    assert [k for k, r in ratios.items() if r > 1] == [("llama3.1-70b", 2)]
    assert ratios[("llama3.1-70b", 2)] == pytest.approx(1.17, abs=0.01)
    assert max(r for k, r in ratios.items() if k != ("llama3.1-70b", 2)) < 0.9
    assert [c["id"] for c in cases if c.get("exclude")] == ["gpt-fast llama3.1-70b TP2"]
    modelled = {r["case"]: r["modelled"] for r in rows if r["case"].startswith("gpt-fast")}
    assert 1 / modelled["gpt-fast llama3.1-70b TP2"] <= 2 / modelled["gpt-fast llama3.1-70b TP4"]


def test_validate_prints_targets_notes_and_exclusions(rows):
    text = validate.format_targets(rows)
    assert "a100-80gb  held-out median" in text and "h100-sxm   held-out median" in text
    assert "note: cuBLAS's kernel choice, not the hardware" in text
    assert "excluded: contradicts its own table: Llama-3.1-70B on 2 GPUs, 16.03 tok/s at 1130.81 GB/s" in text
    assert "(excluded)" in format_table(rows)


def test_h200_held_out_worst(rows):
    held = [r for r in rows if r["gpu"] == "h200" and r["set"] == "held-out"]
    assert max(abs(r["error"]) for r in held) <= 0.40, format_table(held)


def test_calibrate_script_compiles_and_imports_torch_lazily():
    import ast

    path = os.path.join(os.path.dirname(workloads.__file__), "calibrate.py")
    tree = ast.parse(open(path).read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top for a in n.names} | {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert "torch" not in names
    compile(open(path).read(), path, "exec")


def test_compare_shows_one_gpu_and_the_group(capsys):
    import json

    from lpu.cli import main
    prog = os.path.join(os.path.dirname(workloads.__file__), "..", "programs", "attention_decode.lpu")
    assert main(["compare", prog, "--gpus", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    grp = d["gpu"]["group"]
    assert grp["gpus"] == 2 and grp["time_us"] > 0 and grp["allreduce_us"] > 0
    assert d["gpu"]["time_us"] > 0 and "tokens_per_s" in grp


def test_validate_cli_bad_file_exits_2(tmp_path, capsys):
    from lpu.gpu_baseline import validate
    p = tmp_path / "rows.toml"
    p.write_text('[[case]]\nid = "x"\nworkload = "gemm:1,2"\n')
    assert validate.main([str(p)]) == 2
    assert "lacks" in capsys.readouterr().err
