#!/usr/bin/env python3
"""Draws the JSON of tools/bench_poly_scaling.py as the founding paper's Figure 1: time and peak memory
against sequence length, log-log, and prints the slope of every line.

    python3 tools/plot_scaling.py poly_scaling.json [more.json ...] [--out docs/poly_scaling.png]
        [--slope-min-t 4096]

One row of two panels per mode (forward; forward+backward): time per call (ms) against T, and the peak
memory one call adds (MiB, CUDA runs only) against T. One line per (method, B, H, D): the color is the
method, the line style the batch, the marker the head dim. A point that ran out of memory is an X at its
T, on the line's extrapolation from its last two points (as in the paper's figure). Several JSON files
(e.g. a forward run and a forward+backward run made in separate device calls) are drawn together; a point
measured twice keeps the last file's.

Slopes: least squares of log(ms) on log(T) over each line's points with T >= --slope-min-t (default
4096): about 1 for a method linear in T, 2 for softmax attention once its quadratic work dominates; the
same for memory where measured. A line with fewer than two such points prints n/a.

Writes the PNG to --out (default docs/poly_scaling.png in this checkout). Needs matplotlib
(scripts/setup.sh installs it).
"""

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}
COLORS = {"poly": "tab:red", "linear": "tab:blue", "sdpa": "tab:green", "fla_parallel_based": "tab:purple",
          "fla_fused_chunk_based": "tab:orange"}
STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v"]


