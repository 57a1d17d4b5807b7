"""The long fuzz run (docs/fuzzing.md): many programs, binaries x (disasm, verify, run), machine
configs and .npz inputs through the `lpu` command, in this process. Prints the counts, every
internal error and every case over the time limit (saved under --keep for reproduction), the
cases where `run` and `verify` disagree on a binary, and the peak memory of the process.

    python tests/fuzz/long.py --programs 10000 --binaries 2000 --configs 500 --npz 200
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.fuzz import cases as C              # noqa: E402
from tests.fuzz.harness import run_cli         # noqa: E402

# verify's kinds that the emulator does not refuse yet (issue 14; tests/test_fuzz_agree.py)
PENDING = {"sram-live", "stream-unread", "cycles", "mxm-order", "output"}


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Tally:
    def __init__(self, keep: str, limit_s: float, memory_mib: float):
        self.keep, self.limit_s, self.memory_mib = keep, limit_s, memory_mib
        self.heavy = []
        self.n = 0          # cases during which the process' peak memory passed memory_mib
        self.counts, self.bad, self.slow, self.disagree = {}, [], [], []
        self.max_s, self.max_cpu = {}, {}

    def record(self, kind: str, seed: int, outcome, files: dict):
        c = self.counts.setdefault(kind, {"cases": 0, "ok": 0, "refused": 0})
        c["cases"] += 1
        c["ok" if outcome.rc == 0 else "refused" if outcome.rc == 2 else "bad"] = \
            c.get("ok" if outcome.rc == 0 else "refused" if outcome.rc == 2 else "bad", 0) + 1
        self.max_s[kind] = max(self.max_s.get(kind, 0.0), outcome.seconds)
        self.max_cpu[kind] = max(self.max_cpu.get(kind, 0.0), outcome.cpu_s)
        self.n += 1
        if self.n % 250 == 0:      # progress, so that a run cut short still says what it covered
            print(json.dumps({"progress": self.counts, "internal_errors": len(self.bad), "over_limit": len(self.slow),
                              "disagree": len(self.disagree), "peak_rss_mib": round(peak_mib())}),
                  file=sys.stderr, flush=True)
        heavy = peak_mib() > self.memory_mib and not self.heavy
        if heavy:
            self.heavy.append((kind, seed, outcome.rc, round(peak_mib())))
        if outcome.internal or outcome.cpu_s > self.limit_s or heavy:
            where = os.path.join(self.keep, f"{kind}-{seed}")
            os.makedirs(where, exist_ok=True)
            for name, data in files.items():
                with open(os.path.join(where, name), "wb") as f:
                    f.write(data)
            with open(os.path.join(where, "outcome.txt"), "w") as f:
                f.write(f"lpu {' '.join(outcome.argv)}\nrc {outcome.rc}  {outcome.seconds:.1f} s wall, "
                        f"{outcome.cpu_s:.1f} s CPU\n{outcome.err}")
            if outcome.internal or outcome.cpu_s > self.limit_s:
                (self.bad if outcome.internal else self.slow).append((kind, seed, outcome.rc, round(outcome.cpu_s, 1),
                                                                     outcome.err.strip().splitlines()[-1:] or [""]))


def _write(folder: str, files: dict):
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=10000)
    ap.add_argument("--binaries", type=int, default=2000)
    ap.add_argument("--configs", type=int, default=500)
    ap.add_argument("--npz", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="first seed (each case's seed is seed + its index)")
    ap.add_argument("--limit-s", type=float, default=20.0, help="a case over this many CPU seconds is reported "
                    "(one over 10x as many wall-clock seconds is stopped)")
    ap.add_argument("--memory-mib", type=float, default=1024, help="report the case that takes the process' peak "
                    "memory past this")
    ap.add_argument("--keep", default="fuzz-failures", help="folder for the failing cases")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    tally = Tally(a.keep, a.limit_s, a.memory_mib)
    work = tempfile.mkdtemp(prefix="lpu-fuzz-")
    t0 = time.perf_counter()
    try:
        mlp = C.programs()["mlp.lpu"]
        _write(work, {"mlp.lpu": mlp.encode()})
        assert run_cli(["compile", "mlp.lpu", "--machine", "tiny", "-o", "mlp.lpubin"], work).rc == 0
        mlp_prog = C.compiled("mlp.lpu")
        for i in range(a.programs):
            rng = random.Random(f"program-{a.seed + i}")
            name, text = C.program_case(rng)
            files = {"p.lpu": text.encode("utf-8", "surrogatepass")}
            _write(work, files)
            tally.record("program", a.seed + i, run_cli(["compile", "p.lpu", "--machine", "tiny"], work, 10 * a.limit_s),
                         files)
        for i in range(a.binaries):
            rng = random.Random(f"binary-{a.seed + i}")
            files = {"b.lpubin": C.binary_case(rng)}
            _write(work, files)
            rcs = {}
            for cmd in ("disasm", "verify", "run"):
                o = run_cli([cmd, "b.lpubin"], work, 10 * a.limit_s)
                tally.record(f"binary-{cmd}", a.seed + i, o, files)
                rcs[cmd] = o.rc
            if (rcs["run"] == 0) != (rcs["verify"] == 0) and -1 not in rcs.values():
                kinds = sorted(json.loads(run_cli(["verify", "b.lpubin", "--json"], work).out or "{}").get("counts", {}))
                side = "checker" if rcs["run"] else "emulator-pending" if set(kinds) <= PENDING else "other"
                tally.disagree.append((a.seed + i, rcs["run"], rcs["verify"], side, ",".join(kinds)))
        for i in range(a.configs):
            rng = random.Random(f"config-{a.seed + i}")
            files = {"m.toml": C.config_case(rng)}
            _write(work, files)
            tally.record("config", a.seed + i, run_cli(["run", "mlp.lpu", "--machine", "m.toml"], work, 10 * a.limit_s),
                         dict(files, **{"mlp.lpu": mlp.encode()}))
        for i in range(a.npz):
            rng = random.Random(f"npz-{a.seed + i}")
            files = {"in.npz": C.npz_case(rng, mlp_prog)}
            _write(work, files)
            tally.record("npz", a.seed + i, run_cli(["run", "mlp.lpubin", "--inputs", "in.npz"], work, 10 * a.limit_s),
                         files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"counts": tally.counts, "internal_errors": len(tally.bad), "over_limit": len(tally.slow),
              "max_wall_s": {k: round(v, 2) for k, v in tally.max_s.items()},
              "max_cpu_s": {k: round(v, 2) for k, v in tally.max_cpu.items()},
              "run_verify_disagree": {side: sum(d[3] == side for d in tally.disagree)
                                      for side in ("checker", "emulator-pending", "other")},
              "peak_rss_mib": round(peak_mib()), "memory_over": tally.heavy,
              "wall_s": round(time.perf_counter() - t0)}
    if a.json:
        print(json.dumps(dict(report, bad=tally.bad, slow=tally.slow, disagree=tally.disagree[:50])))
    else:
        print(json.dumps(report, indent=1))
        for b in tally.bad:
            print("INTERNAL", *b)
        for s in tally.slow:
            print("SLOW", *s)
        for d in [d for d in tally.disagree if d[3] != "emulator-pending"] + tally.disagree[:50]:
            print("DISAGREE seed %d: run rc %d, verify rc %d (%s: %s)" % d)
    return 1 if tally.bad or tally.slow or tally.heavy else 0


if __name__ == "__main__":
    sys.exit(main())
