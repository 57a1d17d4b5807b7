"""`lpu compare`: the LPU against a GPU, per DSL line and in total, and a sweep over one param.

LPU time per line: the compiled schedule gives every instruction's issue cycle (with --emulate,
the emulator's trace gives them) and its latency. Each cycle of the run is charged to exactly one
DSL line by the rule of `lpu run --report` (emulator.report.LINE_RULE): the line with the most
instructions in flight in it, a cycle with nothing in flight to the line that starts next, and
the closing ICU skew to a "(skew)" row. So the per-line rows sum to the total exactly, and the two
commands agree line by line. The LPU's bottleneck is the report's too.

GPU time per line: gpu_baseline.model.cost_graph, each kernel charged to its head's line; the
line's bound is the bound (compute, hbm, latency, launch) holding most of its kernel time.
`speedup` and `ratio` are GPU time / LPU time (above 1: the LPU is faster).
"""
from __future__ import annotations

import json

import numpy as np

from lpu import cmd_system
from lpu.args import add_chips, parse_params, progress_lines
from lpu.isa.errors import CapacityError, LpuError

DEFAULT_SWEEP = {"S": [16, 32, 64, 128]}
COMPUTE_OPS = ("matmul", "attention")


# ---- LPU cycles per line ----------------------------------------------------------------------
def _lpu_side(program, graph, emulate: bool, progress=None) -> dict:
    """LPU totals, cycles per line and the bottleneck, from the schedule or an emulated trace."""
    from lpu.emulator import report as R
    from lpu.emulator.run import Trace, schedule
    from lpu.emulator.trace import records
    m = program.machine
    extra = {"source": "schedule"}
    if emulate:
        from lpu import api
        if progress:
            progress(f"emulating {program.predicted_cycles:,} cycles ...")
        values = api.inputs_for(graph, program, 0)
        result = api.run(program, values, trace=True)
        trace, total = result.trace, int(result.cycles)
        extra = {"source": "emulation", "predicted_cycles": int(program.predicted_cycles),
                 "check": api.check(graph, program, values, result)}
    else:
        s = schedule(program)                # the issue cycles the emulator will execute
        trace, total = Trace(s.cycle, s.src, s.repeat), int(program.predicted_cycles)
    r = records(program, trace, total)
    rep = R.report(r)
    per_line = {(x["line"] if x["line"] is not None else x["label"]): x["cycles"] for x in rep["lines"]}
    return {"machine": m.name, "clock_mhz": m.clock_mhz, "cycles": total, "time_us": total / m.clock_mhz,
            "chips_needed": 1, "bound": rep["bottleneck"]["kind"], "bound_reason": rep["bottleneck"]["reason"],
            "utilization": rep["utilization"], "line_rule": R.LINE_RULE, **extra, "per_line_cycles": per_line}


# ---- the comparison -----------------------------------------------------------------------------
def _line_ops(graph, gpu_cost) -> dict[int, str]:
    """A short op label per line: its GPU kernels' ops, else its IR compute ops."""
    from lpu.compiler.ir import LEAVES
    from lpu.gpu_baseline.kernels import VIEWS
    out: dict[int, list] = {}
    for o in gpu_cost.ops:
        out.setdefault(o.line, []).append(o.op)
    ir: dict[int, list] = {}
    for n in sorted(graph.nodes(), key=lambda n: n.op in VIEWS):    # compute ops first, then views
        if n.op not in LEAVES and n.op != "output":
            ir.setdefault(n.line, []).append(n.op)
    out = {ln: list(dict.fromkeys(out.get(ln) or ops)) for ln, ops in {**ir, **out}.items()}
    return {ln: "+".join(ops[:3]) + ("+..." if len(ops) > 3 else "") for ln, ops in out.items()}


MEANINGFUL_SHARE = 0.01


