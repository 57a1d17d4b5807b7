"""What every `lpu` subcommand shares: the common options, `-p NAME=INT` parsing, the cycle
window option, and progress on stderr. Command modules import this, never `lpu.cli` (which
imports them)."""
from __future__ import annotations

import json
import sys
import threading
import time

from lpu.isa.errors import LpuError


def parse_params(items) -> dict:
    """`-p NAME=INT` options as a dict (the last one given for a name wins)."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise LpuError(f"-p expects NAME=INT, got '{it}'")
        k, v = it.split("=", 1)
        if not k.strip().isidentifier():
            raise LpuError(f"-p {it}: '{k}' is not a param name")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise LpuError(f"-p {k}: '{v}' is not an integer") from None
    return out


def add_common(p, compiles: bool = True) -> None:
    """The options of every subcommand; `compiles`: it may compile a program (-p, --machine)."""
    if compiles:
        p.add_argument("-p", dest="params", action="append", metavar="NAME=INT",
                       help="override a param of the program (repeatable); a binary remembers the ones it was "
                            "compiled with, and a different value is an error")
        p.add_argument("--machine", default=None, metavar="NAME|FILE.toml",
                       help="machine config: tsp-v1 (default), tiny, or a .toml file")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (no progress on stderr)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")


def add_chips(p, run: bool = False) -> None:
    """`--chips N|auto` (a system of chips, lpu/cmd_system.py) and, for run, `--workers N`."""
    p.add_argument("--chips", metavar="N|auto", default=None,
                   help="partition the program over N chips of a node (isa/systems/node.toml; how: --parallel), "
                        "or the fewest that fit ('auto')")
    p.add_argument("--parallel", choices=("pp", "tp", "auto"), default=None,
                   help="with several chips: pipeline parallel (pp, the default with --chips N), tensor parallel "
                        "in a node (tp: weights split by columns and rows, all-reduces on the links), or the one "
                        "the compiler predicts faster (auto, the default with --chips auto)")
    if run:
        p.add_argument("--workers", type=int, default=0, metavar="N",
                       help="with several chips: emulate them in N local processes (default: this one)")
        p.add_argument("--ray", metavar="ADDRESS|auto|local", default=None,
                       help="with several chips: emulate them as Ray actors (--workers of them, default one a chip) "
                            "on the Ray cluster at ADDRESS (needs the `cluster` extra)")


def add_window(p, what: str) -> None:
    """`--cycles A:B`, the one name of a cycle window on every command."""
    p.add_argument("--cycles", metavar="A:B", help=f"window of cycles {what}")


def compile_detail(stats) -> str:
    """What a compile is doing now, from its CompileStats: the pass and the chains placed."""
    return f"{stats.stage}, {stats.placed:,} chains placed" if stats.placed else stats.stage


def on_terminal(a, stream) -> bool:
    """Progress goes to `stream` only when it is a terminal and the command prints no JSON."""
    return not getattr(a, "json", False) and getattr(stream, "isatty", lambda: False)()


class Progress:
    """Progress lines on stderr for work that takes more than `delay` seconds, only when stderr
    is a terminal and the command does not print JSON. Used as a context manager around a
    stage; a ticker thread rewrites one status line with the stage and the elapsed time."""

    def __init__(self, enabled: bool | None = None, delay: float = 2.0, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = on_terminal(None, self.stream) if enabled is None else enabled
        self.delay = delay
        self._stage = ""
        self._detail = None
        self._t0 = 0.0
        self._shown = False
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def for_args(cls, a) -> "Progress":
        return cls(enabled=on_terminal(a, sys.stderr))

    def stage(self, text: str, detail=None) -> "Progress":
        """The stage's text; `detail()`, if given, says more each tick (the pass, chains placed)."""
        self._stage, self._detail = text, detail
        return self

    def __enter__(self):
        self._t0 = time.perf_counter()
        if self.enabled:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._shown:
            self.stream.write(f"\r{self._stage} done in {time.perf_counter() - self._t0:.1f} s\033[K\n")
            self.stream.flush()
            self._shown = False
        return False

    def _tick(self):
        if self._stop.wait(self.delay):
            return
        while True:
            self._shown = True
            more = f" ({self._detail()})" if self._detail else ""
            self.stream.write(f"\r{self._stage}{more} ... {time.perf_counter() - self._t0:.0f} s\033[K")
            self.stream.flush()
            if self._stop.wait(1.0):
                return


def progress_lines(a, stream=None):
    """A `progress(text)` callable printing one line per step on stderr, or None when stderr is
    not a terminal or the command prints JSON (scripts get clean output)."""
    stream = stream or sys.stderr
    if not on_terminal(a, stream):
        return None

    def say(text: str):
        print(text, file=stream, flush=True)
    return say


SHOWN_VIOLATIONS = 50    # violations `lpu verify` prints (--json lists them all)


def report_check(a, found, wall: float, info: dict, ok_text: str) -> int:
    """Print a checker's result (one JSON object with `info`, or a line; violations on stderr)
    and give the exit code: 0 if nothing was found, else 2."""
    counts = {}
    for v in found:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    if a.json:
        print(json.dumps({**info, "ok": not found, "wall_s": round(wall, 4), "counts": counts,
                          "violations": [v.to_dict() for v in found]}))
    elif not found:
        print(f"{a.program}: ok ({ok_text}; checked in {wall:.2f} s)")
    if found:
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        lines = [f"{a.program}: {len(found)} violation{'s' if len(found) > 1 else ''} ({summary})"]
        lines += [f"  {v}" for v in found[:SHOWN_VIOLATIONS]]
        if len(found) > SHOWN_VIOLATIONS:
            lines.append(f"  ... and {len(found) - SHOWN_VIOLATIONS} more (--json lists them all)")
        print("\n".join(lines), file=sys.stderr)
        return 2
    return 0
