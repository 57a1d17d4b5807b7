"""Measure the kernels the GPU model costs on a real NVIDIA GPU (PyTorch with CUDA; about a minute).

    python -m gpu_baseline.calibrate [--out FILE.toml] [--reps N] [--device cuda|cpu]

Per-kernel rows (metric kernel_us, timing "kernel"): CUDA events around one call, after warm-up,
median over N repetitions; before each repetition a 256 MB buffer is read (summed), which
flushes the L2 without leaving dirty lines to write back (weights come from HBM, as in a real
layer) and keeps the GPU busy while the call is queued, so the launch gap is not in the figure
(as in profiler kernel times, e.g. Vidur's). Measured:
  - Llama-2-7B linears (qkv, o, gate_up, down) at 1 to 4,096 tokens (9 token counts), Llama-2-70B linears per
    tensor-parallel shard (1, 2, 4, 8 GPUs) at one token, and an 8192^3 GEMM;
  - elementwise add, row softmax, layer norm at several sizes;
  - attention: causal fused prefill (scaled_dot_product_attention) and one-token decode over a
    KV cache, 32 heads of 128;
  - launch overhead: back-to-back tiny kernels on a stream, and per kernel inside a CUDA graph.
End-to-end rows (timing "e2e"): a Llama-2-7B written in plain PyTorch with random weights
(LLAMA below), each step captured in a CUDA graph so that the figure is GPU time: decode steps
(tokens/s) and prefill (time to first token; no host time).

Writes [[case]] entries in the format of data/validation.toml, each tagged with the device, the
date, and the torch and CUDA versions, so that `python -m gpu_baseline.validate FILE.toml`
compares them with the model. `--device cpu` is a dry run of every code path with small shapes
(timings meaningless, nothing written unless --out is given).

This script is standalone: nothing imports it, and it imports torch only when run.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import statistics
import time

L7 = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 22016), "down": (11008, 4096)}
L70 = {"qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344), "down": (28672, 8192)}
TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
FLUSH_BYTES = 256 * 2**20          # larger than any L2 we model (50 MB)
LLAMA = dict(d=4096, heads=32, ffn=11008, layers=32, vocab=32000)


def config_name(device: str) -> str:
    d = device.upper()
    for key, name in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb")):
        if key in d:
            return name
    return "unknown"


class Timer:
    def __init__(self, torch, reps: int, cuda: bool, warmup: int = 3):
        self.torch, self.reps, self.cuda, self.warmup = torch, reps, cuda, warmup
        self.flush = torch.ones((FLUSH_BYTES if cuda else 2**16) // 2, dtype=torch.float16,
                                device="cuda" if cuda else "cpu")

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def median_us(self, fn, flush: bool = True, inner: int = 1) -> float:
        """Median over reps of the time of `inner` back-to-back calls, divided by inner."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        self._sync()
        times = []
        for _ in range(self.reps):
            if flush:
                self.flush.sum()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / inner)     # ms -> us
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times.append((time.perf_counter() - t0) * 1e6 / inner)
        return statistics.median(times)

    def graph(self, fn):
        """fn captured in a CUDA graph (returns its replay), or fn itself on the CPU."""
        torch = self.torch
        if not self.cuda:
            return fn
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                      # warm-up on a side stream (PyTorch docs)
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g.replay


