"""`kvcore replay`'s flags as one frozen `ReplayOptions`, and errors that carry the option at
fault (its field), so that the command names the flag without reading a message back."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import kv_api
from kv_api import DiskCacheTierConfig, GpuCacheTierConfig, HostCacheTierConfig
from kv_api.capabilities import Capabilities
from kv_replay.cli import parser
from kv_replay.model import ModelError, model_config
from kv_replay.options import OptionError, ReplayOptions, flag
from kv_replay.replay_command import check_tiers
from kv_replay.replayer import Replayer
from kv_replay.tier_errors import TierError

PETABYTE = 1 << 50  # more address space than a machine has, as test_replay_errors assumes too


def options(*argv: str) -> ReplayOptions:
    return ReplayOptions.from_flags(parser().parse_args(["replay", *argv]))


def test_the_options_are_one_frozen_value() -> None:
    o = options("--quota", "2M,1M", "--layers", "2, 1x64", "--no-partial-reuse")
    assert o.quota == (1 << 20, 2 << 20) and o.host_quota is None and not o.partial_reuse
    assert (o.layers.spec, o.layers.groups, o.layers.count) == ("2,1x64", ((2, None, None), (1, 64, None)), 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.quota = (1,)  # type: ignore[misc]
    assert hash(o) == hash(options("--quota", "1M,2M", "--layers", "2,1x64", "--no-partial-reuse"))
    assert options("--router", "kv,round-robin,kv").router == ("kv", "round-robin")


def test_every_field_spells_a_flag_of_the_replay() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    spelt = {s for action in sub.choices["replay"]._actions for s in action.option_strings}
    for field in dataclasses.fields(ReplayOptions):
        if field.name != "trace":  # the positional TRACE
            assert flag(field.name) in spelt, field.name


@pytest.mark.parametrize(
    ("argv", "field", "message"),
    [
        (["--disk-path", "."], "disk_path", "--disk-path: needs --disk-quota"),
        (["--instances", "2", "--compare"], "compare", "--compare: not with --instances/--router"),
        (["--router", "kv", "--host-quota", "1M,2M"], "host_quota", "--host-quota: not a list with"),
        (["--quota", "1M,2M", "--host-quota", "1M,2M"], "host_quota", "--host-quota: a sweep varies one quota"),
        (["--wait-subscribers", "1"], "wait_subscribers", "--wait-subscribers: needs --publish"),
        (["--publish", "tcp://127.0.0.1:*", "--quota", "1M,2M"], "publish", "--publish: not with a --quota list"),
    ],
)
def test_flags_that_do_not_go_together_name_the_field(argv: list[str], field: str, message: str) -> None:
    with pytest.raises(OptionError) as caught:
        options(*argv)
    assert caught.value.field == field and str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "message"),
    [
        (("1", 4, 1 << 20, 0), {}, "bytes_per_token", "--bytes-per-token: must be in [1, "),
        (("1", 1 << 20, 1 << 20, 1), {}, "tokens_per_block", "--tokens-per-block: must be in [1, "),
        (("4x", 4, 1 << 20, 64), {}, "layers", "--layers: bad group '4x'"),
        (("1", 4, 0, 64), {}, "quota", "--quota: must be in [1, 9223372036854775808) (got 0)"),
        (
            ("1", 4, 1 << 20, 64),
            {"host_quota": 0},
            "host_quota",
            "--host-quota: must be in [1, 9223372036854775808) (got 0)",
        ),
        (("1", 4, 1 << 20, 64), {"disk_quota": 1, "disk_path": "/nonexistent"}, "disk_path", "--disk-path: must be"),
        (("1", 4, 1 << 20, 64), {"pool_ratio": [0.5]}, None, "KVCacheManagerConfig.initial_pool_ratio: "),
    ],
)
def test_a_config_field_kv_api_refuses_names_the_option_it_came_from(
    args: tuple[str, int, int, int], kwargs: dict[str, Any], field: str | None, message: str
) -> None:
    with pytest.raises(ModelError) as caught:
        model_config(*args, **kwargs)
    assert caught.value.field == field and str(caught.value).startswith(message), str(caught.value)


def test_a_missing_tier_names_its_field() -> None:
    bare = cast(kv_api.Backend, SimpleNamespace(name="bare", capabilities=Capabilities()))
    with pytest.raises(ModelError) as caught:
        check_tiers(options("--host-quota", "1M"), [bare])
    assert caught.value.field == "host_quota"


@pytest.mark.parametrize(
    ("quota", "host_quota", "level"),
    [
        (PETABYTE, None, GpuCacheTierConfig),
        (PETABYTE, 1 << 20, GpuCacheTierConfig),
        (2 << 20, PETABYTE, HostCacheTierConfig),
    ],
)
def test_memory_that_cannot_be_mapped_names_its_level(
    backend: kv_api.Backend, quota: int, host_quota: int | None, level: type
) -> None:
    if host_quota is not None and not backend.capabilities.host_tier:
        pytest.skip(f"backend {backend.name!r} has no host tier")
    config = model_config("1", 4, quota, 64, host_quota=host_quota)
    with pytest.raises(TierError) as caught:
        Replayer(backend, config, 1)
    assert isinstance(caught.value.tier, level) and caught.value.field == "quota"
    assert isinstance(caught.value.error, kv_api.errors.HostOOMError)


@pytest.mark.requires("disk_tier")
def test_a_disk_tier_names_its_directory_or_its_size(backend: kv_api.Backend, tmp_path: Path) -> None:
    """A directory no file can be created in (``/proc``, even for root) is the path's fault;
    files too large for the file system are the quota's."""
    config = model_config("1", 4, 2 << 20, 64, disk_quota=1 << 20, disk_path="/proc")
    with pytest.raises(TierError) as caught:
        Replayer(backend, config, 1)
    assert isinstance(caught.value.tier, DiskCacheTierConfig) and caught.value.field == "path"
    config = model_config("1", 4, 2 << 20, 64, disk_quota=PETABYTE, disk_path=str(tmp_path))
    try:
        Replayer(backend, config, 1).manager.shutdown()
    except TierError as exc:
        assert isinstance(exc.tier, DiskCacheTierConfig) and exc.field == "quota"
    else:
        pytest.skip("this file system takes a sparse file of 1 PiB")


def test_a_replay_commits_no_page_memory(backend: kv_api.Backend) -> None:
    """The replay's manager does not populate its pools (nothing writes a page): 200 blocks of
    16 MiB handed out would be 3.2 GiB committed; the replay's peak stays far below."""
    from kv_replay.synthetic import synthetic_tokens
    from kv_replay.trace import Request

    config = model_config("4", 32, 8 << 30, 1 << 16)
    assert not config.populate_memory
    requests = [Request(synthetic_tokens(i, 320), synthetic_tokens(100 + i, 8)) for i in range(20)]
    result = Replayer(backend, config, 20).run(requests)
    assert sum(r.prompt_tokens for r in result.records) == 20 * 320
    assert result.peak_resident_bytes < 1 << 30
