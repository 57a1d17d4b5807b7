"""The measurements of the benchmark runner (issue 7), one function per section. Each returns a
list of items: {section, name, value, unit, target, ok, ...details}; `ok` is None where there is
no target (context figures) or the figure could not be measured (`error` says why)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from benchmarks import bounds as B
from benchmarks.speedprobe import THREAD_VARS
from lpu.compiler.driver import CompileStats, compile_source
from lpu.emulator.run import run
from lpu.isa.encoding import encode, save
from lpu.isa.errors import LpuError
from lpu.isa.machine import MachineConfig
from lpu.isa.opcodes import OPS
from lpu.api import inputs_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "programs")


class Timeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise Timeout in this (main) thread after `seconds` (Python code only: a jitted call
    finishes first)."""
    if not seconds:
        yield
        return

    def fire(*_):
        raise Timeout(f"over the {seconds:.0f} s limit per item")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def item(section, name, value, unit="", target=None, ok=None, **detail) -> dict:
    return dict(section=section, name=name, value=value, unit=unit, target=target, ok=ok, **detail)


def failed(section, name, exc, target=None) -> dict:
    return item(section, name, None, target=target, ok=None, error=f"{type(exc).__name__}: {exc}"[:300])


@dataclass
class Compiled:
    prog: object
    graph: object
    seconds: float
    passes: dict = field(default_factory=dict)


class Bench:
    """Shared state of one run: the machine, the per-item time limit, and compiled programs
    (each program and params compiled once, its compile time kept for the compile section)."""

    def __init__(self, machine: str = "tsp-v1", quick: bool = False, limit_s: float | None = None, log=None):
        self.machine = MachineConfig.load(machine)
        self.quick = quick
        self.limit_s = limit_s
        self.cache: dict = {}
        self.log = log or (lambda msg: None)
        self.warm = False

    def warm_up(self):
        """Load the compiler's jitted code (Numba's cache) once, with a small layered program,
        so that no timed compile pays for it (whichever section compiled first did)."""
        if not self.warm:
            self.warm = True
            try:          # best effort: a small machine may not hold it (the first timed compile pays then)
                with open(os.path.join(PROGRAMS, "gpt2_small_decode.lpu")) as f:
                    compile_source(f.read(), "<warm-up>", {"L": 2}, self.machine)
            except (OSError, LpuError):
                pass

    def compile_text(self, text: str, name: str, params: dict | None = None) -> Compiled:
        key = (name, tuple(sorted((params or {}).items())))
        if key not in self.cache:
            self.warm_up()
            self.log(f"compiling {name} {params or ''}")
            st = CompileStats()
            t0 = time.perf_counter()
            with deadline(self.limit_s):
                prog, graph = compile_source(text, name, params or {}, self.machine, st)
            self.cache[key] = Compiled(prog, graph, time.perf_counter() - t0, dict(st.pass_seconds))
        return self.cache[key]

    def compile(self, prog_name: str, params: dict | None = None) -> Compiled:
        path = os.path.join(PROGRAMS, prog_name + ".lpu")
        with open(path) as f:
            return self.compile_text(f.read(), f"programs/{prog_name}.lpu", params)


