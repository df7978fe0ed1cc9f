"""``kvcore replay``'s flags as one typed, frozen value, built once by ``kv_replay.cli`` from the
parsed command line, and the error that names the option at fault.

Each flag's own value is checked once, by its argparse type (``kv_replay.flag_types``,
``kv_replay.cli``); ``ReplayOptions`` checks only what no single flag says: the flags together.
Code that builds from the options raises ``OptionError`` with the field it was building from,
and the field's flag is spelt here, so no message is read back to find the flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kv_replay.model import Layers

__all__ = ["OptionError", "ReplayOptions", "flag"]

#: The fields whose flag is not ``--`` and the field's name with dashes.
_SPELLINGS = {"trace": "TRACE", "partial_reuse": "--no-partial-reuse"}


def flag(field: str) -> str:
    """How the command line spells an option: ``host_quota`` is ``--host-quota``."""
    return _SPELLINGS.get(field, "--" + field.replace("_", "-"))


class OptionError(ValueError):
    """A value the replay cannot take. ``field`` is the option at fault (a ``ReplayOptions``
    field; None when no option is), ``why`` the reason and ``shown`` the value as the message
    repeats it (``--quota 1P: ...``); the message is ``FLAG[ VALUE]: why``."""

    def __init__(self, field: str | None, why: str, shown: str | None = None) -> None:
        super().__init__(field, why, shown)
        self.field = field
        self.why = why
        self.shown = shown

    def __str__(self) -> str:
        if self.field is None:
            return self.why
        value = f" {self.shown}" if self.shown is not None else ""
        return f"{flag(self.field)}{value}: {self.why}"


@dataclass(frozen=True)
class ReplayOptions:
    """Every flag of ``kvcore replay``, each value as its flag's type made it."""

    trace: str | None  # a path or a built-in trace's name; None: the embedded workload
    backend: str | None  # None: $KV_BACKEND, else the default backend
    tokens_per_block: int
    quota: tuple[int, ...]  # device quotas, ascending: more than one is a sweep
    host_quota: tuple[int, ...] | None  # None: no host tier
    disk_quota: int | None  # None: no disk tier
    disk_path: str | None  # None: a temporary directory for the disk tier
    remote: str | None  # None: no remote tier; else a URL, "valkey" or "file:DIR" (kv_replay.remote_store)
    layers: Layers
    bytes_per_token: int
    max_in_flight: int
    seed: int
    limit: int | None
    instances: int
    router: tuple[str, ...] | None  # None: round-robin, when clustered
    partial_reuse: bool
    json: bool
    plot: str | None
    compare: bool
    publish: str | None  # an endpoint
    wait_subscribers: int
    quiet: bool
    progress: bool
    metrics_port: int | None = None  # None: no metrics endpoint; 0: a free port
    quota_curve: bool = False  # estimate the hit rate at every device quota from one replay

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> ReplayOptions:
        """The options of a parsed ``kvcore replay`` command line."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "partial_reuse"}
        values["quota"] = tuple(args.quota)
        values["host_quota"] = None if args.host_quota is None else tuple(args.host_quota)
        values["router"] = None if args.router is None else tuple(args.router)
        return cls(**values, partial_reuse=not args.no_partial_reuse)

    def __post_init__(self) -> None:
        self._check_tier_flags()
        self._check_remote_flags()
        self._check_publish_flags()
        self._check_curve_flags()

    @property
    def clustered(self) -> bool:
        """``--instances`` or ``--router``: a cluster of managers, one config on one backend."""
        return self.router is not None or self.instances > 1

    def _check_tier_flags(self) -> None:
        """The tier flags together, and with a cluster."""
        if self.disk_path is not None and self.disk_quota is None:
            raise OptionError("disk_path", "needs --disk-quota (there is no disk tier without a quota)")
        host_list = self.host_quota is not None and len(self.host_quota) > 1
        if self.clustered:
            for field, given in (("compare", self.compare), ("quota", len(self.quota) > 1)):
                if given:
                    raise OptionError(
                        field, "not with --instances/--router (a cluster replays one config on one backend)"
                    )
            if host_list:
                raise OptionError("host_quota", "not a list with --instances/--router (a cluster replays one config)")
        if len(self.quota) > 1 and host_list:
            raise OptionError(
                "host_quota", "a sweep varies one quota: give a list to --quota or to --host-quota, not both"
            )

    def _check_remote_flags(self) -> None:
        """Runs that share a store one after another would reuse each other's blocks."""
        if self.remote is None:
            return
        for what, given in (
            ("--compare", self.compare),
            ("a --quota list", len(self.quota) > 1),
            ("a --host-quota list", self.host_quota is not None and len(self.host_quota) > 1),
        ):
            if given:
                raise OptionError(
                    "remote", f"not with {what} (each run would reuse the blocks the runs before it stored)"
                )

    def _check_curve_flags(self) -> None:
        """``--quota-curve`` follows the device level of one manager of full-attention layers."""
        if not self.quota_curve:
            return
        for what, given in (
            ("--compare", self.compare),
            ("--host-quota", self.host_quota is not None),
            ("--disk-quota", self.disk_quota is not None),
            ("--remote", self.remote is not None),
            ("--instances", self.instances > 1),
            ("--router", self.router is not None),
            ("--publish", self.publish is not None),
        ):
            if given:
                raise OptionError(
                    "quota_curve", f"not with {what} (it estimates the device quota of one replay on one backend)"
                )
        if any(window is not None for _, window, _ in self.layers.groups):
            raise OptionError(
                "quota_curve",
                "full-attention layers only (sliding-window and SSM layers drop pages the estimate does not follow)",
            )

    def _check_publish_flags(self) -> None:
        """``--publish`` streams one manager's events: one replay, on one backend."""
        if self.wait_subscribers and self.publish is None:
            raise OptionError("wait_subscribers", "needs --publish (there is nothing to subscribe to without it)")
        if self.publish is None:
            return
        for what, given in (
            ("--compare", self.compare),
            ("a --quota list", len(self.quota) > 1),
            ("a --host-quota list", self.host_quota is not None and len(self.host_quota) > 1),
            ("--instances", self.instances > 1),
            ("--router", self.router is not None),
        ):
            if given:  # one manager's events on one endpoint: a sequence of managers would restart it
                raise OptionError("publish", f"not with {what} (it publishes the events of one replay on one backend)")
