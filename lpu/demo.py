"""`lpu demo`: the README's first command. Compiles the bundled GPT-2 block for prefill (a prompt
of S tokens) and for decode (one token against a KV cache), emulates both cycle by cycle, checks
them against the numpy reference, and prints one table of LPU against GPU per phase, with what
bounds each side and why.

What bounds each side: for the LPU, the bottleneck of `lpu run --report` (emulator.report: a unit
busy at least half the run bounds it, MXM-bound, stream-bound, ...; else latency-bound, the
schedule's dependency chain), shown with the MXM utilization; for the GPU, the bound holding
most of its kernel time (compute, hbm, latency, launch), from gpu_baseline.model.
"""
from __future__ import annotations

import json
import os
import textwrap

from lpu import programs as programs_pkg
from lpu.args import progress_lines
from lpu.compare import compare
from lpu.isa.errors import LpuError

PROGRAMS = os.path.dirname(os.path.abspath(programs_pkg.__file__))
PHASES = (("prefill", "gpt2_block_prefill.lpu"), ("decode", "gpt2_block_decode.lpu"))


def lpu_bound(lpu: dict) -> str:
    return f"{lpu['bound']} (MXM {lpu['utilization']['mxm']:.0%})"


def run_demo(gpu="h100-sxm", launch: str = "stream", progress=None) -> list[dict]:
    """One `compare(..., emulate=True)` result per phase; `gpu` is a name, a path or a GpuConfig."""
    from lpu.gpu_baseline.gpus import GpuConfig, load_gpu
    gpu = gpu if isinstance(gpu, GpuConfig) else load_gpu(gpu)
    if progress:
        progress("lpu demo: compiling and emulating 2 programs (the first run also JIT-compiles the emulator "
                 "core once, which takes longer)")
    out = []
    for i, (phase, name) in enumerate(PHASES):
        step = (lambda t, i=i, phase=phase: progress(
            f"[{i + 1}/{len(PHASES)}] {phase}: " + t.replace(PROGRAMS + os.sep, "programs/"))) if progress else None
        d = compare(os.path.join(PROGRAMS, name), {}, None, gpu, launch, emulate=True, progress=step)
        d["program"] = f"programs/{name}"
        out.append(d)
    return out


def why(results: list[dict], gpu) -> list[str]:
    """The explanation, from the numbers: arithmetic intensity against the GPU's ridge point."""
    ridge = (gpu.tensor_f16_tflops * 1e12 * gpu.tensor_efficiency) / (gpu.hbm_gbs * 1e9 * gpu.hbm_efficiency)
    by = {d["phase"]: d for d in results}
    pre, dec = by["prefill"], by["decode"]
    ip = pre["gpu"]["flops"] / max(pre["gpu"]["hbm_bytes"], 1.0)
    idec = dec["gpu"]["flops"] / max(dec["gpu"]["hbm_bytes"], 1.0)
    s = pre["params"].get("S", 0)
    lines = [
        f"why: prefill multiplies each weight by all S={s} rows ({ip:.0f} flop per HBM byte), decode by one row "
        f"({idec:.1f} flop/byte). The {gpu.name} needs {ridge:.0f} flop/byte to leave its HBM roofline, so decode "
        f"is memory-bound at any size, and prefill turns compute-bound from roughly S={s * ridge / ip:.0f}"
        + (" (at this small width, kernel launches dominate both)." if pre["gpu"]["bound"] == "launch" == dec["gpu"]["bound"]
           else "."),
    ]
    m = results[0]["lpu"]
    stream_tbs = None
    try:
        from lpu.api import machine_of
        mc = machine_of(m["machine"])
        stream_tbs = 2 * mc.streams_per_direction * mc.lanes * mc.clock_mhz * 1e6 / 1e12
    except LpuError:
        pass
    lines.append(
        "The LPU holds every weight and the KV cache in on-chip SRAM"
        + (f" ({stream_tbs:.1f} TB/s of streams)" if stream_tbs else "")
        + ": decode reads no HBM, so what remains is compute and the schedule's dependency chain.")
    return lines


def format_demo(results: list[dict], gpu) -> str:
    hdr = (f"{'phase':<8} {'program':<31} {'LPU us':>9} {'GPU us':>9} {'GPU/LPU':>8}  "
           f"{'LPU bound':<26} {'GPU bound':<9}  check")
    out = [f"LPU ({results[0]['lpu']['machine']}, emulated) against GPU ({gpu.name}, model)", hdr]
    for d in results:
        lpu, g = d["lpu"], d["gpu"]
        out.append(f"{d['phase']:<8} {d['program']:<31} {lpu['time_us']:>9.2f} {g['time_us']:>9.2f} "
                   f"{d['speedup']:>7.2f}x  {lpu_bound(lpu):<26} {g['bound']:<9}  "
                   f"{'ok' if lpu['check']['ok'] else 'MISMATCH'}")
    for d in results:
        lpu, g = d["lpu"], d["gpu"]
        if d["phase"] == "decode":
            out.append(f"decode: {lpu['tokens_per_s']:,.0f} tokens/s on the LPU, {g['tokens_per_s']:,.0f} on the GPU")
        else:
            out.append(f"prefill: time to first token {lpu['ttft_us']:.1f} us on the LPU, "
                       f"{g['ttft_us']:.1f} us on the GPU")
    out += [textwrap.fill(t, 100, subsequent_indent="  ") for t in why(results, gpu)]
    out.append("per line: lpu compare PROG.lpu; over the prompt length: lpu compare "
               "programs/gpt2_block_prefill.lpu --sweep S")
    return "\n".join(out)


def add_parser(sub, common):
    p = sub.add_parser("demo", help="compile and run the bundled programs; LPU against GPU")
    p.add_argument("--gpu", default="h100-sxm", help="a100-80gb, h100-sxm, h200 or a .toml file (default h100-sxm)")
    p.add_argument("--launch", choices=["stream", "graph"], default="stream", help="GPU kernel launches")
    common(p, compiles=False)


def cmd_demo(a):
    from lpu.gpu_baseline.gpus import load_gpu
    gpu = load_gpu(a.gpu)
    results = run_demo(gpu, a.launch, progress_lines(a))
    if a.json:
        print(json.dumps({"gpu": gpu.name, "phases": [
            {"phase": d["phase"], "program": d["program"], "lpu_us": d["lpu"]["time_us"], "gpu_us": d["gpu"]["time_us"],
             "speedup": d["speedup"], "lpu_bound": lpu_bound(d["lpu"]), "gpu_bound": d["gpu"]["bound"],
             "check": d["lpu"]["check"]["ok"]} for d in results]}))
    else:
        print(format_demo(results, gpu))
    bad = [d["program"] for d in results if not d["lpu"]["check"]["ok"]]
    if bad:
        raise LpuError(f"the emulator's outputs differ from the reference for {', '.join(bad)}")
    return 0


HANDLERS = {"demo": cmd_demo}
