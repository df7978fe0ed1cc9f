"""Fixtures the tier tests share: file systems of their own (tmpfs mounts, root only)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._helpers import SLOT, SMALL_FS_SLOTS, mount_tmpfs


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``SMALL_FS_SLOTS`` slots and a little more (skipped where it cannot be mounted)."""
    path = tmp_path / "small"
    path.mkdir()
    if not mount_tmpfs(path, (SMALL_FS_SLOTS * SLOT + 16 * 1024) // 1024):
        pytest.skip("mounting a size-limited tmpfs needs root and mount(8)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def own_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs whose free space only the test's processes change (root); elsewhere a
    plain directory (``os.path.ismount`` tells which)."""
    path = tmp_path / "fs"
    path.mkdir()
    mounted = mount_tmpfs(path, 8 * 1024)
    try:
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)
