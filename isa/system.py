"""A system of chips: `SystemConfig`, loaded from a TOML file in isa/systems/ (or a path).

The chip is a `MachineConfig` (every chip of a system is the same). Chips are numbered
0 .. chips-1; chip c is in node c // chips_per_node. A node's chips are fully connected: chip
a's local link j (0 .. local_links-1) goes to the j-th other chip of its node, in chip order.
Of the global links (P22: nodes join as a Dragonfly's groups), the model wires one chain for
pipelines (an assumption): global link `local_links` of a node's last chip goes to global link
`local_links + 1` of the next node's first chip; and, for pipelines of tensor-parallel nodes,
global link `local_links + 2` of every chip c goes to global link `local_links + 3` of chip
c + chips_per_node (the same rank of the next node). A vector between chips with no direct
link is relayed by every chip in between (`route`).

A link carries one vector (one byte plane of `machine.lanes` bytes) per slot of `slot_cycles`
cycles in each direction, and delivers it `hop_cycles` after it was sent. docs/system.md has
the figures and their sources; the link numbers here index the chip's C2C queues
(`MachineConfig.c2c_queue`).
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field

from lpu.isa.errors import ConfigError
from lpu.isa.machine import MachineConfig

SYSTEMS_DIR = os.path.join(os.path.dirname(__file__), "systems")
TOPOLOGY_KEYS = ("chips_per_node", "local_links", "global_links")
LINK_KEYS = ("lanes", "lane_gbit_per_s", "vector_bytes", "wire_bytes", "local_hop_cycles", "global_hop_ns")
MAX_CHIPS = 4096


@dataclass(frozen=True)
class SystemConfig:
    name: str
    machine: MachineConfig
    chips: int
    topology: dict
    link: dict
    source: str = field(default="", compare=False)

    @classmethod
    def load(cls, name_or_path: str = "node", machine: MachineConfig | None = None,
             chips: int | None = None) -> "SystemConfig":
        path = name_or_path
        if not (path.endswith(".toml") or os.sep in path):
            path = os.path.join(SYSTEMS_DIR, path + ".toml")
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            known = ", ".join(sorted(f[:-5] for f in os.listdir(SYSTEMS_DIR) if f.endswith(".toml")))
            raise ConfigError(f"unknown system '{name_or_path}' (known: {known}; or give a path to a .toml file)") from None
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read system file: {e}") from None
        return cls.from_dict(data, machine, chips, source=path)

    @classmethod
    def from_dict(cls, data: dict, machine: MachineConfig | None = None, chips: int | None = None,
                  source: str = "<dict>") -> "SystemConfig":
        w = source
        unknown = set(data) - {"name", "machine", "chips", "topology", "link"}
        if unknown:
            raise ConfigError(f"{w}: unknown field(s) {', '.join(sorted(unknown))}")
        if machine is None:
            machine = MachineConfig.load(data.get("machine", "tsp-v1"))
        chips = data.get("chips", 1) if chips is None else chips
        if isinstance(chips, bool) or not isinstance(chips, int) or not 1 <= chips <= MAX_CHIPS:
            raise ConfigError(f"{w}: the chip count must be an integer in 1..{MAX_CHIPS}, got {chips!r}")
        tables = {}
        for table, keys in (("topology", TOPOLOGY_KEYS), ("link", LINK_KEYS)):
            t = data.get(table)
            if not isinstance(t, dict):
                raise ConfigError(f"{w}: table [{table}] is missing")
            extra = set(t) - set(keys)
            if extra:
                raise ConfigError(f"{w}: unknown field(s) {', '.join(f'{table}.{k}' for k in sorted(extra))}")
            for k in keys:
                v = t.get(k)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ConfigError(f"{w}: field '{table}.{k}' must be a positive number, got {v!r}")
            tables[table] = {k: t[k] for k in keys}
        topo, link = tables["topology"], tables["link"]
        if topo["local_links"] < topo["chips_per_node"] - 1:
            raise ConfigError(f"{w}: a node of {topo['chips_per_node']} chips fully connected needs "
                              f"{topo['chips_per_node'] - 1} local links, the topology gives {topo['local_links']}")
        if topo["local_links"] + topo["global_links"] > machine.c2c_links:
            raise ConfigError(f"{w}: {topo['local_links']} local + {topo['global_links']} global links per chip, "
                              f"machine '{machine.name}' has {machine.c2c_links} (its [c2c] links)")
        if link["vector_bytes"] != machine.lanes:
            link = dict(link, vector_bytes=machine.lanes, wire_bytes=link["wire_bytes"] - link["vector_bytes"]
                        + machine.lanes)      # a vector is the chip's lanes; the header stays
        return cls(data.get("name", "system"), machine, chips, topo, link, source)

    # ---- derived figures -------------------------------------------------------------------
    @property
    def chips_per_node(self) -> int:
        return int(self.topology["chips_per_node"])

    @property
    def link_gbytes_per_s(self) -> float:
        return self.link["lanes"] * self.link["lane_gbit_per_s"] / 8

    @property
    def slot_cycles(self) -> int:
        """Cycles of the chip's clock a link takes to carry one vector (24 on tsp-v1)."""
        seconds = self.link["wire_bytes"] / (self.link_gbytes_per_s * 1e9)
        return max(1, math.ceil(seconds * self.machine.clock_mhz * 1e6 - 1e-9))

    @property
    def hop_cycles(self) -> int:
        """Latency of a link inside a node, in cycles: from SEND to the earliest RECV."""
        return int(self.link["local_hop_cycles"])

    @property
    def global_hop_cycles(self) -> int:
        return math.ceil(self.link["global_hop_ns"] * self.machine.clock_mhz / 1000)

    @property
    def min_latency(self) -> int:
        """The shortest time from a SEND to its RECV anywhere: the emulator's window."""
        return min(self.hop_cycles, self.global_hop_cycles)

    def node_of(self, chip: int) -> int:
        return chip // self.chips_per_node

    @property
    def global_out(self) -> int:
        """The global link from a node's last chip to the next node's first (`global_in` there)."""
        return int(self.topology["local_links"])

    @property
    def global_in(self) -> int:
        return int(self.topology["local_links"]) + 1

    @property
    def rank_out(self) -> int:
        """The global link from a chip to the same rank of the next node (`rank_in` there)."""
        return int(self.topology["local_links"]) + 2

    @property
    def rank_in(self) -> int:
        return int(self.topology["local_links"]) + 3

    def _ranked(self) -> bool:
        return self.topology["global_links"] >= 4

    def direct(self, a: int, b: int) -> bool:
        """Chips a and b share a link on a pipeline's path: one node, or a node's last chip and
        the next node's first (the links between the same ranks of two nodes: `rank_pair`)."""
        if a == b or not (0 <= a < self.chips and 0 <= b < self.chips):
            return False
        return self.node_of(a) == self.node_of(b) or (min(a, b) + 1 == max(a, b)
                                                      and max(a, b) % self.chips_per_node == 0)

    def rank_pair(self, a: int, b: int) -> bool:
        """Chips a and b are the same rank of two neighbouring nodes (a tensor-parallel pipeline)."""
        return (self._ranked() and abs(a - b) == self.chips_per_node and 0 <= min(a, b)
                and max(a, b) < self.chips)

    def link_between(self, a: int, b: int) -> tuple[int, int]:
        """(link on chip a, link on chip b) of the direct link between chips a and b (ConfigError
        if there is none: `direct`)."""
        if not (self.direct(a, b) or self.rank_pair(a, b)):
            raise ConfigError(f"no direct link between chips {a} and {b} of a {self.chips}-chip system "
                              f"({self.chips_per_node} chips a node)")
        if self.node_of(a) != self.node_of(b):
            if self.direct(a, b):
                return (self.global_out, self.global_in) if a < b else (self.global_in, self.global_out)
            return (self.rank_out, self.rank_in) if a < b else (self.rank_in, self.rank_out)
        la, lb = a % self.chips_per_node, b % self.chips_per_node
        return (lb if lb < la else lb - 1), (la if la < lb else la - 1)

    def hop_between(self, a: int, b: int) -> int:
        """Cycles from a SEND on chip a to the earliest RECV of the vector on chip b (direct)."""
        return self.hop_cycles if self.node_of(a) == self.node_of(b) else self.global_hop_cycles

    def route(self, a: int, b: int) -> list[int]:
        """The chips a vector from chip a to chip b (a < b) passes: directly in a node, else
        through every chip in between (each relays it: stored, then sent on)."""
        return [a, b] if self.direct(a, b) else list(range(a, b + 1))

    def peer(self, chip: int, link: int) -> int:
        """The chip at the far end of `chip`'s link `link` (-1: none)."""
        n = self.chips_per_node
        if link == self.global_out:
            return chip + 1 if chip % n == n - 1 and chip + 1 < self.chips else -1
        if link == self.global_in:
            return chip - 1 if chip % n == 0 and chip > 0 else -1
        if self._ranked() and link == self.rank_out:
            return chip + n if chip + n < self.chips else -1
        if self._ranked() and link == self.rank_in:
            return chip - n if chip >= n else -1
        if link >= n - 1:
            return -1
        local = chip % n
        other = link if link < local else link + 1
        peer = self.node_of(chip) * n + other
        return peer if peer < self.chips else -1

    def to_dict(self) -> dict:
        return {"name": self.name, "machine": self.machine.to_dict(), "chips": self.chips,
                "topology": dict(self.topology), "link": dict(self.link)}

    @classmethod
    def from_stored(cls, d: dict) -> "SystemConfig":
        """Inverse of to_dict (a bundle's record)."""
        return cls(d["name"], MachineConfig.from_dict(d["machine"], source="<bundle>"), int(d["chips"]),
                   dict(d["topology"]), dict(d["link"]), "<bundle>")
