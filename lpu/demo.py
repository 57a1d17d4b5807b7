"""`lpu demo`: the README's first command."""
from __future__ import annotations

import os
import sys

PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs")


def cmd_demo(a):
    from lpu import api
    path = os.path.join(PROGRAMS, "mlp.lpu")
    print("compiling programs/mlp.lpu for tsp-v1 ...", file=sys.stderr)
    prog, graph = api.compile(path, {}, "tsp-v1")
    values = api.inputs_for(graph, prog, 0)
    result = api.run(prog, values)
    chk = api.check(graph, prog, values, result)
    print(f"mlp.lpu: {result.cycles:,} cycles = {result.cycles / prog.machine.clock_mhz:.2f} us on tsp-v1 "
          f"(predicted {prog.predicted_cycles:,}); check {'ok' if chk['ok'] else 'FAILED'}; "
          f"MXM utilization {result.utilization['mxm']:.1%}")
    return 0


HANDLERS = {"demo": cmd_demo}
