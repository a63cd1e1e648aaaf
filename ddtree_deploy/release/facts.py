"""What a SGLang release looks like to the series, read from the file list of its wheel.

Pure: the input is the list of names inside a release wheel (``zipfile.namelist()``),
the output is a small value the matrix report prints next to each release, so that
an uncovered or failing release comes with the *why* ("dflash_worker.py removed in
0.5.14") instead of a bare "failed".

Only names are read, never file contents: listing a wheel's central directory is
cheap, and file presence is what changes between SGLang's DFlash generations
(see SGLANG-DDTREE-FACTS.md, "Which SGLang releases have DFlash").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

from packaging.version import Version

SPECULATIVE = "sglang/srt/speculative/"
V1_WORKER = SPECULATIVE + "dflash_worker.py"
V2_WORKER = SPECULATIVE + "dflash_worker_v2.py"
# From 0.5.13 on, DFLASH's server-argument validation lives in this hook instead of
# server_args.py; a patch that edits the validation has to follow it there.
SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"
#: The files whose presence the facts read, besides the series' own.
MARKERS = (V1_WORKER, V2_WORKER, SPEC_HOOK)


class DFlashWorker(str, Enum):
    NONE = "none"  # no DFlash at all (<= 0.5.10.post1)
    V1 = "v1"  # dflash_worker.py only (0.5.11 - 0.5.13.post1): what the series targets
    V2 = "v2"  # dflash_worker_v2.py only (0.5.14 on)
    BOTH = "v1+v2"  # both present (no release so far; kept so it is reported, not guessed)


@dataclass(frozen=True)
class ReleaseFacts:
    """One release, as the series sees it."""

    version: str
    present: tuple[tuple[str, bool], ...]  # (series path, exists in the release), series order
    dflash_worker: DFlashWorker
    validation_in: str  # the file holding DFLASH's server-argument validation

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(path for path, ok in self.present if not ok)

    def has(self, path: str) -> bool:
        return dict(self.present).get(path, False)

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "files": {path: ok for path, ok in self.present},
            "dflash_worker": self.dflash_worker.value,
            "validation_in": self.validation_in,
        }


def package_names(names: Iterable[str]) -> frozenset[str]:
    """The package files among a wheel's names (drops ``*.dist-info/`` and folders)."""
    return frozenset(n for n in names if n.startswith("sglang/") and not n.endswith("/"))


def facts_from_names(version: str, names: Iterable[str], series_paths: Sequence[str]) -> ReleaseFacts:
    """The facts of one release from its wheel's file names and the series' touched paths.

    ``names`` may be every name in the wheel, or just those of ``series_paths`` and
    ``MARKERS`` that it holds: only their presence is read.

    ``series_paths`` should hold only paths the series *changes* (files it creates
    with ``add`` are expected to be absent, so the caller leaves them out).
    """
    files = package_names(names)
    v1, v2 = V1_WORKER in files, V2_WORKER in files
    worker = {
        (False, False): DFlashWorker.NONE,
        (True, False): DFlashWorker.V1,
        (False, True): DFlashWorker.V2,
        (True, True): DFlashWorker.BOTH,
    }[(v1, v2)]
    return ReleaseFacts(
        version=version,
        present=tuple((p, p in files) for p in series_paths),
        dflash_worker=worker,
        validation_in="arg_groups/speculative_hook.py" if SPEC_HOOK in files else "server_args.py",
    )


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def explain_missing(facts: ReleaseFacts, history: Sequence[ReleaseFacts]) -> tuple[str, ...]:
    """One phrase per series file missing from ``facts.version``, dated from ``history``.

    ``history`` is every release the run looked at (any order). A file present in an
    earlier release and absent since is "removed in <first release without it>"; a
    file only present in later releases is "not yet added (first in <release>)".
    The dates are only as precise as ``history`` is complete, so the phrase names
    the releases it was judged from.
    """
    ordered = sorted(history, key=lambda f: Version(f.version))
    here = Version(facts.version)
    phrases = []
    for path in facts.missing:
        earlier = [f for f in ordered if Version(f.version) < here]
        later = [f for f in ordered if Version(f.version) > here]
        last_with = next((f for f in reversed(earlier) if f.has(path)), None)
        if last_with is not None:
            # The first release after the last one that had it: where it went away.
            gone_in = next(f for f in ordered if Version(f.version) > Version(last_with.version))
            phrase = f"{_short(path)} removed in {gone_in.version}"
        else:
            first_with = next((f for f in later if f.has(path)), None)
            phrase = (
                f"{_short(path)} not yet added (first in {first_with.version})"
                if first_with is not None
                else f"{_short(path)} absent"
            )
        if path == V1_WORKER and facts.dflash_worker is DFlashWorker.V2:
            phrase += " (only the v2 worker, dflash_worker_v2.py)"
        phrases.append(phrase)
    return tuple(phrases)


def describe(facts: ReleaseFacts, history: Sequence[ReleaseFacts], missing: bool = True) -> str:
    """A one-line summary for the report's "why" column (``missing``: also the series files
    the release lacks, dated from ``history``)."""
    parts = list(explain_missing(facts, history)) if missing else []
    parts.append(f"DFlash worker {facts.dflash_worker.value}")
    parts.append(f"validation in {facts.validation_in}")
    return "; ".join(parts)


__all__ = [
    "MARKERS",
    "DFlashWorker",
    "ReleaseFacts",
    "describe",
    "explain_missing",
    "facts_from_names",
    "package_names",
]
