"""GPU descriptions for the analytical baseline: a frozen, validated `GpuConfig` loaded from a
TOML file in gpu_baseline/gpus/ (or any path). Every number in those files carries its source in
a comment; the cost model (model.py) reads nothing else.

Units: bandwidths in GB/s (1e9 B/s), peaks in TFLOPS (1e12 flop/s), latencies in us,
capacities in MB (1e6 B)."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields

from lpu.isa.errors import ConfigError

GPUS_DIR = os.path.join(os.path.dirname(__file__), "gpus")


@dataclass(frozen=True)
class GpuConfig:
    name: str
    hbm_gbs: float            # HBM bandwidth, datasheet
    hbm_latency_us: float     # DRAM load-to-use latency (microbenchmarks)
    l2_mb: float              # L2 capacity
    l2_gbs: float             # L2 bandwidth (microbenchmarks)
    sm_count: int             # streaming multiprocessors
    tensor_f16_tflops: float  # dense f16/bf16 tensor-core peak (f32 accumulate)
    tensor_i8_tops: float     # dense i8 tensor-core peak
    cuda_f32_tflops: float    # CUDA-core (non-tensor) f32 peak
    launch_stream_us: float   # per-kernel overhead, plain stream launches
    launch_graph_us: float    # per-kernel overhead inside a CUDA graph
    hbm_efficiency: float     # achievable fraction of hbm_gbs by streaming kernels
    tensor_efficiency: float  # achievable fraction of the tensor peaks by cuBLAS-class GEMMs
    cuda_efficiency: float    # achievable fraction of cuda_f32_tflops by elementwise kernels
    attention_efficiency: float  # achievable fraction of the tensor peak in fused (flash) attention
    kernel_fixed_us: float    # fixed duration of an elementwise / row kernel (ramp-up, tail)
    gemm_fixed_us: float      # fixed duration of a GEMM or attention kernel (prologue, pipeline fill, tail)
    nvlink_gbs: float         # NVLink bandwidth per GPU and direction (tensor-parallel groups)
    nvlink_efficiency: float  # achievable fraction of nvlink_gbs by all-reduce (bus bandwidth)
    allreduce_latency_us: float  # fixed time of one small all-reduce in a group
    step_host_graph_us: float   # host time per forward pass outside the kernels, CUDA-graph runs
    step_host_stream_us: float  # the same for stream-launched runs (end-to-end figures)
    gemm_split_k_max_rows: int  # GEMMs of more rows never split K
    gemm_hbm_share: float     # a GEMM's busy SM streams up to this many times its share of HBM bandwidth
    gemm_tiles: tuple = ()    # ((rows, cols), ...): output tiles the GEMM heuristic picks from
    gemm_narrow_tiles_own_rows: bool = False  # a tile under 128 rows serves only M up to its rows
    gemm_plan_bound: bool = False  # the plan's whole time (HBM share, L2 feed) is the GEMM's compute
                                   # term; False: those terms only steer the plan's choice
    source: str = ""

    @property
    def l2_bytes(self) -> float:
        return self.l2_mb * 1e6

    def step_host_us(self, mode: str) -> float:
        """Host time per forward pass outside the kernels, by launch mode (0 for "none")."""
        return {"graph": self.step_host_graph_us, "stream": self.step_host_stream_us}.get(mode, 0.0)

    def launch_us(self, mode: str) -> float:
        if mode == "stream":
            return self.launch_stream_us
        if mode == "graph":
            return self.launch_graph_us
        if mode == "none":                   # kernel durations alone (profiler-style figures)
            return 0.0
        raise ConfigError(f"launch mode must be 'stream' or 'graph', got {mode!r}")


_FLOAT_FIELDS = tuple(f.name for f in fields(GpuConfig) if f.type == "float")
_INT_FIELDS = tuple(f.name for f in fields(GpuConfig) if f.type == "int")
_BOOL_FIELDS = tuple(f.name for f in fields(GpuConfig) if f.type == "bool")
_FRACTIONS = ("hbm_efficiency", "tensor_efficiency", "cuda_efficiency", "attention_efficiency",
              "nvlink_efficiency")


def known_gpus() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(GPUS_DIR) if f.endswith(".toml"))


def load_gpu(name_or_path: str = "a100-80gb") -> GpuConfig:
    """Load by name (a file stem in gpu_baseline/gpus/) or by path to a TOML file."""
    path = name_or_path
    if not (path.endswith(".toml") or os.sep in path):
        path = os.path.join(GPUS_DIR, name_or_path + ".toml")
        if not os.path.exists(path):
            raise ConfigError(f"unknown GPU '{name_or_path}' (known: {', '.join(known_gpus())}; "
                              "or give a path to a .toml file)")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such GPU file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return gpu_from_dict(data, source=path)


def _tiles(v, source: str) -> tuple:
    ok = isinstance(v, (list, tuple)) and v and all(
        isinstance(t, (list, tuple)) and len(t) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 4096
                                                    for x in t) for t in v)
    if not ok:
        raise ConfigError(f"{source}: field 'gemm_tiles' must be a non-empty list of [rows, cols] positive "
                          f"integer pairs, got {v!r}")
    return tuple(tuple(t) for t in v)


def gpu_from_dict(data: dict, source: str = "<dict>") -> GpuConfig:
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ConfigError(f"{source}: field 'name' is missing or not a string")
    vals = {"name": data["name"], "source": source}
    for k in _FLOAT_FIELDS + _INT_FIELDS:
        if k not in data:
            raise ConfigError(f"{source}: field '{k}' is missing")
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (k in _INT_FIELDS and not isinstance(v, int)):
            kind = "an integer" if k in _INT_FIELDS else "a number"
            raise ConfigError(f"{source}: field '{k}' must be {kind}, got {v!r}")
        if not v > 0:
            raise ConfigError(f"{source}: field '{k}' must be positive, got {v!r}")
        if k in _FRACTIONS and v > 1:
            raise ConfigError(f"{source}: field '{k}' is a fraction and must be at most 1, got {v!r}")
        vals[k] = float(v) if k in _FLOAT_FIELDS else v
    vals["gemm_tiles"] = _tiles(data.get("gemm_tiles"), source)
    for k in _BOOL_FIELDS:
        v = data.get(k)
        if k not in data:
            raise ConfigError(f"{source}: field '{k}' is missing")
        if not isinstance(v, bool):
            raise ConfigError(f"{source}: field '{k}' must be true or false, got {v!r}")
        vals[k] = v
    unknown = set(data) - set(vals) - {"name"}
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}")
    return GpuConfig(**vals)
