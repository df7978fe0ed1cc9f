"""``--plot``: the output check made before a replay, what the figures show, and the files they make."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_replay.model import model_config
from kv_replay.plot import (
    MAX_POINTS,
    PlotError,
    PlotUnavailable,
    capacity_figure,
    check_output,
    group_identical,
    plot_capacity,
    plot_replay,
    replay_figure,
    routers_figure,
    thin,
)
from kv_replay.plural import plural
from kv_replay.replay_result import ReplayResult, RequestRecord, Sample
from kv_replay.replayer import Replayer
from kv_replay.trace import Request, synthetic_tokens

PNG = b"\x89PNG\r\n\x1a\n"
QUOTA = 128 << 20

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")


@pytest.fixture
def blank(backends: list[kv_api.Backend]) -> ReplayResult:
    """A real (empty) replay's result, for ``dataclasses.replace`` to fill in."""
    return Replayer(backends[0], model_config("1", 16, 2 << 20, 256), 4).run([])


def synthetic(blank: ReplayResult, name: str, rates: list[float], *, util: float = 0.5) -> ReplayResult:
    """A result whose cumulative hit rate is ``rates[step]`` and whose summary hit rate is the last one."""
    prompt = 100_000
    samples = [
        Sample(
            step=i,
            completed=i,
            prompt_tokens=prompt,
            reused_tokens=round(rate * prompt),
            utilization=util,
            occupancy=min(1.0, util + 0.3),
        )
        for i, rate in enumerate(rates)
    ]
    records = [RequestRecord(prompt, 1, reused_tokens=round(rates[-1] * prompt))]
    return dataclasses.replace(blank, backend=name, records=records, samples=samples)


def replay_on(backend: kv_api.Backend) -> ReplayResult:
    """A tiny real replay with reuse: three requests sharing a 64-token prefix."""
    shared = synthetic_tokens(0, 64)
    requests = [
        Request(np.concatenate([shared, synthetic_tokens(i + 1, 20)]).astype(np.int32), synthetic_tokens(9, 3))
        for i in range(3)
    ]
    return Replayer(backend, model_config("2", 16, 2 << 20, 256), 1).run(requests)


def hit_axes(fig: Any) -> Any:
    return fig.axes[0]


def labels(ax: Any) -> list[str]:
    return [line.get_label() for line in ax.get_lines()]


# -- check_output ------------------------------------------------------------------------------


@needs_matplotlib
@pytest.mark.parametrize("name", ["replay.png", "replay.svg", "replay.pdf", "replay.jpg", "REPLAY.PNG"])
def test_check_output_accepts_a_writable_image_and_writes_nothing(tmp_path: Path, name: str) -> None:
    check_output(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


@needs_matplotlib
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("missing/replay.png", "does not exist"),
        (".", "is a directory"),
        ("replay.txt", "unknown image format '.txt'"),
        ("replay", "no file type suffix"),
    ],
)
def test_check_output_rejects_what_cannot_be_written(tmp_path: Path, name: str, says: str) -> None:
    with pytest.raises(PlotError) as caught:
        check_output(tmp_path / name)
    message = str(caught.value)
    assert message.startswith("--plot: ") and says in message and "\n" not in message
    assert not isinstance(caught.value, PlotUnavailable)
    assert list(tmp_path.iterdir()) == []


@needs_matplotlib
def test_check_output_names_the_formats_it_accepts(tmp_path: Path) -> None:
    with pytest.raises(PlotError, match=r"use one of .*\.pdf .*\.png .*\.svg"):
        check_output(tmp_path / "replay.xyz")