# ---- a plain-PyTorch Llama-2-7B (random weights) for the end-to-end rows ---------------------------
class Llama:
    def __init__(self, torch, dev, dt, ctx_max: int, cfg=LLAMA):
        self.t, self.cfg, self.dt = torch, cfg, dt
        d, f, v = cfg["d"], cfg["ffn"], cfg["vocab"]
        hd = d // cfg["heads"]
        mk = lambda *s: torch.randn(*s, device=dev, dtype=dt) * 0.02   # noqa: E731
        self.layers = [dict(n1=torch.ones(d, device=dev, dtype=dt), qkv=mk(d, 3 * d), o=mk(d, d),
                            n2=torch.ones(d, device=dev, dtype=dt), gu=mk(d, 2 * f), dn=mk(f, d),
                            k=torch.zeros(1, cfg["heads"], ctx_max, hd, device=dev, dtype=dt),
                            v=torch.zeros(1, cfg["heads"], ctx_max, hd, device=dev, dtype=dt))
                       for _ in range(cfg["layers"])]
        self.norm, self.head = torch.ones(d, device=dev, dtype=dt), mk(d, v)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(ctx_max, device=dev, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)

    def _rms(self, x, w):
        t = self.t
        xf = x.float()
        return (xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(self.dt) * w

    def _rope(self, x, pos: int):
        s = x.shape[2]
        c, sn = self.cos[pos:pos + s], self.sin[pos:pos + s]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return self.t.stack((x1 * c - x2 * sn, x1 * sn + x2 * c), -1).flatten(-2)

    def layer(self, x, L: dict, pos: int):
        """One transformer layer on x [s, d] at positions [pos, pos + s), writing its KV cache."""
        t, cfg = self.t, self.cfg
        s, d, h = x.shape[0], cfg["d"], cfg["heads"]
        F = t.nn.functional
        q, k, v = (self._rms(x, L["n1"]) @ L["qkv"]).view(s, 3, h, d // h).permute(1, 0, 2, 3).unbind(0)
        q, k, v = (y.transpose(0, 1).unsqueeze(0) for y in (q, k, v))
        q, k = self._rope(q, pos), self._rope(k, pos)
        L["k"][:, :, pos:pos + s] = k
        L["v"][:, :, pos:pos + s] = v
        a = F.scaled_dot_product_attention(q, L["k"][:, :, :pos + s], L["v"][:, :, :pos + s],
                                           is_causal=s > 1)
        x = x + a[0].transpose(0, 1).reshape(s, d) @ L["o"]
        gu = self._rms(x, L["n2"]) @ L["gu"]
        return x + (F.silu(gu[:, :cfg["ffn"]]) * gu[:, cfg["ffn"]:]) @ L["dn"]

    def forward(self, x, pos: int, layer=None):
        """x [s, d] embedded tokens at positions [pos, pos + s); returns the last token's logits.
        `layer`: the per-layer function to run (self.layer, or a torch.compile of it)."""
        layer = layer or self.layer
        for L in self.layers:
            x = layer(x, L, pos)
        return self._rms(x[-1:], self.norm) @ self.head


def _kernel_rows(torch, timer, kw, small, case):
    F = torch.nn.functional
    sc = (lambda n: max(1, n // 64)) if small else (lambda n: n)
    for name, (k, n) in L7.items():
        w = torch.randn(sc(k), sc(n), **kw)
        for m in (TOKENS[:2] if small else TOKENS):
            x = torch.randn(m, sc(k), **kw)
            case(f"L2-7B {name} {m}x{k}x{n}", f"gemm:{m},{k},{n}", timer.median_us(lambda: x @ w))
    for tp in (1, 2, 4, 8):
        for name, (k, n) in L70.items():
            k2, n2 = (k // tp, n) if name in ("o", "down") else (k, n // tp)
            w, x = torch.randn(sc(k2), sc(n2), **kw), torch.randn(1, sc(k2), **kw)
            case(f"L2-70B TP{tp} {name} 1x{k2}x{n2}", f"gemm:1,{k2},{n2}", timer.median_us(lambda: x @ w))
    a = torch.randn(sc(8192), sc(8192), **kw)
    case("GEMM 8192x8192x8192", "gemm:8192,8192,8192", timer.median_us(lambda: a @ a))
    for n in (2**20, 2**24, 2**26):
        a, b = torch.randn(sc(n), **kw), torch.randn(sc(n), **kw)
        case(f"add f16 {n}", f"add:{n}", timer.median_us(lambda: a + b))
    for r, c in ((4096, 4096), (16384, 512), (32 * 2048, 2048)):
        s = torch.randn(sc(r), sc(c), **kw)
        case(f"softmax {r}x{c}", f"softmax:{r},{c}", timer.median_us(lambda: torch.softmax(s, dim=-1)))
    for t in (1, 512, 4096):
        x, g = torch.randn(t, sc(4096), **kw), torch.ones(sc(4096), **kw)
        case(f"layernorm {t}x4096", f"layernorm:{t},4096", timer.median_us(lambda: F.layer_norm(x, (x.shape[-1],), g)))
    h, hd = (2, 8) if small else (32, 128)
    for s in ((128,) if small else (512, 1024, 2048, 4096)):
        q, k, v = (torch.randn(1, h, s, hd, **kw) for _ in range(3))
        case(f"attention prefill causal S={s}", f"attn_prefill:{s},32,32,128",
             timer.median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    for ctx in ((128,) if small else (512, 2048, 8192, 32768)):
        q = torch.randn(1, h, 1, hd, **kw)
        k, v = torch.randn(1, h, ctx, hd, **kw), torch.randn(1, h, ctx, hd, **kw)
        case(f"attention decode ctx={ctx}", f"attn_decode:{ctx},32,32,128",
             timer.median_us(lambda: F.scaled_dot_product_attention(q, k, v)))
    tiny = torch.zeros(1, **kw)
    case("tiny kernels back to back, stream", "empty", timer.median_us(lambda: tiny.add_(1), flush=False, inner=200))
    case("one tiny kernel, GPU busy before", "empty_kernel", timer.median_us(lambda: tiny.add_(1)))
    replay = timer.graph(lambda: [tiny.add_(1) for _ in range(200)])
    case("tiny kernels in a CUDA graph", "empty", timer.median_us(replay, flush=False) / 200, launch="graph")



def measure(reps: int, device: str, kernels: bool = True, e2e: bool = True,
            compile: bool = False) -> tuple[dict, list[dict]]:
    import torch                                             # lazily: only where it runs

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("calibrate: no CUDA device (this script needs an NVIDIA GPU and PyTorch)")
    small = not cuda                                          # CPU dry run: tiny shapes
    info = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)",
            "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    timer = Timer(torch, reps, cuda)
    dt = torch.float16
    kw = dict(dtype=dt, device=device)
    cases = []

    def case(cid, workload, value, metric="kernel_us", **extra):
        unit = {"kernel_us": "us", "tokens_per_s": "tokens/s", "ttft_ms": "ms"}[metric]
        kernel = metric == "kernel_us" and not workload.startswith("empty")
        row = {"id": cid, "workload": workload, "metric": metric, "measured": round(value, 3),
               "unit": unit, "timing": "kernel" if metric == "kernel_us" else "e2e", "prompt_len": 1,
               "output_len": 1, "launch": "none" if kernel else "stream", "gpus": 1, **extra}
        cases.append(row)
        print(f"{cid:<40} {value:>12.3f} {unit}", flush=True)

    if kernels:
        _kernel_rows(torch, timer, kw, small, case)
    if not e2e:
        return info, cases
    # end to end: Llama-2-7B with random weights; with compile, each layer through torch.compile
    # (Inductor fuses the norms, rotary embedding and activation, as gpt-fast does)
    cfg = dict(LLAMA, layers=2, d=256, heads=4, ffn=512, vocab=1000) if small else LLAMA
    ctxs = (64,) if small else (256, 2048)
    model = Llama(torch, device, dt, max(ctxs) + 1, cfg)
    layer = torch.compile(model.layer, dynamic=False) if compile else model.layer
    tag = "torch.compile + CUDA graph" if compile else "CUDA graph"
    # how the model costs these rows: Inductor's fused kernels, or PyTorch eager (one kernel per op
    # but scaled_dot_product_attention, a fused attention kernel)
    fuse = {} if compile else {"fuse": "eager"}
    e2e_reps = max(3, reps // 5)
    with torch.inference_mode():
        for ctx in ctxs:
            x1 = torch.randn(1, cfg["d"], **kw)
            step = timer.graph(lambda: model.forward(x1, ctx - 1, layer))
            us = Timer(torch, e2e_reps, cuda).median_us(step, flush=False)
            case(f"Llama-2-7B decode ctx={ctx}, {tag}", "decode:llama2-7b", 1e6 / us, metric="tokens_per_s",
                 prompt_len=ctx - 1, launch="graph", **fuse)
        for s in ((32,) if small else (128, 512, 2048)):
            xs = torch.randn(s, cfg["d"], **kw)
            step = timer.graph(lambda: model.forward(xs, 0, layer))
            us = Timer(torch, e2e_reps, cuda).median_us(step, flush=False)
            case(f"Llama-2-7B prefill {s}, {tag}", "prefill:llama2-7b", us / 1e3, metric="ttft_ms",
                 prompt_len=s, launch="graph", **fuse)
    return info, cases


def gemm_kernel_names(device: str) -> dict:
    """Which kernels cuBLAS runs for each linear shape above (names carry tile sizes and split-K):
    one profiled call per shape, for checking the model's tile heuristic."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    kw = dict(dtype=torch.float16, device=device)
    shapes = [(m, k, n) for k, n in L7.values() for m in TOKENS]
    shapes += [(1, k, n // tp) if nm in ("qkv", "gate_up") else (1, k // tp, n)
               for tp in (1, 8) for nm, (k, n) in L70.items()] + [(8192, 8192, 8192)]
    out = {}
    if device == "cpu":                                      # dry run: two small shapes
        shapes = [(1, 64, 192), (16, 64, 64)]
    for m, k, n in shapes:
        x, w = torch.randn(m, k, **kw), torch.randn(k, n, **kw)
        x @ w
        acts = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            x @ w
            if device == "cuda":
                torch.cuda.synchronize()
        out[f"{m},{k},{n}"] = sorted({e.key for e in prof.key_averages() if not e.key.startswith("aten::")})
    return out


def split_of(cid: str) -> str:
    """The fit / held-out split of data/validation.toml (make_validation.py): a hash of the id."""
    return "held-out" if int(hashlib.sha256(cid.encode()).hexdigest(), 16) % 3 == 0 else "fit"


def to_toml(info: dict, cases: list[dict], date: str) -> str:
    gpu = config_name(info["device"])
    tag = f"{info['device']}, torch {info['torch']}, CUDA {info['cuda']}, {date}"
    lines = [f"# Measured by gpu_baseline/calibrate.py on {tag}.",
             "# Format: as gpu_baseline/data/validation.toml.", ""]
    for c in cases:
        full = {**c, "source": f"gpu_baseline/calibrate.py, {tag}, CUDA events, median",
                "model": "Llama-2-7B/70B shapes", "gpu": gpu, "dtype": "f16", "batch": 1,
                "device": info["device"], "date": date, "torch": info["torch"], "cuda": info["cuda"],
                "set": split_of(c["id"])}
        lines.append("[[case]]")
        for key, v in full.items():
            lines.append(f"{key} = {json.dumps(v) if isinstance(v, str) else v}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output TOML (default calibration-<gpu>-<date>.toml; none on --device cpu)")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per kernel (median)")
    ap.add_argument("--kernels", help="also write the GEMM kernel names per shape to this JSON file")
    ap.add_argument("--compile", action="store_true",
                    help="end-to-end rows through torch.compile (fused elementwise ops), no kernel rows")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run of every code path with small shapes")
    args = ap.parse_args(argv)
    info, cases = measure(args.reps, args.device, kernels=not args.compile, compile=args.compile)
    if args.kernels:
        with open(args.kernels, "w") as f:
            json.dump({**info, "kernels": gemm_kernel_names(args.device)}, f, indent=1)
    date = datetime.date.today().isoformat()
    out = args.out or (f"calibration-{config_name(info['device'])}-{date}.toml" if args.device == "cuda" else None)
    if out:
        with open(out, "w") as f:
            f.write(to_toml(info, cases, date))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
