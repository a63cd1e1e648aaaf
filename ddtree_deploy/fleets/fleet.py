"""The fleet policy: which host starts when, and what each host's result means. Pure.

A fleet command (push, rollback or status on several hosts) runs in this order:

- **push**: the canary (the first selected host, or ``--canary``) is pushed and
  smoke-tested alone. Only if it ends deployed do the others start, ``parallel`` at a
  time. Once more than ``max_failures`` hosts have failed, no new host is started (the
  running ones finish, and a smoke failure among them is still rolled back by its own
  push); the hosts never started are reported as skipped. A failure once every host has
  started stops nothing: the report's ``stop_reason`` is set only when a host was left
  unstarted.
- **rollback**, **status** and a push's **dry run**: every host, ``parallel`` at a
  time, no canary and no stop: rolling back is the way out of a bad push, one host's
  failure must never keep the others where they are, and a dry run changes nothing.

``Schedule`` is the state machine the runner (``fleet_run``) asks "what may start now?";
``outcome_of_*`` read one host's result (a JSON document or the error it raised) into
one of the ``Kind`` values the outcome table shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import UNREACHABLE, Phase
from ddtree_deploy.base.errors import EXIT_FAILED, BadInput, Changed, DeployError


class Kind(str, Enum):
    """How one host ended. ``ok`` kinds are the only ones that give exit code 0."""

    PUSHED = "pushed"
    ALREADY = "already deployed"
    ROLLED_BACK = "rolled back"  # the rollback command restored a backup
    ALREADY_ROLLED_BACK = "already rolled back"  # the rollback command found nothing to restore
    READ = "fine"  # status: the host answered and nothing in its state needs a person (``attention``)
    ATTENTION = "needs attention"  # status: the host answered, but its state is not fine (``attention``)
    SMOKE_PASSED = "smoke passed"  # smoke: every level passed
    SMOKE_FAILED = "smoke failed"  # smoke: a level failed (the host's report says which)
    PLANNED = "dry run: would change"  # --dry-run: the plan has changes; nothing was changed
    FAILED_ROLLED_BACK = "failed, rolled back"  # smoke failed after the switch; the backup is back
    FAILED_NOT_ROLLED_BACK = "failed, NOT rolled back"  # --no-rollback, or the automatic rollback failed
    SWITCHED = "switched, smoke not passed"  # files patched, but the smoke could not run or the mark failed
    # Nothing on the host changed: refused before the apply request was sent (drift, lock
    # held, check, no sglang in the host's python...), or the switch failed and the agent
    # switched every file back in the same op (the error names the file and errno).
    FAILED_UNCHANGED = "failed, host unchanged"
    FAILED_UNKNOWN = "failed, state unknown"  # the error came from a step that may have changed files
    SKIPPED = "skipped"
    UNREACHABLE = "unreachable"
    RESTARTED = "restarted, healthy"  # restart: the server came back healthy (and proven, where asked)
    UNHEALTHY = "server NOT healthy"  # restart / rollback / push with nothing to switch: the restart failed

    @property
    def ok(self) -> bool:
        return self in _OK


_OK = {Kind.PUSHED, Kind.ALREADY, Kind.ROLLED_BACK, Kind.ALREADY_ROLLED_BACK, Kind.READ, Kind.PLANNED,
       Kind.SMOKE_PASSED, Kind.RESTARTED}



@dataclass(frozen=True)
class Policy:
    canary: str | None  # None: no canary (rollback, status)
    parallel: int
    max_failures: int | None  # None: never stop starting hosts
    # Waves (hosts that restart their server): after the canary, ``parallel`` hosts start
    # together and the next wave waits until all of them ended; a host whose server was
    # left down keeps its place, so never more than ``parallel`` servers are down at once.
    waves: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"canary": self.canary, "parallel": self.parallel, "max_failures": self.max_failures,
                "waves": self.waves}


def push_policy(hosts: Sequence[str], *, canary: str | None, parallel: int | None, max_failures: int,
                waves: bool = False) -> Policy:
    """Validate the push options against the selection (bad input: nothing is started)."""
    if canary is not None and canary not in hosts:
        raise BadInput(f"--canary {canary}: not one of the selected hosts ({', '.join(hosts)})",
                       hint="name a host also given by --host or --group")
    if max_failures < 0:
        raise BadInput(f"--max-failures {max_failures}: must be 0 or more")
    return Policy(canary=canary or hosts[0], parallel=_parallel(hosts, parallel), max_failures=max_failures,
                  waves=waves)


def spread_policy(hosts: Sequence[str], *, parallel: int | None) -> Policy:
    """rollback / status: every host, no canary, no stop."""
    return Policy(canary=None, parallel=_parallel(hosts, parallel), max_failures=None)


def _parallel(hosts: Sequence[str], parallel: int | None) -> int:
    if parallel is None:
        return max(1, len(hosts))
    if parallel < 1:
        raise BadInput(f"--parallel {parallel}: must be 1 or more")
    return min(parallel, max(1, len(hosts)))


def select(hosts: Sequence[str], groups: Sequence[str], group_members: dict[str, tuple[str, ...]]) -> list[str]:
    """--host and --group into one ordered list without repeats (first mention wins).

    Groups are expanded where they are named, after every --host: the canary by
    default is the first --host, else the first member of the first group.
    """
    chosen: list[str] = []
    for name in list(hosts) + [m for g in groups for m in _members(g, group_members)]:
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise BadInput("no host selected: give --host NAME or --group NAME")
    return chosen


def _members(group: str, group_members: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    if group not in group_members:
        known = ", ".join(sorted(group_members)) or "none"
        raise BadInput(f"--group {group}: no such group (groups: {known})",
                       hint=f"groups are defined in the inventory folder's groups.toml: {next_step.hosts_list()} "
                            "shows them")
    return group_members[group]


@dataclass
class Schedule:
    """What may start now, given what has finished. The runner owns the threads."""

    hosts: Sequence[str]
    policy: Policy
    pending: list[str] = field(init=False)
    running: set[str] = field(default_factory=set, init=False)
    results: dict[str, Kind] = field(default_factory=dict, init=False)
    stop_reason: str | None = field(default=None, init=False)
    down: set[str] = field(default_factory=set, init=False)  # ended with their server not healthy
    wave_of: dict[str, int] = field(default_factory=dict, init=False)  # host -> its wave (1: the first batch)

    def __post_init__(self) -> None:
        canary = self.policy.canary
        self.pending = ([canary] if canary else []) + [h for h in self.hosts if h != canary]

    @property
    def failures(self) -> int:
        return sum(1 for k in self.results.values() if not k.ok)

    def ready(self) -> list[str]:
        """Hosts to start now (they are marked running)."""
        if self.stop_reason is not None:
            return []
        canary = self.policy.canary
        if canary is not None and canary not in self.results:
            batch = [canary] if canary not in self.running else []
        elif self.policy.waves and self.running:
            batch = []  # a wave starts only once the previous one has ended
        else:
            room = self.policy.parallel - len(self.running) - len(self.down)
            batch = self.pending[:max(0, room)]
            if not batch and self.pending and not self.running:
                self.stop_reason = (f"{len(self.down)} host(s) left with their server down: starting another "
                                    f"would take more than --parallel {self.policy.parallel} down")
        if batch:
            wave = max(self.wave_of.values(), default=0) + 1
            self.wave_of.update((h, wave) for h in batch)
        for h in batch:
            self.pending.remove(h)
            self.running.add(h)
        return batch

    def record(self, host: str, kind: Kind, *, down: bool = False) -> None:
        self.running.discard(host)
        self.results[host] = kind
        if down:
            self.down.add(host)
        if self.stop_reason is not None or not self.pending:
            return  # (nothing left to start: nothing is stopped, whatever failed)
        if host == self.policy.canary and not kind.ok:
            self.stop_reason = f"the canary {host} ended {kind.value}"
        elif self.policy.max_failures is not None and self.failures > self.policy.max_failures:
            self.stop_reason = f"{self.failures} host(s) failed (--max-failures {self.policy.max_failures})"

    @property
    def done(self) -> bool:
        return not self.running and (not self.pending or self.stop_reason is not None)

    def skipped(self) -> list[str]:
        """Hosts never started (only meaningful once ``done``)."""
        return list(self.pending)


# ---------------------------------------------------------------- one host's result -> Kind


def outcome_of_error(exc: DeployError) -> Kind:
    """The error says, as it was made: ``changed`` is ``Changed.NO`` where the failure is
    known to have left the host as it was (its code proves it, or the push's stages before
    the switch request said so); anything else may have changed files: "state unknown",
    with `status` as the way to find out."""
    if exc.code in UNREACHABLE:
        return Kind.UNREACHABLE
    if exc.changed is Changed.NO:
        return Kind.FAILED_UNCHANGED
    return Kind.FAILED_UNKNOWN


@dataclass(frozen=True)
class HostResult:
    """One host's end: its kind, the document the single-host command would print, why."""

    host: str
    kind: Kind
    doc: dict[str, Any]
    message: str = ""  # the error or skip reason, one line
    exit_code: int = 0  # the error's own exit code (2 for bad input), else 1 when not ok
    lines: tuple[str, ...] = ()  # what the single-host command prints on stdout for this host
    elapsed: float | None = None  # wall time of the host's whole work (push + smoke + rollback); None: not started
    hint: str | None = None  # what to do about it (the error's hint)
    # The exception that ended the host's work, where one did: the one-host CLI re-raises it
    # (its one-line message, hint and exit code); evidence, not part of the JSON.
    error: BaseException | None = field(default=None, compare=False, repr=False)
    down: bool = False  # its server was left not healthy (a restart failed): it counts against --parallel
    wave: int | None = None  # the batch it started in (1: the first, the canary's); None: not started
    started: float | None = None  # seconds after the fleet's start when it started

    def shown_lines(self) -> tuple[str, ...]:
        """``lines`` as printed: the first line is the host's outcome. A host that did not end
        ok whose own lines start otherwise (a push whose smoke failed begins with its switch,
        ``pushed ... switched``) is led by ``HOST: OUTCOME: why``."""
        head = f"{self.host}: {self.kind.value}"
        if self.kind.ok or (self.lines and self.lines[0].lower().startswith(head.lower())):
            return self.lines
        why = self.message[len(self.host) + 2:] if self.message.startswith(f"{self.host}: ") else self.message
        return (head + (f": {why}" if why else ""), *self.lines)

    def to_json(self) -> dict[str, Any]:
        return {**self.doc, "host": self.host, "ok": self.kind.ok, "outcome": self.kind.value,
                "elapsed_s": None if self.elapsed is None else round(self.elapsed, 3),
                "wave": self.wave, "started_s": None if self.started is None else round(self.started, 3)}


