"""Running a smoke plan on a host (the edge): ship the smoke program over the host's
transport, stream its events to the caller's progress, read its report, and copy a
failed launch's server log back. What it runs was decided in ``smoke_plan``; this module
never calls ``deploy`` (what happens around a smoke is ``rollout``'s).
"""

from __future__ import annotations

from typing import Callable

from ddtree_deploy.codes import Code
from ddtree_deploy.smoke_plan import SmokePlan
from ddtree_deploy.smoke_report import SmokeReport, read_answer
from ddtree_deploy.transport import HostProgram, ProgramSession

Progress = Callable[[str], None]


def _quiet(_step: str) -> None:
    pass


# Never sudo: the smoke reads files and starts a server as the SSH user.
SMOKE_PROGRAM = HostProgram("smoke_agent.py", "the smoke program", Code.SMOKE_AGENT)


def smoke_agent_source() -> bytes:
    return SMOKE_PROGRAM.source()


def run_on_host(host, transport, plan: SmokePlan, *, log_dir=None, progress: Progress = _quiet,
                heartbeat: Callable[[str, float], None] | None = None) -> SmokeReport:
    """Ship the smoke program to ``host`` over ``transport``, run ``plan``, read its report.

    The program streams one JSON line per event (level start, heartbeat, level result)
    and the whole answer last; a failed launch's server log comes back with it and is
    written under ``log_dir`` (default: the user's cache, ``smoke-logs/<host>/``).
    ``progress`` hears each level's start; ``heartbeat(level, seconds)``, when given,
    hears the host program's keep-alives during long levels.
    """
    answer = None
    with transport, ProgramSession(transport, host, SMOKE_PROGRAM) as session:
        session.send(plan.request, during="while sending the smoke request")
        while answer is None:
            doc = session.read(what="the smoke result", during="the smoke")
            event = doc.get("event")
            # One progress step per level (a caller's step timer times it); the
            # results themselves are in the report.
            if event == "start":
                progress(f"smoke {doc['level']}")
            elif event == "wait" and heartbeat is not None:
                heartbeat(doc["level"], float(doc["seconds"]))
            elif event == "done":
                answer = doc
    report = read_answer(host.name, plan, answer)
    if answer.get("server_log") is not None:
        report = report.with_log_copy(str(_keep_log(host.name, answer["server_log"], log_dir)))
    return report


def _keep_log(host_name: str, text: str, log_dir) -> "Path":
    import time
    from pathlib import Path

    from ddtree_deploy.locations import cache_dir

    folder = Path(log_dir) if log_dir else cache_dir() / "smoke-logs" / host_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-server.log"
    path.write_text(text, encoding="utf-8")
    return path

