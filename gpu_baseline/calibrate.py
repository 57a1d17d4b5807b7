"""Measure the GPU model's inputs on a real NVIDIA GPU (needs PyTorch with CUDA; about a minute).

    python -m gpu_baseline.calibrate [--out FILE.toml] [--reps N]

Times, with CUDA events, after warm-up, the median over N repetitions (L2 flushed between
repetitions so that weights come from HBM, as in a decode step):
  - the four Llama-2-7B decode linears (f16 GEMV, [1,K]@[K,N]) and prefill GEMMs at 128 and
    2,048 tokens,
  - an elementwise f16 add of 16M elements, a row softmax of [4096, 4096] f16,
  - an (almost) empty kernel: one launch on a stream, and per kernel inside a CUDA graph.
Writes the results as [[case]] entries in the format of data/validation.toml (with the date and
the device name), so that `python -m gpu_baseline.validate FILE.toml` compares them with the model.

This script is standalone: nothing imports it, and it imports torch only when run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

LINEARS = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 22016), "down": (11008, 4096)}
GEMMS = [(m, k, n) for m in (128, 2048) for k, n in ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096))]
FLUSH_BYTES = 256 * 2**20          # larger than any L2 we model (50 MB)


def config_name(device: str) -> str:
    d = device.upper()
    if "H200" in d:
        return "h200"
    if "H100" in d:
        return "h100-sxm"
    if "A100" in d:
        return "a100-80gb"
    return "unknown"


class Timer:
    def __init__(self, torch, reps: int, warmup: int = 5):
        self.torch, self.reps, self.warmup = torch, reps, warmup
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def median_us(self, fn, flush: bool = True) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.reps):
            if flush:
                self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)       # ms -> us
        return statistics.median(times)

    def graph_per_kernel_us(self, fn, kernels: int = 200) -> float:
        """Median time per kernel of `kernels` launches captured in one CUDA graph."""
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                      # warm-up on a side stream (PyTorch docs)
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                fn()
        return self.median_us(graph.replay, flush=False) / kernels


def measure(reps: int) -> tuple[str, list[dict]]:
    import torch                                             # lazily: only on a GPU machine

    if not torch.cuda.is_available():
        raise SystemExit("calibrate: no CUDA device (this script needs an NVIDIA GPU and PyTorch)")
    device = torch.cuda.get_device_name(0)
    timer = Timer(torch, reps)
    f16 = dict(dtype=torch.float16, device="cuda")
    cases = []

    def case(cid, workload, us, prompt_len=1, launch="stream"):
        cases.append({"id": cid, "workload": workload, "metric": "kernel_us", "measured": round(us, 2),
                      "unit": "us", "prompt_len": prompt_len, "launch": launch})

    for name, (k, n) in LINEARS.items():
        x, w = torch.randn(1, k, **f16), torch.randn(k, n, **f16)
        case(f"GEMV {name} 1x{k}x{n}", f"linear:{name}", timer.median_us(lambda: x @ w))
    for m, k, n in GEMMS:
        x, w = torch.randn(m, k, **f16), torch.randn(k, n, **f16)
        case(f"GEMM {m}x{k}x{n}", f"gemm:{m},{k},{n}", timer.median_us(lambda: x @ w), prompt_len=m)
    n = 16 * 2**20
    a, b = torch.randn(n, **f16), torch.randn(n, **f16)
    case(f"add f16 {n}", f"add:{n}", timer.median_us(lambda: a + b))
    s = torch.randn(4096, 4096, **f16)
    case("softmax 4096x4096", "softmax:4096,4096", timer.median_us(lambda: torch.softmax(s, dim=-1)))
    tiny = torch.zeros(1, **f16)
    case("empty kernel, stream", "empty", timer.median_us(lambda: tiny.add_(1), flush=False))
    case("empty kernel, CUDA graph", "empty", timer.graph_per_kernel_us(lambda: tiny.add_(1)), launch="graph")
    return device, cases


def to_toml(device: str, cases: list[dict], date: str) -> str:
    gpu = config_name(device)
    lines = [f"# Measured by gpu_baseline/calibrate.py on {device}, {date}.",
             "# Format: as gpu_baseline/data/validation.toml.", ""]
    for c in cases:
        full = {**c, "source": f"gpu_baseline/calibrate.py, {device}, {date}, CUDA events, median",
                "model": "Llama-2-7B shapes", "gpu": gpu, "dtype": "f16", "batch": 1, "output_len": 1,
                "device": device, "date": date}
        lines.append("[[case]]")
        for key, v in full.items():
            lines.append(f"{key} = {json.dumps(v) if isinstance(v, str) else v}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output TOML (default calibration-<gpu>-<date>.toml)")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions per kernel (median)")
    args = ap.parse_args(argv)
    device, cases = measure(args.reps)
    date = datetime.date.today().isoformat()
    out = args.out or f"calibration-{config_name(device)}-{date}.toml"
    with open(out, "w") as f:
        f.write(to_toml(device, cases, date))
    for c in cases:
        print(f"{c['id']:<32} {c['measured']:>10.2f} us")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
