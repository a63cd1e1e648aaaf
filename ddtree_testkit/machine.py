"""How busy this machine is now: what a timed claim measures besides the code it is about.

A test that bounds the toolkit's own delay ("exit 130 within a second of Ctrl-C", issue 22) also
measures the machine: on a 2-core machine running other jobs a process gets a share of a core,
and the same second of work takes several. ``contention`` measures that now, beside the claim,
with a fixed piece of CPU work (wall time over the CPU time it got), and ``within`` scales the
bound by it: the same claim on an idle machine (factor 1) and on a busy one (issue 28 item 7).
A wait the toolkit should not make (a network timeout, a join that never returns) is seconds
of wall time with no CPU behind it, and still fails.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

# About a tenth of a second of pure Python on an idle core, in a process of its own.
_WORK = "n = 0\nfor k in range(1_500_000):\n    n += k\n"


def contention(samples: int = 3) -> float:
    """Wall time over CPU time of a fixed piece of work in a child process, now: 1.0 on an idle
    core, about the number of runnable processes per core on a busy machine (the median)."""
    ratios = []
    for _ in range(samples):
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _WORK])
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0, "the measuring process failed"
        ratios.append(wall / max(usage.ru_utime + usage.ru_stime, 1e-3))
    return statistics.median(ratios)


def settle(seconds: float) -> float:
    """Wait ``seconds`` (a test's pause before it sends a signal) while measuring
    ``contention()``; returns it, the ``busy_before`` of the interval that follows."""
    started = time.monotonic()
    busy = contention()
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    return busy


def within(took: float, bound_s: float, what: str, busy_before: float | None = None) -> tuple[bool, str]:
    """Whether ``took`` is within ``bound_s`` of an idle machine's time on this machine now, and
    the sentence that says so either way. ``busy_before``: ``contention()`` taken just before
    the timed interval began. A busy machine's load comes in bursts, and one sample after the
    interval can miss the burst the interval ran in (a Ctrl-C exit measured 1.73 s against a
    factor of 1.7 sampled after it); the larger of the two samples brackets the interval."""
    factor = max(1.0, busy_before or 1.0, contention())
    return took < bound_s * factor, (f"{took:.2f} s {what}; the bound: {bound_s:g} s of an idle machine's "
                                     f"time, x{factor:.1f} for how busy this one is now")


__all__ = ["contention", "settle", "within"]
