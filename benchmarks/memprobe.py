"""Child process of the memory benchmark: load a compiled binary, emulate it once, print one
JSON line with the process's peak resident memory (ru_maxrss) and the emulation wall time.
Usage: python -m benchmarks.memprobe PROG.lpubin"""
from __future__ import annotations

import json
import resource
import sys
import time


def main(argv: list[str]) -> int:
    from lpu.emulator.run import run
    from lpu.isa.encoding import load_binary
    from lpu.api import graph_of_binary, inputs_for
    prog = load_binary(argv[0], None)
    values = inputs_for(graph_of_binary(prog), prog, 0)   # the binary records its params
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    res = run(prog, values)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux
    print(json.dumps({"peak_rss_bytes": peak * 1024, "rss_before_run_bytes": before * 1024,
                      "cycles": int(res.cycles), "instructions": int(res.instructions), "wall_s": wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
