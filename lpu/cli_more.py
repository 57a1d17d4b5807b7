"""Subcommands beyond compile/run/disasm/asm, registered here: each module provides
`add_parser(sub, common)` and `HANDLERS`; `after_run` lets them act on a finished `lpu run`."""
from __future__ import annotations

from lpu import cmd_trace, cmd_verify, compare, demo

MODULES = [cmd_trace, cmd_verify, compare, demo]
HANDLERS = {}
for _m in MODULES:
    HANDLERS.update(_m.HANDLERS)


def add_parsers(sub, common):
    for m in MODULES:
        if hasattr(m, "add_parser"):
            m.add_parser(sub, common)


def after_run(args, prog, result, info):
    for m in MODULES:
        if hasattr(m, "after_run"):
            m.after_run(args, prog, result, info)
