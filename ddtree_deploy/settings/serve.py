"""The host's ``[serve]`` table: how the SGLang server that serves traffic on the host is
restarted, where its health shows, and what proves it runs DDTree. Pure: read through
``toml_input.TomlFile``, so a wrong key is the one message every TOML input gives,
``<file>: line N: serve.<key>: <what is wrong>; <what to do>``.

    [serve]
    restart = ["sudo", "-n", "systemctl", "restart", "sglang"]   # argv, run on the host without a shell
    url = "http://127.0.0.1:30000"          # the server's base URL, as seen ON the host
    health_path = "/health_generate"        # GET: 200 once the server is ready
    ready_timeout_s = 600                   # restart -> healthy, at most
    restart_timeout_s = 300                 # the restart command itself, at most
    proof = "tree"                          # "tree" (probe + tree prompts + /server_info) or "width"
    budget = 64                             # the tree budget the server runs (else its /server_info's)
    drain = ["/opt/lb/drain", "ct200"]      # optional argv run before the restart
    drain_wait_s = 30                       # seconds waited after the drain command

What runs on the host is ``serve_plan``'s request to ``hostprog/serve.py``; the restart runs
as an argv list (``subprocess`` without a shell), every element as written here: nothing
is split, joined or expanded.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ddtree_deploy.base.toml_input import Table, TomlFile

PROOFS = ("tree", "width")
DEFAULT_HEALTH_PATH = "/health_generate"
_KEYS = ("restart", "url", "health_path", "ready_timeout_s", "restart_timeout_s", "poll_s", "proof", "budget",
         "probe_timeout_s", "drain", "drain_wait_s", "drain_timeout_s")
_RESTART_EXAMPLE = '["sudo", "-n", "systemctl", "restart", "sglang"]'


@dataclass(frozen=True)
class ServeSettings:
    """``[serve]``, validated."""

    restart: tuple[str, ...]
    url: str  # scheme://host:port, no path
    health_path: str = DEFAULT_HEALTH_PATH
    ready_timeout_s: float = 600.0
    restart_timeout_s: float = 300.0
    poll_s: float = 2.0
    proof: str = "tree"
    budget: int | None = None
    probe_timeout_s: float = 300.0
    drain: tuple[str, ...] | None = None
    drain_wait_s: float = 0.0
    drain_timeout_s: float = 120.0
    doc: TomlFile | None = field(default=None, compare=False, repr=False)

    @property
    def health_url(self) -> str:
        return self.url + self.health_path


def _doc(given: Any, *, source: str | None) -> TomlFile:
    if isinstance(given, TomlFile):
        return given
    if isinstance(given, Table) and given.doc is not None and given.key == "serve":
        return given.doc  # the host file it was read from: its lines
    # A table built in code (the built-in host `local`, whose Host has serve={}): empty is none.
    return TomlFile.of({"serve": given} if given else {}, source=source or "<inventory>")


def has_serve(table: Any) -> bool:
    """Whether the host's inventory has a ``[serve]`` table (``host.serve``)."""
    return bool(table)


def parse_serve(table: Any, *, source: str | None, container: bool = False) -> ServeSettings | None:
    """``[serve]`` -> ServeSettings (None: no table), or one BadInput line naming the key.

    ``table``: ``host.serve`` as the inventory keeps it (a ``toml_input.Table`` that
    remembers its file, so the message names the key's line), or a plain dict.
    ``container``: the host has a ``[container]`` table: the push recreates its container,
    so ``restart`` and ``drain`` have no place (``restart`` is then the empty tuple).
    """
    doc = _doc(table, source=source)
    if not doc.get("serve"):
        if doc.get("serve") is not None:
            doc.table("serve")  # not a table: its own message
            raise doc.bad("serve", "is empty", f"add restart = {_RESTART_EXAMPLE} and url, or remove [serve]")
        return None
    doc.table("serve")
    doc.unknown("serve", _KEYS)
    if container:
        for key in ("restart", "drain", "drain_wait_s", "drain_timeout_s"):
            if doc.get(f"serve.{key}") is not None:
                raise doc.bad(f"serve.{key}", "has no place on a [container] host: its push recreates the container "
                              "(the restart) and waits for serve.url", f"remove {key}")
    restart = () if container else _argv(doc, "serve.restart", required=True) or ()  # required: never None
    url = _url(doc)
    health_path = doc.string("serve.health_path", default=DEFAULT_HEALTH_PATH, example=DEFAULT_HEALTH_PATH)
    if not health_path.startswith("/") or any(c.isspace() or ord(c) < 32 for c in health_path) or "#" in health_path:
        raise doc.bad("serve.health_path", f"must be a path starting with '/', without spaces, not {health_path!r}",
                      f'e.g. health_path = "{DEFAULT_HEALTH_PATH}"')
    drain = _argv(doc, "serve.drain", required=False)
    for key in ("drain_wait_s", "drain_timeout_s"):
        if drain is None and doc.get(f"serve.{key}") is not None:
            raise doc.bad(f"serve.{key}", "set without a drain command", "add drain = [...] or remove it")
    d = ServeSettings(restart=restart, url=url)
    return ServeSettings(
        restart=restart,
        url=url,
        health_path=health_path,
        ready_timeout_s=_seconds(doc, "ready_timeout_s", d.ready_timeout_s),
        restart_timeout_s=_seconds(doc, "restart_timeout_s", d.restart_timeout_s),
        poll_s=_seconds(doc, "poll_s", d.poll_s),
        proof=doc.choice("serve.proof", PROOFS, default=d.proof),
        budget=doc.integer("serve.budget", default=None, lo=1, hi=1024),
        probe_timeout_s=_seconds(doc, "probe_timeout_s", d.probe_timeout_s),
        drain=drain,
        drain_wait_s=_seconds(doc, "drain_wait_s", d.drain_wait_s, zero=True),
        drain_timeout_s=_seconds(doc, "drain_timeout_s", d.drain_timeout_s),
        doc=doc if doc.lines else None,
    )


