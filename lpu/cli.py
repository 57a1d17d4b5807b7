"""The `lpu` command. Every subcommand has --help; --json prints one JSON object on stdout.
User errors: one message on stderr, exit code 2 (with --json also {"error": ...} on stdout);
internal errors: exit code 1 with a request to report it; --debug shows the traceback."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import tomllib

import numpy as np

from lpu import cmd_system, cmd_trace, cmd_verify, compare, demo
from lpu.args import Progress, add_chips, add_common, add_window, compile_detail, parse_params
from lpu.isa.errors import LpuError
from lpu.isa import limits
from lpu.outputs import check_outputs

COMMANDS = (cmd_trace, cmd_verify, compare, demo)   # subcommands with a module of their own


def version() -> str:
    """The installed distribution's version, or in a checkout that is not installed, its
    pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("lpu")
    except PackageNotFoundError:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
            return tomllib.load(f)["project"]["version"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lpu", description="Cycle-level LPU (Tensor Streaming Processor) emulator, "
                                 "compiler and GPU comparison")
    ap.add_argument("--version", action="version", version=f"lpu {version()}")
    ap.add_argument("--limit", dest="limits", action="append", metavar="NAME=N",
                    help="raise (or lower) a named limit for this command, e.g. --limit loop_trips=1000000 "
                         "(the limits: docs/limits.md; the same as LPU_LIMIT_<NAME>=N)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile", help="compile a .lpu program to a .lpubin binary")
    p.add_argument("program", help="PROG.lpu")
    p.add_argument("-o", dest="output", metavar="PROG.lpubin", help="write the binary here")
    p.add_argument("--emit", choices=["ir", "asm", "schedule"], help="print the IR, assembly or schedule")
    add_chips(p)
    add_common(p)
    p = sub.add_parser("run", help="compile (or load) and emulate a program cycle by cycle")
    p.add_argument("program", help="PROG.lpu or PROG.lpubin")
    p.add_argument("--inputs", metavar="IN.npz", help=".npz of inputs/weights/states by declared name")
    p.add_argument("--seed", type=int, default=0, help="seed for values not given (default 0)")
    p.add_argument("--save", metavar="OUT.npz", help="write outputs and final states to this .npz")
    p.add_argument("--check", action="store_true", help="compare with the numpy reference")
    p.add_argument("--trace", metavar="TRACE.json", help="write a Perfetto/Chrome trace JSON here")
    add_window(p, "for --trace (default: the whole run, up to the event bound)")
    p.add_argument("--report", action="store_true", help="print utilization and bottleneck report")
    p.add_argument("--plot", metavar="OUT.png", help="draw utilization over time to this PNG (needs matplotlib)")
    add_chips(p, run=True)
    add_common(p)
    p = sub.add_parser("disasm", help="print a .lpubin as assembly text")
    p.add_argument("binary", help="PROG.lpubin")
    p.add_argument("-o", dest="output", metavar="PROG.s", help="write the text here instead of stdout")
    add_common(p, compiles=False)
    p = sub.add_parser("asm", help="assemble text (as `lpu disasm` prints it) into a .lpubin")
    p.add_argument("source", help="PROG.s")
    p.add_argument("-o", dest="output", required=True, metavar="PROG.lpubin", help="write the binary here")
    add_common(p, compiles=False)
    for m in COMMANDS:
        m.add_parser(sub, add_common)
    return ap


def cmd_compile(a):
    from lpu import api
    from lpu.isa.encoding import save
    from lpu.compiler.driver import CompileStats
    stats = CompileStats()
    if cmd_system.wants_system(a, a.program):
        return cmd_system.cmd_compile(a, stats)
    with Progress.for_args(a).stage(f"compiling {a.program}", lambda: compile_detail(stats)), _chips_hint():
        prog, graph = api.compile(a.program, parse_params(a.params), a.machine, stats)
    if a.output:
        api.write_atomic(a.output, lambda tmp: save(prog, tmp))
    if a.emit == "asm":
        from lpu.isa.asm import disassemble
        print(disassemble(prog), end="")
    elif a.emit == "ir":
        for n in graph.nodes():
            ins = ", ".join(f"%{i}" for i in n.inputs)
            attrs = "".join(f" {k}={v!r}" for k, v in n.attrs.items() if k != "value")
            print(f"%{n.id} = {n.op}({ins}){attrs} : {n.dtype}{list(n.shape)}   # line {n.line}")
    elif a.emit == "schedule":
        _print_schedule(prog)
    info = _compile_info(prog, graph, stats)
    if a.json:
        print(json.dumps(info))
    elif not a.emit:
        print(f"{a.program}: {info['instructions']:,} instructions in the binary, {info['predicted_cycles']:,} cycles "
              f"({info['time_us']:.2f} us at {prog.machine.clock_mhz} MHz), {info['sram_bytes']:,} bytes of SRAM"
              + (f", written to {a.output}" if a.output else ""))
    return 0


