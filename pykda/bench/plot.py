"""`--plot FILE.png`: a sweep drawn with matplotlib (the `plot` extra).

Two panels side by side: kernel µs (log scale) and TB/s, each against the swept setting (one
tick per setting, in the order the bench ran them), one solid line per shape; where a row carries
a peer's time for its shape, that peer is a dashed line of the shape's color (the peer does not
depend on pykda's template parameters, so it is flat), and the TB/s panel has the run's
device-to-device copy bandwidth as a grey dotted line. A setting that failed is a gap."""
from __future__ import annotations

import math
from typing import Callable, Sequence

MARKERS = "osD^v<>ph*"   # beside the colors where there are more than 10 lines
MISSING = "--plot needs matplotlib, the `plot` extra: pip install 'pykda[plot]' (or pip install matplotlib)"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """SystemExit naming the `plot` extra where matplotlib is not installed."""
    if not available():
        raise SystemExit(MISSING)


def _setting(value) -> str:
    return "auto" if value is None else str(value)


def _number(value) -> float:
    return float(value) if value else math.nan


def sweep(path: str, rows: Sequence[dict], params: Sequence[str], shape: Callable[[dict], str],
          peer: Callable[[dict], "tuple[str, float] | None"] = lambda row: None, title: str = ""):
    """Write the sweep in `rows` to `path` (PNG, or any format matplotlib knows by the suffix).

    Each row holds its settings under `params`, "us" and "tbs" (None where it failed) and, for the
    copy line, "pct_copy"; `shape(row)` names its line, `peer(row)` is (peer name, peer µs) or None.
    Returns the matplotlib Figure."""
    import matplotlib
    from matplotlib.figure import Figure   # no pyplot: no GUI backend, nothing global changed
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    varying = [p for p in params if len({row.get(p) for row in rows}) > 1] or list(params)
    ticks: list[tuple] = []
    lines: dict[str, dict] = {}
    for row in rows:
        setting = tuple(row.get(p) for p in varying)
        if setting not in ticks:
            ticks.append(setting)
        line = lines.setdefault(shape(row), dict(us={}, tbs={}, peer=None, bytes=None))
        us, tbs = _number(row.get("us")), _number(row.get("tbs"))
        line["us"][setting], line["tbs"][setting] = us, tbs
        if line["bytes"] is None and us == us and tbs == tbs:
            line["bytes"] = us * tbs   # bytes / 1e6: a peer's TB/s is this / its µs
        line["peer"] = line["peer"] or peer(row)
    copy = [row["tbs"] / row["pct_copy"] * 100 for row in rows if row.get("tbs") and row.get("pct_copy")]

    names = list(lines)
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20" if len(names) <= 20 else "turbo"]
    colors = [cmap(i) if cmap.N < 256 else cmap(i / max(1, len(names) - 1)) for i in range(len(names))]
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax_us, ax_tbs = fig.subplots(1, 2)
    x = list(range(len(ticks)))
    span = (-0.15, len(ticks) - 0.85)
    for i, (name, color) in enumerate(zip(names, colors)):
        line = lines[name]
        label = name if line["peer"] is None else f"{name}  (dashed: {line['peer'][0]})"
        style = dict(color=color, marker=MARKERS[i % len(MARKERS)] if len(names) > 10 else "o")
        ax_us.plot(x, [line["us"].get(t, math.nan) for t in ticks], "-", label=label, **style)
        ax_tbs.plot(x, [line["tbs"].get(t, math.nan) for t in ticks], "-", **style)
        if line["peer"] is not None:
            peer_us = line["peer"][1]
            ax_us.plot(span, [peer_us] * 2, "--", color=color)
            if line["bytes"] is not None:
                ax_tbs.plot(span, [line["bytes"] / peer_us] * 2, "--", color=color)
    if copy:
        ax_tbs.axhline(copy[0], color="grey", linestyle=":", label=f"device-to-device copy {copy[0]:.2f} TB/s")
        ax_tbs.legend(loc="best", fontsize="small")
    xlabel = " / ".join(p.replace("_", " ") for p in varying)
    for ax, ylabel in ((ax_us, "kernel µs (cold L2, median)"), (ax_tbs, "TB/s")):
        ax.set_xticks(x, ["/".join(_setting(v) for v in t) for t in ticks])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if any(v > 0 for line in lines.values() for v in line["us"].values()) or any(ln["peer"] for ln in lines.values()):
        ax_us.set_yscale("log")   # (a log axis of no data raises)
        ax_us.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))   # 10 20 50 100 ..., as plain numbers
        ax_us.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_us.yaxis.set_minor_formatter(NullFormatter())
    ax_tbs.set_ylim(bottom=0)
    ax_us.set_title("time: pykda solid, peer dashed")
    ax_tbs.set_title("bandwidth")
    if title:
        fig.suptitle(title)
    fig.legend(*ax_us.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    fig.savefig(path, dpi=120)
    return fig
