"""The report of a traced run: utilization per unit, SRAM occupancy (peak live and by tensor),
stream occupancy, instruction counts, cycles per DSL line, and the bottleneck; and a plot of
utilization over time. Input: `emulator.trace.Records`."""
from __future__ import annotations

import numpy as np

from lpu.emulator.trace import Records, abc_f16, abc_macs, activity, capacity, tracks
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError

BOUND_AT = 0.5   # a unit busy at least this share of its capacity bounds the run
LINE_RULE = ("each cycle goes to the DSL line with the most instructions in flight in it (issue to result "
             "cycle), ties to the lower line; a cycle with nothing in flight ('idle') to the line that starts next "
             "(the last ones to the line before); the final ICU skew cycles to '(skew)'")


def _sram(r: Records) -> dict:
    """Peak live SRAM: named inputs, weights, states and constants live all run, outputs from their
    write, other addresses from each write to its last read (GATHER/SCATTER: the base address)."""
    m, prog = r.program.machine, r.program
    naddr, C = m.addresses_per_bank, r.cycles
    mem = np.flatnonzero(np.isin(r.op, (O.READ, O.WRITE, O.GATHER, O.SCATTER)))
    qslice = np.array([q[2] for q in m.queues], np.int64)
    key = (qslice[r.queue[mem]] * m.banks_per_slice + r.args[mem, 0]) * naddr + r.args[mem, 1]
    wr = np.isin(r.op[mem], (O.WRITE, O.SCATTER))
    cyc = r.cycle[mem]
    diff = np.zeros(C + 2)
    tensors, sym_keys = [], []
    for s in prog.symbols:
        k = ((np.asarray(s.slices, np.int64) * m.banks_per_slice + s.banks) * naddr + s.addrs).ravel()
        sym_keys.append(k)
        tensors.append({"name": s.name, "kind": s.kind, "dtype": s.dtype, "shape": list(s.shape),
                        "bytes": int(k.size * m.lanes)})
        if s.kind == "output":
            first = {}
            for kk, t in zip(key[wr].tolist(), cyc[wr].tolist()):
                first[kk] = min(t, first.get(kk, t))
            starts = np.array([first.get(kk, C) for kk in k.tolist()], np.int64)
        else:
            starts = np.zeros(k.size, np.int64)
        diff[:C + 1] += np.bincount(starts, minlength=C + 1)[:C + 1]
    named = np.unique(np.concatenate(sym_keys)) if sym_keys else np.zeros(0, np.int64)
    tmp = ~np.isin(key, named)
    k, c, w = key[tmp], cyc[tmp], wr[tmp]
    order = np.lexsort((c, k))
    k, c, w = k[order], c[order], w[order]
    if len(k):
        new = np.ones(len(k), bool)
        new[1:] = (k[1:] != k[:-1]) | w[1:]
        start = c[new]
        end = np.maximum.reduceat(c, np.flatnonzero(new))
        diff += np.bincount(start, minlength=C + 2)[:C + 2] - np.bincount(end + 1, minlength=C + 2)[:C + 2]
    live = np.cumsum(diff)[:max(C, 1)]
    peak_cycle = int(np.argmax(live))
    tensors.sort(key=lambda t: -t["bytes"])
    return {"capacity_bytes": int(m.sram_bytes), "peak_live_bytes": int(live[peak_cycle] * m.lanes),
            "peak_cycle": peak_cycle, "tensor_bytes": int(sum(t["bytes"] for t in tensors)),
            "footprint_bytes": int(len(np.union1d(named, key)) * m.lanes), "tensors": tensors}