def _line_ratio(lpu_us, lpu_total, gpu_us, gpu_total):
    """GPU/LPU time of one line, only where the line holds at least MEANINGFUL_SHARE of both
    totals: the attribution rules give some lines a handful of cycles, and a ratio of those
    would print absurd factors."""
    if not lpu_us or not gpu_us or lpu_us < MEANINGFUL_SHARE * lpu_total or gpu_us < MEANINGFUL_SHARE * gpu_total:
        return None
    return gpu_us / lpu_us


def compare_graph(program, graph, gpu, launch: str = "stream", emulate: bool = False,
                  capacity: CapacityError | None = None, machine_name: str | None = None, progress=None,
                  gpus: int = 1, system_lpu: dict | None = None) -> dict:
    """The comparison as a JSON-ready dict. `program` None (with `capacity`): GPU side only; with
    `system_lpu` (lpu/cmd_system.py lpu_side): a system of chips, in total only.
    gpus > 1 adds out["gpu"]["group"]: the graph split over a tensor-parallel group of that many."""
    from lpu.gpu_baseline.model import BOUNDS, cost_graph, is_decode
    cost = cost_graph(graph, gpu, launch)
    gpu_line = cost.by_line()
    bound_time: dict[int, dict] = {}
    for o in cost.ops:
        bound_time.setdefault(o.line, {b: 0.0 for b in BOUNDS})[o.bound] += o.time_us
    decode = is_decode(graph)
    if program is not None:
        lpu = _lpu_side(program, graph, emulate, progress)
    elif system_lpu is not None:
        lpu = dict(system_lpu, per_line_cycles={})
    else:
        info = capacity.info if capacity is not None else {}
        lpu = {"machine": machine_name, "cycles": None, "time_us": None, "per_line_cycles": {},
               "chips_needed": int(info.get("chips_needed", 0)) or None,
               "bytes_needed": info.get("bytes_needed"), "bytes_available": info.get("bytes_available"),
               "error": capacity.message if capacity is not None else None}
    keys = set(gpu_line) | set(lpu["per_line_cycles"])
    lines = sorted(k for k in keys if isinstance(k, int)) + sorted(k for k in keys if isinstance(k, str))
    labels = _line_ops(graph, cost)
    src = graph.source_lines() if hasattr(graph, "source_lines") else []
    ops = []
    lpu_total = lpu["time_us"] or 0.0
    for ln in lines:
        cyc = lpu["per_line_cycles"].get(ln, 0)
        lpu_us = cyc / lpu["clock_mhz"] if program is not None else None
        g_us = gpu_line.get(ln, 0.0)
        bt = bound_time.get(ln)
        if isinstance(ln, str):                             # "(skew)", "(idle)": cycles of no line
            ops.append({"op": ln, "line": None, "source": "", "lpu_cycles": cyc, "lpu_us": lpu_us, "gpu_us": 0.0,
                        "bound": None, "ratio": None})
            continue
        ops.append({"op": labels.get(ln, "-"), "line": ln,
                    "source": src[ln - 1].strip() if 1 <= ln <= len(src) else "",
                    "lpu_cycles": cyc if program is not None else None, "lpu_us": lpu_us, "gpu_us": g_us,
                    "bound": max(bt, key=bt.get) if bt else None,
                    "ratio": _line_ratio(lpu_us, lpu_total, g_us, cost.total_us)})
    lpu.pop("per_line_cycles")
    by_bound = cost.by_bound()
    out = {"program": graph.source_name, "params": dict(graph.params), "phase": "decode" if decode else "prefill",
           "lpu": lpu,
           "gpu": {"name": gpu.name, "time_us": cost.total_us, "launch": launch, "kernels": len(cost.ops),
                   "bound": max(by_bound, key=by_bound.get) if cost.ops else None,
                   "by_bound_us": by_bound, "flops": cost.flops,
                   "hbm_bytes": sum(o.hbm_bytes for o in cost.ops)},
           "speedup": (cost.total_us / lpu["time_us"]) if lpu["time_us"] else None, "ops": ops}
    for side in ("lpu", "gpu"):
        t = out[side]["time_us"]
        if t:
            out[side]["tokens_per_s" if decode else "ttft_us"] = 1e6 / t if decode else t
    if gpus > 1:
        group = cost_graph(graph, gpu, launch, gpus=gpus)
        t = group.total_us
        out["gpu"]["group"] = {"gpus": gpus, "time_us": t, "kernels": len(group.ops),
                               "allreduce_us": sum(o.time_us for o in group.ops if o.op == "all_reduce"),
                               "tokens_per_s" if decode else "ttft_us": 1e6 / t if decode else t}
    return out


