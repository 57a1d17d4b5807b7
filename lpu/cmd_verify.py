"""`lpu verify PROG.lpu|PROG.lpubin`: run the independent schedule checker (compiler/verify.py)
on a compiled program or a binary (a system's: every chip and its links, lpu/cmd_system.py).
Exit 0 if no violation, 2 with every violation listed."""
from __future__ import annotations

import time

from lpu import cmd_system
from lpu.args import add_chips, parse_params, report_check


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
    return report_check(a, found, wall, {"program": prog.source_name or a.program, "machine": prog.machine.name,
                                         "instructions": prog.n_instructions},
                  f"{prog.n_instructions:,} instructions on {prog.machine.name}, no violation")


HANDLERS = {"verify": cmd_verify}
