"""The GPU model against published measurements (data/validation.toml): one row per case with
the measured and modelled value and the relative error, and the median absolute error.

    python -m gpu_baseline.validate [FILE.toml ...]

Each case is costed with its GPU's config as it stands; nothing is fitted per case."""
from __future__ import annotations

import os
import statistics
import sys
import tomllib

from lpu.gpu_baseline import workloads
from lpu.gpu_baseline.gpus import load_gpu
from lpu.gpu_baseline.model import cost_graph
from lpu.isa.errors import ConfigError

DATA = os.path.join(os.path.dirname(__file__), "data", "validation.toml")
CASE_FIELDS = ("id", "workload", "metric", "measured", "unit", "source", "model", "gpu", "dtype",
               "batch", "prompt_len", "output_len", "launch")


def load_cases(path: str = DATA) -> list[dict]:
    with open(path, "rb") as f:
        cases = tomllib.load(f).get("case", [])
    for c in cases:
        missing = [k for k in CASE_FIELDS if k not in c]
        if missing:
            raise ConfigError(f"{path}: case {c.get('id', '?')!r} lacks {', '.join(missing)}")
    return cases


def workload_graph(case: dict):
    """The IR graph a case measures."""
    kind, _, arg = case["workload"].partition(":")
    dt = "f16"                       # bf16 and f16 cost the same (same width, same peaks)
    if case["batch"] != 1:
        raise ConfigError(f"case {case['id']!r}: only batch 1 is modelled")
    if kind == "decode":
        return workloads.decode_step(case["prompt_len"] + case["output_len"])
    if kind == "prefill":
        return workloads.prefill(case["prompt_len"])
    if kind == "linear":
        return workloads.decode_linear(arg)
    if kind == "gemm":
        m, k, n = (int(v) for v in arg.split(","))
        return workloads.linear(k, n, m_rows=m, dtype=dt)
    if kind == "add":
        return workloads.elementwise(int(arg), dt)
    if kind == "softmax":
        r, c = (int(v) for v in arg.split(","))
        return workloads.softmax(r, c, dt)
    raise ConfigError(f"case {case['id']!r}: unknown workload {case['workload']!r}")


def modelled(case: dict) -> float:
    gpu = load_gpu(case["gpu"])
    if case["workload"] == "empty":
        us = gpu.launch_us(case["launch"])
    else:
        us = cost_graph(workload_graph(case), gpu, launch=case["launch"]).total_us
    metric = case["metric"]
    if metric == "tokens_per_s":
        return 1e6 / us
    if metric == "ttft_ms":
        return us / 1e3
    if metric == "kernel_us":
        return us
    raise ConfigError(f"case {case['id']!r}: unknown metric {metric!r}")


def validation_table(paths=(DATA,)) -> list[dict]:
    rows = []
    for path in paths:
        for c in load_cases(path):
            m = modelled(c)
            rows.append({"case": c["id"], "gpu": c["gpu"], "unit": c["unit"], "measured": c["measured"],
                         "modelled": m, "error": (m - c["measured"]) / c["measured"]})
    return rows


def median_abs_error(rows: list[dict]) -> float:
    return statistics.median(abs(r["error"]) for r in rows)


def format_table(rows: list[dict]) -> str:
    lines = [f"{'case':<24} {'gpu':<10} {'measured':>10} {'modelled':>10} {'unit':<9} {'error':>7}"]
    for r in rows:
        lines.append(f"{r['case']:<24} {r['gpu']:<10} {r['measured']:>10.1f} {r['modelled']:>10.1f} "
                     f"{r['unit']:<9} {100 * r['error']:>+6.1f}%")
    lines.append(f"median |error| {100 * median_abs_error(rows):.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(validation_table(sys.argv[1:] or (DATA,))))
