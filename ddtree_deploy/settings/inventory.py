"""Inventory: ``hosts/<name>.toml`` into a typed, validated ``Host``.

One file per host. Only the ``[ssh]`` table concerns the connection; ``~/.ssh/config``
(or the file named by ``ssh.ssh_config``) still applies to the alias, as with ``ssh``.
A broken file is ``BadInput`` naming the file, the key and what to do; nothing is
connected before the whole inventory parses.
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ddtree_deploy.base import next_step
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.locations import repo_dir
from ddtree_deploy.base.toml_input import TomlFile, read_text
from ddtree_deploy.settings.container import ContainerSettings, parse_container

DEFAULT_STATE_DIR = "~/.ddtree-deploy"
DEFAULT_KEEP_BACKUPS = 5
DEFAULT_CONNECT_TIMEOUT = 10.0
LOCAL = "local"
# Size caps of the local files an inventory names (read by the transport through
# fsutil.read_regular): far above any real one, far below what fills memory.
MAX_KNOWN_HOSTS_BYTES = 16 << 20
MAX_SSH_CONFIG_BYTES = 1 << 20
MAX_IDENTITY_BYTES = 1 << 20

# A host name or ssh-config alias: letters, digits, dots, dashes, underscores, or an
# IPv6 literal. Anything else (spaces, quotes, ;, $) is refused here, so even a
# ProxyCommand expansion in the user's ssh config never sees it.
_HOSTNAME = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|[0-9A-Fa-f:.]+)$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_HOST_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_JUMP_HOP = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]*)@)?(?P<host>[A-Za-z0-9_][A-Za-z0-9_.-]*)(?::(?P<port>\d{1,5}))?$"
)


@dataclass(frozen=True)
class SSHTarget:
    host: str  # hostname or ssh-config alias
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    jump: str | None = None  # ProxyJump: "[user@]host[:port]" hops, comma-separated
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str | None = "~/.ssh/config"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT


@dataclass(frozen=True)
class Host:
    name: str
    python: str  # the host's interpreter that has sglang installed
    ssh: SSHTarget | None  # None: the local transport (running on the GPU box itself)
    state_dir: str = DEFAULT_STATE_DIR
    keep_backups: int = DEFAULT_KEEP_BACKUPS
    sudo: bool = False
    smoke: dict[str, Any] = field(default_factory=dict)  # read by the smoke command
    serve: dict[str, Any] = field(default_factory=dict)  # [serve]: how its server restarts (serve_settings)
    analysis: dict[str, Any] = field(default_factory=dict)  # [analysis]: the speed gate (analysis_settings)
    # Seconds one agent round trip may take; None: 120 s for push/rollback, 30 s for reads.
    op_timeout: float | None = None
    source: str | None = None  # the inventory file, for messages
    container: ContainerSettings | None = None  # [container]: its SGLang runs in a container (container_settings)

    @property
    def is_local(self) -> bool:
        return self.ssh is None


# The folder ``-i/--inventory DIR`` names for the running command (cli/app.handles_errors sets
# it for the command's body): None, the default folder (``locations.repo_dir("hosts")``).
_chosen_folder: Path | None = None


def hosts_dir() -> Path:
    """Where host files are read (and ``hosts init`` writes): ``-i DIR`` when given, else
    ``DDTREE_DEPLOY_HOSTS``, a checkout's ``hosts/``, or ``~/.config/ddtree-deploy/hosts``."""
    return _chosen_folder if _chosen_folder is not None else repo_dir("hosts")


@contextmanager
def inventory_folder(folder: Path | str | None) -> Iterator[None]:
    """Read hosts from ``folder`` (``-i DIR``) in this block; None changes nothing."""
    global _chosen_folder
    if folder is None:
        yield
        return
    before, _chosen_folder = _chosen_folder, Path(folder).expanduser()
    try:
        yield
    finally:
        _chosen_folder = before


def chosen_folder() -> Path | None:
    """The ``-i DIR`` of this command, if one was given (hints repeat it)."""
    return _chosen_folder


GROUPS_FILE = "groups.toml"


def load_groups(directory: Path | None = None) -> dict[str, tuple[str, ...]]:
    """``hosts/groups.toml`` -> group name -> member host names, in the file's order.

    One file for all groups (rather than a ``groups`` key in each host's file): a group
    is an ordered list, and its order matters (the first member is the default canary),
    which per-host keys could not say. No file means no groups.
    """
    path = (directory or hosts_dir()) / GROUPS_FILE
    if not path.exists():
        return {}
    text = read_text(path, what="host groups file")
    doc = TomlFile(text, source=str(path))
    return parse_groups(doc.data, source=str(path), text=text)