def compare(path: str, params: dict | None = None, machine=None, gpu="h100-sxm", launch: str = "stream",
            emulate: bool = False, progress=None, gpus: int = 1, chips=None) -> dict:
    """Compile `path` (elaborate only, if it does not fit one chip) and compare; `progress(text)`
    hears about each stage. chips (N or 'auto'): the LPU side is a system of chips."""
    from lpu.gpu_baseline.gpus import GpuConfig, load_gpu
    from lpu import api
    gpu = gpu if isinstance(gpu, GpuConfig) else load_gpu(gpu)
    gpu.launch_us(launch)                                   # a bad launch mode fails before compiling
    if chips is not None:
        lpu, graph = cmd_system.lpu_side(path, params or {}, machine, chips, emulate, progress)
        return compare_graph(None, graph, gpu, launch, gpus=gpus, system_lpu=lpu)
    if progress:
        progress(f"compiling {path} ...")
    try:
        program, graph = api.compile(path, params or {}, machine)
        if graph is None:
            raise LpuError(f"{path}: compare costs the program's IR, which is rebuilt from the source a binary "
                           f"carries; this one carries none (compare the .lpu file instead)")
    except CapacityError as e:
        from lpu.compiler.frontend import elaborate_file
        return compare_graph(None, elaborate_file(path, params or {}), gpu, launch, capacity=e,
                             machine_name=api.machine_of(machine).name, gpus=gpus)
    return compare_graph(program, graph, gpu, launch, emulate, progress=progress, gpus=gpus)


# ---- the sweep ----------------------------------------------------------------------------------
def parse_sweep(text: str) -> tuple[str, list[int]]:
    name, _, vals = text.partition("=")
    name = name.strip()
    if not name.isidentifier():
        raise LpuError(f"--sweep expects NAME=V1,V2,... (e.g. S=16,64,256), got '{text}'")
    if not vals:
        if name not in DEFAULT_SWEEP:
            raise LpuError(f"--sweep {name}: give the values, e.g. --sweep {name}=16,64,256")
        return name, list(DEFAULT_SWEEP[name])
    try:
        values = [int(v) for v in vals.split(",") if v.strip()]
    except ValueError:
        raise LpuError(f"--sweep {name}: '{vals}' is not a list of integers") from None
    if not values or any(v <= 0 for v in values):
        raise LpuError(f"--sweep {name}: values must be positive integers, got '{vals}'")
    return name, values


def sweep(path: str, name: str, values, params=None, machine=None, gpu="h100-sxm", launch="stream",
          progress=None) -> list[dict]:
    """One comparison per value of param `name`; `progress(text)` is called before each compile."""
    rows = []
    for i, v in enumerate(values):
        if progress:
            progress(f"[{i + 1}/{len(values)}] {name}={v}")
        d = compare(path, {**(params or {}), name: v}, machine, gpu, launch, progress=progress)
        rows.append({name: v, "param": name, "value": v, "phase": d["phase"], "lpu_us": d["lpu"]["time_us"],
                     "chips_needed": d["lpu"]["chips_needed"], "gpu_us": d["gpu"]["time_us"],
                     "ratio": d["speedup"], "gpu_bound": d["gpu"]["bound"]})
    return rows


