"""The `lpu` command. Every subcommand has --help; --json prints one JSON object on stdout.
User errors: one message on stderr, exit code 2 (with --json also {"error": ...} on stdout);
internal errors: exit code 1 with a request to report it; --debug shows the traceback."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from lpu.isa.errors import LpuError


def _params(items) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise LpuError(f"-p expects NAME=INT, got '{it}'")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise LpuError(f"-p {k}: '{v}' is not an integer") from None
    return out


def _common(p, compiles=True):
    if compiles:
        p.add_argument("-p", dest="params", action="append", metavar="NAME=INT", help="override a param")
        p.add_argument("--machine", default=None, help="machine name (tsp-v1, tiny) or a .toml file")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lpu", description="Cycle-level LPU (Tensor Streaming Processor) emulator, "
                                 "compiler and GPU comparison")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile", help="compile a .lpu program to a .lpubin binary")
    p.add_argument("program")
    p.add_argument("-o", dest="output", help="write the binary here")
    p.add_argument("--emit", choices=["ir", "asm", "schedule"], help="print the IR, assembly or schedule")
    _common(p)
    p = sub.add_parser("run", help="compile (or load) and emulate a program cycle by cycle")
    p.add_argument("program", help="PROG.lpu or PROG.lpubin")
    p.add_argument("--inputs", help=".npz of inputs/weights/states by declared name")
    p.add_argument("--seed", type=int, default=0, help="seed for values not given (default 0)")
    p.add_argument("--save", help="write outputs and final states to this .npz")
    p.add_argument("--check", action="store_true", help="compare with the numpy reference")
    p.add_argument("--trace", help="write a Perfetto/Chrome trace JSON here")
    p.add_argument("--trace-cycles", help="A:B window of cycles for --trace")
    p.add_argument("--report", action="store_true", help="print utilization and bottleneck report")
    p.add_argument("--plot", help="draw utilization over time to this PNG (needs matplotlib)")
    _common(p)
    p = sub.add_parser("disasm", help="print a .lpubin as assembly text")
    p.add_argument("binary")
    p.add_argument("-o", dest="output", help="write the text here")
    _common(p, compiles=False)
    p = sub.add_parser("asm", help="assemble text into a .lpubin")
    p.add_argument("source")
    p.add_argument("-o", dest="output", required=True)
    _common(p, compiles=False)
    from lpu import cli_more
    cli_more.add_parsers(sub, _common)
    return ap


def cmd_compile(a):
    from lpu import api
    from lpu.isa.encoding import save
    from lpu.compiler.driver import CompileStats
    stats = CompileStats()
    prog, graph = api.compile(a.program, _params(a.params), a.machine, stats)
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
        print(f"{a.program}: {info['instructions']:,} instructions, {info['predicted_cycles']:,} cycles "
              f"({info['time_us']:.2f} us at {prog.machine.clock_mhz} MHz), {info['sram_bytes']:,} bytes of SRAM"
              + (f", written to {a.output}" if a.output else ""))
    return 0


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
    params = _params(a.params)
    prog, graph = api.compile(a.program, params, a.machine, graph=a.check)
    given = api.load_npz(a.inputs, prog) if a.inputs else {}
    values = api.inputs_for(graph, prog, a.seed, given, f"--inputs {a.inputs}")
    t0 = time.perf_counter()
    result = api.run(prog, values, trace=bool(a.trace or a.report or a.plot))
    wall = time.perf_counter() - t0
    info = {"program": prog.source_name or a.program, "machine": prog.machine.name, "cycles": int(result.cycles),
            "predicted_cycles": int(prog.predicted_cycles), "time_us": result.cycles / prog.machine.clock_mhz,
            "instructions": int(result.instructions), "wall_s": round(wall, 4),
            "utilization": {k: round(float(v), 4) for k, v in result.utilization.items()}}
    if a.check:
        if graph is None and prog.source_lines:
            raise LpuError(f"{a.program}: --check rebuilds the reference from the binary's source, which with these "
                           f"params declares other tensors than the binary; pass the -p NAME=INT it was compiled with")
        if graph is None:
            raise LpuError(f"{a.program}: --check needs the program's source, which this binary does not carry")
        info["check"] = api.check(graph, prog, values, result)
    if a.save:
        arrays = {**{k: np.asarray(v) for k, v in result.outputs.items()},
                  **{k: np.asarray(v) for k, v in result.states.items()}}
        api.write_atomic(a.save, lambda tmp: _savez(tmp, arrays))
    from lpu import cli_more
    cli_more.after_run(a, prog, result, info)
    if a.json:
        print(json.dumps(info))
    else:
        print(f"{info['program']} on {info['machine']}: {info['cycles']:,} cycles ({info['time_us']:.2f} us), "
              f"predicted {info['predicted_cycles']:,}; {info['instructions']:,} instructions in {wall:.2f} s")
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
    text = disassemble(load_binary(a.binary))
    if a.output:
        from lpu.api import write_atomic
        write_atomic(a.output, lambda tmp: open(tmp, "w").write(text))
    else:
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


def _check_outputs(a):
    """Before any work: every output file can be written, is none of the inputs, and no two
    options name one file (lpu/outputs.py)."""
    from lpu.outputs import check_outputs
    check_outputs(a)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    a = ap.parse_args(argv)
    from lpu import cli_more
    handlers = {"compile": cmd_compile, "run": cmd_run, "disasm": cmd_disasm, "asm": cmd_asm, **cli_more.HANDLERS}
    try:
        _check_outputs(a)
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


if __name__ == "__main__":
    sys.exit(main())
