"""A system's chips as Ray actors (the optional `cluster` extra: pip install -e '.[cluster]').

Each actor holds a group of chips (emulator/system.py `Group`) and answers the same two calls as
a local worker process: step (deliver, advance to a window's end, return what was sent) and
finish. The driver (`system._drive`) is the same, so the result is the same as in one process.
"""
from __future__ import annotations

import dataclasses

from lpu.isa.errors import LpuError

try:                      # optional: everything else runs without Ray
    import ray
except ImportError:       # pragma: no cover - depends on the installation
    ray = None


def available() -> bool:
    return ray is not None


class RayGroup:
    """Some chips of a system in one Ray actor."""

    def __init__(self, group_class, items, slot_cycles: int, trace: bool = False):
        clean = [(c, dataclasses.replace(p), v) for c, p, v in items]
        self.actor = _actor_class(group_class).remote(clean, slot_cycles, trace)
        self.pending = None

    def send_step(self, until, deliveries):
        self.pending = self.actor.step.remote(until, deliveries)

    def _get(self):
        try:
            return ray.get(self.pending)
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            if isinstance(cause, LpuError):
                raise LpuError(cause.message, **cause.info) from None
            raise

    def send_finish(self):
        self.pending = self.actor.finish.remote()

    def finished(self):
        return self._get()

    def join(self):
        pass

    def close(self):
        ray.kill(self.actor)


_ACTORS = {}


def _actor_class(group_class):
    if group_class not in _ACTORS:
        _ACTORS[group_class] = ray.remote(group_class)
    return _ACTORS[group_class]


def connect(address: str) -> None:
    """Join the Ray cluster at `address` ('auto': the one this machine belongs to; 'local': start
    one on this machine)."""
    if ray is None:
        raise LpuError("--ray needs Ray, the optional `cluster` extra: pip install -e '.[cluster]'")
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except ConnectionError as e:
                where = "no Ray cluster is running on this machine" if address == "auto" else \
                    f"no Ray cluster answers at {address}"
                raise LpuError(f"--ray {address}: {where} ({e}); start one with `ray start --head`, "
                               f"or use --ray local to run the chips on a Ray instance started for this run") from None
