"""Running one fuzz case through the `lpu` command in this process: its exit code, output and
time, with a hard time limit (a case over it is stopped and reported, not waited for)."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from dataclasses import dataclass

from lpu.cli import main


class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException: `lpu`'s own handlers do not catch it)."""


@dataclass
class Outcome:
    argv: list
    rc: int              # 0 ok, 2 user error, 1 internal error, -1 over the time limit
    err: str
    seconds: float       # wall-clock
    out: str = ""
    cpu_s: float = 0.0   # CPU time of this process (the shared machine's load inflates the wall clock)

    @property
    def internal(self) -> bool:
        return self.rc not in (0, 2)


def _alarm(signum, frame):
    raise CaseTimeout()


def run_cli(argv: list, cwd: str, limit_s: float = 0) -> Outcome:
    """`lpu ARGV` in folder `cwd`; with `limit_s`, stopped after that many seconds (rc -1)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    t0, c0 = time.perf_counter(), time.process_time()
    if limit_s:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as e:          # argparse
                rc = e.code if isinstance(e.code, int) else 2
    except CaseTimeout:
        rc = -1
    finally:
        if limit_s:
            signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)
    return Outcome(list(argv), rc, err.getvalue(), time.perf_counter() - t0, out.getvalue(), time.process_time() - c0)
