"""The one check of a host file before any connection: the file itself (inventory.py) and the
command tables push uses, ``[smoke]`` (levels, the launch template) and ``[serve]``; and a
group's members, each a host file. Push refuses what this refuses, and ``hosts list`` shows
the same files broken with the same line: one validator for both (issue 28).

Light on purpose (no transport): ``hosts list`` imports it.
"""

from __future__ import annotations

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.settings.analysis import AnalysisSettings, apply_overrides, parse_analysis
from ddtree_deploy.settings.container import refuse_tables
from ddtree_deploy.settings.inventory import Host, load_host
from ddtree_deploy.settings.serve import ServeSettings, parse_serve
from ddtree_deploy.smoke.plan import check_settings


def check_tables(host: Host, *, smoke: bool = True) -> ServeSettings | None:
    """``host``'s [smoke] (unless ``smoke`` is False: ``push --no-smoke`` runs none) and
    [serve] tables, checked whole: BadInput (one line: file, line, key) for the first wrong
    value. Returns the [serve] settings (None: no table)."""
    parse_analysis(host.analysis, source=host.source)  # [analysis]: the speed gate's table
    if host.container is not None:
        return container_serve(host)
    if smoke:
        check_settings(host)
    return parse_serve(host.serve, source=host.source)


def analysis_settings(host: Host, overrides=()) -> AnalysisSettings | None:
    """``host``'s ``[analysis]`` with ``overrides`` (``--analysis KEY=VALUE`` pairs, already
    parsed) laid over it, checked whole: BadInput (one line) for a wrong value, before any
    connection. None: no table and no override (no speed gate)."""
    return apply_overrides(host.analysis, list(overrides), source=host.source)


def unused_analysis(host: Host, overrides=()) -> str | None:
    """Why ``host``'s ``[analysis]`` (or ``--analysis`` overrides) does nothing, else None: a
    host without ``[serve]`` has no server the toolkit restarts or measures (nothing says where
    it listens), so push, restart and rollback take no figures there. Said, not refused (the
    speed gate is documented for hosts with ``[serve]``): push warns, ``hosts list`` names it."""
    if host.container is not None or host.serve or not (host.analysis or list(overrides)):
        return None
    what = "[analysis]" if host.analysis else "--analysis"
    return (f"{host.source or host.name}: {what} has no effect: the host has no [serve] table (nothing says where "
            "its server listens), so push, restart and rollback measure no speed there; add [serve] with "
            'url = "http://127.0.0.1:PORT" and its restart command, or remove [analysis]')


def container_serve(host: Host) -> ServeSettings:
    """A ``[container]`` host's ``[serve]`` (required: its url is the health gate) without
    ``restart`` or ``drain``, and no ``[smoke]`` table; BadInput (one line) else."""
    refuse_tables(host)
    serve = parse_serve(host.serve, source=host.source, container=True)
    if serve is None:
        raise BadInput(f"{host.source or host.name}: serve: a [container] host needs a [serve] table with url (the "
                       "server's base URL as seen on the host): its push waits there for the new container's health",
                       hint='add [serve] with url = "http://127.0.0.1:30000"')
    return serve


def checked_host(name: str, *, smoke: bool = True) -> Host:
    """A host file read and its tables checked (``check_tables``), as push does it."""
    host = load_host(name)
    check_tables(host, smoke=smoke)
    return host


def group_problem(group: str, members, listed: dict[str, BadInput | None]) -> BadInput | None:
    """Why group ``group`` cannot be pushed (a member whose file is missing or broken, as push
    would say it), else None. ``listed``: the folder's host files already checked (name ->
    its error or None), so each is read once."""
    for member in members:
        if member in listed:
            error = listed[member]
        else:
            try:
                load_host(member)  # not in the folder: the built-in `local`, or a missing file
                error = None
            except BadInput as exc:
                error = exc
        if error is not None:
            return BadInput(f"group {group}: member {member}: {error.message}", hint=error.hint)
    return None


__all__ = ["analysis_settings", "check_tables", "checked_host", "container_serve", "group_problem", "unused_analysis"]
