"""What the host commands show: live progress (one host: a spinner and a timed line per
finished step; a fleet: one row per host) and the outcome table on stderr, the fleet
status table on stdout. Rendering only: each view is a ``rollout.Listener`` (it gets
``rollout.Event``s); the policy is ddtree_deploy.fleets.fleet, the work ddtree_deploy.fleets.rollout."""

from __future__ import annotations

import threading
import time
from typing import Callable, List

from ddtree_deploy.cli.app import emit_json, err, out, say
from ddtree_deploy.cli.text import safe
from ddtree_deploy.fleets.fleet import FleetReport, HostResult, Kind
from ddtree_deploy.fleets.rollout import Event, EventKind

_STYLE = {True: "green", False: "red"}


def _warning(event: Event) -> None:
    who = f"{event.host}: " if event.host else ""
    err.print("[yellow]" + safe(who + event.text) + "[/]", highlight=False)


def _heartbeat(event: Event) -> None:
    err.print(f"[dim]{safe(event.host)}: {safe(event.text)}: still running ({event.seconds or 0:.0f} s)[/]",
              highlight=False)


class HostView:
    """One host: a live spinner for the running step, then a timed line for each finished one.

    Lines are printed in order: a step's line before the next step starts, the last one
    before the result (the caller prints results after leaving this context), and a step
    that ended in an error says ``failed``.
    """

    def __init__(self, host: str, *, bars: bool = True):
        from ddtree_deploy.cli.download_view import Downloads

        self.host = host
        self.step: str | None = None
        self.started = time.monotonic()
        self.spinner = err.status(safe(f"{host}: starting"))
        # A download's bar replaces the spinner while it runs (one live display at a time).
        self.downloads = Downloads(bar=bars, pause=self.spinner.stop, resume=self.spinner.start)

    def __enter__(self) -> "HostView":
        self.spinner.start()
        return self

    def __exit__(self, *exc) -> None:
        self.downloads.close()
        self._close(failed=exc[0] is not None)
        self.spinner.stop()

    def __call__(self, event: Event) -> None:
        if event.kind is EventKind.STEP:
            self._close(failed=False)
            self.step, self.started = event.text, time.monotonic()
            self.spinner.update(safe(f"{self.host}: {event.text}"))
        elif event.kind is EventKind.FINISHED:
            self._close(failed=event.result is not None and event.result.error is not None)
        elif event.kind is EventKind.WARNING:
            _warning(event)
        elif event.kind is EventKind.HEARTBEAT:
            _heartbeat(event)
        elif event.kind is EventKind.DOWNLOAD:
            self.downloads.update(event.text, event.total or 0, event.received or 0)

    def _close(self, *, failed: bool) -> None:
        if self.step is not None:
            took = f"{time.monotonic() - self.started:.2f} s"
            if failed:
                err.print(f"[dim]{safe(self.host)}:[/] {safe(self.step)} [bold red]failed[/] [dim]({took})[/]",
                          highlight=False)
            else:
                err.print(f"[dim]{safe(self.host)}:[/] {safe(self.step)} [dim]({took})[/]", highlight=False)
            self.step = None


