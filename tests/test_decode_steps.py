"""Decode token by token on the emulator, through `lpu run --inputs/--save`, and match a prefill
of the same tokens row by row (outputs and KV caches)."""
import os

import numpy as np
import pytest

from lpu.compiler.semantics import TOLERANCE
from lpu.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFILL = os.path.join(ROOT, "programs", "gpt2_block_prefill.lpu")
DECODE = os.path.join(ROOT, "programs", "gpt2_block_decode.lpu")
SMALL = ["-p", "D=64", "-p", "H=2", "-p", "C=8", "--machine", "tiny"]
S = 4


def lpu(*argv):
    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    d = tmp_path_factory.mktemp("steps")
    # weights and the prompt: let the prefill draw its weights from seed 0, save them with the run
    lpu("run", PREFILL, *SMALL, "-p", f"S={S}", "--seed", 0, "--save", d / "prefill.npz", "--check")
    from lpu.compiler.frontend import elaborate_file
    from lpu.compiler.reference import random_values
    g = elaborate_file(PREFILL, {"D": 64, "H": 2, "C": 8, "S": S})
    values = random_values(g, 0)
    x = values.pop("x")
    cache = {k: np.zeros_like(values[k]) for k in ("kc", "vc")}
    rows = []
    for t in range(S):
        step = {**{k: v for k, v in values.items() if k not in ("kc", "vc")}, **cache, "x": x[t:t + 1]}
        np.savez(d / f"in{t}.npz", **step)
        lpu("run", DECODE, *SMALL, "-p", f"T={t}", "--inputs", d / f"in{t}.npz", "--save", d / f"out{t}.npz",
            "--check")
        with np.load(d / f"out{t}.npz") as z:
            rows.append(z["y"][0])
            cache = {"kc": z["kc"], "vc": z["vc"]}
    with np.load(d / "prefill.npz") as z:
        pre = {k: z[k] for k in z.files}
    # the prefill above drew x from seed 0 too: same tokens
    return np.stack(rows), cache, pre


def test_decode_steps_match_prefill_rows(stepped):
    rows, cache, pre = stepped
    atol, rtol = TOLERANCE["f16"]
    np.testing.assert_allclose(rows.astype(np.float32), pre["y"].astype(np.float32), atol=atol * 4, rtol=rtol * 4)


def test_decode_steps_fill_the_cache_like_prefill(stepped):
    rows, cache, pre = stepped
    atol, rtol = TOLERANCE["f16"]
    for k in ("kc", "vc"):
        np.testing.assert_allclose(cache[k][:S].astype(np.float32), pre[k][:S].astype(np.float32),
                                   atol=atol, rtol=rtol)
