"""What a host is in, read-only: the status document and the sentence that explains it.

One agent session that takes no lock: [init, facts] in one round trip (``reading``), and
more read-only requests on it where the caller needs them (a server that started before the
last switch: its switches, one more round trip). ``describe`` and ``explain`` are pure: the
facts (and what the series wants) -> the document and its one sentence.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Phase
from ddtree_deploy.remote.agent_session import AgentSession, expect_ok
from ddtree_deploy.remote.link import Transport
from ddtree_deploy.session.agent_link import agent_session, init_request
from ddtree_deploy.session.host_facts import hashes
from ddtree_deploy.session.plan import Desired, FileState, classify
from ddtree_deploy.settings.inventory import Host


@dataclass
class Reading:
    """A read-only agent session's first answer (``facts``), and the way to ask more on it."""

    facts: dict
    transport: Transport
    _sess: AgentSession
    _host: Host

    def ask(self, request: dict) -> dict:
        """One more read-only request over this session (e.g. the history's switches)."""
        return expect_ok(self._sess.one(request), self._host.name, request["op"])

    @property
    def round_trips(self) -> int:
        return self._sess.round_trips


@contextmanager
def reading(host: Host, transport: Transport, paths: list[str] = (), content: bool = False,
            driver: bool = False) -> Iterator[Reading]:
    """A read-only agent session (takes no lock): [init, facts] in one round trip; the caller
    may ``ask`` more on it (the serving processes' record) before it closes. ``content``
    (``status --diff``): the facts carry the files' bytes too; ``driver`` (status): the
    host's NVIDIA driver as nvidia-smi says it."""
    with transport, agent_session(transport, host, write=False) as sess:
        request = {"op": "facts", "paths": list(paths), "content": content}
        if driver:
            request["driver"] = True
        init, facts = sess.call(init_request(host), request)
        expect_ok(init, host.name, "agent start")
        expect_ok(facts, host.name, "discover")
        yield Reading(facts, transport, sess, host)


def status(host: Host, transport: Transport, paths: list[str] = (), desired: Desired | None = None) -> dict:
    """The host's state as one JSON-able document (read-only: takes no lock); ``desired``:
    what the series wants there (``describe``). A caller that resolves the series from the
    host's facts, or looks at its serving processes, reads with ``reading`` and ``describe``s."""
    with reading(host, transport, paths) as read:
        pass
    return describe(host.name, read.facts, desired, read.round_trips)


def describe(name: str, facts: dict, desired: Desired | None, round_trips: int = 0) -> dict:
    """Pure: facts (+ optionally what the series wants) -> the status document."""
    journal = facts.get("journal")
    current = hashes(facts)
    expect: dict[str, tuple[str | None, str | None]] = {}
    if journal:
        expect.update({p: (e.get("pristine"), e.get("patched")) for p, e in journal.get("files", {}).items()})
    if desired is not None:
        for t in desired.targets:
            expect.setdefault(t.path, (t.pristine, t.patched))
    files = []
    unsafe = {p: i["unsafe"] for p, i in (facts.get("files") or {}).items() if i and "unsafe" in i}
    # Paths of other families (the CLI asks for every family's paths before it knows the
    # host's release) say nothing about this host: once its files are known, only they count.
    shown = (set(expect) if expect else {p for p, sha in current.items() if sha}) | set(unsafe)
    for path in sorted(shown):
        pristine, patched = expect.get(path, (None, None))
        state = classify(current.get(path), pristine, patched) if path in expect else None
        entry = {"path": path, "state": state.value if state else "unknown", "sha256": current.get(path)}
        if path in unsafe:  # a symlink: never read through, reported by name
            entry.update(state="unsafe", detail=unsafe[path])
        files.append(entry)
    return {
        "host": name,
        "sglang_version": facts.get("sglang_version"),
        "package_root": facts.get("package_root"),
        "phase": (journal or {}).get("phase", Phase.NEVER_DEPLOYED),
        # The files disagree with the journal's phase (see disagreement): the host is MIXED
        # whatever the journal says, and the explanation starts with that.
        "mixed": disagreement(journal, files) is not None,
        "explanation": explain(journal, files, name),
        "series": ({"name": journal.get("series"), "id": journal.get("series_id"), "run_id": journal.get("run_id"),
                    "updated": journal.get("updated"), "backup_id": journal.get("backup_id")} if journal else None),
        "files": files,
        "backups": [{"id": b["id"], "created": b.get("created"), "series": b.get("series")}
                    for b in facts.get("backups", [])],
        # Files edited outside ddtree-deploy that --replace-drifted replaced: kept, as found.
        "drifted_backups": [_kept(d) for d in facts.get("drifted") or () if isinstance(d, dict)],
        "lock": facts.get("lock"),
        # This install's state folder, and every install keeping state in the same state folder.
        "state_home": facts.get("state_home"),
        "installs": [i for i in facts.get("installs") or () if isinstance(i, dict)],
        "round_trips": round_trips,
    }


