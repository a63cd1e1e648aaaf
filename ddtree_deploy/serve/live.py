"""`status`'s live DDTree line: what a host's serving server does right now, and since when it
runs the code it runs. Pure: the figures come from ``serve/metrics_run.py`` (two scrapes of
``/metrics`` ``window_s`` apart and one read of ``/server_info``), the processes from
``serve_plan.serving`` and the journal's serve record; this module only joins and renders them.

    Live(window_s, figures, since).line()
    -> DDTree B=64/K=8: accept length 3.4, 1,210 tok/s, 31 running, ITL p50 12 ms / p99 41 ms,
       2.1 req/s (window 2 s: two scrapes); serving this code since 2026-12-02T12:00:01Z
       (pid 4242, restarted by run 20261202-...)

``since``: the serving process whose start the line gives (the oldest one found), whether it
runs the files' bytes (``serve_plan.serving`` decided it: by content where the host's history
could tell, ``loaded_now``; else by the times) and, where the journal's serve record names that
process, the restart that started it. The JSON form is ``to_json`` (docs/json.md, "The live
line"; ``$defs/live`` in docs/json-schema.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.serve.figures import ServedFigures, Unavailable, label

#: status' default window: short, so that `status` stays quick; two scrapes this far apart.
DEFAULT_WINDOW_S = 2.0
#: The longest window `status --window` takes: status is a look, not a bake.
MAX_WINDOW_S = 120.0


def check_window(value: float, option: str = "--window") -> float:
    """The window ``status`` measures over, or one BadInput line (exit 2, before any connection).
    0 skips the live line (no scrape at all)."""
    if value is None or isinstance(value, bool) or not math.isfinite(value) or value < 0 or value > MAX_WINDOW_S:
        raise BadInput(f"{option} {value}: the window is seconds between two scrapes of the server's /metrics, "
                       f"from 0 (no live line) to {MAX_WINDOW_S:g}",
                       hint=f"give e.g. {option} {DEFAULT_WINDOW_S:g} (the default)")
    return float(value)


@dataclass(frozen=True)
class Since:
    """Since when the serving server runs the code it runs (the host's clock)."""

    started: str | None  # the serving process's start, ISO
    pid: int | None
    current: bool  # it runs the bytes the files hold now (False: older code, `status` says restart)
    decided_by: str | None  # "content" (the host's history of switches) or "time" (start vs the files' change)
    restart_run: str | None = None  # the run whose restart started it (the journal's serve record)
    restart_state: str | None = None  # how that restart ended: healthy, unhealthy, ...
    restart_time: str | None = None  # when that restart ended
    undecided: str | None = None  # it started before the files' last change and the history could not tell

    def text(self) -> str:
        what = "serving this code" if self.current else "serving code OLDER than the files"
        out = f"{what} since {self.started or 'an unknown time'}"
        extra = [f"pid {self.pid}"] if self.pid is not None else []
        if self.restart_run:
            extra.append(f"restarted by run {self.restart_run}" + (f", {self.restart_state}" if self.restart_state
                                                                    else ""))
        if self.undecided:
            extra.append(f"judged by the times: {self.undecided}")
        return out + (f" ({', '.join(extra)})" if extra else "")

    def to_json(self) -> dict:
        return {"started": self.started, "pid": self.pid, "current": self.current, "decided_by": self.decided_by,
                "restart_run": self.restart_run, "restart_state": self.restart_state,
                "restart_time": self.restart_time, "undecided": self.undecided}


def since_of(serving: Mapping[str, Any] | None, journal: Mapping[str, Any] | None) -> Since | None:
    """``serving`` (``serve_plan.serving``'s document) and the host's journal -> Since, or None
    when no serving process was found (nothing runs any code)."""
    procs = [p for p in (serving or {}).get("processes") or () if isinstance(p, Mapping)]
    if not procs:
        return None
    oldest = min(procs, key=lambda p: p.get("started") or 0.0)
    record = (journal or {}).get("serve")
    record = record if isinstance(record, Mapping) else {}
    ours = oldest.get("pid") is not None and oldest.get("pid") in (record.get("pids") or ())
    current = not any(p.get("stale") for p in procs)  # one process on older bytes: the server is not current
    return Since(started=oldest.get("started_iso"), pid=oldest.get("pid"), current=current,
                 decided_by=oldest.get("decided_by"),
                 restart_run=record.get("restart_run") if ours else None,
                 restart_state=record.get("state") if ours else None,
                 restart_time=record.get("time") if ours else None, undecided=oldest.get("undecided"))


@dataclass(frozen=True)
class Live:
    """One host's live line: the figures over one window, and since when the code runs."""

    window_s: float  # the window asked for (the figures' own ``window_s`` is the one measured)
    figures: ServedFigures | Unavailable
    since: Since | None
    url: str | None = None

    def line(self) -> str:
        return _figures_text(self.figures) + (f"; {self.since.text()}" if self.since else
                                                             "; no serving process found")

    def to_json(self) -> dict:
        return {"window_s": self.window_s, "url": self.url, "figures": self.figures.to_json(),
                "since": self.since.to_json() if self.since else None, "line": self.line()}


def _n(x: float) -> str:
    """1210.4 -> '1,210'; 3.41 -> '3.4'; 0.042 -> '0.042'."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1 or x == 0:
        return f"{x:,.1f}"
    return f"{x:.2g}"


def _ms(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _figures_text(f: ServedFigures | Unavailable) -> str:
    if isinstance(f, Unavailable):
        return f"no figures: {f.line}"
    window = f"window {f.window_s:.1f} s: two scrapes"
    if f.idle:
        return f"{label(f)}: idle: no request finished or running ({window})"
    parts = []
    if f.accept_length is not None:
        parts.append(f"accept length {_n(f.accept_length)}")
    if f.output_tps is not None:
        parts.append(f"{_n(f.output_tps)} tok/s")
    if f.running is not None:
        parts.append(f"{f.running:.0f} running")
    if f.itl_p50_ms is not None and f.itl_p99_ms is not None:
        parts.append(f"ITL p50 {_ms(f.itl_p50_ms)} ms / p99 {_ms(f.itl_p99_ms)} ms")
    elif f.itl_p50_ms is None:
        parts.append("ITL: no token in the window")
    if f.request_rate is not None:
        parts.append(f"{_n(f.request_rate)} req/s")
    if f.error_rate:
        parts.append(f"{f.error_rate * 100:.1f}% aborted")
    return f"{label(f)}: {', '.join(parts) or 'no figures'} ({window})"


__all__ = ["DEFAULT_WINDOW_S", "Live", "MAX_WINDOW_S", "Since", "check_window", "since_of"]