def _lines(r: Records) -> list:
    """Cycles per DSL line (LINE_RULE); the rows add up to r.cycles."""
    prog, C = r.program, r.cycles
    end = np.minimum(r.cycle + np.maximum(r.latency, r.busy - 1) + 1, C)
    best = np.zeros(C, np.int64)
    owner = np.full(C, -1, np.int64)
    for L in np.unique(r.line):
        sel = r.line == L
        d = np.bincount(r.cycle[sel], minlength=C + 1)[:C + 1] - np.bincount(end[sel], minlength=C + 1)[:C + 1]
        cnt = np.cumsum(d)[:C]
        better = cnt > best
        best[better], owner[better] = cnt[better], L
    idle = owner < 0
    pos = np.where(owner >= 0, np.arange(C), C)
    nxt = np.minimum.accumulate(pos[::-1])[::-1]          # the next cycle with something in flight
    prv = np.maximum.accumulate(np.where(owner >= 0, np.arange(C), -1))
    owner = np.where(nxt < C, owner[np.minimum(nxt, C - 1)], np.where(prv >= 0, owner[np.maximum(prv, 0)], -1))
    owner[C - min(prog.machine.icu_skew, C):] = -2
    rows = []
    for L, n in zip(*np.unique(owner, return_counts=True)):
        L = int(L)
        row = {"line": L if L >= 0 else None, "cycles": int(n), "share": round(float(n) / C, 4),
               "idle": int((idle & (owner == L)).sum())}
        if L >= 0:
            sel = r.line == L
            ops = list(dict.fromkeys(prog.nodes[i][0] for i in prog.node[r.src[sel]].tolist() if 0 <= i < len(prog.nodes)))
            row.update(label=f"line {L}" if L else "(no line)", source=prog.source_line(L),
                       instructions=int(sel.sum()), macs=int(abc_macs(r, np.flatnonzero(sel & (r.op == O.ABC))).sum()),
                       ir_ops=ops)
        else:
            row.update(label="(idle)" if L == -1 else "(skew)", source="", instructions=0, macs=0, ir_ops=[])
        rows.append(row)
    rows.sort(key=lambda x: (-x["cycles"], x["line"] if x["line"] is not None else 1 << 30))
    return rows


def report(r: Records) -> dict:
    m, C = r.program.machine, max(r.cycles, 1)
    act = activity(r)
    cap = capacity(m)
    util = {k: float(act[k].sum()) / (C * cap[k]) for k in ("mxm", "vxm", "mem", "sxm")}
    units = []
    index = {n: i for i, (n, _) in enumerate(r.track_names)}
    qcount = np.bincount(tracks(m)[1], minlength=len(r.track_names))
    for t, (name, kind) in enumerate(r.track_names):
        sel = r.track == t
        words = name.split()
        if kind == "mxm" and len(words) == 2:   # plane-cycles held by ABCs, its own and its pair's
            p = int(words[1])
            pair = (r.track == index[f"MXM {p - 1}"]) & (r.op == O.ABC) if p % 2 else np.zeros(len(r), bool)
            pair[pair] = abc_f16(r, np.flatnonzero(pair))
            busy, per = int(r.busy[(r.op == O.ABC) & (sel | pair)].sum()), 1
        elif kind == "mem":
            lo, _, hi = words[1].partition("-")
            busy, per = int(sel.sum()), (int(hi or lo) - int(lo) + 1) * m.banks_per_slice
        elif kind != "icu":
            busy, per = int(sel.sum()), int(qcount[t])
        else:
            continue
        units.append({"unit": name, "kind": kind, "instructions": int(sel.sum()),
                      "utilization": round(busy / (C * per), 4)})
    kinds = np.array([k for _, k in r.track_names])[r.track]
    counts = {k: int((kinds == k).sum()) for k in ("mem", "vxm", "mxm", "sxm")}
    ops = {O.OPS[o].name: int(n) for o, n in zip(*np.unique(r.op, return_counts=True))}
    streams = {"streams": cap["streams"], "mean_in_use": round(float(act["streams"].mean()) if r.cycles else 0.0, 3),
               "peak_in_use": int(act["streams"].max()) if r.cycles else 0,
               "peak_cycle": int(np.argmax(act["streams"])) if r.cycles else 0}
    streams["occupancy"] = round(streams["mean_in_use"] / cap["streams"], 4)
    lines = _lines(r)
    return {"cycles": r.cycles, "time_us": r.cycles / m.clock_mhz, "instructions": len(r),
            "utilization": {k: round(v, 4) for k, v in util.items()}, "units": units,
            "instructions_per_unit": counts, "opcodes": ops, "sram": _sram(r), "streams": streams,
            "lines": lines, "line_rule": LINE_RULE,
            "bottleneck": _bottleneck(util, streams, lines, act, m)}


def _bottleneck(util, streams, lines, act, m) -> dict:
    measures = {"MXM": (util["mxm"], f"the MXM planes are busy in {util['mxm']:.0%} of plane-cycles "
                        f"({act['macs'].sum():,.0f} MACs at a peak of {m.macs_per_cycle('f16'):,} f16 MACs/cycle)"),
                "stream": (streams["occupancy"], f"on average {streams['mean_in_use']:.1f} of the "
                           f"{streams['streams']} streams receive a value each cycle"),
                "SRAM": (util["mem"], f"the MEM banks are accessed in {util['mem']:.0%} of bank-cycles"),
                "VXM": (util["vxm"], f"the VXM ALUs are busy in {util['vxm']:.0%} of ALU-cycles")}
    name, (value, why) = max(measures.items(), key=lambda kv: kv[1][0])
    busiest = {"MXM": "MXM planes", "stream": "streams", "SRAM": "SRAM banks", "VXM": "VXM ALUs"}[name]
    if value >= BOUND_AT:
        return {"kind": f"{name}-bound", "reason": why}
    top = next((x for x in lines if x["line"] is not None), None)
    idle = sum(x["idle"] for x in lines) / max(1, sum(x["cycles"] for x in lines))
    where = f"; {idle:.0%} of the cycles have nothing in flight"
    where += f"; the most cycles go to {top['label']} ({top['cycles']:,})" if top else ""
    return {"kind": "latency-bound",
            "reason": f"no unit is busy more than {value:.0%} of its capacity (the busiest: {busiest}); the cycles go "
                      f"to dependent instructions waiting for results (functional latency, hops, superlane skew)"
                      f"{where}"}


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024


