"""The benchmark runner's deterministic parts: the float32 numpy baseline agrees with the golden
model, the lower bounds are bounds (no compiled schedule beats them), the traffic accounting of
slices, and the runner end to end on a tiny machine with two small programs. No wall-clock
time is asserted."""
from __future__ import annotations

import functools
import json
import os
import shutil

import numpy as np
import pytest

import benchmarks.suite as S
from benchmarks import bounds as B
from benchmarks import npref
from benchmarks.__main__ import main as bench_main
from lpu.compiler.driver import compile_file, compile_source
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.reference import random_values, run_reference
from lpu.isa.machine import MachineConfig

PROGRAMS = S.PROGRAMS
BOUND_KEYS = ("compute", "vxm", "sram", "stream", "critical_path")


@functools.lru_cache(maxsize=None)
def _compiled(machine: str, name: str):
    m = MachineConfig.load(machine)
    prog, g = compile_file(os.path.join(PROGRAMS, name + ".lpu"), {}, m)
    return m, prog, g


def _graph(name: str, params=None):
    path = os.path.join(PROGRAMS, name + ".lpu")
    with open(path) as f:
        return elaborate_source(f.read(), path, params or {})


@pytest.mark.parametrize("name", ["mlp", "attention_prefill", "gpt2_block_decode", "llama_block_decode"])
def test_float32_baseline_matches_reference(name):
    g = _graph(name)
    values = random_values(g, 0)
    want, _ = run_reference(g, values)
    got = npref.evaluate(g, npref.prepare(g, values))
    for k, v in want.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape
        np.testing.assert_allclose(got[k], v.astype(np.float32), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("machine,name", [("tiny", "matmul"), ("tiny", "attention_decode"),
                                          pytest.param("tiny", "mlp", marks=pytest.mark.slow),
                                          ("tsp-v1", "matmul"), ("tsp-v1", "mlp"), ("tsp-v1", "attention_decode")])
def test_no_schedule_beats_the_lower_bounds(machine, name):
    m, prog, g = _compiled(machine, name)
    lb = B.lower_bounds(g, m)
    for k in BOUND_KEYS:
        assert prog.predicted_cycles >= lb[k], (k, lb)
    assert lb["bound"] == max(lb[k] for k in BOUND_KEYS)


@pytest.mark.parametrize("src", ["input x : f32[1, 64]\noutput y = max(x, axis=1)",
                                 "input x : f32[1, 320]\noutput y = max(x, axis=1)",
                                 "input x : f16[1, 64]\noutput y = softmax(x, axis=1)",
                                 "input x : f16[37, 200]\noutput y = mean(x, axis=0)"])
@pytest.mark.parametrize("machine", ["tiny", "tsp-v1"])
def test_no_reduction_beats_its_bound(machine, src):
    """Lane reductions in one SXM round trip (compiler/lower_reduce.py) beat a bound that
    charged an SXM trip per tree level: the bound is one trip and the VXM tree."""
    m = MachineConfig.load(machine)
    prog, g = compile_source(src, "<reduce>", {}, m)
    lb = B.lower_bounds(g, m)
    assert prog.predicted_cycles >= lb["bound"], (prog.predicted_cycles, lb)


@pytest.mark.parametrize("name", ["matmul", pytest.param("mlp", marks=pytest.mark.slow)])
def test_small_programs_on_tiny_are_close_to_their_bound(name):
    m, prog, g = _compiled("tiny", name)
    lb = B.lower_bounds(g, m)
    assert prog.predicted_cycles / lb["bound"] <= 1.3, (prog.predicted_cycles, lb)


def test_f16_matmul_utilization_on_tiny():
    m = MachineConfig.load("tiny")
    mm, k, n = S.scaled(m, (1280, 2560, 2560))
    prog, _ = compile_source(S.matmul_source(mm, k, n, "f16"), "<mm>", {}, m)
    util = mm * k * n / (m.macs_per_cycle("f16") * prog.predicted_cycles)
    assert util >= 0.90


def test_traffic_counts_the_slices_read_and_the_writes():
    src = ("input x : f16[1, 64]\nstate kc : f16[128, 64]\nweight w : i8[64, 64]\n"
           "kc[3:4, :] <- f16(x)\n"
           "s = x @ f16(kc[0:8, :]).T\n"
           "t = x @ f16(kc[4:12, :]).T\n"
           "output y = f16(x @ f16(w)) + s[:, 0:1] + t[:, 0:1]\n")
    g = elaborate_source(src, "<t>", {})
    read, written = B.traffic(g)
    # x whole (128 B), w whole (4096 B); kc: the store happens first, so reads are of the new
    # version and not of the declared leaf
    assert read == 128 + 4096
    assert written == 64 * 2 + 64 * 4      # the stored f16 row, the f32 output


def test_traffic_of_a_sliced_leaf_is_the_union_of_regions():
    src = ("input x : f16[1, 64]\nweight kc : f16[4, 128, 64]\n"
           "a = x @ kc[1][0:8, :].T\nb = x @ kc[1][4:12, :].T\n"
           "output y = f16(a + b)\n")
    g = elaborate_source(src, "<t>", {})
    read, _ = B.traffic(g)
    assert read == 128 + 12 * 64 * 2


def test_critical_path_counts_the_hops_between_vxm_and_mxm():
    m = MachineConfig.load("tsp-v1")
    g1 = elaborate_source("input x : f16[1, 320]\nweight w : f16[320, 320]\noutput y = x @ w\n", "<a>", {})
    g2 = elaborate_source("input x : f16[1, 320]\nweight w : f16[320, 320]\noutput y = f16(exp(x) @ w)\n", "<b>", {})
    lat = m.latency
    tail = lat["mxm_abc"] + lat["mxm_acc"] + 1 + m.icu_skew
    install = lat["mem_read"] + -(-320 // m.lw_ports_per_plane) + 1      # weights read, LW, IW
    assert B.critical_path(g1, m) == install + tail
    hops = abs(m.vxm_pos - m.mxm_pos(0))
    # the f32 product goes to the VXM to be rounded to f16 (only VXM ops convert an accumulator)
    assert B.critical_path(g2, m) == max(install, lat["mem_read"] + lat["vxm_transcendental"] + hops) + tail \
        + hops + lat["vxm"]


def test_critical_path_rounds_a_product_on_the_vxm_before_the_next_product():
    """f16(x @ w1) @ w2: ACC puts f32 on the stream, LW and ABC take f16 or i8, and only a VXM op
    converts: the first product's row goes to the VXM and back before the second product."""
    m = MachineConfig.load("tsp-v1")
    lat = m.latency
    g = elaborate_source("input x : f16[1, 320]\nweight w1 : f16[320, 320]\nweight w2 : f16[320, 320]\n"
                         "output y = f16(x @ w1) @ w2\n", "<c>", {})
    implicit = elaborate_source("input x : f16[1, 320]\nweight w1 : f16[320, 320]\nweight w2 : f16[320, 320]\n"
                                "output y = (x @ w1) @ w2\n", "<i>", {})
    d = lat["mxm_abc"] + lat["mxm_acc"]
    install = lat["mem_read"] + -(-320 // m.lw_ports_per_plane) + 1
    hops = abs(m.vxm_pos - m.mxm_pos(0))
    want = install + d + 2 * hops + lat["vxm"] + d + 1 + m.icu_skew
    assert B.critical_path(g, m) == B.critical_path(implicit, m) == want


def test_critical_path_installs_computed_weights_after_their_last_row():
    """s = x @ k.T with k = f16(x @ w) computed: k's rows go through the MXM's inputs (64 rows of
    64 lanes, at most macs_per_cycle / lanes lanes a cycle) and to the VXM to be rounded; then
    either k.T is installed (transposed, from k's rows) after k's last row (an LW and an IW) and
    y's rows follow, or y.T = k @ x.T is made (k's rows through the inputs, x installed
    transposed) and the SXM turns it into rows (its 64 vectors out of the SXMs' queues): the
    bound takes the earlier."""
    m = MachineConfig.load("tsp-v1")
    lat = m.latency
    g = elaborate_source("input x : f16[64, 64]\nweight w : f16[64, 64]\n"
                         "output y = x @ f16(x @ w).T\n", "<k>", {})
    d = lat["mxm_abc"] + lat["mxm_acc"]
    hops = abs(m.vxm_pos - m.mxm_pos(0))
    work = -(-64 * 64 * m.lanes // m.macs_per_cycle("f16"))          # each product's input lanes
    k_last = lat["mem_read"] + -(-64 // m.lw_ports_per_plane) + 1 + work - 1 + d + hops + lat["vxm"]
    rows = k_last + hops + 2 + work - 1 + d                            # k.T installed, y's rows
    out = -(-64 // (2 * m.sxm_queues_per_hemisphere)) - 1
    transposed = k_last + hops + d + 1 + lat["sxm"] + out              # y.T made, the SXM's rows
    assert transposed < rows
    assert B.critical_path(g, m) == min(rows, transposed) + 1 + m.icu_skew
    one = elaborate_source("input x : f16[1, 64]\nweight w : f16[64, 64]\noutput y = x @ w\n", "<r>", {})
    assert B.critical_path(one, m) == lat["mem_read"] + -(-64 // m.lw_ports_per_plane) + 1 + d + 1 + m.icu_skew


def test_bounds_hold_on_random_programs():
    """No compiled random program (tests/strategies.py) beats any bound, on tiny and tsp-v1: the
    critical path follows both layouts and the SXM's copies, so schedules that lay a tensor
    across vectors or route it by the SXM are covered (a fixed sample, not a search)."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from tests.strategies import programs
    ms = [MachineConfig.load("tiny"), MachineConfig.load("tsp-v1")]

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs(max_ops=8), st.integers(0, 1))
    def check(dsl, mi):
        m = ms[mi]
        prog, g = compile_source(dsl.text, "<f>", {}, m)
        lb = B.lower_bounds(g, m)
        for k in BOUND_KEYS:
            assert prog.predicted_cycles >= lb[k], (k, prog.predicted_cycles, lb, dsl.text)
    check()


def test_runner_on_tiny_writes_json_and_marks_targets(tmp_path, monkeypatch, capsys):
    progs = tmp_path / "programs"
    progs.mkdir()
    for name in ("matmul.lpu",):
        shutil.copy(os.path.join(PROGRAMS, name), progs)
    monkeypatch.setattr(S, "PROGRAMS", str(progs))
    out = tmp_path / "r.json"
    assert bench_main(["--machine", "tiny", "--only", "schedule", "--quick", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "matmul: cycles / lower bound" in table and "<= 1.3" in table and "pass" in table
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["environment"]["machine"] == "tiny"
    names = {it["name"]: it for it in doc["items"]}
    assert not [it for it in doc["items"] if "error" in it]
    assert names["matmul: cycles / lower bound"]["ok"] is True
    assert names["matmul: cycles / lower bound"]["cycles"] >= names["matmul: cycles / lower bound"]["bound"]
    assert 0 < names["matmul: cycles / lower bound"]["mxm_utilization"] <= 1      # emulated, as lpu run reports it
    f16 = next(it for it in doc["items"] if it["name"].startswith("f16 matmul"))
    assert f16["value"] >= 0.90 and f16["ok"] is True
    assert bench_main(["--only", "nope", "--out", str(out)]) == 2


@pytest.mark.slow
def test_block_programs_do_not_beat_their_bounds_on_tsp_v1():
    m = MachineConfig.load("tsp-v1")
    for name in ("gpt2_block_decode", "gpt2_block_prefill", "llama_block_decode", "llama_block_prefill",
                 "attention_prefill"):
        prog, g = compile_file(os.path.join(PROGRAMS, name + ".lpu"), {}, m)
        lb = B.lower_bounds(g, m)
        assert all(prog.predicted_cycles >= lb[k] for k in BOUND_KEYS), (name, prog.predicted_cycles, lb)


def test_table_prints_every_kind_of_value():
    """Figures written out as text (the system section's "cycles / check") print as they are."""
    from benchmarks.__main__ import table
    items = [S.item("system", "emulated == predicted, check", "1,785,286 / True", "", "equal, ok", True),
             S.item("system", "ratio", 0.64, "x", "<= 0.65", True),
             S.item("system", "cycles", 235386, "cycles")]
    out = table(items)
    assert "1,785,286 / True" in out and "0.64 x" in out and "235,386 cycles" in out
