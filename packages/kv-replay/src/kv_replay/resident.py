"""The process's peak resident memory (RSS), resettable so each replay reports its own peak."""

from __future__ import annotations

import resource
import sys


def reset_peak() -> bool:
    """Start a new peak at the current RSS (Linux: /proc/self/clear_refs); False where the
    platform cannot, and the peak then covers the whole process."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """The peak RSS since the last ``reset_peak`` (since the process started where it failed)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