@needs_matplotlib
def test_check_output_rejects_a_file_as_the_directory(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("")
    with pytest.raises(PlotError, match=r"^--plot: .*notes is not a directory"):
        check_output(tmp_path / "notes" / "replay.png")


@needs_matplotlib
def test_check_output_rejects_an_unwritable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.access(locked, os.W_OK):
        pytest.skip("this process may write anywhere (root with CAP_DAC_OVERRIDE)")
    with pytest.raises(PlotError, match=r"^--plot: .*permission denied"):
        check_output(locked / "replay.png")
    assert list(locked.iterdir()) == []


def test_without_matplotlib_every_entry_point_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    calls: list[Callable[[], None]] = [
        lambda: check_output(tmp_path / "x.png"),
        lambda: plot_replay([], tmp_path / "x.png", trace="t", quota=QUOTA, tokens_per_block=32),
        lambda: plot_capacity({}, {}, tmp_path / "x.png", trace="t", tokens_per_block=32),
    ]
    for call in calls:
        with pytest.raises(PlotUnavailable) as caught:
            call()
        message = str(caught.value)
        assert message.startswith("--plot: ") and "pip install 'kv-replay[plot]'" in message
    assert list(tmp_path.iterdir()) == []


# -- grouping and thinning ---------------------------------------------------------------------


def test_group_identical_merges_equal_series_only() -> None:
    a, b = [0.1, 0.2, 0.3], [0.1, 0.2, 0.31]
    assert group_identical({"cpp": a, "py": list(a)}) == [("cpp = py", a)]
    assert group_identical({"cpp": a, "py": b}) == [("cpp", a), ("py", b)]
    assert group_identical({"cpp": a, "x": b, "py": a}) == [("cpp = py", a), ("x", b)]
    assert group_identical({"cpp": a, "x": b, "py": a, "y": b}) == [("cpp = py", a), ("x = y", b)]
    assert group_identical({"cpp": a, "py": a[:-1]}) == [("cpp", a), ("py", a[:-1])]  # a prefix is not equal
    assert group_identical({}) == []


def test_thin_keeps_short_series_and_the_shape_of_long_ones() -> None:
    x, y = thin([0.1, 0.5, 0.2])
    assert x.tolist() == [0, 1, 2] and y.tolist() == [0.1, 0.5, 0.2]

    rng = np.random.default_rng(0)
    values = rng.uniform(0.4, 0.6, 100_003)
    values[12_345], values[77_777] = 1.0, 0.0  # a peak and a dip that stride sampling would miss
    x, y = thin(values.tolist())
    assert len(x) <= MAX_POINTS + 2
    assert (np.diff(x) > 0).all() and (values[x] == y).all()
    assert {0, 12_345, 77_777, 100_002} <= set(x.tolist())


# -- the per-step figure -------------------------------------------------------------------------


@needs_matplotlib
def test_replay_title_and_hit_rate_axis_follow_the_data(blank: ReplayResult) -> None:
    rates = [0.0, 0.01, 0.03, 0.04, 0.035]
    fig = replay_figure([synthetic(blank, "cpp", rates)], trace="mooncake-synthetic", quota=QUOTA, tokens_per_block=32)
    title = fig.get_suptitle()
    for part in ("mooncake-synthetic", "cpp", "128M", "32 tokens/block", "hit rate 3.50%"):
        assert part in title
    ax = hit_axes(fig)
    bottom, top = ax.get_ylim()
    assert bottom == 0 and 0.04 < top < 0.10  # not a fixed 0-1 axis
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") for t in ticks)


@needs_matplotlib
def test_an_all_zero_hit_rate_gets_a_small_axis_and_a_note(blank: ReplayResult) -> None:
    fig = replay_figure([synthetic(blank, "cpp", [0.0] * 5)], trace="t", quota=QUOTA, tokens_per_block=32)
    ax = hit_axes(fig)
    assert ax.get_ylim() == (0.0, 0.01)
    assert "no prefix reuse" in [t.get_text() for t in ax.texts]


@needs_matplotlib
def test_legends_lie_outside_the_data(blank: ReplayResult) -> None:
    fig = replay_figure([synthetic(blank, "cpp", [0.2, 0.9, 1.0])], trace="t", quota=QUOTA, tokens_per_block=32)
    fig.canvas.draw()
    drawn = [ax for ax in fig.axes if ax.get_legend_handles_labels()[0]]  # no records: no reasons panel
    assert fig.axes[:2] == drawn
    for ax in drawn:
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
        assert legend.get_window_extent().x1 <= fig.bbox.x1  # and not cut off


@needs_matplotlib
def test_identical_backends_are_drawn_once_and_named_together(backends: list[kv_api.Backend]) -> None:
    results = [replay_on(b) for b in backends]
    assert results[0].records[1].reused_tokens > 0  # the figure has reuse to show
    fig = replay_figure(results, trace="t", quota=2 << 20, tokens_per_block=16)
    together = " = ".join(b.name for b in backends)
    assert labels(hit_axes(fig)) == [together]
    assert labels(fig.axes[1]) == [f"{together}: in use", f"{together}: in use + cached"]


@needs_matplotlib
def test_differing_backends_are_drawn_distinctly(blank: ReplayResult) -> None:
    same = [0.01, 0.02, 0.04]
    results = [
        synthetic(blank, "cpp", same),
        synthetic(blank, "x", [0.01, 0.02, 0.03], util=0.6),
        synthetic(blank, "py", same),
    ]
    fig = replay_figure(results, trace="t", quota=QUOTA, tokens_per_block=32)
    lines = hit_axes(fig).get_lines()
    assert [line.get_label() for line in lines] == ["cpp = py", "x"]
    assert lines[0].get_color() != lines[1].get_color()
    assert lines[0].get_linestyle() != lines[1].get_linestyle()
    assert labels(fig.axes[1]) == ["cpp = py: in use", "x: in use", "cpp = py: in use + cached", "x: in use + cached"]
    assert "hit rate cpp = py 4.00%, x 3.00%" in fig.get_suptitle()


@needs_matplotlib
def test_a_long_replay_is_thinned_for_drawing(blank: ReplayResult) -> None:
    rates = np.linspace(0.0, 0.05, 100_000).tolist()
    fig = replay_figure([synthetic(blank, "cpp", rates)], trace="t", quota=QUOTA, tokens_per_block=32)
    for ax in fig.axes:
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata())
            assert len(x) <= MAX_POINTS + 2 and x[-1] == 99_999


