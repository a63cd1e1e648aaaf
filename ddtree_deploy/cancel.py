"""A process-wide request to stop waiting on hosts: Ctrl-C reaches only the main thread,
while a fleet's work (even one host's) runs on worker threads (``fleet_run``).

``fleet_run.run_fleet`` sets it when the main thread is interrupted; a long wait on a
worker thread (``serve_run``'s health wait) checks it between reads and gives up within
a second, leaving the host in a state its journal records and ``status`` explains.
"""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()


def request() -> None:
    _REQUESTED.set()


def requested() -> bool:
    return _REQUESTED.is_set()


def clear() -> None:
    """For tests and library callers that go on after an interrupted run."""
    _REQUESTED.clear()


__all__ = ["clear", "request", "requested"]