def parse_groups(data: dict[str, Any], *, source: str, text: str = "") -> dict[str, tuple[str, ...]]:
    """``groups.toml``'s values -> group name -> members (``text`` lets messages name the line)."""
    doc = TomlFile.of(data, source=source, text=text)
    extra = sorted(set(data) - {"groups"})
    if extra:
        raise doc.bad(extra[0], "unknown key", "put groups in a [groups] table")
    table = doc.table("groups")
    groups: dict[str, tuple[str, ...]] = {}
    for name, members in table.items():
        key = f"groups.{name}"
        if not _HOST_FILE_NAME.match(name):
            raise doc.bad(key, "a group name uses letters, digits, '.', '-', '_'", "rename the group")
        if not isinstance(members, list) or not members:
            raise doc.bad(key, "must be a non-empty list of host names", f'e.g. {name} = ["ct200"]')
        for m in members:
            if not isinstance(m, str) or not _HOST_FILE_NAME.match(m):
                raise doc.bad(key, f"{m!r} is not a host name",
                              f"use the name of a host file in {path_parent(source)} (without .toml)")
        if len(set(members)) != len(members):
            dup = next(m for m in members if members.count(m) > 1)
            raise doc.bad(key, f"{dup!r} is listed twice", "list each host once")
        groups[name] = tuple(members)
    return groups


def host_file_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a host file's name (``NAME.toml``), or None."""
    if not _HOST_FILE_NAME.match(name) or name in (".", ".."):
        return "a host name uses letters, digits, '.', '-', '_' and starts with a letter, digit or '_'"
    return None


def load_host(name_or_path: str, *, directory: Path | None = None) -> Host:
    """``ct200`` -> hosts/ct200.toml; a path ending in .toml is read as is; ``local`` is built in."""
    folder = directory or hosts_dir()
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
        # The stem becomes the host's name: in messages, log folders, snapshot names.
        if not _HOST_FILE_NAME.match(path.stem) or path.stem in (".", ".."):
            raise BadInput(f"{name_or_path}: {path.stem!r} is not a host name (the file's name without .toml "
                           "must use letters, digits, '.', '-', '_' and start with a letter, digit or '_')")
    else:
        if not _HOST_FILE_NAME.match(name_or_path):
            raise BadInput(
                f"host name {name_or_path!r}: use letters, digits, '.', '-', '_' "
                f"(the name of a host file in {folder}, without .toml)",
                hint=f"list them: {next_step.hosts_list(chosen_folder())}")
        if name_or_path == GROUPS_FILE[:-5]:
            raise BadInput(f"host name {name_or_path!r}: reserved ({folder / GROUPS_FILE} holds the host groups); "
                           "use --group NAME, or name the host's file otherwise")
        path = folder / f"{name_or_path}.toml"
        if not path.exists():
            if name_or_path == LOCAL:
                return Host(name=LOCAL, python=sys.executable, ssh=None, source=None)
            raise BadInput(f"{path}: no such inventory file",
                           hint=f"write one: {next_step.hosts_init(name_or_path, chosen_folder())}, or see which "
                                f"hosts there are: {next_step.hosts_list(chosen_folder())}")
    return parse_host(read_text(path, what="inventory"), name=path.stem, source=str(path))


