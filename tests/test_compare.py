"""`lpu compare`, the sweep and `lpu demo`. LPU cycle counts change as the compiler improves, so
nothing here hard-codes them: the tests check structure, sums and the rules that relate them."""
import contextlib
import io
import json
import math
import os
import sys
from argparse import Namespace

import pytest

from lpu.gpu_baseline.gpus import load_gpu
from lpu import compare as C
from lpu.args import progress_lines
from lpu.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE = os.path.join(ROOT, "programs", "gpt2_block_decode.lpu")
LLAMA = os.path.join(ROOT, "programs", "llama_block_decode.lpu")
MLP = os.path.join(ROOT, "programs", "mlp.lpu")
LLAMA_7B = ["-p", "D=4096", "-p", "H=32", "-p", "F=11008"]


def _cli_json(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def _run_quiet(*argv):
    """Run the CLI outside pytest's capture (for module-scoped fixtures): (rc, stdout, stderr)."""
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, buf.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def decode_json():
    """`lpu compare programs/gpt2_block_decode.lpu --json`, run once for the module."""
    rc, out, err = _run_quiet("compare", DECODE, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def llama_7b_json():
    rc, out, err = _run_quiet("compare", LLAMA, *LLAMA_7B, "--json")
    return rc, json.loads(out), err


# ---- compare --json ----------------------------------------------------------------------------
def test_compare_json_fields(decode_json):
    d = decode_json
    assert d["phase"] == "decode"
    assert d["lpu"]["cycles"] > 0 and d["lpu"]["time_us"] == pytest.approx(d["lpu"]["cycles"] / d["lpu"]["clock_mhz"])
    assert d["gpu"]["name"] == "h100-sxm" and d["gpu"]["time_us"] > 0
    assert d["speedup"] == pytest.approx(d["gpu"]["time_us"] / d["lpu"]["time_us"])
    assert d["lpu"]["tokens_per_s"] == pytest.approx(1e6 / d["lpu"]["time_us"])
    assert d["gpu"]["tokens_per_s"] == pytest.approx(1e6 / d["gpu"]["time_us"])
    for o in d["ops"]:
        assert {"op", "line", "lpu_us", "gpu_us", "bound"} <= set(o)
        assert o["bound"] in (None, "compute", "hbm", "latency", "launch")


def test_compare_rows_sum_to_totals(decode_json):
    d = decode_json
    ops = d["ops"]
    assert sum(o["lpu_cycles"] for o in ops) == d["lpu"]["cycles"]           # exactly: one line per cycle
    assert math.isclose(sum(o["lpu_us"] for o in ops), d["lpu"]["time_us"], rel_tol=1e-9)
    assert math.isclose(sum(o["gpu_us"] for o in ops), d["gpu"]["time_us"], rel_tol=1e-9)
    assert len({o["line"] for o in ops}) == len(ops)
    assert any(o["op"] == "matmul" and o["gpu_us"] > 0 and o["lpu_us"] > 0 for o in ops)


def test_emulated_times_match_schedule():
    from lpu import api
    gpu = load_gpu("a100-80gb")
    prog, graph = api.compile(MLP, {"S": 16}, "tiny")
    sched = C.compare_graph(prog, graph, gpu)
    emu = C.compare_graph(prog, graph, gpu, emulate=True)
    assert emu["lpu"]["source"] == "emulation" and emu["lpu"]["check"]["ok"]
    assert emu["lpu"]["cycles"] == sched["lpu"]["cycles"]
    assert [(o["line"], o["lpu_cycles"]) for o in emu["ops"]] == [(o["line"], o["lpu_cycles"]) for o in sched["ops"]]
    assert sched["phase"] == "prefill" and sched["lpu"]["ttft_us"] == pytest.approx(sched["lpu"]["time_us"])


# ---- the per-line attribution rule -------------------------------------------------------------
def test_lines_agree_with_run_report(capsys):
    """compare charges cycles to lines by the rule of `lpu run --report`, so the two agree."""
    rc, rep, _ = _cli_json(capsys, "run", MLP, "--machine", "tiny", "-p", "S=16", "--report", "--json")
    d = C.compare(MLP, {"S": 16}, "tiny", "h100-sxm")
    assert rc == 0 and d["lpu"]["cycles"] == rep["cycles"]
    want = {(x["line"], x["cycles"]) for x in rep["report"]["lines"]}
    assert {(o["line"], o["lpu_cycles"]) for o in d["ops"] if o["lpu_cycles"]} == want
    assert d["lpu"]["bound"] == rep["report"]["bottleneck"]["kind"]
    skew = [o for o in d["ops"] if o["op"] == "(skew)"]
    assert len(skew) == 1 and skew[0]["line"] is None and skew[0]["gpu_us"] == 0


# ---- too large for one chip --------------------------------------------------------------------
def test_too_large_program_gives_gpu_time_and_chips(llama_7b_json):
    rc, d, err = llama_7b_json
    assert rc == 0, err
    assert d["lpu"]["time_us"] is None and d["lpu"]["cycles"] is None and d["speedup"] is None
    assert d["lpu"]["chips_needed"] > 1 and d["lpu"]["bytes_needed"] > d["lpu"]["bytes_available"]
    assert d["gpu"]["time_us"] > 0 and d["phase"] == "decode"
    assert math.isclose(sum(o["gpu_us"] for o in d["ops"]), d["gpu"]["time_us"], rel_tol=1e-9)
    assert any(o["bound"] == "hbm" for o in d["ops"])        # 7B weights stream from HBM


def test_too_large_text(capsys):
    assert main(["compare", LLAMA, *LLAMA_7B]) == 0
    out = capsys.readouterr().out
    assert "chips" in out and "no LPU time" in out and "tokens/s: GPU" in out


# ---- errors ------------------------------------------------------------------------------------
def _bad_gpu_file(tmp_path, key, value=None):
    lines = open(load_gpu("h100-sxm").source).read().splitlines()
    out = []
    for line in lines:
        k = line.split("=")[0].strip()
        if k == key:
            if value is None:
                continue
            line = f"{key} = {value}"
        out.append(line)
    p = tmp_path / "bad.toml"
    p.write_text("\n".join(out) + "\n")
    return str(p)


@pytest.mark.parametrize("key,value", [("hbm_gbs", None), ("hbm_gbs", -3350), ("tensor_efficiency", 1.5)])
def test_bad_gpu_file_names_the_field(tmp_path, capsys, key, value):
    rc = main(["compare", MLP, "--machine", "tiny", "--gpu", _bad_gpu_file(tmp_path, key, value)])
    err = capsys.readouterr().err
    assert rc == 2 and key in err and "Traceback" not in err


def test_unknown_gpu_and_bad_sweep(capsys):
    assert main(["compare", MLP, "--gpu", "b200-imaginary"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    for bad in ("S=16,x", "S=0", "1S=4", "Q"):
        assert main(["compare", MLP, "--sweep", bad]) == 2
        assert "--sweep" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    out = tmp_path / "x.png"
    assert main(["compare", MLP, "--machine", "tiny", "-p", "S=16", "--plot", str(out)]) == 2
    assert "matplotlib" in capsys.readouterr().err and not out.exists()


def test_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "ops.png"
    assert main(["compare", MLP, "--machine", "tiny", "-p", "S=16", "--plot", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["ops.png"]


# ---- sweep -------------------------------------------------------------------------------------
def test_sweep_progress_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    say = progress_lines(Namespace(json=False), tty)
    C.sweep(MLP, "S", [8, 16], {}, "tiny", progress=say)
    assert "[1/2] S=8" in tty.getvalue() and "[2/2] S=16" in tty.getvalue()
    assert progress_lines(Namespace(json=True), tty) is None and progress_lines(Namespace(json=False), io.StringIO()) is None


def test_sweep_table_and_json(capsys, tmp_path):
    rc, d, err = _cli_json(capsys, "compare", MLP, "--machine", "tiny", "--sweep", "S=8,32", "--json")
    assert rc == 0 and [r["value"] for r in d["rows"]] == [8, 32]
    assert err == ""                                   # no progress with --json or off a terminal
    for r in d["rows"]:
        assert r["lpu_us"] > 0 and r["gpu_us"] > 0 and r["ratio"] == pytest.approx(r["gpu_us"] / r["lpu_us"])
        assert r["gpu_bound"] in ("compute", "hbm", "latency", "launch")
    assert d["crossover"] == C.crossover(d["rows"])
    text = C.format_sweep(d["rows"], d["gpu"]).splitlines()
    assert "GPU/LPU" in text[0] and text[0].split()[0] == "S" and text[-1] == d["crossover"]


def test_crossover_words():
    def rows(*ratios):
        return [{"param": "S", "value": 16 << i, "ratio": r} for i, r in enumerate(ratios)]
    assert C.crossover(rows(3.0, 1.5, 0.5)) == "the GPU overtakes the LPU between S=32 and S=64"
    assert "LPU is faster at every S" in C.crossover(rows(3.0, 2.0))
    assert "GPU is faster at every S" in C.crossover(rows(0.5, 0.2))
    assert "fits one chip" in C.crossover(rows(None))
    assert C.parse_sweep("S") == ("S", C.DEFAULT_SWEEP["S"])
    assert C.parse_sweep("T=1,2") == ("T", [1, 2])


# ---- demo --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)   # progress lines go to a terminal only
    assert main(["demo"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert any(l.startswith("prefill ") for l in lines) and any(l.startswith("decode ") for l in lines)
    assert "tokens/s" in out.out and "time to first token" in out.out and "h100-sxm" in out.out
    assert "bound" in out.out and "why:" in out.out and "MISMATCH" not in out.out
    assert "[1/2] prefill" in out.err and "[2/2] decode" in out.err
    assert any(b in out.out for b in ("latency-bound", "MXM-bound", "stream-bound"))