@needs_matplotlib
def test_plot_replay_writes_a_png(tmp_path: Path, backends: list[kv_api.Backend]) -> None:
    path = tmp_path / "replay.png"
    plot_replay([replay_on(b) for b in backends], path, trace="t", quota=2 << 20, tokens_per_block=16)
    assert path.read_bytes()[:8] == PNG


@needs_matplotlib
@pytest.mark.parametrize(
    ("name", "says"),
    [("missing/x.png", "No such file"), ("x.xyz", "xyz"), ("dir.png", "Is a directory"), ("x", "no file type suffix")],
)
def test_a_failed_save_is_a_plot_error(tmp_path: Path, blank: ReplayResult, name: str, says: str) -> None:
    (tmp_path / "dir.png").mkdir()
    result = synthetic(blank, "cpp", [0.1])
    with pytest.raises(PlotError, match=r"^--plot: cannot write ") as caught:
        plot_replay([result], tmp_path / name, trace="t", quota=QUOTA, tokens_per_block=32)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(PlotError, match=r"^--plot: cannot write "):
        plot_capacity({"cpp": [(QUOTA, 0.1)]}, {"cpp": 0.2}, tmp_path / name, trace="t", tokens_per_block=32)
    assert [p.name for p in tmp_path.iterdir()] == ["dir.png"]  # nothing saved under another name


# -- the capacity curve --------------------------------------------------------------------------

SWEEP = [256 << 20, 1 << 30, 4 << 30, 16 << 30]


@needs_matplotlib
def test_capacity_curve_axes_title_and_reference_line() -> None:
    points = {name: [(q, r) for q, r in zip(SWEEP, [0.01, 0.02, 0.03, 0.035], strict=True)] for name in ("cpp", "py")}
    fig = capacity_figure(points, {"cpp": 0.04, "py": 0.04}, trace="mooncake-synthetic", tokens_per_block=32)
    ax = fig.axes[0]
    title = fig.get_suptitle()
    for part in ("mooncake-synthetic", "cpp", "py", "32 tokens/block", "unbounded hit rate 4.00%"):
        assert part in title
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["256M", "1G", "4G", "16G"]
    assert 0.04 < ax.get_ylim()[1] < 0.10 and ax.get_ylim()[0] == 0
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["cpp = py", "cpp = py: unbounded cache, 4.00%"]
    assert np.asarray(lines[1].get_ydata()).tolist() == [0.04, 0.04]  # horizontal


