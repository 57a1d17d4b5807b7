"""The model against every token count of Vidur's Llama-2-7B linears (developer tool, as
make_validation.py; validation.toml holds 8 token counts of the 261 the CSVs give). Needs a clone
of microsoft/vidur:

    python gpu_baseline/data/vidur_bands.py VIDUR_CLONE [TOKENS ...]

Per GPU and op: the rows, how many take over 10% (ENVELOPE_SLACK) more than the least time the CSV
gives for as many rows or more (the envelope: a library that ran more rows faster could have run
these as fast; make_validation.py excludes the validation rows that far above it), the model's
median |error| against the rows and against the envelope, and which token counts lie beyond 25% of
each; then row, envelope and model at TOKENS (default 128 256)."""
from __future__ import annotations

import statistics
import sys

from lpu.gpu_baseline import workloads
from lpu.gpu_baseline.data.make_validation import ENVELOPE_SLACK, L7, VIDUR_GPU, linear_shapes, med_us, vidur_rows
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
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (128, 256))