def load(paths):
    """Points of every file (the last measurement of a point wins) and the first file's header."""
    header, points = None, {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SystemExit(f"plot_scaling: error: {path}: no such file")
        except json.JSONDecodeError as exc:
            raise SystemExit(f"plot_scaling: error: {path}: not JSON ({exc})")
        if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
            raise SystemExit(f"plot_scaling: error: {path}: no \"points\" list (not a bench_poly_scaling.py JSON)")
        header = header or doc
        for p in doc["points"]:
            missing = [k for k in ("method", "mode", "B", "H", "D", "T", "ms", "peak_bytes", "status") if k not in p]
            if missing:
                raise SystemExit(f"plot_scaling: error: {path}: a point lacks {', '.join(missing)}: {p}")
            points[(p["method"], p["mode"], p["B"], p["H"], p["D"], p["T"])] = p
    return header, list(points.values())


def series_of(points):
    """{(mode, method, B, H, D): points sorted by T}."""
    out = {}
    for p in points:
        out.setdefault((p["mode"], p["method"], p["B"], p["H"], p["D"]), []).append(p)
    return {key: sorted(v, key=lambda p: p["T"]) for key, v in sorted(out.items(), key=lambda kv: str(kv[0]))}


def slope(xs, ys):
    """Least-squares slope of log y on log x, or None with fewer than two points."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx


def line_slopes(series, min_t):
    rows = []
    for key, pts in series.items():
        ok = [p for p in pts if p["status"] == "ok" and p["T"] >= min_t]
        t = [p for p in ok if p["ms"] and p["ms"] > 0]
        m = [p for p in ok if p["peak_bytes"] and p["peak_bytes"] > 0]
        rows.append((key, len(t), slope([p["T"] for p in t], [p["ms"] for p in t]),
                     slope([p["T"] for p in m], [p["peak_bytes"] for p in m])))
    return rows


def oom_mark(ok_pts, T, field, scale):
    """Where an OOM point's X goes: the line extended from its last two points (its last point's height
    with only one; None with none)."""
    vals = [(p["T"], p[field] * scale) for p in ok_pts if p[field]]
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0][1]
    (t0, y0), (t1, y1) = vals[-2], vals[-1]
    k = math.log(y1 / y0) / math.log(t1 / t0) if y0 > 0 and y1 > 0 and t1 != t0 else 0.0
    return y1 * (T / t1) ** k


def draw(header, series, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        raise SystemExit("plot_scaling: error: matplotlib is not installed (bash scripts/setup.sh, or "
                         "pip install matplotlib)")
    modes = [m for m in MODE_TITLES if any(key[0] == m for key in series)]
    modes += sorted({key[0] for key in series} - set(modes))
    batches = sorted({key[2] for key in series})
    dims = sorted({key[4] for key in series})
    heads = sorted({key[3] for key in series})
    fig, axes = plt.subplots(len(modes), 2, figsize=(12, 4.5 * len(modes)), squeeze=False)
    for row, mode in enumerate(modes):
        ax_t, ax_m = axes[row]
        any_memory = False
        for key, pts in series.items():
            if key[0] != mode:
                continue
            _, method, B, H, D = key
            ok = [p for p in pts if p["status"] == "ok"]
            label = f"{method} B={B} D={D}" + (f" H={H}" if len(heads) > 1 else "")
            style = dict(color=COLORS.get(method, "black"), linestyle=STYLES[batches.index(B) % len(STYLES)],
                         marker=MARKERS[dims.index(D) % len(MARKERS)], markersize=4)
            for ax, field, scale in ((ax_t, "ms", 1.0), (ax_m, "peak_bytes", 1 / 2**20)):
                xy = [(p["T"], p[field] * scale) for p in ok if p[field]]
                if field == "peak_bytes" and xy:
                    any_memory = True
                if xy:
                    ax.plot([x for x, _ in xy], [y for _, y in xy], label=label, **style)
                for p in pts:
                    if p["status"] == "oom":
                        y = oom_mark(ok, p["T"], field, scale)
                        if y is not None:
                            ax.plot([p["T"]], [y], marker="X", markersize=11, color=style["color"],
                                    linestyle="none")
        ax_t.set_title(f"{MODE_TITLES.get(mode, mode)}: time per call")
        ax_t.set_ylabel("ms")
        ax_m.set_title(f"{MODE_TITLES.get(mode, mode)}: peak memory one call adds")
        ax_m.set_ylabel("MiB")
        if not any_memory:
            ax_m.text(0.5, 0.5, "memory not measured\n(CPU run, or no point ran)", ha="center", va="center",
                      transform=ax_m.transAxes)
        for ax in (ax_t, ax_m):
            ax.set_xlabel("sequence length T")
            if ax.lines:
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = ax_t.get_legend_handles_labels()
        if any(p["status"] == "oom" for key, pts in series.items() if key[0] == mode for p in pts):
            handles.append(Line2D([], [], marker="X", color="gray", linestyle="none", markersize=9))
            labels.append("out of memory")
        if handles:
            ax_t.legend(handles, labels, fontsize=7, loc="upper left")
    settings = header.get("settings", {})
    fig.suptitle(f"linac: time and memory against sequence length, H={','.join(map(str, heads))} "
                 f"{settings.get('dtype', '')}; {header.get('device', '?')}, torch {header.get('torch', '?')}, "
                 f"{header.get('date', '')}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON files written by tools/bench_poly_scaling.py")
    ap.add_argument("--out", default=str(REPO / "docs" / "poly_scaling.png"),
                    help="the PNG (default docs/poly_scaling.png)")
    ap.add_argument("--slope-min-t", type=int, default=4096, help="fit slopes over T >= this (default 4096)")
    args = ap.parse_args(argv)
    header, points = load(args.json)
    if not points:
        raise SystemExit("plot_scaling: error: the JSON holds no points")
    series = series_of(points)
    print(f"slopes of log(ms) and log(peak bytes) on log(T), over T >= {args.slope_min_t} "
          f"({header.get('device', '?')}):")
    print(f"{'mode':>6} {'method':>22} {'B':>2} {'H':>3} {'D':>3} {'points':>6} {'time slope':>10} "
          f"{'memory slope':>12}")
    for (mode, method, B, H, D), n, st, sm in line_slopes(series, args.slope_min_t):
        st_text = f"{st:.2f}" if st is not None else "n/a"
        sm_text = f"{sm:.2f}" if sm is not None else "n/a"
        print(f"{mode:>6} {method:>22} {B:>2} {H:>3} {D:>3} {n:>6} {st_text:>10} {sm_text:>12}")
    for p in points:
        if p["status"] in ("oom", "error"):
            print(f"  {p['method']} {p['mode']} B={p['B']} H={p['H']} D={p['D']} T={p['T']}: {p['status']} "
                  f"{p.get('detail', '')}")
    out = Path(args.out)
    draw(header, series, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