def crossover(rows: list[dict]) -> str:
    """Where the GPU overtakes the LPU (ratio falls below 1), in words."""
    rs = [r for r in rows if r["ratio"] is not None]
    if not rs:
        return "no value of the sweep fits one chip"
    name = rs[0]["param"]
    if all(r["ratio"] >= 1 for r in rs):
        return f"the LPU is faster at every {name} in the sweep"
    if all(r["ratio"] < 1 for r in rs):
        return f"the GPU is faster at every {name} in the sweep"
    for a, b in zip(rs, rs[1:]):
        if a["ratio"] >= 1 > b["ratio"]:
            return f"the GPU overtakes the LPU between {name}={a['value']} and {name}={b['value']}"
    return f"the LPU and the GPU trade places along {name} (see the ratio column)"


# ---- text and plots -------------------------------------------------------------------------
def _us(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:.2f}")


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def format_compare(d: dict) -> str:
    lpu, gpu = d["lpu"], d["gpu"]
    head = f"{d['program']} ({d['phase']}) on {lpu['machine'] or 'the LPU'} against {gpu['name']} ({gpu['launch']} launches)"
    out = [head, f"{'line':>5}  {'op':<20} {'LPU us':>10} {'GPU us':>10} {'GPU/LPU':>8}  {'GPU bound':<9}  source"]
    for o in d["ops"]:
        out.append(f"{o['line'] if o['line'] is not None else '-':>5}  {o['op'][:20]:<20} {_us(o['lpu_us']):>10} {_us(o['gpu_us']):>10} "
                   f"{_ratio(o['ratio']):>8}  {o['bound'] or '-':<9}  {o['source'][:60]}")
    out.append(f"{'total':>5}  {'':<20} {_us(lpu['time_us']):>10} {_us(gpu['time_us']):>10} "
               f"{_ratio(d['speedup']):>8}  {gpu['bound'] or '-':<9}  ({gpu['kernels']} GPU kernels)")
    out.append("(per line: a GPU kernel counts on its first op's line, so ops fused into it show 0 on theirs; an "
               "LPU cycle counts on the line with the most instructions in flight, as in `lpu run --report`)")
    if lpu["time_us"] is None:
        out.append(f"LPU: does not fit one chip; it needs {lpu['chips_needed']} chips "
                   f"({lpu['bytes_needed']:,} bytes, {lpu['bytes_available']:,} per chip), so no LPU time")
    else:
        src = "emulated" if lpu["source"] == "emulation" else "from the compiled schedule"
        src += f", {lpu['chips']} chips" if lpu.get("chips", 1) > 1 else ""
        out.append(f"LPU: {lpu['cycles']:,} cycles at {lpu['clock_mhz']} MHz = {_us(lpu['time_us'])} us ({src})"
                   + (f"; check {'ok' if lpu['check']['ok'] else 'MISMATCH'}" if "check" in lpu else "")
                   + f"; {lpu['bound']}")
    key, unit, fmt = ("tokens_per_s", "tokens/s", "{:,.0f}") if d["phase"] == "decode" else ("ttft_us", "us to first token", "{:,.2f}")
    rate = [f"{side.upper()} {fmt.format(d[side][key])}" for side in ("lpu", "gpu") if key in d[side]]
    grp = gpu.get("group")
    if grp:
        rate.append(f"{grp['gpus']} x {gpu['name']} (tensor parallel) {fmt.format(grp[key])}")
        out.append(f"GPU group: {grp['gpus']} x {gpu['name']}, {_us(grp['time_us'])} us per pass, of which "
                   f"{_us(grp['allreduce_us'])} us all-reduces over NVLink")
    out.append(f"{unit}: " + ", ".join(rate))
    return "\n".join(out)


def format_sweep(rows: list[dict], gpu_name: str) -> str:
    name = rows[0]["param"] if rows else "value"
    out = [f"{name:>8} {'LPU us':>10} {'GPU us':>10} {'GPU/LPU':>8}  GPU bound ({gpu_name})"]
    for r in rows:
        lpu = _us(r["lpu_us"]) if r["lpu_us"] is not None else f"{r['chips_needed']} chips"
        out.append(f"{r['value']:>8} {lpu:>10} {_us(r['gpu_us']):>10} {_ratio(r['ratio']):>8}  {r['gpu_bound']}")
    out.append(crossover(rows))
    return "\n".join(out)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LpuError("--plot needs matplotlib: pip install -e '.[plot]' in a checkout, or pip install matplotlib") from None
    return plt


