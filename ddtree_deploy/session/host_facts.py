"""Pure readings of the agent's ``facts`` reply, shared by push, status and pull: each target's
hash, the targets the agent would not replace (a symlink), where the host keeps this install's
state."""

from __future__ import annotations

from typing import Any

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.session.plan import StateFolder


def hashes(facts: dict[str, Any]) -> dict[str, str | None]:
    """Each target's sha256 on the host (None: absent)."""
    return {path: (info or {}).get("sha256") for path, info in facts["files"].items()}


def refuse_unsafe(host: str, facts: dict[str, Any]) -> None:
    """Refuse to plan over a target the agent would not read or replace (a symlink)."""
    bad = [(p, i["unsafe"]) for p, i in sorted(facts["files"].items()) if i and "unsafe" in i]
    if bad:
        raise DeployError(f"{host}: {len(bad)} target file(s) cannot be replaced safely: {bad[0][1]}",
                          code=Code.UNSAFE_FILE, hint="replace the symlink by the real file on the host, then rerun",
                          host=host, step="discover", changed=Changed.NO, evidence={"unsafe": dict(bad)})


def state_folder(facts: dict[str, Any]) -> StateFolder:
    """Where the host keeps this install's state, and its newest backup (for messages)."""
    backups = facts.get("backups") or []
    return StateFolder(facts.get("state_home"), backups[-1].get("id") if backups else None)


__all__ = ["hashes", "refuse_unsafe", "state_folder"]