def parse_host(text: str, *, name: str, source: str) -> Host:
    doc = TomlFile(text, source=source)
    data = doc.data
    transport = doc.choice("transport", ("ssh", "local"), default="ssh")
    doc.table("host")
    python = doc.string("host.python", required=True, example="/opt/venv/bin/python")
    state_dir = doc.string("host.state_dir", default=DEFAULT_STATE_DIR)
    problem = state_dir_problem(state_dir)
    if problem:
        raise doc.bad("host.state_dir", f"{state_dir!r} {problem}",
                      'use an absolute path or one under ~, e.g. "~/.ddtree-deploy"')
    keep = doc.integer("host.keep_backups", default=DEFAULT_KEEP_BACKUPS, lo=1, hi=1000)
    sudo = doc.boolean("host.sudo", default=False)
    op_timeout = doc.seconds("host.op_timeout", default=None)
    doc.unknown("host", {"python", "state_dir", "keep_backups", "sudo", "op_timeout"})
    ssh = None
    if transport == "ssh":
        doc.table("ssh", required=True)
        host = doc.string("ssh.host", required=True, example="gpu1.example.com")
        if not _HOSTNAME.match(host):
            raise doc.bad("ssh.host", f"{host!r} is not a host name or ssh alias",
                          "use letters, digits, '.', '-', '_' only")
        user = doc.string("ssh.user")
        if user is not None and not _USER.match(user):
            raise doc.bad("ssh.user", f"{user!r} is not a valid user name",
                          "use letters, digits, '.', '-', '_' (starting with a letter, digit or '_')")
        jump = doc.string("ssh.jump")
        if jump is not None:
            for hop in jump.split(","):
                m = _JUMP_HOP.match(hop.strip())
                if not m or (m["port"] and not 0 < int(m["port"]) < 65536):
                    raise doc.bad("ssh.jump", f"hop {hop!r} is not [user@]host[:port]",
                                  'write hops as "[user@]host[:port]", comma-separated')
        ssh = SSHTarget(
            host=host,
            user=user,
            port=doc.integer("ssh.port", default=None, lo=1, hi=65535),
            identity_file=doc.file("ssh.identity_file", default=None, limit=MAX_IDENTITY_BYTES,
                                   example="~/.ssh/id_ed25519"),
            jump=jump,
            known_hosts=doc.file("ssh.known_hosts", default="~/.ssh/known_hosts", limit=MAX_KNOWN_HOSTS_BYTES,
                                 example="~/.ssh/known_hosts"),
            ssh_config=doc.file("ssh.ssh_config", default="~/.ssh/config", limit=MAX_SSH_CONFIG_BYTES,
                                example="~/.ssh/config"),
            connect_timeout=doc.seconds("ssh.connect_timeout", default=DEFAULT_CONNECT_TIMEOUT, hi=3600.0),
        )
        doc.unknown("ssh", {f.name for f in SSHTarget.__dataclass_fields__.values()} | {"jump"})
    elif "ssh" in data:
        raise doc.bad("ssh", 'a local host (transport = "local") takes no [ssh] table',
                      "remove the [ssh] table, or drop transport = \"local\"")
    # Its keys are smoke_settings' to check, when a command uses them (push --no-smoke does
    # not); the table keeps this file's lines for that message.
    smoke = doc.located("smoke")
    serve = doc.located("serve")  # checked by serve_settings, before any command that restarts connects
    analysis = doc.located("analysis")  # checked by analysis_settings, likewise
    container = parse_container(doc)  # checked whole now: a broken [container] is a broken host file
    doc.unknown("", {"transport", "host", "ssh", "smoke", "serve", "analysis", "container"})
    return Host(name=name, python=python, ssh=ssh, state_dir=state_dir, keep_backups=keep,
                sudo=sudo, smoke=smoke, source=source, op_timeout=op_timeout, serve=serve,
                analysis=analysis, container=container)


def path_parent(source: str) -> str:
    """The folder of an inventory file named in a message."""
    return str(Path(source).parent)


@dataclass(frozen=True)
class Listed:
    """One file of an inventory folder, as ``hosts list`` shows it: its Host, or why not."""

    name: str
    path: Path
    host: Host | None
    error: BadInput | None = None


def list_inventory(directory: Path | None = None) -> list[Listed]:
    """Every host file (``*.toml`` but ``groups.toml``) of the inventory folder, by name,
    each parsed (a broken one keeps its error: the others are still listed)."""
    folder = directory or hosts_dir()
    if not folder.is_dir():
        return []
    listed = []
    for path in sorted(folder.glob("*.toml")):
        if path.name == GROUPS_FILE or not path.is_file():
            continue
        try:
            listed.append(Listed(path.stem, path, load_host(str(path))))
        except BadInput as exc:
            listed.append(Listed(path.stem, path, None, exc))
    return listed


def machine_of(host: Host) -> tuple[Any, ...]:
    """Which machine a host file reaches, as written (``local``, or the SSH host, user and
    port): two files with the same one and the same ``python`` are one install under two names."""
    return ("local",) if host.ssh is None else ("ssh", host.ssh.host, host.ssh.user, host.ssh.port)


def same_machine(host: Host, listed: list[Listed]) -> list[Host]:
    """The other host files of ``listed`` that reach ``host``'s machine (hosts init: an install
    of its own there, or the same install again)."""
    return [item.host for item in listed
            if item.host is not None and item.name != host.name and machine_of(item.host) == machine_of(host)]


def key_error(host: Host, key: str, what: str, todo: str) -> BadInput:
    """A problem with ``key`` of ``host``'s inventory found after it was parsed (at connect
    time: a named file gone or swapped, a name that does not resolve), in the one format
    ``<file>: line N: <key>: <what is wrong>; <what to do>``: the file is read again (bounded)
    to find the key's line; without a readable file the line is left out."""
    source = host.source or "the inventory"
    doc = None
    if host.source:
        try:
            doc = TomlFile(read_text(host.source), source=source)
        except BadInput:
            doc = None
    if doc is None:
        return BadInput(f"{source}: {key}: {what}; {todo}")
    return doc.bad(key, what, todo)


def state_dir_problem(state_dir: str) -> str | None:
    """Why ``state_dir`` cannot be a state folder, judged before any connection (pure).

    The host agent checks again where it runs (``~`` is the host user's home there) and
    also refuses a folder inside or above the package root, or one that is not ours.
    """
    if "$" in state_dir or "`" in state_dir:
        return "holds shell syntax ($ or `), which nothing expands: it would be created literally"
    if not (state_dir.startswith("/") or state_dir == "~" or state_dir.startswith("~/")):
        return "is not absolute (nor under ~/)"
    if ".." in state_dir.split("/"):
        return "climbs with '..'"
    return None
