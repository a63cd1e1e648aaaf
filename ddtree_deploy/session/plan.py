"""Plans: compare what a host has with what we want, before anything is written.

Pure functions over plain values (no I/O). A plan is an immutable list of per-file
steps with the hashes they go from and to; the agent re-checks every ``current`` hash
under the lock, so what executes is exactly the plan that was printed. A file that
matches neither side fails the plan before any write (drift), with the way through in its
hint: ``--replace-drifted``, which plans such a file like any other (``Plan.drifted``: the
files whose edited bytes the agent keeps in a backup of their own before the switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed, DeployError


class FileState(str, Enum):
    PRISTINE = "pristine"  # as released / as in the snapshot (for an added file: absent)
    PATCHED = "patched"  # as the series makes it
    DRIFTED = "drifted"  # neither: someone edited it, or another release
    MISSING = "missing"  # absent where a file is expected


@dataclass(frozen=True)
class Target:
    """One file the series produces: its pristine and patched versions."""

    path: str
    pristine: str | None  # sha256; None when the series adds the file
    patched: str
    data: bytes = field(repr=False)  # the patched bytes, uploaded on push
    mode: int = 0o644  # for a file the series adds
    # The pristine bytes (None: the series adds the file): what ``--diff`` shows a drifted
    # host file against (drift.py). Evidence only: never compared, never sent.
    original: bytes | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Desired:
    """What a series makes of a host's SGLang: the input of a push plan."""

    series: str  # family name, e.g. "sglang-0.5.12"
    series_id: str  # hash of the series content: says *which* series is deployed
    sglang_version: str
    snapshot: str  # where the pristine versions came from (for messages)
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class FileStep:
    path: str
    state: FileState
    current: str | None  # sha256 on the host now (None: absent)
    want: str | None  # sha256 after the step (None: absent)

    @property
    def action(self) -> str:
        if self.current == self.want:
            return "keep"
        if self.want is None:
            return "remove"
        return "create" if self.current is None else "replace"


@dataclass(frozen=True)
class Plan:
    kind: str  # "push" | "rollback"
    host: str
    steps: tuple[FileStep, ...]
    backup_id: str | None = None  # rollback: the backup restored
    # --replace-drifted: the files edited outside ddtree-deploy that the plan replaces (their
    # bytes, as read, are kept on the host first; a missing one has none to keep).
    drifted: tuple[str, ...] = ()

    @property
    def changes(self) -> tuple[FileStep, ...]:
        return tuple(s for s in self.steps if s.action != "keep")

    @property
    def noop(self) -> bool:
        return not self.changes

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "backup_id": self.backup_id,
            "changes": len(self.changes),
            "files": [
                {"path": s.path, "state": s.state.value, "action": s.action, "current": s.current, "want": s.want}
                for s in self.steps
            ],
        }


def classify(current: str | None, pristine: str | None, patched: str | None) -> FileState:
    if current is not None and current == patched:
        return FileState.PATCHED
    if current == pristine:
        return FileState.PRISTINE  # includes "absent, and the series adds it"
    if current is None:
        return FileState.MISSING
    return FileState.DRIFTED


@dataclass(frozen=True)
class StateFolder:
    """Where the host keeps this install's state (the agent's ``state_home``) and its newest
    backup: what a drift refusal names, so that the way out says where everything is."""

    home: str | None = None
    backup_id: str | None = None  # the newest backup (push) or the one restored (rollback)

    @property
    def backup(self) -> str | None:
        """The backup's folder on the host (None: no backup, or an agent that does not say)."""
        return f"{self.home}/backups/{self.backup_id}" if self.home and self.backup_id else None

    @property
    def originals(self) -> str:
        """The clause a refusal ends with, naming where the originals are ("" when unknown)."""
        return f"; the originals are in backup {self.backup_id} ({self.backup})" if self.backup else ""

    @property
    def kept(self) -> str:
        return f"{self.home}/drifted/" if self.home else "drifted/ in the host's state folder"


