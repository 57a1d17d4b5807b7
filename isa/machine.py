"""The machine description: a frozen, validated `MachineConfig` loaded from a TOML file.

Every size and latency the compiler and the emulator use comes from here. Derived layout:

Floorplan of a superlane, west to east (positions on the east-west axis, one hop per cycle):

    pos 0        MXM west (planes 0 .. Pw-1)
    pos 1        SXM west (hemisphere 0)
    pos 2 ..     MEM slices 0 .. N-1 (west hemisphere)
    pos 2+N      VXM
    pos 3+N ..   MEM slices N .. 2N-1 (east hemisphere)
    pos 3+2N     SXM east (hemisphere 1)
    pos 4+2N     MXM east (planes Pw .. 2Pw-1)

Instruction queues (the ICU's), in this order: one ICU queue, two per MEM slice (ports 0 and 1;
each may address either bank), one per VXM ALU, per MXM plane `lw_ports` LW queues + one
compute queue (IW, ABC) + one ACC queue, `sxm_queues` per SXM, and one per chip-to-chip link
(`c2c.links`; isa/system.py): links 0 .. L/2-1 meet the streams at the west edge (position 0),
the others at the east edge (an assumption: P22 does not place them).
"""
from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field, fields
from functools import cached_property

from lpu.isa.errors import ConfigError
from lpu.isa.limits import how_to_raise, limit

MACHINES_DIR = os.path.join(os.path.dirname(__file__), "machines")

# unit kinds (plain ints: they go into Numba code)
UNIT_ICU, UNIT_MEM, UNIT_VXM, UNIT_MXM, UNIT_SXM, UNIT_C2C = 0, 1, 2, 3, 4, 5
UNIT_NAMES = ("icu", "mem", "vxm", "mxm", "sxm", "c2c")
# MXM queue roles
MXM_LW, MXM_CTL, MXM_ACC = 0, 1, 2

EAST, WEST = 0, 1

LATENCY_KEYS = ("mem_read", "vxm", "vxm_transcendental", "sxm", "mxm_abc", "mxm_acc")
INT_FIELDS = (
    "clock_mhz", "superlanes", "lanes_per_superlane", "mem_slices_per_hemisphere",
    "banks_per_slice", "addresses_per_bank", "streams_per_direction",
    "mxm_planes_per_hemisphere", "lw_ports_per_plane", "acc_rows", "f16_pair_cycles",
    "vxm_alus", "sxm_queues_per_hemisphere", "icu_skew",
)


MAX_FIELD = 1 << 24  # no size or latency is larger; keeps every address and cycle in int32
# tighter ranges (the emulator sizes its state from them; see emulator_bytes), and the least
# the compiler needs to place every op kind (found by compiling the bundled programs on smaller
# configs): 4 MEM slices per hemisphere (a VXM operand staged away from the slices of another
# needs free slices besides the two operands') and 2 VXM ALUs (a lane-step reduction issues
# two VXM ops in one cycle)
FIELD_RANGE = {
    "clock_mhz": (1, 100_000), "mem_slices_per_hemisphere": (4, 256), "banks_per_slice": (1, 64),
    "mxm_planes_per_hemisphere": (2, 64), "lw_ports_per_plane": (1, 64), "acc_rows": (1, 65536),
    "f16_pair_cycles": (1, 64), "vxm_alus": (2, 64), "sxm_queues_per_hemisphere": (1, 64),
    "icu_skew": (0, 4096),
}
MAX_LATENCY = 1024
MAX_LINKS = 64        # chip-to-chip links (P22: 16)