class FleetView:
    """Live per-host progress on stderr (one row per host), and a timed line per finished step."""

    def __init__(self, names: List[str], canary: str | None = None, *, bars: bool = True):
        from rich.live import Live

        from ddtree_deploy.cli.download_view import Downloads

        self.rows = {n: ["waiting", "", None] for n in names}  # state, step, started
        self.steps: dict[str, tuple[str, float]] = {}
        self.lock = threading.Lock()
        if canary:
            self.rows[canary][0] = "canary: waiting"
        self.live = Live(console=err, get_renderable=self._table, transient=True, refresh_per_second=4,
                         redirect_stdout=False, redirect_stderr=False)
        # A download's bar replaces the host rows while it runs (one live display at a time).
        self.downloads = Downloads(bar=bars, pause=self.live.stop, resume=self.live.start)

    def __enter__(self) -> "FleetView":
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.downloads.close()
        self.live.stop()

    def _table(self):
        from rich.table import Table

        table = Table(box=None, show_header=False, pad_edge=False)
        with self.lock:
            for name, (state, step, started) in self.rows.items():
                secs = f"{time.monotonic() - started:.1f} s" if started and state == "running" else ""
                table.add_row(safe(name), safe(state), safe(step), secs)
        return table

    def __call__(self, event: Event) -> None:
        if event.kind is EventKind.STARTED:
            self.started(event.host)
        elif event.kind is EventKind.STEP:
            self.step(event.host, event.text)
        elif event.kind is EventKind.FINISHED:
            self.finished(event.result)
        elif event.kind is EventKind.WARNING:
            with self.lock:
                _warning(event)
        elif event.kind is EventKind.HEARTBEAT:
            _heartbeat(event)
        elif event.kind is EventKind.DOWNLOAD:  # not under self.lock: stopping the Live redraws the rows
            self.downloads.update(event.text, event.total or 0, event.received or 0)

    def started(self, host: str) -> None:
        with self.lock:
            self.rows[host] = ["running", "connect", time.monotonic()]
        self.live.refresh()

    def step(self, host: str, text: str) -> None:
        with self.lock:
            prev = self.steps.pop(host, None)
            self.rows[host][1] = text
            self.steps[host] = (text, time.monotonic())
        self._done_line(host, prev)

    def finished(self, result: HostResult) -> None:
        with self.lock:
            prev = self.steps.pop(result.host, None)
            self.rows[result.host] = [result.kind.value, "", None]
        self._done_line(result.host, prev, failed=result.error is not None)
        colour = _STYLE[result.kind.ok] if result.kind is not Kind.SKIPPED else "yellow"
        tail = f": {_esc(result.message)}" if result.message and not result.kind.ok else ""
        err.print(f"[bold {colour}]{safe(result.host)}: {result.kind.value}[/]{tail}", highlight=False)

    def _done_line(self, host: str, prev: tuple[str, float] | None, failed: bool = False) -> None:
        # Refresh first: a line printed during a live display redraws its last render below it.
        self.live.refresh()
        if prev is not None:
            mark = " [bold red]failed[/]" if failed else ""
            err.print(f"[dim]{safe(host)}:[/] {_esc(prev[0])}{mark} [dim]({time.monotonic() - prev[1]:.2f} s)[/]",
                      highlight=False)


def _esc(text: str) -> str:
    return safe(text)


def print_outcomes(report: FleetReport) -> None:
    """The per-host outcome table, on stderr (the results themselves are on stdout or in --json)."""
    from rich.table import Table

    from ddtree_deploy.serve.bake import speed_cell

    table = Table(title=f"{report.command}: {len(report.results)} host(s), {report.seconds:.1f} s", title_justify="left")
    waves = report.policy.waves  # restarts: the wave timeline (which batch, when it started and ended)
    # push with [analysis]: each host's baseline and new figures, and whether they promoted it
    speeds = {r.host: speed_cell((r.doc.get("serve") or {}).get("analysis")) for r in report.results}
    speed = ("speed (baseline -> new)",) if any(speeds.values()) else ()
    for col in ("host", "outcome", "detail") + speed + (("wave", "start", "end") if waves else ("time",)):
        # Names and numbers whole; the detail (prose) wraps between words.
        table.add_column(col, overflow="fold", no_wrap=col not in ("detail", "outcome") + speed)
    for r in report.results:
        colour = "yellow" if r.kind is Kind.SKIPPED else _STYLE[r.kind.ok]
        if waves:
            end = "" if r.started is None or r.elapsed is None else f"{r.started + r.elapsed:.1f} s"
            timing = ("" if r.wave is None else str(r.wave), "" if r.started is None else f"{r.started:.1f} s", end)
        else:
            timing = ("" if r.elapsed is None else f"{r.elapsed:.1f} s",)
        cells = (_esc(speeds[r.host]),) if speed else ()
        table.add_row(safe(r.host), f"[{colour}]{r.kind.value}[/]", _esc(r.message), *cells, *timing)
    err.print(table)
    footer = stop_line(report)
    if footer:
        err.print(f"[yellow]{_esc(footer)}[/]", highlight=False)
    print_counts(report)