def drift_error(host: str, bad: Sequence[tuple[str, FileState]], source: str, *, command: str,
                folder: StateFolder = StateFolder(), also: str = "", diff: str | None = None) -> DeployError:
    """The drift refusal: which files, where the originals are, and the one command through
    (``command --replace-drifted``); ``also``: another way, where one works. Its evidence:
    the files and their states, and (``push --diff``) ``diff``, what differs in them."""
    listed = ", ".join(f"{path} ({state.value})" for path, state in bad)
    then = "pushes the series" if command == "push" else f"restores backup {folder.backup_id}"
    hint = (f"{next_step.replace_drifted(command, host)} keeps the edited bytes in a backup of their own "
            f"({folder.kept}) and {then}; add --dry-run to see the diff first{also}")
    return DeployError(f"{host}: {len(bad)} file(s) match neither {source} nor the patched version: {listed}"
                       f"{folder.originals}", code=Code.DRIFT, hint=hint, host=host, step="drift check",
                       changed=Changed.NO, evidence={"files": {path: state.value for path, state in bad}}
                       | ({"diff": diff} if diff else {}))


def plan_push(host: str, desired: Desired, current: dict[str, str | None], journal: dict[str, Any] | None = None, *,
              replace_drifted: bool = False, folder: StateFolder = StateFolder(), drift_diff: str | None = None) -> Plan:
    """Every target goes to its patched version; refuse if any is drifted or missing
    (``replace_drifted``: replace those too, their edited bytes kept first: ``Plan.drifted``).

    A file holding the patched version of *another* series (as the host's journal records
    it) is not drift but a different deployment: refuse with the way out (roll back first),
    so that backups only ever hold pristine files and no file of the old series is orphaned.
    ``drift_diff`` (``push --diff``): the drifted files' diff, the refusal's evidence.
    """
    recorded = (journal or {}).get("files", {})
    steps, bad, other = [], [], []
    for t in desired.targets:
        have = current.get(t.path)
        state = classify(have, t.pristine, t.patched)
        if state in (FileState.DRIFTED, FileState.MISSING):
            if have is not None and have == recorded.get(t.path, {}).get("patched"):
                other.append(t.path)
            else:
                bad.append((t.path, state))
        steps.append(FileStep(t.path, state, have, t.patched))
    for path, entry in recorded.items():  # patched by the old series, untouched by this one
        if path not in {t.path for t in desired.targets} and current.get(path) == entry.get("patched") \
                and entry.get("patched") != entry.get("pristine"):
            other.append(path)
    if other:
        j = journal or {}
        raise DeployError(
            f"{host}: series {j.get('series')} ({str(j.get('series_id'))[:12]}) is deployed there, not "
            f"{desired.series} ({desired.series_id[:12]}): {', '.join(sorted(other))} hold its patched versions",
            code=Code.OTHER_SERIES, hint=f"{next_step.rollback(host, drifted=bool(bad))} first, then push")
    if bad and not replace_drifted:
        # `snapshot pull` works too where no file holds a patched version it would refuse.
        patched_here = any(current.get(p) == e.get("patched") and e.get("patched") != e.get("pristine")
                           for p, e in recorded.items() if isinstance(e, dict))
        also = "" if patched_here else (f"; or {next_step.snapshot_pull(host)} records the host's files as the new "
                                        "pristine state (after checking why they changed)")
        raise drift_error(host, bad, f"the snapshot ({desired.snapshot})", command="push", folder=folder, also=also,
                          diff=drift_diff)
    return Plan("push", host, tuple(steps), drifted=_present(bad, current))


def _present(bad: Sequence[tuple[str, FileState]], current: dict[str, str | None]) -> tuple[str, ...]:
    """The drifted files that have bytes to keep (a missing one has none)."""
    return tuple(path for path, _state in bad if current.get(path) is not None)


def plan_rollback(host: str, manifest: dict[str, Any], current: dict[str, str | None], journal: dict[str, Any] | None, *,
                  replace_drifted: bool = False, folder: StateFolder = StateFolder()) -> Plan:
    """Every file of the backup goes back to its backed-up version.

    A file may be at the backup's version or at the patched version the journal records;
    anything else is somebody's edit, and rollback refuses rather than overwrite it, unless
    ``replace_drifted``: then its edited bytes are kept first (``Plan.drifted``).
    """
    recorded = (journal or {}).get("files", {})
    steps, bad = [], []
    for path, entry in sorted(manifest["files"].items()):
        want = entry["sha256"]
        have = current.get(path)
        state = classify(have, want, recorded.get(path, {}).get("patched"))
        if state in (FileState.DRIFTED, FileState.MISSING):
            bad.append((path, state))
        steps.append(FileStep(path, state, have, want))
    if bad and not replace_drifted:
        raise drift_error(host, bad, f"backup {manifest['id']}", command="rollback",
                          folder=StateFolder(folder.home, manifest["id"]))
    return Plan("rollback", host, tuple(steps), backup_id=manifest["id"], drifted=_present(bad, current))