def _save(fig, out: str):
    from lpu.api import write_atomic
    write_atomic(out, lambda tmp: fig.savefig(tmp, dpi=120, format=out.rsplit(".", 1)[-1] if "." in out else "png"))


def plot_ops(d: dict, out: str):
    plt = _pyplot()
    ops = d["ops"]
    labels = [f"{o['line']}: {o['op']}" for o in ops]
    y = np.arange(len(ops))
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(ops)))
    if d["lpu"]["time_us"] is not None:
        ax.barh(y - 0.2, [o["lpu_us"] for o in ops], 0.4, label=f"LPU ({d['lpu']['machine']})")
    ax.barh(y + 0.2, [o["gpu_us"] for o in ops], 0.4, label=f"GPU ({d['gpu']['name']})")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(f"{d['program']} ({d['phase']})")
    ax.legend()
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)


def plot_sweep(rows: list[dict], gpu_name: str, out: str):
    plt = _pyplot()
    name = rows[0]["param"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ok = [r for r in rows if r["lpu_us"] is not None]
    ax.plot([r["value"] for r in ok], [r["lpu_us"] for r in ok], "o-", label="LPU")
    ax.plot([r["value"] for r in rows], [r["gpu_us"] for r in rows], "s-", label=f"GPU ({gpu_name})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel("time (us)")
    ax.set_title(crossover(rows))
    ax.legend()
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)


# ---- the subcommand -------------------------------------------------------------------------
def add_parser(sub, common):
    p = sub.add_parser("compare", help="the LPU against a GPU, per DSL line and in total")
    p.add_argument("program", help="PROG.lpu or PROG.lpubin")
    p.add_argument("--gpu", default="h100-sxm", help="a100-80gb, h100-sxm, h200 or a .toml file (default h100-sxm)")
    p.add_argument("--launch", choices=["stream", "graph"], default="stream",
                   help="GPU kernel launches: plain stream or CUDA graph (default stream)")
    p.add_argument("--gpus", type=int, choices=[1, 2, 4, 8], default=1,
                   help="also cost a tensor-parallel group of this many GPUs (NVLink all-reduces)")
    p.add_argument("--emulate", action="store_true", help="LPU times from emulation instead of the schedule")
    add_chips(p)
    p.add_argument("--plot", help="draw the comparison (or the sweep) to this PNG (needs matplotlib)")
    p.add_argument("--sweep", metavar="NAME=V1,V2,...",
                   help="recompile for each value of a param (default values for S: "
                        + ",".join(map(str, DEFAULT_SWEEP["S"])) + ")")
    common(p)


def cmd_compare(a):
    from lpu.gpu_baseline.gpus import load_gpu
    params = parse_params(a.params)
    gpu = load_gpu(a.gpu)
    if a.sweep:
        name, values = parse_sweep(a.sweep)
        rows = sweep(a.program, name, values, params, a.machine, gpu, a.launch,
                     progress=progress_lines(a))
        if a.plot:
            plot_sweep(rows, gpu.name, a.plot)
        if a.json:
            print(json.dumps({"program": a.program, "gpu": gpu.name, "param": name, "rows": rows,
                              "crossover": crossover(rows)}))
        else:
            print(format_sweep(rows, gpu.name))
        return 0
    if a.chips and a.sweep:
        raise LpuError("--sweep with --chips: not supported yet")
    d = compare(a.program, params, a.machine, gpu, a.launch, a.emulate, progress=progress_lines(a), gpus=a.gpus,
                chips=a.chips)
    if a.plot:
        plot_ops(d, a.plot)
    print(json.dumps(d) if a.json else format_compare(d))
    return 0


HANDLERS = {"compare": cmd_compare}
