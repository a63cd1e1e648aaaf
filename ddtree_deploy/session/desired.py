"""What a series makes of one host: choose the pristine snapshot, check, hash.

This is the bridge between the series/check layer and the deploy plans. It runs in
memory, between the two round trips of a push, with the host's facts in hand:

1. The family must cover the host's SGLang version (or ``--family`` forces one).
2. The pristine versions come from ``snapshot/<host>/`` (made by ``snapshot pull``) when
   it is of the host's SGLang version, else from the release snapshot of that version
   (the PyPI wheel). The push plan then refuses any host file that matches neither
   that pristine version nor its patched version: that is the drift check.
3. ``check_series`` must be clean on those exact files; its patched bytes are what
   gets uploaded.

A command settles what it wants (``Want``: the family, forced or chosen per host by its
version, the paths each host reports, the check shared by the hosts of one version) before
it opens any deploy session; the session calls ``Want.resolve`` on the host's unlocked
read, so the resolution runs here, below the rollout, never back up in it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.digests import hasher, sha256
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import AddEntry, PatchEntry, Series, choose_series, load_family, require_finished
from ddtree_deploy.release.snapshot import all_touched_paths, fresh_release_snapshot, load_snapshot, snapshot_root
from ddtree_deploy.session import driver_gate
from ddtree_deploy.session.driver_gate import DriverVerdict
from ddtree_deploy.session.plan import Desired, Target


def series_id(series: Series) -> str:
    """A hash of the series' content (order, patch bytes, added files): which series is deployed."""
    h = hasher()
    for entry in series.entries:
        if isinstance(entry, PatchEntry):
            h.update(b"patch\0" + entry.name.encode() + b"\0" + entry.file.read_bytes() + b"\0")
        elif isinstance(entry, AddEntry):
            h.update(b"add\0" + entry.dest.encode() + b"\0" + entry.content + b"\0")
    return h.hexdigest()


def pristine_files(host_name: str, version: str, paths: tuple[str, ...]) -> tuple[str, dict[str, bytes | None]]:
    """(snapshot description, path -> pristine bytes) for a host running SGLang ``version``."""
    try:
        snap = load_snapshot(host_name)
    except BadInput:
        snap = None
    if snap is not None and snap.manifest.sglang_version == version and set(paths) <= set(snap.manifest.paths()):
        return f"snapshot/{host_name}", snap.read_files()
    release = fresh_release_snapshot(version, paths)
    return f"release snapshot {release.name}", release.read_files()


def desired_for(series: Series, host_name: str, facts: dict, *, fuzz: int = 0, forced: bool = False) -> Desired:
    version = facts.get("sglang_version")
    if not version:
        raise DeployError(f"{host_name}: cannot tell the SGLang version at {facts.get('package_root')}",
                          code=Code.NO_VERSION)
    if not forced and not series.info.covers(version):
        raise BadInput(f"{host_name}: runs SGLang {version}, but family {series.name} covers {series.specifier}",
                       hint="choose the family for that release with --family")
    paths = series.touched_paths()
    source, files = pristine_files(host_name, version, paths)
    check_cmd = (next_step.check(snapshot=host_name, family=series.name) if source == f"snapshot/{host_name}"
                 else next_step.check(release=version, family=series.name))
    report = check_series(series, files, fuzz=fuzz)
    if not report.ok:
        failed = [e.name for e in report.entries if not e.ok] or [str(c) for c in report.compile_errors]
        raise DeployError(f"{host_name}: series {series.name} does not apply cleanly to {source}: "
                          f"{', '.join(failed)}", code=Code.CHECK_FAILED,
                          hint=f"run {check_cmd} for the hunk-by-hunk report; nothing was changed")
    targets = []
    for path in paths:
        p = report.patched[path]
        targets.append(Target(path=path, pristine=None if p.original is None else sha256(p.original),
                              patched=sha256(p.patched), data=p.patched, original=p.original))
    return Desired(series=series.name, series_id=series_id(series), sglang_version=version, snapshot=source,
                   targets=tuple(targets))


class CheckOnce:
    """The in-memory series check, once per fleet for hosts that share its inputs.

    Every host of one SGLang version without a snapshot of its own (``snapshot pull``)
    compares against the same release snapshot, so its ``Desired`` (the patched bytes
    and hashes) is the same value: computed once, it is shared (it is immutable). A host
    with its own snapshot folder is checked on its own. Calls are serialised: the first
    check of a version fills the release snapshot cache (a folder swap, not safe against
    a second writer), and the check is CPU-bound Python, which threads would not speed up.
    Errors are not cached: each host raises its own (they name the host).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple, object] = {}

    def __call__(self, host_name: str, series, facts: dict, forced: bool, compute: Callable[[], object]):
        with self._lock:
            key = None if _own_snapshot(host_name) else (series_id(series), facts.get("sglang_version"), forced)
            if key is not None and key in self._done:
                return self._done[key]
            result = compute()
            if key is not None:
                self._done[key] = result
            return result


def _own_snapshot(host_name: str) -> bool:
    """Whether a snapshot named after the host may exist (then its check is its own)."""
    return Path(host_name).is_dir() or (snapshot_root() / host_name).exists()


class Want:
    """What a push or status wants on its hosts, settled before any connection.

    ``family`` (``--family``) forces one family (loaded and required finished now: bad
    input stops the command before any host is read); without it each host gets the family
    whose range covers its SGLang version. ``paths``: what every host reports in its first
    read. ``resolve`` (host, facts) -> ``Desired`` is what the deploy session calls on that
    unlocked read; it records the series it chose per host in ``chosen`` (the smoke needs it).
    ``resolve`` first checks the host's NVIDIA driver against its release's CUDA lane
    (driver_gate.py: refused in one line, or with ``force_driver`` a warning); what it said
    of each host is in ``drivers``. ``expected`` (status) resolves without that check.
    """

    def __init__(self, family: str | None = None, *, force_driver: bool = False):
        self.force_driver = force_driver
        self.drivers: dict[str, DriverVerdict] = {}
        self._forced: Series | None = None
        if family:
            series = load_family(family)
            require_finished(series, "push")  # a range never picks an unfinished port; a name may not deploy one
            self._forced, self.paths = series, list(series.touched_paths())
        else:
            self.paths = list(all_touched_paths())
        self.check = CheckOnce()
        self.chosen: dict[str, Series] = {}

    @property
    def forced(self) -> bool:
        return self._forced is not None

    def series_for(self, facts: dict) -> Series:
        if self._forced is not None:
            return self._forced
        version = facts.get("sglang_version")
        if not version:
            raise DeployError(f"cannot tell the SGLang version at {facts.get('package_root')}", code=Code.NO_VERSION)
        return choose_series(version)

    def resolve(self, host_name: str, facts: dict) -> Desired:
        self.drivers[host_name] = driver_gate.check(host_name, facts, force=self.force_driver)
        return self._resolve(host_name, facts)

    def _resolve(self, host_name: str, facts: dict) -> Desired:
        series = self.series_for(facts)
        self.chosen[host_name] = series
        return self.check(host_name, series, facts, self.forced,
                          lambda: desired_for(series, host_name, facts, forced=self.forced))

    def expected(self, host_name: str, facts: dict) -> Desired | None:
        """``resolve`` for a status: None when the series does not resolve (status still
        reports what the journal knows)."""
        try:
            return self._resolve(host_name, facts)
        except DeployError:
            return None


__all__ = ["CheckOnce", "Want", "desired_for", "pristine_files", "series_id"]