def _int_field(where: str, key: str, v, low: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_FIELD:
        want = "a non-negative integer" if low == 0 else "a positive integer" if key in INT_FIELDS else \
            f"an integer >= {low}"
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_FIELD:
            want = f"at most {MAX_FIELD:,}"
        raise ConfigError(f"{where}: field '{key}' must be {want}, got {v!r}")
    return v


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"


@dataclass(frozen=True)
class MachineConfig:
    name: str
    clock_mhz: int
    superlanes: int
    lanes_per_superlane: int
    mem_slices_per_hemisphere: int
    banks_per_slice: int
    addresses_per_bank: int
    streams_per_direction: int
    mxm_planes_per_hemisphere: int
    lw_ports_per_plane: int
    acc_rows: int
    f16_pair_cycles: int
    vxm_alus: int
    sxm_queues_per_hemisphere: int
    icu_skew: int
    latency: dict = field(hash=False, compare=True)
    c2c: dict = field(hash=False, compare=True, default_factory=dict)
    source: str = field(default="", compare=False)

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str = "tsp-v1") -> "MachineConfig":
        """Load by name (a file stem in isa/machines/) or by path to a TOML file."""
        path = name_or_path
        if not (path.endswith(".toml") or os.sep in path or os.path.exists(path)):
            path = os.path.join(MACHINES_DIR, name_or_path + ".toml")
            if not os.path.exists(path):
                known = ", ".join(sorted(f[:-5] for f in os.listdir(MACHINES_DIR) if f.endswith(".toml")))
                raise ConfigError(f"unknown machine '{name_or_path}' (known: {known}; or give a path to a .toml file)")
        try:
            if os.path.getsize(path) > 1 << 20:
                raise ConfigError(f"{path}: a machine file is a few hundred bytes of TOML, this one has "
                                  f"{os.path.getsize(path):,}")
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: not UTF-8 text (byte {e.start})") from None
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such machine file") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read machine file: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        return cls.from_dict(data, source=path)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> "MachineConfig":
        where = source
        if not isinstance(data.get("name"), str) or not data.get("name"):
            raise ConfigError(f"{where}: field 'name' is missing or not a string")
        unknown = set(data) - set(INT_FIELDS) - {"name", "latency", "c2c"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}"
                              + _did_you_mean(sorted(unknown)[0], INT_FIELDS + ("latency", "c2c")))
        vals = {"name": data["name"], "source": source}
        for k in INT_FIELDS:
            if k not in data:
                raise ConfigError(f"{where}: field '{k}' is missing")
            low = 0 if k == "icu_skew" else 1
            vals[k] = _int_field(where, k, data[k], low)
        lat = data.get("latency")
        if not isinstance(lat, dict):
            raise ConfigError(f"{where}: table [latency] is missing" if lat is None else
                              f"{where}: field 'latency' must be a table [latency], got {lat!r}")
        extra = set(lat) - set(LATENCY_KEYS)
        if extra:
            raise ConfigError(f"{where}: unknown field(s) {', '.join('latency.' + k for k in sorted(extra))}"
                              + _did_you_mean("latency." + sorted(extra)[0], ["latency." + k for k in LATENCY_KEYS]))
        for k in LATENCY_KEYS:
            if k not in lat:
                raise ConfigError(f"{where}: field 'latency.{k}' is missing")
            _int_field(where, f"latency.{k}", lat[k], 1)
        vals["latency"] = {k: lat[k] for k in LATENCY_KEYS}
        c2c = data.get("c2c", {})
        if not isinstance(c2c, dict):
            raise ConfigError(f"{where}: field 'c2c' must be a table [c2c], got {c2c!r}")
        for k, v in c2c.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"{where}: field 'c2c.{k}' must be a positive number, got {v!r}")
        vals["c2c"] = dict(c2c)
        cfg = cls(**vals)
        cfg._validate()
        return cfg

    def _validate(self):
        w = self.source
        for k, (lo, hi) in FIELD_RANGE.items():
            if not lo <= getattr(self, k) <= hi:
                why = {"mem_slices_per_hemisphere": " (the compiler needs free slices to stage operands)",
                       "vxm_alus": " (the compiler issues two VXM ops in one cycle)"}.get(k, "")
                raise ConfigError(f"{w}: field '{k}' must be in {lo}..{hi:,}, got {getattr(self, k):,}{why}")
        for k, v in self.latency.items():
            if v > MAX_LATENCY:
                raise ConfigError(f"{w}: field 'latency.{k}' must be at most {MAX_LATENCY}, got {v:,}")
        if self.lanes > 4096:
            raise ConfigError(f"{w}: lanes ({self.lanes}) must be at most 4096")
        if self.streams_per_direction < 8:
            raise ConfigError(f"{w}: field 'streams_per_direction' must be at least 8 (two f32 operands "
                              f"of one VXM instruction travel side by side)")
        if self.streams_per_direction > 64:
            raise ConfigError(f"{w}: field 'streams_per_direction' must be at most 64")
        if self.mxm_planes_per_hemisphere % 2:
            raise ConfigError(f"{w}: field 'mxm_planes_per_hemisphere' must be even (f16 uses plane pairs)")
        links = self.c2c.get("links", 0)
        if not isinstance(links, int) or not 0 <= links <= MAX_LINKS:
            raise ConfigError(f"{w}: field 'c2c.links' must be an integer in 0..{MAX_LINKS} (one instruction queue "
                              f"per link), got {links!r}")
        if self.acc_rows < 1 or self.lw_ports_per_plane > self.lanes:
            raise ConfigError(f"{w}: field 'lw_ports_per_plane' must be at most the lane count")
        if self.emulator_bytes() > limit("machine_bytes"):
            raise ConfigError(f"{w}: the machine is too large to emulate: its SRAM, MXM and stream state take "
                              f"{self.emulator_bytes():,} bytes; {how_to_raise('machine_bytes')}")

    def emulator_bytes(self) -> int:
        """About how many bytes the emulator's state for this machine takes (emulator/core.py)."""
        lanes, planes = self.lanes, self.mxm_planes
        ring = 64
        while ring < 2 * (self.n_positions + max(self.latency.values()) + 1):
            ring *= 2
        return (self.sram_bytes + planes * lanes * lanes * 10 + planes * self.acc_rows * (lanes * 4 + 16)
                + planes * 32 * lanes * 8 + 8 * lanes * lanes + 2 * self.streams_per_direction * ring * (24 + lanes))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        return d

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def lanes(self) -> int:
        return self.superlanes * self.lanes_per_superlane

    @property
    def mem_slices(self) -> int:
        return 2 * self.mem_slices_per_hemisphere

    @property
    def mxm_planes(self) -> int:
        return 2 * self.mxm_planes_per_hemisphere

    @property
    def sram_bytes(self) -> int:
        return self.mem_slices * self.banks_per_slice * self.addresses_per_bank * self.lanes

    @property
    def n_positions(self) -> int:
        return 2 * self.mem_slices_per_hemisphere + 5

    @property
    def vxm_pos(self) -> int:
        return 2 + self.mem_slices_per_hemisphere

    def slice_pos(self, s: int) -> int:
        n = self.mem_slices_per_hemisphere
        return 2 + s if s < n else 3 + s

    def slice_hemisphere(self, s: int) -> int:
        return 0 if s < self.mem_slices_per_hemisphere else 1

    def mxm_pos(self, plane: int) -> int:
        return 0 if plane < self.mxm_planes_per_hemisphere else self.n_positions - 1

    def sxm_pos(self, hemi: int) -> int:
        return 1 if hemi == 0 else self.n_positions - 2

    # ---- queues ------------------------------------------------------------------------
    @cached_property
    def queues(self) -> tuple:
        """Tuple of (name, unit kind, unit index, role, position) for every instruction queue."""
        q = [("icu", UNIT_ICU, 0, 0, 0)]
        for s in range(self.mem_slices):
            for port in range(2):
                q.append((f"mem{s}.{port}", UNIT_MEM, s, port, self.slice_pos(s)))
        for a in range(self.vxm_alus):
            q.append((f"vxm{a}", UNIT_VXM, a, 0, self.vxm_pos))
        for p in range(self.mxm_planes):
            pos = self.mxm_pos(p)
            for i in range(self.lw_ports_per_plane):
                q.append((f"mxm{p}.lw{i}", UNIT_MXM, p, MXM_LW, pos))
            q.append((f"mxm{p}", UNIT_MXM, p, MXM_CTL, pos))
            q.append((f"mxm{p}.acc", UNIT_MXM, p, MXM_ACC, pos))
        for h in range(2):
            for i in range(self.sxm_queues_per_hemisphere):
                q.append((f"sxm{h}.{i}", UNIT_SXM, h, i, self.sxm_pos(h)))
        for link in range(self.c2c_links):
            q.append((f"c2c{link}", UNIT_C2C, link, 0, self.c2c_pos(link)))
        return tuple(q)

    @property
    def c2c_links(self) -> int:
        return int(self.c2c.get("links", 0))

    def c2c_pos(self, link: int) -> int:
        return 0 if link < self.c2c_links // 2 else self.n_positions - 1

    def c2c_queue(self, link: int) -> int:
        return len(self.queues) - self.c2c_links + link

    @cached_property
    def queue_index(self) -> dict:
        return {q[0]: i for i, q in enumerate(self.queues)}

    def mem_queue(self, s: int, port: int) -> int:
        return 1 + 2 * s + port

    def vxm_queue(self, alu: int) -> int:
        return 1 + 2 * self.mem_slices + alu

    def mxm_queue(self, plane: int, role: int, port: int = 0) -> int:
        base = 1 + 2 * self.mem_slices + self.vxm_alus + plane * (self.lw_ports_per_plane + 2)
        if role == MXM_LW:
            return base + port
        return base + self.lw_ports_per_plane + (0 if role == MXM_CTL else 1)

    def sxm_queue(self, hemi: int, i: int) -> int:
        return (1 + 2 * self.mem_slices + self.vxm_alus
                + self.mxm_planes * (self.lw_ports_per_plane + 2) + hemi * self.sxm_queues_per_hemisphere + i)

    # ---- published peak rates, derived (used by reports and benchmarks) ---------------------
    def abc_cycles(self, f16: bool, half: bool) -> int:
        """Cycles an ABC holds its plane (and, for f16, the pair's other plane): a half ABC
        (weight rows < lanes/2) takes half the passes of the f16 pair, rounded up."""
        full = self.f16_pair_cycles if f16 else 1
        return -(-full // 2) if half else full

    def macs_per_cycle(self, dtype: str) -> int:
        if dtype == "i8":
            return self.mxm_planes * self.lanes * self.lanes
        return (self.mxm_planes // 2) * self.lanes * self.lanes // self.f16_pair_cycles

    def stream_bytes_per_cycle(self) -> int:
        return 2 * self.streams_per_direction * self.lanes

    def sram_bytes_per_cycle(self) -> int:
        return self.mem_slices * self.banks_per_slice * self.lanes
