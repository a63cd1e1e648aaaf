"""Plans: compare what a host has with what we want, before anything is written.

Pure functions over plain values (no I/O). A plan is an immutable list of per-file
steps with the hashes they go from and to; the agent re-checks every ``current`` hash
under the lock, so what executes is exactly the plan that was printed. A file that
matches neither side fails the plan before any write (drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError


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

    @property
    def changes(self) -> tuple[FileStep, ...]:
        return tuple(s for s in self.steps if s.action != "keep")

    @property
    def noop(self) -> bool:
        return not self.changes

    def to_json(self) -> dict:
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


def drift_error(host: str, bad: list[tuple[str, FileState]], source: str, *, hint: str) -> DeployError:
    listed = ", ".join(f"{path} ({state.value})" for path, state in bad)
    return DeployError(f"{host}: {len(bad)} file(s) match neither {source} nor the patched version: {listed}",
                       code=Code.DRIFT, hint=hint)


def plan_push(host: str, desired: Desired, current: dict[str, str | None], journal: dict | None = None) -> Plan:
    """Every target goes to its patched version; refuse if any is drifted or missing.

    A file holding the patched version of *another* series (as the host's journal records
    it) is not drift but a different deployment: refuse with the way out (roll back first),
    so that backups only ever hold pristine files and no file of the old series is orphaned.
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
            code=Code.OTHER_SERIES, hint=f"{next_step.rollback(host)} first, then push")
    if bad:
        raise drift_error(host, bad, f"the snapshot ({desired.snapshot})",
                          hint=f"{next_step.snapshot_pull(host)} records the host's files as the new "
                          "pristine state (after checking why they changed)")
    return Plan("push", host, tuple(steps))


def plan_rollback(host: str, manifest: dict, current: dict[str, str | None], journal: dict | None) -> Plan:
    """Every file of the backup goes back to its backed-up version.

    A file may be at the backup's version or at the patched version the journal records;
    anything else is somebody's edit, and rollback refuses rather than overwrite it.
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
    if bad:
        raise drift_error(host, bad, f"backup {manifest['id']}",
                          hint=f"restore those files by hand, or inspect them with {next_step.status(host)}")
    return Plan("rollback", host, tuple(steps), backup_id=manifest["id"])
