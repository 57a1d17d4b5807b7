"""`lpu verify PROG.lpu|PROG.lpubin`: run the independent schedule checker (compiler/verify.py)
on a compiled program or a binary (a system's: every chip and its links, lpu/cmd_system.py).
Exit 0 if no violation, 2 with every violation listed."""
from __future__ import annotations

import json
import sys
import time

from lpu import cmd_system
from lpu.args import add_chips, parse_params

SHOWN = 50


def add_parser(sub, common):
    p = sub.add_parser("verify", help="prove a compiled program keeps every timing and resource rule")
    p.add_argument("program", help="PROG.lpu or PROG.lpubin")
    p.add_argument("--limit", type=int, default=1000, metavar="N", help="stop after this many violations (default 1000)")
    add_chips(p)
    common(p)


def cmd_verify(a):
    from lpu.compiler.verify import verify
    from lpu.api import machine_of
    if cmd_system.wants_system(a, a.program):
        return cmd_system.cmd_verify(a)
    if a.program.endswith(".lpubin"):
        from lpu.api import check_binary_params
        from lpu.isa.encoding import load_binary
        prog = load_binary(a.program, machine_of(a.machine) if a.machine else None)
        check_binary_params(prog, parse_params(a.params), a.program)
    else:
        from lpu import api
        prog = api.compile(a.program, parse_params(a.params), a.machine)[0]
    t0 = time.perf_counter()
    found = verify(prog, a.limit)
    wall = time.perf_counter() - t0
    counts = {}
    for v in found:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    if a.json:
        print(json.dumps({"program": prog.source_name or a.program, "machine": prog.machine.name,
                          "instructions": prog.n_instructions, "ok": not found, "wall_s": round(wall, 4),
                          "counts": counts, "violations": [v.to_dict() for v in found]}))
    elif not found:
        print(f"{a.program}: ok ({prog.n_instructions:,} instructions on {prog.machine.name}, "
              f"no violation; checked in {wall:.2f} s)")
    if found:
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        lines = [f"{a.program}: {len(found)} violation{'s' if len(found) > 1 else ''} ({summary})"]
        lines += [f"  {v}" for v in found[:SHOWN]]
        if len(found) > SHOWN:
            lines.append(f"  ... and {len(found) - SHOWN} more (--json lists them all)")
        print("\n".join(lines), file=sys.stderr)
        return 2
    return 0


HANDLERS = {"verify": cmd_verify}
