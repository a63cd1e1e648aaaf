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
"""

from __future__ import annotations

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.digests import hasher, sha256
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import AddEntry, PatchEntry, Series
from ddtree_deploy.release.snapshot import fresh_release_snapshot, load_snapshot
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
                              patched=sha256(p.patched), data=p.patched))
    return Desired(series=series.name, series_id=series_id(series), sglang_version=version, snapshot=source,
                   targets=tuple(targets))
