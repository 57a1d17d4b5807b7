"""The model against every token count of Vidur's Llama-2-7B linears (developer tool, as
make_validation.py; validation.toml holds 8 token counts of the 261 the CSVs give). Needs a clone
of microsoft/vidur:

    python gpu_baseline/data/vidur_bands.py VIDUR_CLONE [TOKENS ...]
    python gpu_baseline/data/vidur_bands.py VIDUR_CLONE --all
    python gpu_baseline/data/vidur_bands.py VIDUR_CLONE --steps

Per GPU and op: the rows, how many take over 10% (ENVELOPE_SLACK) more than the least time the CSV
gives for as many rows or more (the envelope: a library that ran more rows faster could have run
these as fast; make_validation.py excludes the validation rows that far above it), the model's
median |error| against the rows and against the envelope, and which token counts lie beyond 25% of
each; then row, envelope and model at TOKENS (default 128 256). --all: every linear of every
model's CSV (all models, all TP degrees; shapes from the CSV's own columns), the model's signed and
absolute median error over all its rows and per band of token counts, and in the 65-128 band per band of N: whether a
miss is the row's or the model's across shapes. --steps: per GPU, each linear shape's (K, N) median time in the
64-token bands from 129 to 512 tokens, the step from one band to the next (median over shapes, and the
shapes whose step lies furthest out), and how many shapes take over 10% less time in a band than in the
band below it: what a rule of the shape and the token count would have to reproduce."""
from __future__ import annotations

import csv
import io
import statistics
import subprocess
import sys

from lpu.gpu_baseline import workloads
from lpu.gpu_baseline.data.make_validation import (ENVELOPE_SLACK, L7, VIDUR_COMMIT, VIDUR_GPU, linear_shapes, med_us,
                                                   vidur_rows)
from lpu.gpu_baseline.gpus import load_gpu
from lpu.gpu_baseline.model import cost_graph


def bands(clone: str, vg: str, op: str):
    """{tokens: (measured, envelope, modelled)} in us for one Vidur GPU and Llama-2-7B op (TP 1)."""
    gpu = load_gpu(VIDUR_GPU[vg])
    k, n = linear_shapes(L7, 1)[op]
    _, by = vidur_rows(clone, vg, "Llama-2-7b-hf", L7)
    meas = {t: med_us(rows, op) for (t, tp), rows in sorted(by.items()) if tp == 1}
    out, least = {}, float("inf")
    for t in sorted(meas, reverse=True):
        least = min(least, meas[t])
        out[t] = (meas[t], least, cost_graph(workloads.linear(k, n, m_rows=t), gpu, launch="none",
                                             inputs_in_l2=True).total_us)
    return dict(sorted(out.items()))


M_BANDS = ((1, 64), (65, 128), (129, 256), (257, 512), (513, 1024), (1025, 2048), (2049, 4096))
N_BANDS = ((1, 5120), (5121, 11008), (11009, 1 << 20))


