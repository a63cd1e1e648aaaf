"""Ctrl-C (and SIGTERM): what each host was waiting on, what that leaves there, and no new request.

Every wait on a host (a connect, an agent round trip, a smoke or tune read, a fleet of them
in worker threads) registers here while it lasts (``waiting``). When the user interrupts:

* the main thread raises KeyboardInterrupt at once (a fleet's loop polls; its workers are
  daemon threads, never joined), and ``interrupt`` drops every link still in flight: each
  host program sees the link close and finishes on its own (the agent completes a request
  it has whole and releases its lock; the smoke and tune programs stop what they started);
* ``cancelled`` is set: a worker woken by its dropped link can send nothing more (no
  automatic rollback, no mark) -- ``check`` raises ``Interrupted`` before any send;
* each dropped wait leaves one line (``notes``): the host, what it was waiting for, the
  state that leaves on the host and what to run next. The CLI prints them with exit 130.

Pure bookkeeping (stdlib and next_step): the transport registers, the CLI reads.
"""

from __future__ import annotations

import itertools
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError

#: The envelope's error code and the exit code of an interrupted run (docs/json.md).
CODE = Code.INTERRUPTED


class Interrupted(DeployError):
    """A worker asked to send after the user interrupted the run (nothing is sent)."""

    code = CODE


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C (``terminate_as_interrupt``)."""


@dataclass
class _Wait:
    host: str
    state: Callable[[], str]  # "waiting for X: what that leaves on the host" (called once, at the interrupt)
    drop: Callable[[], None]  # let go of the link now; the host program goes on alone


_lock = threading.Lock()
_waits: dict[int, _Wait] = {}
_notes: list[str] = []
_ids = itertools.count()
cancelled = threading.Event()


def enter(host: str, state: Callable[[], str], drop: Callable[[], None]) -> int:
    """Register a wait on ``host`` (until ``leave``); returns its key."""
    key = next(_ids)
    with _lock:
        _waits[key] = _Wait(host, state, drop)
    return key


def leave(key: int, interrupted: bool = False) -> None:
    """The wait ended; ``interrupted`` (a KeyboardInterrupt in this thread): note it, drop its link."""
    wait = _pop(key)
    if interrupted:
        _stop(wait)


@contextmanager
def waiting(host: str, state: Callable[[], str], drop: Callable[[], None]) -> Iterator[None]:
    """``enter`` / ``leave`` around a block (a KeyboardInterrupt inside it is noted, then goes on)."""
    key = enter(host, state, drop)
    try:
        yield
    except KeyboardInterrupt:
        leave(key, interrupted=True)
        raise
    finally:
        leave(key)


def _pop(key: int) -> _Wait | None:
    with _lock:
        return _waits.pop(key, None)


def _stop(wait: _Wait | None) -> None:
    if wait is None:
        return
    try:
        line = f"{wait.host}: {wait.state()}"
    except Exception as exc:  # noqa: BLE001 - the note must never hide the interrupt itself
        line = (f"{wait.host}: interrupted ({type(exc).__name__} while describing the wait); run "
                f"{next_step.status(wait.host)}")
    try:
        wait.drop()
    except Exception:  # noqa: BLE001 - a link that is already gone
        pass
    with _lock:
        _notes.append(line)


def interrupt(running: Iterable[str] = ()) -> None:
    """From the main thread, on Ctrl-C: no new request anywhere, every wait noted and dropped;
    a ``running`` host (a fleet's) with no wait registered was between two steps."""
    cancelled.set()
    with _lock:
        waits = list(_waits.values())
        _waits.clear()
    for wait in waits:
        _stop(wait)
    for host in sorted(set(running) - {w.host for w in waits}):
        with _lock:
            _notes.append(f"{host}: interrupted between two steps (nothing was in flight on the link); "
                          f"{next_step.status(host)} shows where the host stands")


def check(host: str) -> None:
    """Before anything is sent to a host: refuse once the user interrupted the run."""
    if cancelled.is_set():
        raise Interrupted(f"{host}: not sent: the run was interrupted")


def notes() -> list[str]:
    """The lines of the waits the interrupt dropped (each once), in order."""
    with _lock:
        out = list(_notes)
        _notes.clear()
    return out


def reset() -> None:
    """A new run in this process (the CLI in tests): nothing cancelled, nothing noted."""
    cancelled.clear()
    with _lock:
        _notes.clear()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` (a KeyboardInterrupt) in the main thread for the block, so
    a `kill` ends a run as Ctrl-C does (exit 130, the host lines); the old handler comes back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(_signum, _frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["CODE", "Interrupted", "Terminated", "cancelled", "check", "enter", "interrupt", "leave", "notes",
           "reset", "terminate_as_interrupt", "waiting"]