def best_of(fn, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def pstr(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


# ---- 1. emulator speed ------------------------------------------------------------------------
def speed_probe(b: "Bench", c: Compiled, params: dict, one_thread: bool) -> dict:
    """Emulation and numpy float32 times of a compiled program, measured alternately in a child
    process (benchmarks/speedprobe.py), with numpy's default threads or one thread."""
    env = _child_env()
    if one_thread:
        env.update({v: "1" for v in THREAD_VARS})
    else:
        for v in THREAD_VARS:
            env.pop(v, None)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prog.lpubin")
        save(c.prog, path)
        p = subprocess.run([sys.executable, "-m", "benchmarks.speedprobe", path, json.dumps(params),
                            str(3 if b.quick else 5)], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=3600)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def emulator_speed(b: Bench) -> list:
    sec = "emulator speed"
    cases = [("decode", "gpt2_small_decode", {"L": 2} if b.quick else {}, "<= 1.5", 1.5),
             ("prefill", "bert_base", {"L": 1} if b.quick else {}, "<= 3 (aim 2)", 3.0)]
    out = []
    for phase, name, params, target, limit in cases:
        label = f"{phase}: {name}" + (f" ({pstr(params)})" if params else "")
        try:
            c = b.compile(name, params)
            b.log(f"emulating {label}")
            runs = {"default threads": speed_probe(b, c, params, False),
                    "1 thread": speed_probe(b, c, params, True)}
        except Exception as e:   # noqa: BLE001 - report and go on
            out.append(failed(sec, f"{label}: emulation / numpy", e, target))
            continue
        common = dict(program=name, params=params)
        for how, r in runs.items():
            emu, npt = r["emulation_median_s"], r["numpy_median_s"]
            ratio = emu / npt
            cps = r["cycles"] / emu
            kept = r["resident_median_s"]          # weights and states left in SRAM (speedprobe)
            kcps = r["cycles"] / kept
            out += [
                item(sec, f"{label}, {how}: emulation wall time (median)", round(emu, 4), "s", **common,
                     cycles=r["cycles"], predicted_cycles=int(c.prog.predicted_cycles), instructions=r["instructions"],
                     runs_s=[round(t, 4) for t in r["emulation_s"]]),
                item(sec, f"{label}, {how}: numpy float32 time (median)", round(npt, 4), "s", **common,
                     blas=r["blas"], threads=r["threads"], runs_s=[round(t, 4) for t in r["numpy_s"]]),
                item(sec, f"{label}, {how}: emulated cycles/s", round(cps), "cycles/s", ">= 1M", cps >= 1e6, **common),
                item(sec, f"{label}, {how}: resident run wall time (median)", round(kept, 4), "s", **common,
                     runs_s=[round(t, 4) for t in r["resident_s"]]),
                item(sec, f"{label}, {how}: emulated cycles/s, resident", round(kcps), "cycles/s", ">= 1M",
                     kcps >= 1e6, **common),
                item(sec, f"{label}, {how}: instructions/s", round(r["instructions"] / emu), "instr/s", **common),
                item(sec, f"{label}, {how}: numpy float32's own cycles/s", round(r["cycles"] / npt), "cycles/s",
                     note="the program's cycles over numpy's time: the rate at which numpy alone computes it",
                     **common),
                item(sec, f"{label}, {how}: emulation / numpy", round(ratio, 2), "x", target, ratio <= limit,
                     blas=r["blas"], threads=r["threads"], **common),
            ]
    return out


# ---- 2. compile speed -------------------------------------------------------------------------
def compile_speed(b: Bench) -> list:
    sec = "compile speed"
    out = []
    full = [("gpt2_small_decode", 3.0), ("bert_base", 20.0), ("gpt2_small_prefill", 20.0)]
    for name, limit in full:
        if b.quick:
            out.append(item(sec, f"{name} (default params) compile", None, "s", f"<= {limit:g}", None,
                            skipped="--quick"))
            continue
        try:
            c = b.compile(name)
            out.append(item(sec, f"{name} (default params) compile", round(c.seconds, 2), "s", f"<= {limit:g}",
                            c.seconds <= limit, passes={k: round(v, 2) for k, v in c.passes.items()}))
        except Exception as e:   # noqa: BLE001
            out.append(failed(sec, f"{name} (default params) compile", e, f"<= {limit:g}"))
    if not b.quick:
        out += _layer_ratio_and_size(b, sec)
    layers = (1, 2, 4) if b.quick else (1, 2, 4, 8)
    prev = None
    with open(os.path.join(PROGRAMS, "gpt2_small_decode.lpu")) as f:
        text = f.read()
    for n in layers:
        name = f"gpt2_small_decode L={n} compile"
        try:
            c = b.compile("gpt2_small_decode", {"L": n})
            # best of three: a one-off compile of a second or less moves by half between runs
            seconds = min(c.seconds, best_of(lambda: compile_source(text, "gpt2_small_decode.lpu", {"L": n},
                                                                    b.machine), 2))
        except Exception as e:   # noqa: BLE001
            out.append(failed(sec, name, e))
            break
        growth = None if prev is None else seconds / prev
        out.append(item(sec, name, round(seconds, 2), "s",
                         None if prev is None else "growth <= 2.3x", None if prev is None else growth <= 2.3,
                         growth=None if growth is None else round(growth, 2),
                         passes={k: round(v, 2) for k, v in c.passes.items()}))
        prev = seconds
    return out


def _record_bytes(p) -> int:
    """The size of `p`'s instructions as one fixed record each (queue u16, opcode u8, its fields,
    line u32, node i32): the .lpubin format up to version 3, the baseline of the size target."""
    width = {"int": 4, "ref": 2, "dtype": 1, "f32": 4}
    rec = np.array([3 + sum(width[k] for _, k in s.fields) + 8 for s in OPS], np.int64)
    return int(rec[np.asarray(p.op)].sum())


def _layer_ratio_and_size(b: "Bench", sec: str) -> list:
    """compile(12 layers)/compile(1 layer) of bert_base, and its binary against fixed records."""
    out = []
    try:
        full = b.compile("bert_base")
        with open(os.path.join(PROGRAMS, "bert_base.lpu")) as f:
            text = f.read()
        # each the best of its runs (the full one: the suite's compile and one more), so that
        # neither side pays a first run's cold memory alone
        full_s = min(full.seconds, best_of(lambda: compile_source(text, "bert_base.lpu", {}, b.machine), 1))
        one_s = best_of(lambda: compile_source(text, "bert_base.lpu", {"L": 1}, b.machine), 3)
        ratio = full_s / one_s
        out.append(item(sec, "bert_base compile(12 layers) / compile(1 layer)", round(ratio, 2), "x", "<= 2.5",
                        ratio <= 2.5, one_s=round(one_s, 2), full_s=round(full_s, 2)))
        size, records = len(encode(full.prog)), _record_bytes(full.prog)
        out.append(item(sec, "bert_base binary size", size, "bytes", None, None, instructions=len(full.prog.op)))
        out.append(item(sec, "bert_base binary: fixed records / .lpubin", round(records / size, 1), "x", ">= 10",
                        records / size >= 10, record_bytes=records))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, "bert_base compile(12 layers) / compile(1 layer)", e, "<= 2.5"))
    return out