def stop_line(report: FleetReport) -> str | None:
    """Why some hosts were never started, and which: only when some were."""
    unstarted = [r.host for r in report.results if r.kind is Kind.SKIPPED]
    if not report.stop_reason or not unstarted:
        return None
    return f"stopped starting hosts: {report.stop_reason}; not started: {', '.join(unstarted)}"


def print_counts(report: FleetReport) -> None:
    counts = ", ".join(f"{n} {k}" for k, n in report.counts().items())
    err.print(f"{'[green]all ok' if report.ok else '[red]not all ok'}[/]: {counts}", highlight=False)


def print_status_footer(report: FleetReport) -> None:
    """`status` on several hosts: how many are fine, each kind of trouble and its hosts."""
    from ddtree_deploy.fleets.fleet import status_footer

    err.print(f"{'[green]all fine' if report.ok else '[red]not all fine'}[/]: {_esc(status_footer(report))}",
              highlight=False)


def print_status_table(report: FleetReport) -> None:
    """`status` on a fleet: one table of every host, on stdout (it is the result)."""
    from rich.table import Table

    from ddtree_deploy.fleets.fleet import status_row

    table = Table(box=None)
    cols = ("host", "sglang", "phase", "series", "drift", "lock", "serving")
    for col in cols:  # the host's name whole; the others wrap between words
        table.add_column(col, overflow="fold", no_wrap=col == "host")
    for r in report.results:
        if r.kind in (Kind.READ, Kind.ATTENTION):  # it answered (what is not fine: the footer)
            row = status_row(r.doc)
            table.add_row(*(safe(c) for c in (r.host, row["version"], row["phase"], row["series"], row["drift"],
                                               row["lock"], row["serving"])))
        else:  # why it failed was printed on stderr as it happened
            table.add_row(safe(r.host), "-", r.kind.value, "-", "-", "-", "-")
    out.print(table)


def print_live_lines(report: FleetReport) -> None:
    """`status` on a fleet: each serving host's live DDTree line under the table (stdout)."""
    for r in report.results:
        live = r.doc.get("live") if r.kind in (Kind.READ, Kind.ATTENTION) else None
        if live:
            out.print(f"{safe(r.host)}: live: {safe(live['line'])}", highlight=False)


__all__ = ["FleetView", "HostView", "print_counts", "print_live_lines", "print_outcomes", "print_status_footer",
           "print_status_table"]


def render(command: str, hosts: list, json_output: bool, call: Callable, *, canary: str | None = None,
           single: Callable[[HostResult], None] | None = None) -> None:
    """Run ``call(listener)`` (a rollout function) under the right view; print its results.

    One host: its lines (``single`` prints more, e.g. status' detail), its error re-raised
    as is (one line, its exit code), exit 1 when it did not end ok; with ``--json`` the
    fleet's document, as for several.
    Several: the outcome table (status: its table and counts), every host's document with
    its outcome; exit non-zero unless every host is ok.
    """
    import typer

    if len(hosts) == 1:
        with HostView(hosts[0].name, bars=not json_output) as view:
            report = call(view)
        r = report.results[0]
        if json_output:  # the envelope adds the error, if raised
            emit_json(report.to_json())
        if r.error is not None:
            if not json_output:
                for line in r.lines:  # evidence the error carries (push --diff: the drifted files)
                    _say(line)
            raise r.error
        if not json_output:
            if single is not None:  # (status: its block, then its lines: the --diff of drifted files)
                single(r)
            for line in r.shown_lines():
                _say(line)
        if not r.kind.ok or r.doc.get("ok") is False:  # e.g. a failed smoke, or left `switched`: exit 1
            raise typer.Exit(r.exit_code or 1)
        return
    with FleetView([h.name for h in hosts], canary, bars=not json_output) as view:
        report = call(view)
    if not json_output:  # results on stdout, in selection order, once every host is done
        for r in report.results:
            for line in r.shown_lines():
                _say(line)
    if command == "status":  # its table (stdout), then what is not fine, counted (the exit code follows it)
        if not json_output:
            print_status_table(report)
            print_live_lines(report)
        print_status_footer(report)
    else:
        print_outcomes(report)
    if json_output:
        emit_json(report.to_json())
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _say(line: str) -> None:
    # Every result line quotes host text (series, backup ids, errors, smoke details): none is markup.
    say(line)
