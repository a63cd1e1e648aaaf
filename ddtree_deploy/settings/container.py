"""The host's ``[container]`` table: a host whose SGLang server runs in a Docker or Podman
container. Pure: read through ``toml_input.TomlFile``, so a wrong value is the one message
every TOML input gives, ``<file>: line N: container.<key>: <what is wrong>; <what to do>``.

    [container]
    engine = "podman"                    # "docker" or "podman": its CLI runs ON the host, over SSH
    name = "sglang"                      # the container that serves (as `docker ps` names it)
    python = "python3"                   # the interpreter INSIDE the image that imports sglang
    stop_timeout_s = 30                  # `stop -t`: seconds the old container gets to stop
    build_timeout_s = 1800               # the image build, at most
    # compose_file = "/opt/sglang/compose.yaml"   # optional: recreate with `compose up -d`
    # service = "sglang"                          #   (the file's service; required with compose_file)

A container host also needs ``[serve]`` with ``url`` (the server's base URL as seen on the
host: the health gate and the DDTree proof), and no ``restart`` or ``drain`` (the
container is recreated, not restarted) and no ``[smoke]`` (the image build byte-compiles
the files; the proof runs on the real server). ``host.python`` is the host's own
interpreter, which runs the container program (stdlib only: no sglang needed outside the
container). Every value reaches the host as JSON and is used as an argv element there,
never through a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddtree_deploy.base.toml_input import Table, TomlFile

if TYPE_CHECKING:  # inventory.py imports this module: the annotation only
    from ddtree_deploy.settings.inventory import Host

ENGINES = ("docker", "podman")
DEFAULT_PYTHON = "python3"
_KEYS = ("engine", "name", "python", "compose_file", "service", "stop_timeout_s", "build_timeout_s")
# Docker's own rule for a container name (podman's is the same): a letter or digit, then
# letters, digits, '_', '.', '-'. Also a compose service name.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# The interpreter inside the image: one word (it goes into `exec`'s argv and the Dockerfile's ARG).
_PYTHON = re.compile(r"^[A-Za-z0-9_./+-]{1,255}$")
MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class ContainerSettings:
    """``[container]``, validated."""

    engine: str
    name: str
    python: str = DEFAULT_PYTHON
    compose_file: str | None = None
    service: str | None = None
    stop_timeout_s: float = 30.0
    build_timeout_s: float = 1800.0

    @property
    def identity(self) -> str:
        """The container's key in the host's state folder, where a venv install has its
        package root (hostprog/roots.py keys both the same way): one per engine and name.
        Absolute, so that no state folder can lie inside or above it."""
        return f"/container:{self.engine}/{self.name}"

    def to_request(self) -> dict[str, Any]:
        """What the container program is told (hostprog/container.py's ``init``)."""
        return {"engine": self.engine, "name": self.name, "python": self.python,
                "compose_file": self.compose_file, "service": self.service, "stop_timeout_s": self.stop_timeout_s}


def parse_container(doc: TomlFile) -> ContainerSettings | None:
    """A host file's ``[container]`` -> ContainerSettings (None: no table), or one BadInput line
    naming the key (inventory.parse_host calls it: a broken table is a broken host file)."""
    if doc.get("container") is None:
        return None
    doc.table("container")
    doc.unknown("container", _KEYS)
    if not doc.get("container"):
        raise doc.bad("container", "is empty", 'add engine = "podman" (or "docker") and name, or remove [container]')
    if doc.get("container.engine") is None:
        raise doc.bad("container.engine", "missing (required): which engine runs the container",
                      'add engine = "docker" or engine = "podman"')
    engine = doc.choice("container.engine", ENGINES, default="")
    name = doc.string("container.name", required=True, example="sglang")
    if not _NAME.match(name):
        raise doc.bad("container.name", f"{name!r} is not a container name (a letter or digit, then letters, "
                      "digits, '_', '.', '-')", "write the name `docker ps` shows for the container")
    python = doc.string("container.python", default=DEFAULT_PYTHON, example=DEFAULT_PYTHON)
    if not _PYTHON.match(python):
        raise doc.bad("container.python", f"{python!r} is not one word naming an interpreter",
                      'write the image\'s interpreter that imports sglang, e.g. python = "python3"')
    compose_file = doc.string("container.compose_file", default=None, example="/opt/sglang/compose.yaml")
    service = doc.string("container.service", default=None, example="sglang")
    if compose_file is not None:
        if not compose_file.startswith("/") or any(c in compose_file for c in "\n\0") or \
                ".." in compose_file.split("/"):
            raise doc.bad("container.compose_file", f"{compose_file!r} is not an absolute path on the host",
                          'write the compose file\'s absolute path, e.g. compose_file = "/opt/sglang/compose.yaml"')
        if service is None:
            raise doc.bad("container.service", "missing: a compose_file needs the service that runs SGLang",
                          'add service = "sglang" (the service\'s name in the compose file)')
    if service is not None:
        if compose_file is None:
            raise doc.bad("container.service", "set without compose_file", "add compose_file, or remove service")
        if not _NAME.match(service):
            raise doc.bad("container.service", f"{service!r} is not a compose service name",
                          "write the service's name as the compose file has it")
    return ContainerSettings(engine=engine, name=name, python=python, compose_file=compose_file, service=service,
                             stop_timeout_s=_seconds(doc, "stop_timeout_s", 30.0),
                             build_timeout_s=_seconds(doc, "build_timeout_s", 1800.0))


def _seconds(doc: TomlFile, key: str, default: float) -> float:
    return doc.seconds(f"container.{key}", default=default, hi=MAX_SECONDS)


def refuse_tables(host: Host) -> None:
    """A ``[container]`` host's other tables: ``[smoke]`` has no meaning there (one line)."""
    if host.smoke:
        doc = host.smoke.doc if isinstance(host.smoke, Table) and host.smoke.doc is not None else \
            TomlFile.of({}, source=host.source or "<inventory>")
        raise doc.bad("smoke", "a [container] host runs no smoke levels (its image build byte-compiles the files; "
                      "the health gate proves DDTree on the real server)", "remove the [smoke] table")


def refuse_container(host: Host, command: str) -> None:
    """``command`` does not take a ``[container]`` host: one line, exit 2, nothing sent."""
    if host.container is not None:
        from ddtree_deploy.base.errors import BadInput

        raise BadInput(f"{host.source or host.name}: container: `{command}` does not take a [container] host (its "
                       "SGLang runs in a container: push and rollback recreate it, status reads it, history and "
                       "lock read its state)", hint="run it against a host whose SGLang is installed on the host")


__all__ = ["ContainerSettings", "ENGINES", "parse_container", "refuse_container", "refuse_tables"]
