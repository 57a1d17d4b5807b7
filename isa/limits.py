"""Named limits on what `lpu` accepts, so that no input makes it crash, hang or exhaust memory.
Each limit is checked before the work it bounds, and its error names it and says how to raise
it: the environment variable `LPU_LIMIT_<NAME>` (upper case), e.g. `LPU_LIMIT_LOOP_TRIPS=1000000`.
The list, with the reasons for the defaults, is in docs/limits.md."""
from __future__ import annotations

import os

from lpu.isa.errors import LpuError

DEFAULTS = {
    # source programs
    "source_bytes": 4 << 20,         # size of one .lpu file
    "nesting": 500,                  # expressions, blocks and inlined calls within one another
    "int_bits": 63,                  # |compile-time integer| < 2**int_bits (literals, params, folding)
    "loop_trips": 100_000,           # trips of one `for` loop or list comprehension
    "steps": 2_000_000,              # expressions evaluated while elaborating (loops unrolled)
    "ir_nodes": 20_000,              # nodes of the IR graph (the bundled programs have at most ~3,000)
    "dim": 2**31 - 1,                # one dimension of a tensor
    "tensor_elements": 2**36,        # elements of one tensor
    "vector_ops": 4_000_000,         # vector operations of a program, estimated before lowering
    "errors": 50,                    # source errors reported (then "and N more")
    # binaries and configs
    "instructions": 32_000_000,      # instructions of a program, REPEATs expanded
    "cycles": 2**40,                 # issue cycle of any instruction
    "machine_bytes": 1 << 30,        # emulator state of a machine config (SRAM, MXM, streams)
    # .npz inputs
    "npz_bytes": 4 << 30,            # bytes of all arrays of an --inputs file, uncompressed
}


def limit(name: str) -> int:
    """The value of limit `name`: its default, or the environment variable LPU_LIMIT_<NAME>."""
    env = env_name(name)
    raw = os.environ.get(env)
    return DEFAULTS[name] if raw is None else parse(name, raw, env)


def env_name(name: str) -> str:
    return "LPU_LIMIT_" + name.upper()


def parse(name: str, raw: str, given_as: str) -> int:
    """A value for limit `name` given as text (`given_as` names where, in the error)."""
    if name not in DEFAULTS:
        raise LpuError(f"{given_as}: no limit named '{name}' (the limits: {', '.join(DEFAULTS)}; docs/limits.md)")
    try:
        value = int(raw)
    except ValueError:
        raise LpuError(f"{given_as}={raw!r} is not an integer") from None
    if value < 1:
        raise LpuError(f"{given_as}={raw!r} must be at least 1")
    return value


def how_to_raise(name: str) -> str:
    return (f"limit '{name}' is {limit(name):,}; raise it with `lpu --limit {name}=N ...` or "
            f"LPU_LIMIT_{name.upper()}=N")
