"""``--plot FILE.png``: hit rate and pool utilisation over the replay (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

from kv_replay.replayer import ReplayResult


class PlotUnavailable(RuntimeError):
    pass


def plot(results: list[ReplayResult], path: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'kv-replay[plot]' (or pip install matplotlib)"
        ) from None
    fig, (hits, pools) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for result in results:
        steps = [s.step for s in result.samples]
        rate = [s.reused_tokens / s.prompt_tokens if s.prompt_tokens else 0.0 for s in result.samples]
        hits.plot(steps, rate, label=f"{result.backend}")
        pools.plot(steps, [s.utilization for s in result.samples], label=f"{result.backend}: in use")
        pools.plot(
            steps, [s.occupancy for s in result.samples], linestyle="--", label=f"{result.backend}: in use + cached"
        )
    hits.set_ylabel("cumulative hit rate")
    hits.set_ylim(0, 1)
    hits.legend(loc="lower right")
    pools.set_ylabel("pool utilisation")
    pools.set_ylim(0, 1.05)
    pools.set_xlabel("engine step")
    pools.legend(loc="lower right")
    fig.suptitle("kvcore replay")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