# A wait longer than a day is a typo (and past ~1e9 s, time arithmetic overflows).
MAX_SECONDS = 86400.0


def _seconds(doc: TomlFile, key: str, default: float, *, zero: bool = False) -> float:
    full = f"serve.{key}"
    value = doc.get(full)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero) or value > MAX_SECONDS:
        lower = "0" if zero else "more than 0"
        raise doc.bad(full, f"must be a number of seconds from {lower} to {MAX_SECONDS:g}, not {value!r}",
                      f"write a number without quotes, e.g. {key} = 30")
    return float(value)


def _argv(doc: TomlFile, key: str, *, required: bool) -> tuple[str, ...] | None:
    """A command as an argv list: non-empty strings, the first naming a program."""
    value = doc.get(key)
    leaf = key.rsplit(".", 1)[-1]
    if value is None:
        if required:
            raise doc.bad(key, "missing (required): the command that restarts the server",
                          f"add {leaf} = {_RESTART_EXAMPLE}")
        return None
    if isinstance(value, str):
        raise doc.bad(key, f"must be a list of arguments, not the string {value!r} (it is run without a shell, "
                      "so nothing would split it)", f"write each word as its own string, e.g. {leaf} = "
                      f"{_RESTART_EXAMPLE}")
    argv = doc.strings(key, nonempty=True, example=_RESTART_EXAMPLE)
    if not argv:
        raise doc.bad(key, "must not be empty", f"name the program and its arguments, e.g. {leaf} = {_RESTART_EXAMPLE}")
    if any("\n" in a for a in argv):
        raise doc.bad(key, "an argument holds a newline", "write each argument on one line")
    return tuple(argv)


# The URL's host: a DNS name (labels of letters, digits, '-', '_'; 63 characters each, 253 in
# all), an IPv4 address or an IPv6 literal (in brackets in the URL). Anything else (a 1 MB
# name, a label past 63) would make the host's HTTP client fail mid-restart: refused here.
_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                   r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$")
MAX_URL_CHARS = 2048


def _shown(raw: str) -> str:
    """``raw`` as a message shows it: whole when short, else its start and its length."""
    return repr(raw) if len(raw) <= 80 else f"{raw[:60]!r}... ({len(raw)} characters)"


def _url(doc: TomlFile) -> str:
    key = "serve.url"
    raw = doc.string(key, required=True, example="http://127.0.0.1:30000")
    todo = 'write the server\'s base URL as seen on the host, e.g. url = "http://127.0.0.1:30000"'
    shown = _shown(raw)
    if len(raw) > MAX_URL_CHARS:
        raise doc.bad(key, f"{shown} is longer than {MAX_URL_CHARS} characters: not a server's base URL", todo)
    if any(c.isspace() or ord(c) < 32 for c in raw):
        raise doc.bad(key, f"{shown} holds spaces or control characters", todo)
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise doc.bad(key, f"{shown} is not a URL ({exc})", todo) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise doc.bad(key, f"{shown} is not an http:// or https:// URL with a host", todo)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise doc.bad(key, f"{shown} has a path, query or user part: give the base URL only "
                      "(the health path is serve.health_path)", todo)
    if port == 0:
        raise doc.bad(key, f"{shown}: port 0 is not a port", todo)
    if not _host_ok(parts.hostname):
        raise doc.bad(key, f"{shown}: {_shown(parts.hostname)} is not a host name or IP address (labels of "
                      "letters, digits, '-', at most 63 characters each, 253 in all)", todo)
    return f"{parts.scheme}://{parts.netloc}"


def _host_ok(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(_NAME.match(name))


__all__ = ["DEFAULT_HEALTH_PATH", "PROOFS", "ServeSettings", "has_serve", "parse_serve"]