def failed(host: str, exc: DeployError) -> HostResult:
    """A host whose work raised ``exc``; evidence the error carries (``diff``: a drifted
    file against what the series expects, ``push --diff``) is its lines and ``diff``."""
    doc = {"host": host, **exc.to_json()}
    diff = exc.evidence.get("diff")
    if diff:
        doc["diff"] = diff
    return HostResult(host, outcome_of_error(exc), doc, exc.message, exc.exit_code, hint=exc.hint, error=exc,
                      lines=tuple(diff.splitlines()) if diff else ())


def skipped(host: str, reason: str) -> HostResult:
    return HostResult(host, Kind.SKIPPED, {"host": host, "reason": reason}, reason, EXIT_FAILED)


@dataclass(frozen=True)
class FleetReport:
    command: str
    policy: Policy
    results: tuple[HostResult, ...]  # in selection order
    stop_reason: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.kind.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        return max([r.exit_code or EXIT_FAILED for r in self.results if not r.kind.ok], default=0)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.kind.value] = out.get(r.kind.value, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "ok": self.ok, "policy": self.policy.to_json(),
                "stopped": self.stop_reason, "counts": self.counts(), "seconds": round(self.seconds, 3),
                "hosts": [r.to_json() for r in self.results]}


# ---------------------------------------------------------------- status: a host that answered is not a fine host