# ---- 3. schedule quality ----------------------------------------------------------------------
def matmul_source(m: int, k: int, n: int, dtype: str) -> str:
    return (f"input x : {dtype}[{m}, {k}]\nweight w : {dtype}[{k}, {n}]\noutput y = x @ w\n")


def scaled(m: MachineConfig, dims: tuple) -> tuple:
    """Matmul sizes written for 320 lanes, scaled to the machine's lanes (--machine tiny)."""
    return tuple(max(1, d * m.lanes // 320) for d in dims)


def schedule_quality(b: Bench) -> list:
    sec = "schedule quality"
    m = b.machine
    out = []
    big = scaled(m, (640, 1280, 1280) if b.quick else (1280, 2560, 2560))
    for dt in ("i8", "f16"):
        name = f"{dt} matmul [{big[0]},{big[1]}]@[{big[1]},{big[2]}] MXM utilization"
        try:
            c = b.compile_text(matmul_source(*big, dt), f"<matmul {dt} {big}>")
            macs = big[0] * big[1] * big[2]
            util = macs / (m.macs_per_cycle(dt) * c.prog.predicted_cycles)
            out.append(item(sec, name, round(util, 4), "", ">= 0.90", util >= 0.90,
                            cycles=int(c.prog.predicted_cycles), macs=macs,
                            compute_bound=int(np.ceil(macs / m.macs_per_cycle(dt))), compile_s=round(c.seconds, 2)))
        except Exception as e:   # noqa: BLE001
            out.append(failed(sec, name, e, ">= 0.90"))
    k, n = scaled(m, (1280, 5120) if b.quick else (2560, 10240))
    name = f"f16 GEMV [1,{k}]@[{k},{n}] cycles / weight-streaming bound"
    try:
        c = b.compile_text(matmul_source(1, k, n, "f16"), f"<gemv f16 {k}x{n}>")
        bound = int(np.ceil(k * n * 2 / m.stream_bytes_per_cycle()))
        r = c.prog.predicted_cycles / bound
        out.append(item(sec, name, round(r, 3), "x", "<= 1.25", r <= 1.25, cycles=int(c.prog.predicted_cycles),
                        bound=bound, compile_s=round(c.seconds, 2)))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, name, e, "<= 1.25"))
    out += _axis_ratio(b)
    for path in sorted(f for f in os.listdir(PROGRAMS) if f.endswith(".lpu")):
        prog_name = path[:-4]
        params = {}
        if b.quick and prog_name in ("gpt2_small_decode", "gpt2_small_prefill", "bert_base"):
            cached = [key for key in b.cache if key[0] == f"programs/{path}"]
            if not cached:
                out.append(item(sec, f"{prog_name}: cycles / lower bound", None, "x", "<= 1.3", None,
                                skipped="--quick (12-layer program)"))
                continue
            params = dict(cached[0][1])
        label = f"{prog_name}" + (f" ({pstr(params)})" if params else "") + ": cycles / lower bound"
        limit = ISSUE13_RATIO.get(prog_name, 1.3) if not params else 1.3
        try:
            c = b.compile(prog_name, params)
            lb = B.lower_bounds(c.graph, m)
            r = c.prog.predicted_cycles / lb["bound"]
            util = _mxm_utilization(c)
            out.append(item(sec, label, round(r, 2), "x", f"<= {limit}", r <= limit, program=prog_name, params=params,
                            cycles=int(c.prog.predicted_cycles), mxm_utilization=round(util, 3), **lb))
            if prog_name == "bert_base" and not params:
                out.append(item(sec, "bert_base: MXM utilization (plane-cycles held, emulated)", round(util, 3), "",
                                ">= 0.75", util >= 0.75))
        except Exception as e:   # noqa: BLE001
            out.append(failed(sec, label, e, f"<= {limit}"))
    return out


