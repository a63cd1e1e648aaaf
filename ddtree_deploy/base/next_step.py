"""The one home of "what to run next": the command lines that errors, hints and reports tell
the user to run, written once, each in backticks so that it reads as a command and can be
copied whole. Pure text, stdlib only (plan.py uses it, and the image build copies plan.py
with the modules it imports).

The host programs (ddtree_deploy/hostprog/, the image build's image_apply.py among them) print
no commands of the toolkit's own, or keep theirs: they run alone, without this package.
"""

from __future__ import annotations

PROG = "ddtree-deploy"


def command(*args: str) -> str:
    """```ddtree-deploy ARGS...``` in backticks: one command the user can copy."""
    return "`" + " ".join((PROG, *args)) + "`"


def _folder(folder: object) -> list[str]:
    """``-i DIR`` when the command was given one, so the hint reads the same folder."""
    return ["-i", str(folder)] if folder is not None else []


def push(host: str) -> str:
    return command("push", "--host", host)


def rollback(host: str, *, drifted: bool = False) -> str:
    """``drifted``: files were edited outside ddtree-deploy (a plain rollback refuses them)."""
    return replace_drifted("rollback", host) if drifted else command("rollback", "--host", host)


def replace_drifted(verb: str, host: str) -> str:
    """Push or roll back over files edited outside ddtree-deploy, their edited bytes kept
    first in a backup of their own on the host."""
    return command(verb, "--host", host, "--replace-drifted")


def status_diff(host: str) -> str:
    """What each drifted file holds, against what the series expects there."""
    return command("status", "--host", host, "--diff")


def smoke(host: str) -> str:
    return command("smoke", "--host", host)


def status(host: str | None = None, folder: object = None) -> str:
    return command("status", "--host", host, *_folder(folder)) if host else command("status")


def restart(host: str) -> str:
    """Restart the host's serving SGLang through its [serve] table, gated on health."""
    return command("restart", "--host", host)


def push_or_rollback(host: str) -> str:
    """A host whose server restart after a push was not confirmed: complete it, or go back."""
    return f"run {push(host)} (it restarts and checks the server again) or {rollback(host)}"


def smoke_or_rollback(host: str) -> str:
    """A host left `switched` (smoke not run or not passed): the two ways on."""
    return f"run {smoke(host)} or {rollback(host)}"


def check(*, release: str | None = None, snapshot: str | None = None, family: str | None = None) -> str:
    """`check` of a release or a snapshot (it needs one of them), with the family when known."""
    args = ["check"]
    args += ["--snapshot", snapshot] if snapshot else ["--release", release or "VERSION"]
    return command(*args, *(["--family", family] if family else []))


def snapshot_pull(host: str) -> str:
    return command("snapshot", "pull", "--host", host)


def snapshot_release(version: str = "VERSION") -> str:
    return command("snapshot", "release", version)


def port(family: str, version: str = "VERSION") -> str:
    """A family of your own, made from ``family`` for a release."""
    return command("port", "--family", family, "--to", version)


def series_refresh(family: str, tree: str) -> str:
    """After `port` left rejects to fix by hand in ``tree``."""
    return command("series", "refresh", "--family", family, "--from", tree, "--resolved")


def hosts_list(folder: object = None) -> str:
    """The hosts of the inventory folder (and where it is)."""
    return command("hosts", "list", *_folder(folder))


def hosts_init(name: str, folder: object = None) -> str:
    """Write a commented host file for ``name`` where the toolkit reads hosts."""
    return command("hosts", "init", name, *_folder(folder))


def python_that_imports_sglang(source: str | None = None, *, local: bool = True) -> str:
    """A host whose ``python`` finds no sglang. ``source``: its host file (None: the built-in
    ``local``, which is the toolkit's own Python); ``local``: this machine (else reached by SSH:
    the hint speaks of that host, never of this machine's built-in one)."""
    if source is None:
        return ("set [host] python in the host's file to the interpreter that imports sglang (the built-in host "
                "'local' runs ddtree-deploy's own Python; for another on this machine: "
                + command("hosts", "init", "NAME", "--local", "--python", "PATH") + ")")
    where = "this machine" if local else "the host"
    return (f"set host.python in {source} to the interpreter on {where} that imports sglang (the one its SGLang "
            f"server runs with: ps -eo args | grep sglang on {where} shows it)")


def lock_release(host: str, *, force: bool = False) -> str:
    """``force``: for a lock whose process may still run (the user must know it is gone)."""
    return command("lock", "release", "--host", host, *(["--force"] if force else []))


__all__ = [
    "PROG",
    "check",
    "command",
    "hosts_init",
    "hosts_list",
    "lock_release",
    "port",
    "python_that_imports_sglang",
    "push",
    "push_or_rollback",
    "replace_drifted",
    "restart",
    "rollback",
    "series_refresh",
    "smoke",
    "smoke_or_rollback",
    "snapshot_pull",
    "snapshot_release",
    "status",
    "status_diff",
]
