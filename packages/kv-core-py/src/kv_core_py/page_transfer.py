"""Moving page bytes between cache levels: runs of contiguous slots, one copier call or one
positioned I/O per run, bytes counted per direction, what comes from disk checked against its
checksums (docs/manager.md, "Eviction and tiers")."""

from __future__ import annotations

import ctypes

from kv_api.page_copier import CopyRun, PageCopier
from kv_core_py.cache_level import CacheLevel


def slot_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(src_slot, dst_slot)`` pairs merged into ``(src_first, dst_first, count)`` runs where
    both sides continue by one."""
    runs: list[tuple[int, int, int]] = []
    for src, dst in pairs:
        if runs:
            s, d, n = runs[-1]
            if src == s + n and dst == d + n:
                runs[-1] = (s, d, n + 1)
                continue
        runs.append((src, dst, 1))
    return runs


def address_of(buffer: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class PageTransfer:
    def __init__(self, levels: list[CacheLevel], copier: PageCopier | None) -> None:
        self.levels = levels
        self.copier = copier  # None: memmove in this process
        self.bytes_moved: dict[tuple[int, int], int] = {}
        #: The remote tier's level (its values' host memory in copier calls): after the last.
        self.remote_level = len(levels)

    def _count(self, src_level: int, dst_level: int, num_bytes: int) -> None:
        key = (src_level, dst_level)
        self.bytes_moved[key] = self.bytes_moved.get(key, 0) + num_bytes

    def export(self, pages: list[tuple[int, int, int, int]], buffer: bytearray) -> list[int]:
        """Copy pages ``(level, pool group, slot, offset)`` into ``buffer`` at ``offset``, pool by
        pool: one copier call per memory level (runs in the given order), disk read per page.
        The indices of pages read from disk whose bytes failed their checksum."""
        base = address_of(buffer)
        view = memoryview(buffer)
        bad: list[int] = []
        runs: dict[int, list[CopyRun]] = {}
        for i, (level, pg, slot, offset) in enumerate(pages):
            group = self.levels[level].pool_groups[pg]
            if group.on_disk:
                for disk in group.disk_pools:
                    if disk.read(slot, view[offset : offset + disk.slot_size]):
                        bad.append(i)
                    offset += disk.slot_size
                continue
            for pool in group.pools:
                runs.setdefault(level, []).append(
                    (pool.base_address + slot * pool.slot_size, base + offset, pool.slot_size)
                )
                offset += pool.slot_size
        for level, level_runs in sorted(runs.items()):
            self._copy_runs(level, self.remote_level, level_runs)
        for level, pg, _, _ in pages:
            self._count(level, self.remote_level, self.levels[level].pool_groups[pg].slot_bytes)
        return bad

    def import_(self, level: int, pages: list[tuple[int, int, int]], buffer: bytearray) -> None:
        """Copy ``buffer[offset:]`` into slot ``slot`` of ``level`` for each ``(pool group, slot,
        offset)``, pool by pool: one copier call for a memory level, positioned writes for disk."""
        base = address_of(buffer)
        view = memoryview(buffer)
        runs: list[CopyRun] = []
        for pg, slot, offset in pages:
            group = self.levels[level].pool_groups[pg]
            for disk in group.disk_pools:
                disk.ensure_backed(slot + 1)
                disk.write(slot, view[offset : offset + disk.slot_size])
                offset += disk.slot_size
            group.populate(slot + 1)
            for pool in group.pools:
                runs.append((base + offset, pool.base_address + slot * pool.slot_size, pool.slot_size))
                offset += pool.slot_size
        if runs:
            self._copy_runs(self.remote_level, level, runs)
        for pg, _, _ in pages:
            self._count(self.remote_level, level, self.levels[level].pool_groups[pg].slot_bytes)

    def _copy_runs(self, src_level: int, dst_level: int, runs: list[CopyRun]) -> None:
        if self.copier is None:
            for s_addr, d_addr, size in runs:
                ctypes.memmove(d_addr, s_addr, size)
        else:
            self.copier.copy(src_level, dst_level, runs)

    def copy(self, src_level: int, dst_level: int, pool_group: int, pairs: list[tuple[int, int]]) -> list[int]:
        """Copy slot ``src`` of ``src_level`` into slot ``dst`` of ``dst_level`` for each pair,
        in every pool of the group. Raises (the copier's error, or the disk's) before counting.
        The source slots (in pair order) whose bytes read from disk failed their checksum in
        some pool; within the disk tier their copies fail it too."""
        if not pairs:
            return []
        runs = slot_runs(pairs)
        src, dst = self.levels[src_level].pool_groups[pool_group], self.levels[dst_level].pool_groups[pool_group]
        bad: set[int] = set()
        dst.populate(max(d + n for _, d, n in runs))  # a disk level has no memory pools
        if src.on_disk and dst.on_disk:  # within the disk tier (a quota resize's defragmentation)
            for disk in src.disk_pools:
                for s, d, n in runs:
                    buf = memoryview(bytearray(n * disk.slot_size))
                    corrupt = disk.read(s, buf)
                    disk.ensure_backed(d + n)
                    disk.write(d, buf)
                    for slot in corrupt:  # written as read: still no page
                        disk.forget(d + slot - s)
                    bad.update(corrupt)
            moved = sum(p.slot_size for p in src.disk_pools)
        elif dst.on_disk:
            for disk, pool in zip(dst.disk_pools, src.pools, strict=True):
                view = pool.view()
                for s, d, n in runs:
                    disk.ensure_backed(d + n)
                    disk.write(d, view[s * pool.slot_size : (s + n) * pool.slot_size])
            moved = sum(p.slot_size for p in dst.disk_pools)
        elif src.on_disk:
            for disk, pool in zip(src.disk_pools, dst.pools, strict=True):
                view = pool.view()
                for s, d, n in runs:
                    bad.update(disk.read(s, view[d * pool.slot_size : (d + n) * pool.slot_size]))
            moved = sum(p.slot_size for p in src.disk_pools)
        else:
            memory: list[CopyRun] = [
                (sp.base_address + s * sp.slot_size, dp.base_address + d * dp.slot_size, n * sp.slot_size)
                for sp, dp in zip(src.pools, dst.pools, strict=True)
                for s, d, n in runs
            ]
            if self.copier is None:
                for s_addr, d_addr, size in memory:
                    ctypes.memmove(d_addr, s_addr, size)
            else:
                self.copier.copy(src_level, dst_level, memory)
            moved = sum(p.slot_size for p in src.pools)
        key = (src_level, dst_level)
        self.bytes_moved[key] = self.bytes_moved.get(key, 0) + moved * len(pairs)
        return [s for s, _ in pairs if s in bad]
