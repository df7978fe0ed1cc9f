"""``--plot FILE``: a replay step by step, or a quota sweep's capacity curve (needs matplotlib).

Figures are built with ``matplotlib.figure.Figure`` and saved through the Agg canvas, never
pyplot: no process-wide backend switch, no figure registry to leak figures into.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from kv_api.constants import ceil_div
from kv_replay.miss_report import REPLAY_REASONS
from kv_replay.plural import plural
from kv_replay.replay_result import ReplayResult
from kv_replay.sizes import format_size

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

T = TypeVar("T")

MAX_POINTS = 2000  # drawn per line: a real trace has ~100k steps, a screen ~1000 pixels across
DPI = 110
_DASHES: list[Any] = ["-", (0, (5, 3)), (0, (1, 2)), (0, (8, 3, 2, 3))]  # one per differing series
_WIDTHS = [2.6, 1.8, 1.4, 1.2]  # the first drawn widest, so lines drawn over it leave it visible


class PlotError(RuntimeError):
    """A ``--plot`` problem, message ready for the user and starting with ``--plot: ``."""


class PlotUnavailable(PlotError):
    """matplotlib cannot be imported."""


def _require_matplotlib() -> None:
    try:
        import matplotlib.backends.backend_agg  # noqa: F401  (the canvas every figure here is saved through)
    except ImportError:
        raise PlotUnavailable(
            "--plot: needs matplotlib: pip install 'kv-replay[plot]' (or pip install matplotlib)"
        ) from None


def _formats() -> list[str]:
    """File suffixes the Agg canvas can save here: matplotlib's list, less those whose helper is
    missing (pgf runs LaTeX; Pillow may be built without webp or avif). Saving would otherwise
    fail only after the whole replay."""
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import features

    usable = []
    for fmt in FigureCanvasAgg.get_supported_filetypes():
        if fmt == "pgf" and shutil.which(rcParams["pgf.texsystem"]) is None:
            continue
        if fmt in ("webp", "avif") and not features.check(fmt):
            continue
        usable.append(fmt)
    return sorted(usable)


def _format(path: Path) -> str:
    """The format its suffix names; given to savefig, which would otherwise save ``replay`` as
    ``replay.png``, a file the user did not name."""
    formats = _formats()
    fmt = path.suffix[1:].lower()
    if fmt not in formats:
        what = f"unknown image format {path.suffix!r}" if path.suffix else "no file type suffix"
        raise PlotError(f"--plot: cannot write {path}: {what}; use one of " + " ".join(f".{f}" for f in formats))
    return fmt


def check_output(path: str | Path) -> None:
    """Before a replay: ``PlotUnavailable`` without matplotlib, ``PlotError`` if ``path`` cannot
    be written (missing or unwritable directory, a directory, an unknown suffix). Writes nothing."""
    _require_matplotlib()
    target = Path(path)
    if target.is_dir():
        raise PlotError(f"--plot: {path} is a directory; name a file in it, e.g. {target / 'replay.png'}")
    where = target.parent
    if not where.exists():
        raise PlotError(f"--plot: cannot write {path}: directory {where} does not exist")
    if not where.is_dir():
        raise PlotError(f"--plot: cannot write {path}: {where} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise PlotError(f"--plot: cannot write {path}: permission denied")
    _format(target)


def group_identical(series: Mapping[str, Sequence[T]]) -> list[tuple[str, list[T]]]:
    """Series equal at every point, merged: ``{"cpp": a, "py": a, "x": b}`` gives
    ``[("cpp = py", a), ("x", b)]``, in order of first appearance."""
    groups: list[tuple[list[str], list[T]]] = []
    for name, values in series.items():
        for names, shared in groups:
            if shared == list(values):
                names.append(name)
                break
        else:
            groups.append(([name], list(values)))
    return [(" = ".join(names), values) for names, values in groups]


def thin(y: Sequence[float]) -> tuple[np.ndarray[Any, np.dtype[np.intp]], np.ndarray[Any, np.dtype[np.float64]]]:
    """The points of ``y`` (indexed 0, 1, ...) worth drawing: all of them up to ``MAX_POINTS``,
    else each bucket's lowest and highest, so peaks and dips survive; the last point always."""
    values = np.asarray(y, dtype=np.float64)
    n = len(values)
    if n <= MAX_POINTS:
        return np.arange(n), values
    width = ceil_div(n, MAX_POINTS // 2)
    buckets = ceil_div(n, width)
    # Padding repeats the last value after its real index: argmin/argmax, taking the first of
    # equal values, never pick the padding.
    grid = np.concatenate([values, np.full(buckets * width - n, values[-1])]).reshape(buckets, width)
    starts = np.arange(buckets) * width
    keep = np.unique(np.concatenate([starts + grid.argmin(axis=1), starts + grid.argmax(axis=1), [0, n - 1]]))
    return keep, values[keep]


def _percent(rate: float) -> str:
    return f"{rate:.2%}"


def _per_backend(values: Mapping[str, T], show: Callable[[T], str]) -> str:
    """``4.12%`` when every backend agrees, else ``cpp = py 4.12%, x 4.10%``."""
    groups = group_identical({name: [value] for name, value in values.items()})
    if len(groups) == 1:
        return show(groups[0][1][0])
    return ", ".join(f"{label} {show(value)}" for label, (value,) in groups)


def _hit_rate_limits(ax: Axes, highest: float) -> None:
    """0 at the bottom, headroom over the highest value (an axis fixed at 100% flattens a 4% curve)."""
    from matplotlib.ticker import PercentFormatter

    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    if highest <= 0:
        ax.set_ylim(0, 0.01)
        ax.text(0.5, 0.5, "no prefix reuse", transform=ax.transAxes, ha="center", va="center", color="0.4")
    else:
        ax.set_ylim(0, min(highest * 1.15, 1.05))


def _legend_outside(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:  # a panel with nothing drawn (no prompt yet) has none
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def _new_figure(height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> None:
    fmt = _format(Path(path))
    try:
        fig.savefig(path, format=fmt, dpi=DPI)
    except OSError as exc:
        raise PlotError(f"--plot: cannot write {path}: {exc.strerror or exc}") from exc


def _first(label: str) -> str:
    """The first backend of a ``group_identical`` label."""
    return label.split(" = ")[0]


def _backends(names: Sequence[str]) -> str:
    return ("backend " if len(names) == 1 else "backends ") + ", ".join(names)


def _colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per backend, the same in every panel; a merged series takes its first backend's."""
    return {name: f"C{i}" for i, name in enumerate(names)}


def replay_figure(
    results: list[ReplayResult], *, trace: str, quota: int, tokens_per_block: int, detail: str = ""
) -> Figure:
    """The figure ``plot_replay`` saves."""
    _require_matplotlib()
    from matplotlib.ticker import PercentFormatter, StrMethodFormatter

    names = [r.backend for r in results]
    colour = _colours(names)
    hit_rate: dict[str, list[float]] = {}
    in_use: dict[str, list[float]] = {}
    cached: dict[str, list[float]] = {}
    final: dict[str, float] = {}
    for r in results:
        prompt = np.array([s.prompt_tokens for s in r.samples], dtype=np.float64)
        reused = np.array([s.reused_tokens for s in r.samples], dtype=np.float64)
        hit_rate[r.backend] = np.divide(reused, prompt, out=np.zeros_like(prompt), where=prompt > 0).tolist()
        in_use[r.backend] = [s.utilization for s in r.samples]
        cached[r.backend] = [s.occupancy for s in r.samples]
        final[r.backend] = hit_rate[r.backend][-1] if r.samples else 0.0

    fig = _new_figure(9.5)
    hits, pools, why = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 3])
    curves = group_identical(hit_rate)
    for i, (label, values) in enumerate(curves):
        x, y = thin(values)  # x: the engine step, as the replayer samples once a step from step 0
        hits.plot(
            x,
            y,
            color=colour[_first(label)],
            linestyle=_DASHES[i % len(_DASHES)],
            linewidth=_WIDTHS[i % len(_WIDTHS)],
            label=label,
        )
    _hit_rate_limits(hits, max((max(v, default=0.0) for v in hit_rate.values()), default=0.0))
    hits.set_ylabel("cumulative hit rate")
    hits.set_title(
        "share of prompt tokens reused from the cache (rejected requests count as misses)",
        loc="left",
        fontsize="medium",
    )

    # Thinner than the hit rate: utilisation jumps every step and thick lines merge into a block.
    for metric, series, dash in (("in use", in_use, "-"), ("in use + cached", cached, ":")):
        for i, (label, values) in enumerate(group_identical(series)):
            x, y = thin(values)
            pools.plot(
                x,
                y,
                color=colour[_first(label)],
                linestyle=dash,
                linewidth=_WIDTHS[i % len(_WIDTHS)] / 2,
                label=f"{label}: {metric}",
            )
    pools.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    pools.set_ylim(0, 1.05)  # a share of the pool: full scale shows how close it came to full
    pools.set_ylabel("pool utilisation")
    _reasons(why, results[0], len(results) > 1)
    why.set_xlabel("engine step")
    why.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    pools.set_xlim(left=0)
    for ax in (hits, pools, why):
        ax.grid(alpha=0.3)
        _legend_outside(ax)

    fig.suptitle(
        f"kvcore replay: {trace}\n{_backends(names)}  ·  quota {format_size(quota)}"
        f"  ·  {plural(tokens_per_block, 'token')}/block  ·  hit rate {_per_backend(final, _percent)}"
        + (f"\n{detail}" if detail else "")
    )
    return fig


def reasons_by_step(result: ReplayResult) -> tuple[list[str], np.ndarray[Any, np.dtype[np.float64]]]:
    """``reused`` and each miss reason that has tokens, and per step (columns) each one's share
    of the prompt tokens counted so far (a request counts when it first starts, or is rejected)."""
    names = ["reused", *REPLAY_REASONS]
    tokens = np.zeros((len(names), max(result.steps, 1)))
    for record in result.records:
        if record.step < 0:
            continue
        tokens[0, record.step] += record.reused_tokens
        tokens[1 : 1 + len(record.misses), record.step] += record.misses
        if record.rejected:
            tokens[-1, record.step] += record.prompt_tokens
    counted = np.cumsum(tokens, axis=1)
    total = counted.sum(axis=0)
    shares = np.divide(counted, total, out=np.zeros_like(counted), where=total > 0)
    keep = [i for i in range(len(names)) if counted[i, -1] > 0]
    return [names[i].replace("_", " ") for i in keep], shares[keep]


def _reasons(ax: Axes, result: ReplayResult, several: bool) -> None:
    """Why prompt tokens missed, so far, as shares stacked on the reused ones."""
    from matplotlib.ticker import PercentFormatter

    names, shares = reasons_by_step(result)
    steps = np.unique(np.linspace(0, shares.shape[1] - 1, min(shares.shape[1], MAX_POINTS)).astype(np.intp))
    if names:
        ax.stackplot(steps, shares[:, steps], labels=names, colors=[f"C{i}" for i in range(len(names))], alpha=0.8)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of prompt tokens")
    whose = f" ({result.backend})" if several else ""
    ax.set_title(f"reused, or why not: every prompt so far{whose}", loc="left", fontsize="medium")


def plot_replay(
    results: list[ReplayResult], path: str | Path, *, trace: str, quota: int, tokens_per_block: int, detail: str = ""
) -> None:
    """Cumulative hit rate and pool utilisation (in use, and in use + cached) per engine step,
    one ``ReplayResult`` per backend; identical backends are drawn once, as ``cpp = py``.
    ``detail`` (the model and quotas) is the title's last line."""
    fig = replay_figure(results, trace=trace, quota=quota, tokens_per_block=tokens_per_block, detail=detail)
    _save(fig, path)


def capacity_figure(
    points: dict[str, list[tuple[int, float]]],
    unbounded: dict[str, float],
    *,
    trace: str,
    tokens_per_block: int,
    xlabel: str = "device quota",
    detail: str = "",
    floor: int = 0,
) -> Figure:
    """The figure ``plot_capacity`` saves."""
    _require_matplotlib()
    from matplotlib.ticker import NullLocator

    colour = _colours([*points, *(n for n in unbounded if n not in points)])
    fig = _new_figure(6.0)
    ax = fig.subplots()
    highest = max([rate for curve in points.values() for _, rate in curve] + list(unbounded.values()), default=0.0)
    _hit_rate_limits(ax, highest)
    bottom_band = ax.get_ylim()[1] * 0.06
    curves = group_identical(points)
    for i, (label, curve) in enumerate(curves):
        quotas = [q for q, _ in curve]
        rates = [rate for _, rate in curve]
        style = {
            "color": colour[_first(label)],
            "linestyle": _DASHES[i % len(_DASHES)],
            "linewidth": _WIDTHS[i % len(_WIDTHS)],
        }
        ax.plot(quotas, rates, marker="o", label=label, **style)
        if len(curves) == 1:  # values on several curves' points would collide
            for q, rate in curve:
                # Below right, clear of a curve that rises to the right and of the unbounded line
                # above it; above right near the bottom, clear of the tick labels.
                offset = (7, -12) if rate > bottom_band else (7, 5)
                ax.annotate(_percent(rate), (q, rate), textcoords="offset points", xytext=offset, fontsize="small")
    for label, (rate,) in group_identical({name: [rate] for name, rate in unbounded.items()}):
        ax.axhline(
            rate,
            color=colour[_first(label)],
            linestyle=(0, (6, 4)),
            linewidth=1.2,
            alpha=0.7,
            label=f"{label}: unbounded cache, {_percent(rate)}",
        )

    quotas = sorted({q for curve in points.values() for q, _ in curve})
    if floor and quotas and floor > quotas[0]:
        ax.axvline(floor, color="grey", linestyle=":", label="peak in use: below it, requests wait (a rough estimate)")
    ax.set_xscale("log", base=2)
    if quotas:
        ax.set_xticks(quotas, [format_size(q) for q in quotas])
        ax.set_xlim(quotas[0] / 1.5, quotas[-1] * 1.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("hit rate")
    ax.grid(alpha=0.3)
    _legend_outside(ax)

    fig.suptitle(
        f"kvcore replay capacity curve: {trace}\n{_backends(list(points))}  ·  {plural(tokens_per_block, 'token')}/block"
        f"  ·  unbounded hit rate {_per_backend(unbounded, _percent)}" + (f"\n{detail}" if detail else "")
    )
    return fig


def plot_capacity(
    points: dict[str, list[tuple[int, float]]],
    unbounded: dict[str, float],
    path: str | Path,
    *,
    trace: str,
    tokens_per_block: int,
    xlabel: str = "device quota",
    detail: str = "",
    floor: int = 0,
) -> None:
    """Hit rate against the swept quota (log axis labelled in sizes; ``xlabel`` names it), one
    series per backend (``points``: backend -> [(quota bytes, hit rate)], sorted by quota), with
    each backend's unbounded-cache hit rate as a horizontal reference line; a ``floor`` quota
    (``--quota-curve``'s peak in use) as a vertical one."""
    fig = capacity_figure(
        points, unbounded, trace=trace, tokens_per_block=tokens_per_block, xlabel=xlabel, detail=detail, floor=floor
    )
    _save(fig, path)


def _spread(count: int, width: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    """``count`` offsets across a bar of ``width`` (its middle for one): instances of equal hit
    rate stay apart instead of drawing one dot."""
    half = width * 0.4
    return np.linspace(-half, half, count) if count > 1 else np.zeros(count)


def routers_figure(
    reports: Sequence[Mapping[str, Any]], *, trace: str, tokens_per_block: int, detail: str = ""
) -> Figure:
    """The cluster hit rate per router (bars; the value in the router's tick label), each
    instance's as a dot across its bar. No label lies over the data: the values sit under the
    axis, the legend right of it, and the axis reaches the highest instance too."""
    _require_matplotlib()
    fig = _new_figure(4.5)
    ax = fig.add_subplot()
    names = [str(r["router"]) for r in reports]
    rates = [float(r["hit_rate"]) for r in reports]
    per = [[float(inst["hit_rate"]) for inst in r["per_instance"]] for r in reports]
    width = 0.6
    positions = np.arange(len(names), dtype=np.float64)
    ax.bar(positions, rates, width=width, color=[f"C{i}" for i in range(len(names))], label="the cluster (bar)")
    for i, rates_i in enumerate(per):
        # Not clipped: a dot at 0 would show half, under the axis line.
        ax.plot(
            i + _spread(len(rates_i), width),
            rates_i,
            "k.",
            clip_on=False,
            zorder=3,
            label="one instance" if i == 0 else None,
        )
    ax.set_xticks(positions, [f"{name}\n{_percent(rate)}" for name, rate in zip(names, rates, strict=True)])
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("hit rate (reused / prompt tokens)")
    _hit_rate_limits(ax, max([*rates, *(rate for rates_i in per for rate in rates_i), 0.0]))
    ax.grid(axis="y", alpha=0.3)
    _legend_outside(ax)
    instances = plural(int(reports[0]["instances"]), "instance") if reports else "no instances"
    backend = f"backend {reports[0]['backend']}  ·  " if reports and "backend" in reports[0] else ""
    fig.suptitle(
        f"kvcore replay, hit rate by router: {trace}\n{backend}{instances}  ·  {plural(tokens_per_block, 'token')}/block"
        + (f"\n{detail}" if detail else "")
    )
    return fig


def plot_routers(
    reports: Sequence[Mapping[str, Any]], path: str | Path, *, trace: str, tokens_per_block: int, detail: str = ""
) -> None:
    _save(routers_figure(reports, trace=trace, tokens_per_block=tokens_per_block, detail=detail), path)
