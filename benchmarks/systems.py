"""The system section of the benchmark runner (issue 15): programs on several chips. Long (the
full-size programs compile for minutes), so it is left out of --quick. Each compile and run is
a child process (benchmarks/sysprobe.py): its own wall time and peak resident memory.

- bert_large on 4 chips: predicted and emulated cycles, the check, the time beside Groq's
  published 1,225 us (isa/systems/published.json) and beside the multi-chip bounds
  (benchmarks/bounds.py system_bounds).
- llama2_7b_decode on --chips auto (--parallel auto): compile wall time and peak RSS, tokens/s beside the modelled
  H100 and 8 x H100 (gpu_baseline, tensor parallel over NVLink).
- llama2_7b_decode on --chips auto --parallel tp (nodes of 8 ranks): compile CPU time, tokens/s
  beside the same GPUs and the tensor-parallel bound, emulated == predicted.
- Emulation speed of a system: instructions/s of bert_large (one layer a chip) on 4 chips in
  one process against one layer on one chip, and --workers 2 against one process, for that
  pipeline and for 8 chips in tensor parallel (llama2_7b_decode L=2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import bounds as B
from benchmarks.suite import ROOT, _child_env, failed, item

SYSTEMS = os.path.join(ROOT, "programs", "systems")
PUBLISHED = os.path.join(ROOT, "isa", "systems", "published.json")
PAIRS = 7           # --workers 2 against one process: runs of each, alternating (a median: the machine is shared)


def probe(*args, timeout=7200) -> dict:
    p = subprocess.run([sys.executable, "-m", "benchmarks.sysprobe", *map(str, args)], capture_output=True,
                       text=True, env=_child_env(), cwd=ROOT, timeout=timeout)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _graph(name: str, params: dict | None = None):
    from lpu.compiler.frontend import elaborate_file
    return elaborate_file(os.path.join(SYSTEMS, f"{name}.lpu"), params or {})


def _system(b, chips: int):
    from lpu.isa.system import SystemConfig
    return SystemConfig.load("node", b.machine, chips)


def bert_large(b, d) -> list:
    sec, out = "system", []
    groq = json.load(open(PUBLISHED))["bert_large_4_chips_p99_us"]["value"]
    path, bundle = os.path.join(SYSTEMS, "bert_large.lpu"), os.path.join(d, "bert_large4.lpubin")
    b.log("compiling bert_large for 4 chips")
    c = probe("compile", path, 4, bundle)
    m = b.machine
    us = c["predicted_cycles"] / m.clock_mhz
    bd = B.system_bounds(_graph("bert_large"), m, _system(b, 4), 4)
    out += [item(sec, "bert_large on 4 chips (pipeline): compile wall time", round(c["wall_s"], 1), "s",
                 peak_rss_gib=round(c["peak_rss_bytes"] / 2**30, 2), instructions=c["instructions"]),
            item(sec, "bert_large on 4 chips: predicted time", round(us, 1), "us", cycles=c["predicted_cycles"],
                 per_chip_cycles=c["per_chip_cycles"]),
            item(sec, f"bert_large on 4 chips: time / Groq's published {groq:,} us (P22)", round(us / groq, 2), "x"),
            item(sec, "bert_large on 4 chips: cycles / pipeline bound", round(c["predicted_cycles"] / bd["pp"], 2), "x",
                 "<= 1.5", c["predicted_cycles"] / bd["pp"] <= 1.5, bounds=bd),
            item(sec, "bert_large on 4 chips: bound any partition / pipeline / tensor parallel",
                 f"{bd['any'] / m.clock_mhz:,.0f} / {bd['pp'] / m.clock_mhz:,.0f} / {bd['tp'] / m.clock_mhz:,.0f}", "us",
                 tp_link_cycles=bd["tp_links"])]
    b.log("emulating bert_large on 4 chips")
    r = probe("run", bundle, 0, "check")
    same = r["cycles"] == c["predicted_cycles"]
    out += [item(sec, "bert_large on 4 chips: emulated == predicted, check", f"{r['cycles']:,} / {r['check']['ok']}", "",
                 "equal, ok", same and r["check"]["ok"], check=r["check"]),
            item(sec, "bert_large on 4 chips: emulation wall time", round(r["wall_s"], 1), "s",
                 instructions_per_s=round(r["instructions"] / r["wall_s"]),
                 peak_rss_gib=round(r["peak_rss_bytes"] / 2**30, 2))]
    return out


def llama(b, d) -> list:
    from lpu.gpu_baseline.gpus import load_gpu
    from lpu.gpu_baseline.model import cost_graph
    sec, out = "system", []
    path, bundle = os.path.join(SYSTEMS, "llama2_7b_decode.lpu"), os.path.join(d, "llama.lpubin")
    b.log("compiling llama2_7b_decode for --chips auto")
    c = probe("compile", path, "auto", bundle)
    gib = c["peak_rss_bytes"] / 2**30
    m = b.machine
    lpu_tps = m.clock_mhz * 1e6 / c["predicted_cycles"]
    g = _graph("llama2_7b_decode")
    bd = B.system_bounds(g, m, _system(b, c["chips"]), c["chips"])
    h100 = load_gpu("h100-sxm")
    one, eight = cost_graph(g, h100).total_us, cost_graph(g, h100, gpus=8).total_us
    out += [item(sec, "llama2_7b_decode --chips auto: compile wall time", round(c["wall_s"], 1), "s", "<= 60",
                 c["wall_s"] <= 60, chips=c["chips"], instructions=c["instructions"]),
            item(sec, "llama2_7b_decode --chips auto: compile peak RSS", round(gib, 2), "GiB", "<= 8", gib <= 8),
            item(sec, f"llama2_7b_decode on {c['chips']} chips ({c['parallel']}): tokens/s", round(lpu_tps), "tokens/s",
                 cycles=c["predicted_cycles"], bounds=bd),
            item(sec, f"llama2_7b_decode: cycles / {c['parallel']} bound",
                 round(c["predicted_cycles"] / bd[c["parallel"]], 2), "x"),
            item(sec, "llama2_7b_decode: tensor-parallel bound, tokens/s", round(m.clock_mhz * 1e6 / bd["tp"]), "tokens/s"),
            item(sec, "llama2_7b_decode: H100 (modelled) tokens/s", round(1e6 / one), "tokens/s"),
            item(sec, "llama2_7b_decode: 8 x H100 (modelled, tensor parallel) tokens/s", round(1e6 / eight), "tokens/s")]
    out += llama_tp(b, d, path, g, one, eight, c if c["parallel"] == "tp" else None)
    b.log("emulating llama2_7b_decode")
    try:
        r = probe("run", bundle, 0, "check")
        out.append(item(sec, "llama2_7b_decode: emulated == predicted, check", f"{r['cycles']:,} / {r['check']['ok']}", "",
                        "equal, ok", r["cycles"] == c["predicted_cycles"] and r["check"]["ok"], check=r["check"],
                        wall_s=round(r["wall_s"], 1), peak_rss_gib=round(r["peak_rss_bytes"] / 2**30, 2)))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, "llama2_7b_decode: emulated == predicted, check", e, "equal, ok"))
    return out


def llama_tp(b, d, path, g, one_us, eight_us, auto=None) -> list:
    """llama2_7b_decode with --parallel tp --chips auto: nodes of 8 ranks, a pipeline of nodes
    (auto: the --chips auto compile, when it chose tensor parallel: not compiled nor run again)."""
    sec, m = "system", b.machine
    bundle = os.path.join(d, "llama_tp.lpubin")
    if auto is None:
        b.log("compiling llama2_7b_decode for --chips auto --parallel tp")
    c = auto or probe("compile", path, "auto", bundle, "--parallel=tp")
    tps = m.clock_mhz * 1e6 / c["predicted_cycles"]
    bd = B.system_bounds(g, m, _system(b, c["chips"]), c["chips"])
    out = [item(sec, "llama2_7b_decode --chips auto --parallel tp: compile CPU time", round(c["cpu_s"], 1), "s",
                "<= 60", c["cpu_s"] <= 60, wall_s=round(c["wall_s"], 1), chips=c["chips"],
                peak_rss_gib=round(c["peak_rss_bytes"] / 2**30, 2), instructions=c["instructions"]),
           item(sec, f"llama2_7b_decode on {c['chips']} chips (tensor parallel): tokens/s", round(tps), "tokens/s",
                cycles=c["predicted_cycles"], vs_h100=round(tps * one_us / 1e6, 2),
                vs_8xh100=round(tps * eight_us / 1e6, 2)),
           item(sec, "llama2_7b_decode (tensor parallel): cycles / tensor-parallel bound",
                round(c["predicted_cycles"] / bd["tp"], 2), "x", bounds=bd)]
    if auto is not None:
        return out
    b.log("emulating llama2_7b_decode in tensor parallel")
    try:
        r = probe("run", bundle, 0)
        out.append(item(sec, "llama2_7b_decode (tensor parallel): emulated == predicted", f"{r['cycles']:,}", "",
                        "equal", r["cycles"] == c["predicted_cycles"], wall_s=round(r["wall_s"], 1),
                        peak_rss_gib=round(r["peak_rss_bytes"] / 2**30, 2)))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, "llama2_7b_decode (tensor parallel): emulated == predicted", e, "equal"))
    return out


def speed_tp(b, d) -> list:
    """--workers 2 on a system whose chips work at the same time: llama2_7b_decode L=2 on one node
    of 8 chips in tensor parallel (fresh processes, as `lpu run` is)."""
    path, bundle = os.path.join(SYSTEMS, "llama2_7b_decode.lpu"), os.path.join(d, "llama_tp8.lpubin")
    b.log("emulation speed: llama2_7b_decode L=2 on 8 chips in tensor parallel, --workers 2")
    probe("compile", path, 8, bundle, "L=2", "--parallel=tp")
    ones, twos = [], []
    for _ in range(PAIRS):              # alternating: a load that comes and goes falls on both
        ones.append(probe("run", bundle, 0)["wall_s"])
        twos.append(probe("run", bundle, 2)["wall_s"])
    ratios = [b / a for a, b in zip(ones, twos)]
    x = float(np.median(ratios))
    return [item("system", f"system inputs + emulation: --workers 2 wall / one process (8 chips in tensor parallel, "
                 f"median of {PAIRS} alternating pairs)", round(x, 2), "x", "<= 0.65", x <= 0.65,
                 ratios=[round(r, 2) for r in ratios], one_process_s=[round(a, 2) for a in ones],
                 workers2_s=[round(b, 2) for b in twos])]


def speed(b, d) -> list:
    sec, out = "system", []
    path = os.path.join(SYSTEMS, "bert_large.lpu")
    bundle = os.path.join(d, "bert4x1.lpubin")
    b.log("emulation speed: bert_large L=1 on one chip, L=4 on 4 chips")
    one = probe("one", path, "L=1")
    probe("compile", path, 4, bundle, "L=4")
    sys1 = probe("run", bundle, 0, "warm")      # the rate: prepared, as the one-chip figure is
    cold1 = probe("run", bundle, 0)             # workers: a fresh process each, as `lpu run` is
    cold2 = probe("run", bundle, 2)
    rate1 = one["instructions"] / one["wall_s"]
    rate4 = sys1["instructions"] / (sys1["wall_s"] - sys1["inputs_s"])   # emulation alone (one process: after the inputs)
    out += [item(sec, "system emulation (4 chips, one process): instructions/s / one chip's", round(rate4 / rate1, 2),
                 "x", ">= 0.5", rate4 / rate1 >= 0.5, one_chip_instr_per_s=round(rate1), system_instr_per_s=round(rate4)),
            # no target: a pipeline's chips compute one after another (each waits for the activations
            # of the chip before), so there is no work for a second process to overlap; the target
            # (<= 0.65) is the tensor-parallel system's, whose chips work at the same time (speed_tp)
            item(sec, "system emulation: --workers 2 wall / one process (a pipeline: chips one after another)",
                 round(cold2["wall_s"] / cold1["wall_s"], 2), "x",
                 one_process_s=round(cold1["wall_s"], 2), workers2_s=round(cold2["wall_s"], 2))]
    return out


def systems(b) -> list:
    if b.quick or b.machine.name != "tsp-v1":
        return [item("system", "bert_large on 4 chips, llama2_7b_decode on --chips auto", None,
                     skipped="--quick" if b.quick else "full-size programs: tsp-v1 only")]
    out = []
    with tempfile.TemporaryDirectory() as d:
        for part in (speed, speed_tp, bert_large, llama):
            try:
                out += part(b, d)
            except Exception as e:   # noqa: BLE001 - report and go on
                out.append(failed("system", part.__name__, e))
    return out