def all_linears(clone: str, vg: str) -> list:
    """(tokens, K, N, measured us) of every linear of every model and TP degree in Vidur's CSVs."""
    ls = subprocess.run(["git", "-C", clone, "ls-tree", "-r", "--name-only", VIDUR_COMMIT,
                         f"data/profiling/compute/{vg}"], capture_output=True, text=True, check=True).stdout
    by: dict = {}
    for path in (p for p in ls.split() if p.endswith("/mlp.csv")):
        txt = subprocess.run(["git", "-C", clone, "show", f"{VIDUR_COMMIT}:{path}"], capture_output=True,
                             text=True, check=True).stdout
        for r in csv.DictReader(io.StringIO(txt)):
            d, h, f = int(r["n_embd"]), int(r["n_head"]), int(r["n_expanded_embd"])
            t, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
            up = (2 if r["use_gated_mlp"] == "True" else 1) * f     # gate and up in one GEMM when gated
            shapes = {"attn_pre_proj": (d, (d + 2 * int(r["n_kv_head"]) * (d // h)) // tp),
                      "attn_post_proj": (d // tp, d), "mlp_up_proj": (d, up // tp), "mlp_down_proj": (f // tp, d)}
            for op, (k, n) in shapes.items():
                if r.get(f"time_stats.{op}.median"):
                    by.setdefault((path, t, k, n, op), []).append(r)
    return [(t, k, n, med_us(rows, op)) for (_, t, k, n, op), rows in by.items()]


def profile(clone: str, vg: str):
    gpu = load_gpu(VIDUR_GPU[vg])
    errs = [(t, n, cost_graph(workloads.linear(k, n, m_rows=t), gpu, launch="none", inputs_in_l2=True).total_us / us - 1)
            for t, k, n, us in all_linears(clone, vg)]
    print(f"{vg}: {len(errs)} linear rows (every model and TP degree of the CSVs): median |error| "
          f"{100 * statistics.median(abs(x) for _, _, x in errs):.1f}%, beyond 25%: {sum(abs(x) > 0.25 for _, _, x in errs)}")
    for lo, hi in M_BANDS:
        e = [x for t, _, x in errs if lo <= t <= hi]
        print(f"    tokens {lo:>4}-{hi:<4}: {len(e):5d} rows, median error {100 * statistics.median(e):+5.1f}%, "
              f"median |error| {100 * statistics.median(map(abs, e)):4.1f}%, beyond 25%: {sum(abs(x) > 0.25 for x in e)}")
    for lo, hi in N_BANDS:
        e = [x for t, n, x in errs if 65 <= t <= 128 and lo <= n <= hi]
        print(f"    tokens 65-128, N {lo}-{hi}: {len(e)} rows, median error {100 * statistics.median(e):+5.1f}%")


STEP_BANDS = ((129, 192), (193, 256), (257, 320), (321, 384), (385, 448), (449, 512))


def steps(clone: str, vg: str):
    by: dict = {}
    for t, k, n, us in all_linears(clone, vg):
        by.setdefault((k, n), []).append((t, us))
    med = {s: [statistics.median(us for t, us in rows if lo <= t <= hi) for lo, hi in STEP_BANDS]
           for s, rows in by.items()}
    print(f"{vg}: {len(med)} linear shapes (K, N); time of each 64-token band over the band below it")
    for i in range(1, len(STEP_BANDS)):
        r = sorted((v[i] / v[i - 1], s) for s, v in med.items())
        falls = [s for x, s in r if x < 0.9]
        print(f"    {STEP_BANDS[i][0]:>3}-{STEP_BANDS[i][1]:<3} / {STEP_BANDS[i - 1][0]:>3}-{STEP_BANDS[i - 1][1]:<3}: median "
              f"{statistics.median(x for x, _ in r):.2f}, lowest {r[0][0]:.2f} {r[0][1]}, highest {r[-1][0]:.2f} {r[-1][1]}; "
              f"over 10% faster than the band below: {len(falls)} shapes")


def main(clone: str, tokens=(128, 256)):
    for vg in VIDUR_GPU:
        for op in linear_shapes(L7, 1):
            b = bands(clone, vg, op)
            slow = [t for t, (m, e, _) in b.items() if m > (1 + ENVELOPE_SLACK) * e]
            err = {t: mod / m - 1 for t, (m, _, mod) in b.items()}
            err_env = {t: mod / e - 1 for t, (_, e, mod) in b.items()}
            far = [t for t, x in err.items() if abs(x) > 0.25]
            far_env = [t for t, x in err_env.items() if abs(x) > 0.25]
            print(f"{vg} {op:<15} rows {len(b)}  over 10% above the envelope {len(slow):3d}  model median |err| "
                  f"{100 * statistics.median(map(abs, err.values())):.1f}% (envelope "
                  f"{100 * statistics.median(map(abs, err_env.values())):.1f}%)  beyond 25%: {len(far)} {far}; "
                  f"against the envelope {len(far_env)} {far_env}")
            for t in tokens:
                m, e, mod = b[t]
                print(f"    T={t}: row {m:.1f} us, envelope {e:.1f}, model {mod:.1f} ({100 * err[t]:+.1f}% / "
                      f"{100 * err_env[t]:+.1f}%)")


if __name__ == "__main__":
    if sys.argv[2:] in (["--all"], ["--steps"]):
        for vg in VIDUR_GPU:
            (profile if sys.argv[2] == "--all" else steps)(sys.argv[1], vg)
    else:
        main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (128, 256))
