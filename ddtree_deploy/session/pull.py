"""``snapshot pull``: the bytes of the host's files (read-only, one round trip), and the
refusal when some of them are the patched version the host's journal records, not pristine."""

from __future__ import annotations

import base64

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.digests import sha256
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.remote.agent_session import expect_ok
from ddtree_deploy.remote.link import Transport
from ddtree_deploy.session.agent_link import agent_session, init_request
from ddtree_deploy.session.host_facts import refuse_unsafe, state_folder
from ddtree_deploy.settings.inventory import Host


def pull(host: Host, transport: Transport, paths: list[str]) -> tuple[dict, dict[str, bytes | None]]:
    """The host's SGLang version/root facts and the bytes of ``paths`` (None: absent)."""
    with transport, agent_session(transport, host, write=False) as sess:
        init, facts = sess.call(init_request(host), {"op": "facts", "paths": list(paths), "content": True,
                                              "include_state_paths": False})
        expect_ok(init, host.name, "agent start")
        expect_ok(facts, host.name, "discover")
    got = facts.get("files") or {}
    # Only what was asked for: a file the host adds to its answer is never stored.
    extra = sorted(set(got) - set(paths))
    missing = sorted(set(paths) - set(got))
    if extra or missing:
        raise DeployError(f"{host.name}: the host answered for other files than asked "
                          f"({'extra: ' + extra[0] if extra else 'missing: ' + missing[0]}); nothing was stored",
                          code=Code.AGENT, host=host.name, step="pull", changed=Changed.NO,
                          evidence={"extra": extra, "missing": missing})
    refuse_unsafe(host.name, facts)
    files = {p: (base64.b64decode(got[p]["data"]) if got[p] else None) for p in paths}
    return facts, files


def patched_paths(facts: dict, files: dict[str, bytes | None]) -> list[str]:
    """Paths whose bytes are the patched version the host's journal records (not pristine)."""
    recorded = (facts.get("journal") or {}).get("files", {})
    out = []
    for path, data in files.items():
        entry = recorded.get(path) or {}
        have = None if data is None else sha256(data)
        if have is not None and have == entry.get("patched") and have != entry.get("pristine"):
            out.append(path)
    return out


def not_pristine(host: str, facts: dict, files: dict[str, bytes | None]) -> DeployError | None:
    """``snapshot pull``'s refusal when some of ``files`` are the patched version the journal
    records (None: every file may be taken as pristine): where the originals are, and the
    rollback that gets there (``--replace-drifted`` where other files were edited by hand,
    which a plain rollback refuses)."""
    patched = patched_paths(facts, files)
    if not patched:
        return None
    recorded = (facts.get("journal") or {}).get("files", {})
    edited = any(path in files and (None if files[path] is None else sha256(files[path]))
                 not in (entry.get("pristine"), entry.get("patched"))
                 for path, entry in recorded.items() if isinstance(entry, dict))
    return DeployError(f"{host}: {', '.join(patched)} are patched by ddtree-deploy, not pristine"
                       f"{state_folder(facts).originals}",
                       code=Code.NOT_PRISTINE, hint=f"roll back first: {next_step.rollback(host, drifted=edited)}",
                       host=host, step="pull", changed=Changed.NO, evidence={"patched": patched})


__all__ = ["not_pristine", "patched_paths", "pull"]