#: What ``attention`` finds, in the order the footer counts them: (kind, words for the footer).
ATTENTION_KINDS = (("mixed", "MIXED"), ("drifted", "drifted files"), ("interrupted", "a run not completed"),
                   ("stale", "serving stale code"), ("unhealthy", "server not healthy"),
                   ("restart-unrecorded", "a restart's end not recorded"))


def attention(doc: dict[str, Any], *, serve: bool, restart: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Pure: what in a host's status document needs a person, as [{kind, detail}] (empty: the
    host is fine). ``serve``: the host has a ``[serve]`` table (its server must be healthy);
    ``restart``: the journal's record of the newest server restart (its ``serve``)."""
    out = []

    def add(kind: str, detail: str) -> None:
        out.append({"kind": kind, "detail": detail})

    phase = doc.get("phase")
    lock = doc.get("lock") or {}
    busy = bool(lock) and not lock.get("stale")  # a live run is completing its switch or restart now
    if doc.get("mixed"):
        add("mixed", f"MIXED: its files contradict the journal ({phase})")
    bad = [f for f in doc.get("files") or () if f.get("state") in ("drifted", "missing", "unsafe")]
    if bad:
        add("drifted", f"{len(bad)} file(s) changed outside ddtree-deploy ({bad[0]['path']} {bad[0]['state']}"
                       + (", ..." if len(bad) > 1 else "") + ")")
    if not doc.get("mixed") and not busy and phase in (Phase.STAGED, Phase.SWITCHING, Phase.SWITCHED):
        add("interrupted", f"phase {phase}: " + ("files patched, not deployed (the smoke or the server restart has "
                                                 "not passed)" if phase == Phase.SWITCHED else
                                                 "a push or rollback was interrupted"))
    serving = doc.get("serving") or {}
    if serving.get("state") == "stale":
        add("stale", "serving code older than the files: " + ", ".join(
            f"pid {p.get('pid')}" for p in serving.get("processes") or () if p.get("stale")))
    health = serving.get("health")
    if serve and serving.get("state") == "unknown":
        add("unhealthy", "its server could not be looked at")
    elif serve and health is not None and health.get("status") != 200:
        status = health.get("status")
        add("unhealthy", f"server NOT healthy now ({health.get('url')}: "
                         f"{status if status is not None else 'no answer'})")
    if not busy and restart and restart.get("state") == "restarting":
        add("restart-unrecorded", f"the server restart of {restart.get('time')} has no recorded end")
    return out


