"""Run one command on a fleet: the threads that follow ``fleet.Schedule``.

The work on one host (a push and its smoke, a rollback, a status read) is a callable
given by the caller; it holds its own connection, so hosts share nothing but this
loop. Whatever one host does — refuse, time out, raise something unexpected — becomes
that host's ``HostResult``; the loop carries on, so every host is reported and every
started push finishes (and rolls itself back when its smoke fails).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from typing import Callable, Protocol, Sequence

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.progress import Progress
from ddtree_deploy.fleets.fleet import FleetReport, HostResult, Kind, Policy, Schedule, failed, skipped
from ddtree_deploy.remote import inflight

Work = Callable[[str, Progress], HostResult]
POLL_S = 0.1  # the loop's wait between checks: how late a Ctrl-C may be seen at most


class Events(Protocol):
    """What a progress display hears; called from worker threads (``step``) and the loop."""

    def started(self, host: str) -> None: ...

    def step(self, host: str, text: str) -> None: ...

    def finished(self, result: HostResult) -> None: ...


class _Silent:
    def started(self, host: str) -> None:
        pass

    def step(self, host: str, text: str) -> None:
        pass

    def finished(self, result: HostResult) -> None:
        pass


def run_fleet(command: str, hosts: Sequence[str], policy: Policy, work: Work,
              events: Events | None = None) -> FleetReport:
    """Run ``work`` on every host the schedule lets start; report every selected host.

    Each host's work runs in a daemon thread, and this loop waits in short polls: Ctrl-C
    (or SIGTERM) reaches it at once, and it returns without joining a worker blocked on a
    silent host (``inflight.interrupt`` drops their links and forbids any new request;
    each host program finishes what it has on its own)."""
    events = events or _Silent()
    schedule = Schedule(hosts, policy)
    results: dict[str, HostResult] = {}
    begun: dict[str, float] = {}  # host -> seconds after t0 when it started
    finished: queue.Queue = queue.Queue()
    running: set[str] = set()
    t0 = time.monotonic()
    try:
        while True:
            for host in schedule.ready():
                events.started(host)
                begun[host] = time.monotonic() - t0
                running.add(host)
                threading.Thread(target=lambda h=host: finished.put((h, _guarded(work, h, events))),
                                 name=f"fleet-{host}", daemon=True).start()
            if schedule.done:
                break
            if not running:  # a schedule that neither finishes nor starts anything is a bug here
                raise RuntimeError(f"fleet schedule stalled: pending {schedule.pending}")
            try:
                host, result = finished.get(timeout=POLL_S)
            except queue.Empty:
                continue
            running.discard(host)
            result = replace(result, wave=schedule.wave_of.get(host), started=begun.get(host))
            results[host] = result
            schedule.record(host, result.kind, down=result.down)
            events.finished(result)
    except KeyboardInterrupt:
        inflight.interrupt(running)  # also cancels the worker threads' long waits (serve_run)
        raise
    for host in schedule.skipped():
        results[host] = skipped(host, f"not started: {schedule.stop_reason}")
        events.finished(results[host])
    return FleetReport(command, policy, tuple(results[h] for h in hosts), schedule.stop_reason,
                       time.monotonic() - t0)


def _guarded(work: Work, host: str, events: Events) -> HostResult:
    """One host's work, timed; any exception is that host's failure, never the fleet's."""
    t0 = time.monotonic()
    try:
        result = work(host, lambda text: events.step(host, text))
    except DeployError as exc:
        result = failed(host, exc)
    except Exception as exc:  # noqa: BLE001 - a bug on one host must not abandon the others mid-push
        result = HostResult(host, Kind.FAILED_UNKNOWN,
                            {"host": host, "error": {"code": Code.INTERNAL, "message": f"{type(exc).__name__}: {exc}",
                                                     "hint": "rerun with DDTREE_DEPLOY_DEBUG=1 for a traceback"}},
                            f"{type(exc).__name__}: {exc}", error=exc)
    return replace(result, elapsed=time.monotonic() - t0)


__all__ = ["Events", "run_fleet"]
