"""The unit tier's promise, held at run time: a test in tests/unit starts no process and opens
no socket (so `pytest tests/unit` runs in seconds, anywhere).

scripts/tier_tests.py sorts the test files by what their source uses; what it cannot see (a
product function that starts a program inside) shows here: the test fails, naming what it
did, and the file belongs in tests/integration (add a name to the script's tables, or pin the
file in its PINNED, and run it again). The shared fixtures stay in tests/conftest.py.
"""

from __future__ import annotations

import sys

import pytest

# Python's audit events for a new process and for a socket that talks or listens.
_EVENTS = {"subprocess.Popen": "started a process", "os.system": "started a process",
           "os.posix_spawn": "started a process", "os.fork": "forked",
           "socket.connect": "opened a connection", "socket.bind": "bound a socket"}
_watching = [False]
_seen: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if _watching[0] and event in _EVENTS:
        what = args[1] if event == "subprocess.Popen" else args[1:] if event.startswith("socket.") else args
        _seen.append(f"{_EVENTS[event]} ({event}: {what!r:.120})")


sys.addaudithook(_audit)  # process-wide and permanent; it records only while a unit test runs


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_process(request: pytest.FixtureRequest):
    _seen.clear()
    _watching[0] = True
    try:
        yield
    finally:
        _watching[0] = False
    if _seen:
        pytest.fail(f"{request.node.nodeid} is a unit test but {_seen[0]}: it belongs in tests/integration "
                    "(scripts/tier_tests.py: name what it uses, or pin the file, and run the script)",
                    pytrace=False)