def status_footer(report: "FleetReport") -> str:
    """``status`` on several hosts: how many are fine, and each kind of trouble with its hosts
    (a host that answered is not a host that is fine)."""
    fine = [r.host for r in report.results if r.kind is Kind.READ]
    parts = [f"{len(fine)} of {len(report.results)} host(s) fine"]
    for kind, words in ATTENTION_KINDS:
        hosts = [r.host for r in report.results if any(a["kind"] == kind for a in r.doc.get("attention") or ())]
        if hosts:
            parts.append(f"{words}: {len(hosts)} ({', '.join(hosts)})")
    other: dict[str, list[str]] = {}
    for r in report.results:
        if r.kind not in (Kind.READ, Kind.ATTENTION):
            other.setdefault(r.kind.value, []).append(r.host)
    parts += [f"{kind}: {len(hosts)} ({', '.join(hosts)})" for kind, hosts in other.items()]
    return "; ".join(parts)


def status_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One host's status document -> the fleet status table's columns."""
    files = doc.get("files") or []
    bad = [f["path"] for f in files if f["state"] in ("drifted", "missing", "unsafe")]
    series = doc.get("series") or {}
    lock = doc.get("lock")
    if lock:
        lock_text = f"held by {lock.get('holder')} (run {lock.get('run_id')})" + (" stale" if lock.get("stale") else "")
    else:
        lock_text = "free"
    serving = doc.get("serving") or {}
    phase = doc.get("phase") or "?"
    if doc.get("mixed"):  # the files contradict the journal: never shown as deployed
        phase = f"MIXED ({phase})"
    return {"version": doc.get("sglang_version") or "?", "phase": phase,
            "series": (f"{series.get('name')} {(series.get('id') or '')[:12]}" if series else "-"),
            "drift": f"{len(bad)} file(s)" if bad else "none", "lock": lock_text,
            "serving": _serving_cell(serving)}


def _serving_cell(serving: dict[str, Any]) -> str:
    """status' table: the serving processes in a few words (``serve_plan.serving``'s state)."""
    state = serving.get("state")
    if not state:
        return "-"
    health = (serving.get("health") or {}).get("status", "") if serving.get("health") is not None else ""
    # Short: the table must fit a terminal; `status --host H` has the sentence.
    return {"stale": "STALE", "current": "current", "none": "none"}.get(state, "?") + (
        f" {health or 'down'}" if health != "" else "")


__all__ = ["ATTENTION_KINDS", "FleetReport", "HostResult", "Kind", "Policy", "Schedule", "attention", "failed",
           "outcome_of_error", "push_policy", "status_footer",
           "select", "skipped", "spread_policy",
           "status_row"]