@contextlib.contextmanager
def _chips_hint():
    """A program too large for one chip: today's error, plus the way out (--chips)."""
    from lpu.isa.errors import CapacityError
    try:
        yield
    except CapacityError as e:
        raise cmd_system.fits_hint(e) from None


def _compile_info(prog, graph, stats) -> dict:
    resident = sum(s.slices.size * prog.machine.lanes for s in prog.symbols)
    return {
        "program": prog.source_name, "machine": prog.machine.name,
        "instructions": prog.n_instructions, "predicted_cycles": prog.predicted_cycles,
        "time_us": prog.predicted_cycles / prog.machine.clock_mhz,
        "sram_bytes": max(resident, stats.sram_peak_bytes), "resident_bytes": resident,
        "chips_needed": max(1, -(-resident // prog.machine.sram_bytes)),
        "compile_s": round(sum(stats.pass_seconds.values()), 4),
        "passes_s": {k: round(v, 4) for k, v in stats.pass_seconds.items()},
        "replayed_nodes": stats.replayed,
    }


def _print_schedule(prog):
    from lpu.emulator.run import schedule
    from lpu.isa.opcodes import OPS
    s = schedule(prog)
    for i in range(len(s.cycle)):
        q = prog.machine.queues[int(s.queue[i])][0]
        src = int(s.src[i])
        print(f"{int(s.cycle[i]):>8}  {q:<12} {OPS[int(s.op[i])].name:<10} line {int(prog.line[src])}")


def cmd_run(a):
    from lpu import api
    if a.seed < 0:
        raise LpuError(f"--seed must be a non-negative integer, got {a.seed}")
    progress = Progress.for_args(a)
    t0 = time.perf_counter()
    from lpu.compiler.driver import CompileStats
    stats = CompileStats()
    if cmd_system.wants_system(a, a.program) or a.ray:
        if a.workers < 0:
            raise LpuError(f"--workers must be a non-negative integer, got {a.workers}")
        return cmd_system.cmd_run(a, stats)
    with progress.stage(f"compiling {a.program}", lambda: compile_detail(stats)), _chips_hint():
        prog, graph = api.compile(a.program, parse_params(a.params), a.machine, stats, graph=a.check)
    compile_s = time.perf_counter() - t0
    given = api.load_npz(a.inputs, prog) if a.inputs else {}
    values = api.inputs_for(graph, prog, a.seed, given, f"--inputs {a.inputs}")
    t0 = time.perf_counter()
    with progress.stage(f"emulating {prog.predicted_cycles:,} cycles"):
        result = api.run(prog, values, trace=bool(a.trace or a.report or a.plot))
    wall = time.perf_counter() - t0
    info = {"program": prog.source_name or a.program, "machine": prog.machine.name, "cycles": int(result.cycles),
            "predicted_cycles": int(prog.predicted_cycles), "time_us": result.cycles / prog.machine.clock_mhz,
            "instructions": int(result.instructions), "instructions_compiled": prog.n_instructions,
            "wall_s": round(wall, 4), "compile_s": round(compile_s, 4), "params": dict(prog.params),
            "utilization": {k: round(float(v), 4) for k, v in result.utilization.items()}}
    if a.check:
        if graph is None and prog.source_lines:
            raise LpuError(f"{a.program}: --check rebuilds the reference from the binary's source, which with the "
                           f"recorded params does not declare the binary's tensors (a binary assembled by hand?)")
        if graph is None:
            raise LpuError(f"{a.program}: --check needs the program's source, which this binary does not carry")
        info["check"] = api.check(graph, prog, values, result)
    if a.save:
        arrays = {**{k: np.asarray(v) for k, v in result.outputs.items()},
                  **{k: np.asarray(v) for k, v in result.states.items()}}
        api.write_atomic(a.save, lambda tmp: _savez(tmp, arrays))
    cmd_trace.after_run(a, prog, result, info)
    if a.json:
        print(json.dumps(info))
    else:
        print(f"{info['program']} on {info['machine']}: {info['cycles']:,} cycles ({info['time_us']:.2f} us), "
              f"predicted {info['predicted_cycles']:,}; {info['instructions']:,} instructions executed "
              f"({info['instructions_compiled']:,} in the binary) in {wall:.2f} s")
        u = info["utilization"]
        print("utilization: " + ", ".join(f"{k} {v:.1%}" for k, v in u.items()))
        if "check" in info:
            c = info["check"]
            print(f"check: {'ok' if c['ok'] else 'MISMATCH'} (max abs err {c['max_abs_err']:.3g}, "
                  f"max rel err {c['max_rel_err']:.3g})")
        if not a.save:
            for k, v in result.outputs.items():
                print(f"{k}: {np.asarray(v).dtype}{list(np.shape(v))} " + np.array2string(
                    np.asarray(v).reshape(-1)[:6], precision=4) + (" ..." if np.size(v) > 6 else ""))
    if a.check and not info["check"]["ok"]:
        print(f"error: the emulator's outputs differ from the reference ({info['check']['worst']})", file=sys.stderr)
        return 2
    return 0


def _savez(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def cmd_disasm(a):
    from lpu.isa.asm import disassemble
    from lpu.isa.encoding import load_binary
    if cmd_system.wants_system(a, a.binary):
        return cmd_system.cmd_disasm(a)
    prog = load_binary(a.binary)
    text = disassemble(prog)
    if a.output:
        from lpu.api import write_atomic
        write_atomic(a.output, lambda tmp: open(tmp, "w").write(text))
    if a.json:
        info = {"binary": a.binary, "program": prog.source_name, "machine": prog.machine.name,
                "params": dict(prog.params), "instructions": prog.n_instructions,
                "predicted_cycles": int(prog.predicted_cycles), "source_sha256": prog.source_hash(),
                "symbols": [{"name": s.name, "kind": s.kind, "dtype": s.dtype, "shape": [int(d) for d in s.shape]}
                            for s in prog.symbols if s.kind != "const"]}
        if a.output:
            info["output"] = a.output
        else:
            info["text"] = text
        print(json.dumps(info))
    elif not a.output:
        sys.stdout.write(text)
    return 0


def cmd_asm(a):
    from lpu.isa.asm import assemble
    from lpu.isa.encoding import save
    from lpu.api import write_atomic
    try:
        with open(a.source) as f:
            text = f.read()
    except OSError as e:
        raise LpuError(f"{a.source}: {e.strerror}") from None
    prog = assemble(text, a.source)
    write_atomic(a.output, lambda tmp: save(prog, tmp))
    if a.json:
        print(json.dumps({"output": a.output, "instructions": prog.n_instructions}))
    return 0


def set_limits(items) -> dict:
    """`--limit NAME=N`: the limits' environment variables for the rest of this command; returns
    what they were before (None: unset), for `main` to put back."""
    given = {}
    for it in items or []:                    # every value checked before any is set
        name, _, raw = it.partition("=")
        name = name.strip().lower()
        given[limits.env_name(name)] = limits.parse(name, raw, f"--limit {name}")
    before = {env: os.environ.get(env) for env in given}
    os.environ.update({env: str(v) for env, v in given.items()})
    return before


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    a = ap.parse_args(argv)
    handlers = {"compile": cmd_compile, "run": cmd_run, "disasm": cmd_disasm, "asm": cmd_asm}
    for m in COMMANDS:
        handlers.update(m.HANDLERS)
    saved = {}
    try:
        saved = set_limits(a.limits)
        check_outputs(a)
        return handlers[a.cmd](a) or 0
    except LpuError as e:
        if a.debug:
            raise
        if getattr(a, "json", False):
            print(json.dumps({"error": e.message, **e.info}))
        from lpu.compiler.errors import SourceError  # already says `file:line:col: error:`
        print(e.message if isinstance(e, SourceError) else f"error: {e.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:        # `lpu ... | head`: the reader left; not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence
        if a.debug:
            raise
        print(f"internal error: {type(e).__name__}: {e}\nThis is a bug in lpu; please report it with the "
              f"command you ran (rerun with --debug for the traceback).", file=sys.stderr)
        return 1
    finally:
        for env, value in saved.items():
            if value is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = value


if __name__ == "__main__":
    sys.exit(main())
