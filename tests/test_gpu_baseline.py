"""The analytical GPU baseline: configs, the per-kernel cost model, and validation against
published measurements."""
import math
import os

import pytest

from lpu.gpu_baseline import workloads
from lpu.gpu_baseline.gpus import gpu_from_dict, known_gpus, load_gpu
from lpu.gpu_baseline.model import cost_graph, is_decode, summarize
from lpu.gpu_baseline.validate import format_table, median_abs_error, validation_table
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


def test_graph_launch_is_cheaper_than_stream():
    g = workloads.decode_step(128, layers=2)
    assert cost_graph(g, A100, launch="graph").total_us < cost_graph(g, A100, launch="stream").total_us


def test_faster_gpu_is_faster():
    g = workloads.decode_step(1024, layers=2)
    t = [cost_graph(g, load_gpu(n)).total_us for n in GPUS]
    assert t[0] > t[1] > t[2]


def test_linear_costs_match_roofline():
    # decode GEMV: weight bytes at HBM x efficiency, plus latency and launch
    c = cost_graph(workloads.decode_linear("o"), A100)
    bw = A100.hbm_gbs * 1e9 * A100.hbm_efficiency
    expect = 4096 * 4096 * 2 / bw * 1e6 + A100.hbm_latency_us + A100.launch_stream_us
    assert c.total_us == pytest.approx(expect, rel=0.01)
    assert c.ops[0].flops == pytest.approx(2 * 4096 * 4096, rel=0.01)


def test_summarize():
    s = summarize(workloads.decode_step(64, layers=1), A100, launch="graph")
    assert s["phase"] == "decode" and s["tokens_per_s"] > 0
    s = summarize(workloads.prefill(128, layers=1), A100)
    assert s["phase"] == "prefill" and s["ttft_ms"] > 0


# ---- validation ----------------------------------------------------------------------------------
def test_validation_error_bound():
    rows = validation_table()
    print("\n" + format_table(rows))
    assert len(rows) >= 7
    assert median_abs_error(rows) <= 0.15
    assert all(abs(r["error"]) < 0.35 for r in rows)


def test_calibrate_script_compiles_and_imports_torch_lazily():
    import ast

    path = os.path.join(os.path.dirname(workloads.__file__), "calibrate.py")
    tree = ast.parse(open(path).read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top for a in n.names} | {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert "torch" not in names
    compile(open(path).read(), path, "exec")