def _kept(manifest: dict) -> dict:
    """A kept-edits manifest as status shows it: where each file's bytes are on the host."""
    folder = str(manifest.get("folder") or "")
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    return {"id": manifest.get("id"), "created": manifest.get("created"), "run_id": manifest.get("run_id"),
            "command": manifest.get("command"), "folder": folder or None,
            "files": [{"path": p, "sha256": (e or {}).get("sha256"),
                       "file": f"{folder}/{(e or {}).get('file')}" if folder and (e or {}).get("file") else None}
                      for p, e in sorted(files.items())]}


def explain(journal: dict | None, files: list[dict], host: str = "HOST") -> str:
    """One sentence saying what state the host is in and what to run next."""
    counts: dict[str, int] = {}
    for f in files:
        counts[f["state"]] = counts.get(f["state"], 0) + 1
    tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no files known"
    if not journal:
        return f"never deployed by ddtree-deploy ({tally})"
    op, phase, run = journal.get("op"), journal.get("phase"), journal.get("run_id")
    mixed = disagreement(journal, files)
    if mixed is not None:
        return (f"MIXED: the journal says {phase} ({op} run {run}) but {mixed} ({tally}): an import of SGLang may "
                f"fail; rerun {next_step.push(host)} to complete the series or {next_step.rollback(host)} to "
                "restore the backup")
    bad = counts.get(FileState.DRIFTED.value, 0) + counts.get(FileState.MISSING.value, 0) + counts.get("unsafe", 0)
    suffix = f"; {bad} file(s) changed outside ddtree-deploy" if bad else ""
    edited = counts.get(FileState.DRIFTED.value, 0) + counts.get(FileState.MISSING.value, 0)
    if edited:  # the way through: see them, then replace them with the edits kept
        suffix += (f" ({next_step.status_diff(host)} shows them; {next_step.replace_drifted('push', host)} or "
                   f"{next_step.rollback(host, drifted=True)} keeps their bytes in a backup of their own and "
                   "replaces them)")
    serve = journal.get("serve") if isinstance(journal.get("serve"), dict) else {}
    if serve.get("run_id") != run:
        serve = {}  # a restart for files switched since: it says nothing about these
    restarted = _restart_clause(serve)
    if phase == Phase.DEPLOYED:
        return f"deployed {journal.get('series')} by run {run} ({tally}){restarted}{suffix}"
    if phase == Phase.SWITCHED and serve:
        return (f"files patched by run {run} ({tally}); its smoke passed and the server was restarted"
                f"{restarted}, so the host is not marked deployed: {next_step.push_or_rollback(host)}{suffix}")
    if phase == Phase.SWITCHED:
        failed = (journal.get("smoke") or {}).get("failed")
        why = f" (it failed at {failed})" if failed else ""
        return (f"files patched by run {run} ({tally}); the smoke has not passed{why}: "
                f"{next_step.smoke_or_rollback(host)}{suffix}")
    if phase == Phase.ROLLED_BACK:
        auto = journal.get("automatic") if isinstance(journal.get("automatic"), dict) else None
        how = (f" automatically after push run {auto.get('push_run')} ({cause_words(auto)})" if auto else "")
        return f"rolled back{how} to backup {journal.get('backup_id')} by run {run} ({tally}){restarted}{suffix}"
    if phase == Phase.STAGED:
        return (f"{op} run {run} stopped after staging, before any file changed ({tally}); "
                f"rerun `{op}` to complete it{suffix}")
    if phase == Phase.SWITCHING:
        return (f"{op} run {run} was interrupted while switching files ({tally}); each file is wholly old or new; "
                f"rerun `{op}` to complete it" + (" or `rollback` to restore the backup" if op == "push" else "")
                + suffix)
    return f"journal phase {phase!r} ({tally}){suffix}"