# issue 13's targets for the whole programs it names (cycles / lower bound); every other program
# keeps the benchmark runner's first target, 1.3 (issue 7)
ISSUE13_RATIO = {"bert_base": 1.5, "gpt2_small_prefill": 1.6, "attention_prefill": 1.5,
                 "gpt2_block_decode": 2.0, "llama_block_decode": 2.0, "gpt2_small_decode": 2.0}


def _mxm_utilization(c) -> float:
    """The MXM's share of plane-cycles held by ABCs, as `lpu run` reports it: from an emulation
    with seed-0 inputs (which must take the predicted cycles)."""
    r = run(c.prog, inputs_for(c.graph, c.prog, 0))
    if r.cycles != c.prog.predicted_cycles:
        raise LpuError(f"emulated {r.cycles:,} cycles, predicted {c.prog.predicted_cycles:,}")
    return float(r.utilization["mxm"])


def _axis_ratio(b: Bench) -> list:
    """Issue 13: a reduction over axis 0 against the same over axis 1 of one tensor (lanes hold
    axis 1: axis 0 is an add between vectors, axis 1 a reduction across lanes)."""
    sec, name = "schedule quality", "mean(x, axis=0) / mean(x, axis=1) cycles, f16[37,200]"
    try:
        c = {ax: b.compile_text(f"input x : f16[37, 200]\noutput y = mean(x, axis={ax})\n",
                                f"<mean axis {ax}>").prog.predicted_cycles for ax in (0, 1)}
        r = c[0] / c[1]
        return [item(sec, name, round(r, 2), "x", "<= 1.5", r <= 1.5, axis0=int(c[0]), axis1=int(c[1]))]
    except Exception as e:   # noqa: BLE001
        return [failed(sec, name, e, "<= 1.5")]