@needs_matplotlib
def test_capacity_curve_separates_differing_backends() -> None:
    points = {
        "cpp": [(q, 0.01 * i) for i, q in enumerate(SWEEP)],
        "x": [(q, 0.009 * i) for i, q in enumerate(SWEEP)],
        "py": [(q, 0.01 * i) for i, q in enumerate(SWEEP)],
    }
    fig = capacity_figure(points, {"cpp": 0.05, "x": 0.045, "py": 0.05}, trace="t", tokens_per_block=32)
    assert labels(fig.axes[0]) == [
        "cpp = py",
        "x",
        "cpp = py: unbounded cache, 5.00%",
        "x: unbounded cache, 4.50%",
    ]
    assert "unbounded hit rate cpp = py 5.00%, x 4.50%" in fig.get_suptitle()


@needs_matplotlib
def test_plot_capacity_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "capacity.png"
    plot_capacity({"cpp": [(q, 0.01) for q in SWEEP]}, {"cpp": 0.02}, path, trace="t", tokens_per_block=32)
    assert path.read_bytes()[:8] == PNG


# -- the hit rate per router ---------------------------------------------------------------------


def router_report(name: str, cluster: float, instances: list[float]) -> dict[str, Any]:
    per = [{"hit_rate": rate} for rate in instances]
    return {"backend": "cpp", "router": name, "hit_rate": cluster, "instances": len(per), "per_instance": per}


@needs_matplotlib
@pytest.mark.parametrize(
    "reports",
    [
        # Instances above the cluster's rate (where its value once sat), several alike, one router.
        [
            router_report("round-robin", 0.0063, [0.0, 0.018, 0.0035, 0.0]),
            router_report("kv", 0.0054, [0.0195, 0, 0, 0]),
        ],
        [router_report("kv", 0.5, [0.5, 0.5])],
        [router_report(name, 0.1 * i, [0.1 * i] * 8) for i, name in enumerate(["round-robin", "kv", "dynamo"])],
    ],
)
def test_the_router_figure_labels_overlap_nothing(reports: list[dict[str, Any]]) -> None:
    fig = routers_figure(reports, trace="mooncake-synthetic", tokens_per_block=32, detail="4 layers  ·  device 32M")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    (ax,) = fig.axes
    inside = ax.get_window_extent(renderer)
    assert [t.get_text() for t in ax.texts] == []  # no value drawn over the bars and dots
    legend = ax.get_legend()
    assert legend is not None and not legend.get_window_extent(renderer).overlaps(inside)
    labels = [t for t in [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label] if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels] + [legend.get_window_extent(renderer)]
    (title_text,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
    boxes.append(title_text.get_window_extent(renderer))
    for i, a in enumerate(boxes):
        assert fig.bbox.contains(a.x0, a.y0) and fig.bbox.contains(a.x1, a.y1)  # not cut off
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # Each router's tick names it and its cluster hit rate; every instance is a dot of its own,
    # inside the axis.
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{r['router']}\n{r['hit_rate']:.2%}" for r in reports]
    top = ax.get_ylim()[1]
    for i, (line, report) in enumerate(zip(ax.get_lines(), reports, strict=True)):
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert len(set(x.tolist())) == len(report["per_instance"]) and all(abs(x - i) < 0.3)
        assert y.tolist() == [inst["hit_rate"] for inst in report["per_instance"]] and max(y) < top
    title = fig.get_suptitle()
    assert f"\nbackend cpp  ·  {plural(reports[0]['instances'], 'instance')}  ·  32 tokens/block\n" in title
    assert title.endswith("\n4 layers  ·  device 32M")