def cause_words(automatic: dict) -> str:
    """An automatic rollback's cause in a few words: "smoke failed at import", "server health"."""
    cause, step = automatic.get("cause"), automatic.get("step")
    if cause == "smoke":
        return f"smoke failed at {step}"
    if cause == "analysis":  # the speed gate: slower than the baseline, not proven, or the server died
        return "speed analysis failed" if step in (None, "analysis") else f"speed analysis: {step}"
    return f"server {step or cause} failed after the restart"


def _restart_clause(serve: dict) -> str:
    """The journal's newest server restart, as a clause of ``explain`` ("" when none)."""
    state, when = serve.get("state"), serve.get("time")
    if not state:
        return ""
    if state == "healthy":
        return f"; server restarted {when}, healthy then"  # (now: the serving line's health, status' attention)
    if state == "restarting":
        return (f"; a server restart began {when} and its end was never recorded (interrupted, or the "
                "connection lost): whether the server is healthy is unknown")
    if state == "interrupted":
        return f"; the server restart of {when} was interrupted (Ctrl-C) before its health was confirmed"
    return f"; the server restart of {when} left it NOT healthy ({serve.get('failed')}: {serve.get('detail')})"


def disagreement(journal: dict | None, files: list[dict]) -> str | None:
    """Pure: how the files contradict the journal's phase, in words, or None when they agree.

    ``deployed`` and ``switched`` mean every file is patched, ``rolled-back`` every file
    pristine, ``staged`` nothing switched yet (all on one side). Only ``switching`` may be
    mixed: a switch under way or interrupted, which its explanation says. Drifted, missing
    and unsafe files are told apart by the explanation (changed outside ddtree-deploy)."""
    phase = (journal or {}).get("phase")
    pristine = sum(1 for f in files if f["state"] == FileState.PRISTINE.value)
    patched = sum(1 for f in files if f["state"] == FileState.PATCHED.value)
    if phase in (Phase.DEPLOYED, Phase.SWITCHED) and pristine:
        return f"{pristine} of its file(s) {'is' if pristine == 1 else 'are'} pristine (not patched)"
    if phase == Phase.ROLLED_BACK and patched:
        return f"{patched} of its file(s) {'is' if patched == 1 else 'are'} still patched"
    if phase == Phase.STAGED and pristine and patched:
        return f"{patched} file(s) are patched and {pristine} pristine, though no file should have changed yet"
    return None


def ask(host: Host, transport: Transport, request: dict) -> dict:
    """One read-only agent request over an open ``transport``: [init, request], one round trip."""
    with agent_session(transport, host, write=False) as sess:
        init, reply = sess.call(init_request(host), request)
    expect_ok(init, host.name, "agent start")
    return expect_ok(reply, host.name, request["op"])


__all__ = ["Reading", "ask", "cause_words", "describe", "disagreement", "explain", "reading", "status"]