# ---- 4. memory and start-up -------------------------------------------------------------------
def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def memory(b: Bench) -> list:
    sec = "memory"
    out = []
    name, params = ("bert_base", {"L": 1}) if b.quick else ("bert_base", {})
    label = f"peak RSS emulating {name}" + (f" ({pstr(params)})" if params else "")
    try:
        c = b.compile(name, params)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "prog.lpubin")
            save(c.prog, path)
            p = subprocess.run([sys.executable, "-m", "benchmarks.memprobe", path, json.dumps(params)],
                               capture_output=True, text=True, env=_child_env(), cwd=ROOT, timeout=1800)
        if p.returncode:
            raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
        probe = json.loads(p.stdout.strip().splitlines()[-1])
        gib = probe["peak_rss_bytes"] / 2**30
        out.append(item(sec, label, round(gib, 3), "GiB", "< 2", gib < 2, program=name, params=params,
                        instructions=probe["instructions"], rss_before_run_gib=round(probe["rss_before_run_bytes"] / 2**30, 3)))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, label, e, "< 2"))
    label = "lpu run programs/matmul.lpu --json start-up (warm cache)"
    try:
        exe = shutil.which("lpu")
        cmd = ([exe] if exe else [sys.executable, "-c", "import sys; from lpu.cli import main; sys.exit(main())"]) + \
            ["run", "programs/matmul.lpu", "--json"] + (["--machine", b.machine.name] if b.machine.name != "tsp-v1" else [])
        subprocess.run(cmd, capture_output=True, env=_child_env(), cwd=ROOT, timeout=600, check=True)   # warm
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, env=_child_env(), cwd=ROOT, timeout=600, check=True)
            times.append(time.perf_counter() - t0)
        out.append(item(sec, label, round(min(times), 3), "s", "< 2", min(times) < 2,
                        runs_s=[round(t, 3) for t in times]))
    except Exception as e:   # noqa: BLE001
        out.append(failed(sec, label, e, "< 2"))
    return out


# ---- 5. tracing cost --------------------------------------------------------------------------
def tracing(b: Bench) -> list:
    from lpu.emulator import trace as T
    sec = "tracing"
    name, params = "gpt2_small_decode", {"L": 2}
    try:
        c = b.compile(name, params)
        values = inputs_for(c.graph, c.prog, 0)
        run(c.prog, values)
        off = on = float("inf")
        for _ in range(5):       # interleaved, so a noisy neighbour hits both alike
            off = min(off, best_of(lambda: run(c.prog, values), 1))
            on = min(on, best_of(lambda: run(c.prog, values, trace=True), 1))
        res = run(c.prog, values, trace=True)

        def perfetto():
            r = T.records(c.prog, res.trace, res.cycles)
            doc, _ = T.chrome_trace(r, None)
            json.dumps(doc, separators=(",", ":"))
        doc_s = best_of(perfetto, 1)
    except Exception as e:   # noqa: BLE001
        return [failed(sec, f"{name} (L=2): trace on / off", e)]
    name += " (L=2)"
    return [
        item(sec, f"{name}: emulation, trace off", round(off, 4), "s", instructions=int(res.instructions)),
        item(sec, f"{name}: emulation, trace on", round(on, 4), "s"),
        item(sec, f"{name}: trace on / off", round(on / off, 3), "x", "<= 1.2", on / off <= 1.2),
        item(sec, f"{name}: Perfetto JSON (records + events + dump)", round(doc_s, 3), "s"),
    ]


def _systems(b: Bench) -> list:
    from benchmarks.systems import systems
    return systems(b)


SECTIONS = {"speed": emulator_speed, "compile": compile_speed, "schedule": schedule_quality,
            "memory": memory, "tracing": tracing, "system": _systems}