def format_report(rep: dict, top: int = 12) -> str:
    b = rep["bottleneck"]
    out = [f"bottleneck: {b['kind']}: {b['reason']}",
           f"{rep['cycles']:,} cycles ({rep['time_us']:.2f} us), {rep['instructions']:,} instructions executed",
           "utilization by unit (share of capacity: MXM plane-cycles with an ABC, MEM bank-cycles, ALU/queue-cycles):"]
    for u in rep["units"]:
        if u["instructions"] or u["utilization"]:
            out.append(f"  {u['unit']:<10} {u['utilization']:7.1%}  {u['instructions']:>9,} instructions")
    out.append("  all: " + ", ".join(f"{k} {v:.1%}" for k, v in rep["utilization"].items()))
    out.append("instructions per unit: " + ", ".join(f"{k} {v:,}" for k, v in rep["instructions_per_unit"].items())
               + "  (" + ", ".join(f"{k} {v:,}" for k, v in rep["opcodes"].items()) + ")")
    s = rep["sram"]
    out.append(f"SRAM: peak live {_bytes(s['peak_live_bytes'])} at cycle {s['peak_cycle']:,} of "
               f"{_bytes(s['capacity_bytes'])}; named tensors {_bytes(s['tensor_bytes'])}, "
               f"every address used {_bytes(s['footprint_bytes'])}")
    for t in s["tensors"][:top]:
        out.append(f"  {t['name']:<12} {t['kind']:<7} {t['dtype']}{t['shape']}  {_bytes(t['bytes'])}")
    if len(s["tensors"]) > top:
        out.append(f"  ... {len(s['tensors']) - top} more")
    st = rep["streams"]
    out.append(f"streams: {st['mean_in_use']:.2f} of {st['streams']} in use per cycle on average "
               f"({st['occupancy']:.1%}), peak {st['peak_in_use']} at cycle {st['peak_cycle']:,}")
    out.append("cycles per DSL line (a cycle goes to the line with the most instructions in flight; "
               "'idle' cycles, with none, to the line that starts next):")
    out.append(f"  {'line':<10} {'cycles':>9} {'share':>7} {'idle':>9}  source  [IR ops]")
    for x in rep["lines"]:
        ops = f"  [{', '.join(x['ir_ops'])}]" if x["ir_ops"] else ""
        out.append(f"  {x['label']:<10} {x['cycles']:>9,} {x['share']:7.1%} {x['idle']:>9,}  {x['source'][:56]}{ops}")
    out.append(f"  {'total':<10} {sum(x['cycles'] for x in rep['lines']):>9,}")
    return "\n".join(out) + "\n"


def plot(r: Records, path: str, buckets: int = 400) -> None:
    """Utilization over time per unit kind, as a PNG (needs matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LpuError("--plot needs matplotlib: pip install -e '.[plot]' in a checkout, or pip install matplotlib") from None
    act, cap = activity(r), capacity(r.program.machine)
    step = max(1, -(-r.cycles // buckets))
    keys = ("mxm", "vxm", "mem", "sxm", "streams")
    fig, axes = plt.subplots(len(keys), 1, sharex=True, figsize=(10, 1.4 * len(keys) + 1))
    for ax, k in zip(axes, keys):
        v = act[k]
        v = np.concatenate([v, np.zeros((-len(v)) % step)]).reshape(-1, step).mean(axis=1) / cap[k]
        ax.fill_between(np.arange(len(v)) * step, v, step="post", alpha=0.6)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(k.upper() if k != "streams" else "streams", rotation=0, ha="right", va="center")
    axes[-1].set_xlabel(f"cycle ({step} per bar)" if step > 1 else "cycle")
    m = r.program.machine
    axes[0].set_title(f"{r.program.source_name or 'program'} on {m.name}: utilization over {r.cycles:,} cycles")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
