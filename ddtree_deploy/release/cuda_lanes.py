"""Which CUDA each SGLang release ships for, and which releases a host's NVIDIA driver can run.

Pure: tables and small functions, no I/O. Three facts, each with its source:

- **Lanes per release** (``LANES``). SGLang's install docs: "SGLang requires CUDA 13. The
  CUDA 12 (cu129) wheels and images are retired, because PyTorch 2.14 publishes no CUDA 12.9
  builds. SGLang 0.5.19 is the last release with a CUDA 12 lane" (shared/FIELD-FACTS.md,
  "SGLang: releases and CUDA lanes"); the Docker tags agree: ``v0.5.19-cu129`` is the last
  CUDA 12 tag (shared/SGLANG-V2-FACTS.md section 6, from docs.sglang.io's install page).
  So 0.5.11 - 0.5.19 run on the cu129 lane (CUDA 12.9) and 0.5.20 on only on CUDA 13
  (cu130). Whether a release before 0.5.20 also had a CUDA 13 build is not in our facts and
  does not change what a host can run: the oldest lane a release ships decides that.
- **The driver each CUDA major needs** (``DRIVER_FLOOR``). NVIDIA's "CUDA Compatibility",
  Minor Version Compatibility, Table 1 (docs.nvidia.com/deploy/cuda-compatibility/
  minor-version-compatibility.html): CUDA 13.x needs >= 580, CUDA 12.x >= 525 (the CUDA
  Toolkit release notes' table gives the exact floor, 525.60.13 on Linux x86_64), CUDA 11.x
  >= 450 (450.80.02). Within a major, a build for a newer minor (cu129) runs on any driver
  of that major's floor or newer, "with limited feature-set" (no PTX JIT for newer PTX):
  the smoke's launch level is the proof on the host.
- **The CUDA a driver branch supports** (``BRANCH_CUDA``): what nvidia-smi's banner says for
  each branch's drivers (the CUDA Toolkit release notes' driver table: 570 ships with 12.8,
  575 with 12.9, 580 with 13.0...). Used only when the banner gave none: the host's own
  ``CUDA Version`` wins.

"The newest release DDTree covers on this host" reads the families' coverage from the family
registry (engine.series.families), so it moves when a family lands; releases are the ones
this table knows (``KNOWN_RELEASES``, 0.5.11 - 0.5.23 as PyPI lists them) plus any the caller
adds (a host's own version).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ddtree_deploy.hostprog import gpu_driver


@dataclass(frozen=True)
class Lane:
    """One CUDA build line of SGLang's wheels and images: ``tag`` (cu129) and its CUDA."""

    tag: str
    cuda: str  # "12.9"

    @property
    def major(self) -> int:
        return int(self.cuda.split(".")[0])


CU129 = Lane("cu129", "12.9")
CU130 = Lane("cu130", "13.0")

#: (releases, the lanes they ship, oldest first). Sources: see the module's docstring.
LANES: tuple[tuple[SpecifierSet, tuple[Lane, ...]], ...] = (
    (SpecifierSet(">=0.5.11,<0.5.20"), (CU129,)),
    (SpecifierSet(">=0.5.20"), (CU130,)),
)

#: Every SGLang release from 0.5.11 on PyPI (shared/SGLANG-V2-FACTS.md section 1: 0.5.23 is
#: the newest, uploaded 2026-10-30).
KNOWN_RELEASES = (
    "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
    "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)

#: Oldest Linux driver per CUDA major (NVIDIA's minor version compatibility table).
DRIVER_FLOOR: dict[int, tuple[int, int, int]] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 0, 0),
}

#: Driver branch -> the CUDA its nvidia-smi banner reports (CUDA Toolkit release notes).
BRANCH_CUDA: tuple[tuple[int, str], ...] = (
    (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"), (470, "11.4"), (495, "11.5"), (510, "11.6"),
    (515, "11.7"), (520, "11.8"), (525, "12.0"), (530, "12.1"), (535, "12.2"), (545, "12.3"), (550, "12.4"),
    (555, "12.5"), (560, "12.6"), (565, "12.7"), (570, "12.8"), (575, "12.9"), (580, "13.0"), (590, "13.1"),
)


def version(text: str) -> Version:
    return Version(str(text))


def lanes_of(release: str) -> tuple[Lane, ...]:
    """The CUDA lanes SGLang ``release`` ships (oldest first); () for a release before 0.5.11,
    which this table does not record."""
    v = version(release)
    for spec, lanes in LANES:
        if spec.contains(v, prereleases=True):
            return lanes
    return ()


def lane_label(release: str) -> str:
    """``cu129`` / ``cu130`` (``cu129+cu130`` were there several), or ``?`` when unrecorded."""
    return "+".join(lane.tag for lane in lanes_of(release)) or "?"


def lane_words(release: str) -> str:
    """A release's lane for people: "cu130 (CUDA 13.0: NVIDIA driver 580+)"; "no CUDA lane
    recorded" before 0.5.11."""
    lanes = lanes_of(release)
    if not lanes:
        return "no CUDA lane recorded"
    return ", ".join(f"{lane.tag} (CUDA {lane.cuda}: NVIDIA driver {floor_text(lane.major)})" for lane in lanes)


def first_release_of_major(major: int) -> str | None:
    """The oldest known release whose oldest lane is CUDA ``major`` (0.5.20 for 13)."""
    for release in KNOWN_RELEASES:
        lanes = lanes_of(release)
        if lanes and lanes[0].major == major:
            return release
    return None


def last_release_of_major(major: int) -> str | None:
    """The newest known release with a CUDA ``major`` lane (0.5.19 for 12)."""
    found = [r for r in KNOWN_RELEASES if any(lane.major == major for lane in lanes_of(r))]
    return found[-1] if found else None


def floor_text(major: int) -> str:
    """How a message names the driver CUDA ``major`` needs: "580+", "525.60.13+"."""
    branch, minor, patch = DRIVER_FLOOR[major]
    return f"{branch}+" if (minor, patch) == (0, 0) else f"{branch}.{minor:02d}.{patch:02d}+"


_TAG_CUDA = re.compile(r"(?:^|[-_.])cu(\d{2})(\d)(?:$|[-_.])")


def cuda_of_image(base: str, release: str) -> tuple[str, str]:
    """(CUDA version, where it was read) of a base image: its tag's ``cuNNN`` (``v0.5.19-cu129``:
    "12.9", "tag"), else the release's oldest lane ("release lane"); ("", "unknown") for a
    release this table does not record."""
    cuda = tag_cuda(base)
    if cuda:
        return cuda, "tag"
    return _release_lane_cuda(release)


def _release_lane_cuda(release: str) -> tuple[str, str]:
    """(the oldest CUDA lane SGLang ``release`` ships, "release lane"); ("", "unknown") for a
    release this table does not record."""
    lanes = lanes_of(release)
    return (lanes[0].cuda, "release lane") if lanes else ("", "unknown")


def tag_cuda(ref: str) -> str | None:
    """The CUDA an image reference's tag names (``lmsysorg/sglang:v0.5.19-cu129``: "12.9"), else None."""
    tag = ref.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
    m = _TAG_CUDA.search(tag)
    return f"{int(m.group(1))}.{m.group(2)}" if m else None


#: The labels that say an image's CUDA: ours (``image`` and a container push write it:
#: containers/image_context.labels_for), then NVIDIA's CUDA base images' own.
CUDA_LABELS = ("io.ddtree-deploy.cuda", "com.nvidia.cuda.version")
_CUDA_TEXT = re.compile(r"^\s*(\d{2})\.(\d{1,2})(?:\.\d+)*\s*$")


def _major_minor(text: object) -> str | None:
    """"12.9.1" / "12.9" -> "12.9"; None for anything else (an empty label, "N/A")."""
    m = _CUDA_TEXT.match(str(text or ""))
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def image_cuda(image: dict | None, ref: str, release: str | None) -> tuple[str, str]:
    """(CUDA version, where it was read) of the image a container runs, the first of:

    - ``env CUDA_VERSION``: the variable NVIDIA's CUDA base images set (SGLang's images are
      built on them), from the image's own configuration: what the image really carries;
    - ``label <key>``: a CUDA label of ``CUDA_LABELS`` (ours from an earlier build);
    - ``tag``: the ``cuNNN`` of ``ref`` or of one of the image's tags (``v0.5.19-cu129``);
    - ``release lane``: the oldest CUDA lane SGLang ``release`` ships (LANES);
    - ("", "unknown"): nothing says it.

    ``image``: the container program's image summary (``env``, ``labels``, ``tags``)."""
    image = image or {}
    for entry in image.get("env") or ():
        name, _, value = str(entry).partition("=")
        if name == "CUDA_VERSION" and _major_minor(value):
            return str(_major_minor(value)), "env CUDA_VERSION"
    labels = image.get("labels") or {}
    for key in CUDA_LABELS:
        if _major_minor(labels.get(key)):
            return str(_major_minor(labels.get(key))), f"label {key}"
    for name in (ref, *(image.get("tags") or ())):
        cuda = tag_cuda(str(name or ""))
        if cuda:
            return cuda, "tag"
    try:
        return _release_lane_cuda(release) if release else ("", "unknown")
    except InvalidVersion:  # a version the container's metadata got wrong: nothing known from it
        return "", "unknown"


# ---------------------------------------------------------------- the host's driver


@dataclass(frozen=True)
class Driver:
    """A host's NVIDIA driver, from the agent's ``driver`` fact (hostprog/gpu_driver.py).

    ``found`` false: no nvidia-smi on the host (a CPU or demo host). ``version`` None with
    ``found``: nvidia-smi answered something that is not a driver version (``error``,
    ``read``: what it printed).
    """

    found: bool
    version: str | None = None
    cuda: str | None = None  # the CUDA the driver supports
    cuda_from: str | None = None  # "nvidia-smi" (its banner) or "driver table" (BRANCH_CUDA)
    gpus: tuple[str, ...] = ()
    error: str | None = None
    read: str | None = None

    @property
    def parts(self) -> tuple[int, int, int] | None:
        return gpu_driver.parse_driver(self.version) if self.version else None

    @property
    def readable(self) -> bool:
        return self.parts is not None

    @property
    def branch_text(self) -> str:
        return f"{self.parts[0]}.x" if self.parts else "?"

    def runs_major(self, major: int) -> bool:
        """Whether this driver runs builds for CUDA ``major`` (minor version compatibility)."""
        floor = DRIVER_FLOOR.get(major)
        return self.parts is not None and floor is not None and self.parts >= floor

    def runs(self, release: str) -> bool:
        """Whether SGLang ``release`` has a lane this driver runs (an unrecorded release: True,
        nothing known against it)."""
        lanes = lanes_of(release)
        return not lanes or any(self.runs_major(lane.major) for lane in lanes)

    def newest_lane(self) -> Lane | None:
        """The newest SGLang CUDA lane this driver runs."""
        ok = [lane for _spec, lanes in LANES for lane in lanes if self.runs_major(lane.major)]
        return ok[-1] if ok else None


def cuda_of_branch(branch: int) -> str | None:
    """The CUDA the drivers of ``branch`` support (the last table row at or below it)."""
    rows = [cuda for b, cuda in BRANCH_CUDA if b <= branch]
    return rows[-1] if rows else None


def driver_from_fact(fact: dict | None) -> Driver | None:
    """The agent's ``driver`` fact as a Driver; None when the host was not asked (an older
    agent reply, or a read that did not want it)."""
    if not isinstance(fact, dict):
        return None
    if not fact.get("found"):
        return Driver(found=False)
    text = fact.get("driver")
    parts = gpu_driver.parse_driver(text) if isinstance(text, str) else None
    if parts is None:
        error = fact.get("error") or f"cannot read a driver version in nvidia-smi's output: {text!r}"
        return Driver(found=True, error=str(error), read=fact.get("read"))
    cuda, cuda_from = fact.get("cuda"), "nvidia-smi"
    if not isinstance(cuda, str) or not cuda:
        cuda, cuda_from = cuda_of_branch(parts[0]), "driver table"
    return Driver(found=True, version=text, cuda=cuda, cuda_from=cuda_from,
                  gpus=tuple(str(g) for g in fact.get("gpus") or ()))


# ---------------------------------------------------------------- what DDTree covers


def newest_covered(driver: Driver, families: Sequence, extra: Iterable[str] = ()) -> str | None:
    """The newest release that a finished family covers and ``driver`` runs (None: none).

    ``families``: engine.series.FamilyInfo values (``covers``, ``unfinished``); the releases
    looked at are KNOWN_RELEASES and ``extra``.
    """
    releases = set(KNOWN_RELEASES)
    for r in extra:
        try:
            version(r)
        except InvalidVersion:
            continue
        releases.add(r)
    ok = [r for r in releases if driver.runs(r) and any(f.covers(r) and not f.unfinished for f in families)]
    return max(ok, key=version) if ok else None


def refusal(host: str, release: str, driver: Driver, families: Sequence) -> str | None:
    """Why ``driver`` cannot run SGLang ``release`` (one line), or None when it can."""
    if driver.runs(release):
        return None
    need = lanes_of(release)[0]
    since = first_release_of_major(need.major)
    newest = newest_covered(driver, families, (release,))
    covered = (f"the newest release DDTree covers on this host is {newest}" if newest
               else "no release DDTree covers runs on this host")
    supports = f"supports CUDA {driver.cuda}" if driver.cuda else "supports no CUDA this table knows"
    return (f"{host}: runs SGLang {release}: driver {driver.branch_text} ({driver.version}) {supports}; "
            f"SGLang {since}+ needs CUDA {need.major} (driver {floor_text(need.major)}); {covered}")


def _cuda_major(cuda: str | None) -> int | None:
    """"12.9" -> 12; None when nothing says the CUDA ("" or None)."""
    return int(cuda.split(".")[0]) if cuda else None


def image_refusal(host: str, ref: str, cuda: str, source: str, driver: Driver, families: Sequence) -> str | None:
    """Why ``driver`` cannot run a container image built for CUDA ``cuda`` (read from
    ``source``: ``image_cuda``), one line; None when it can, or when nothing says the image's
    CUDA (nothing known against it)."""
    major = _cuda_major(cuda)
    if major is None or major not in DRIVER_FLOOR or driver.runs_major(major):
        return None
    newest = newest_covered(driver, families)
    lane = driver.newest_lane()
    covered = (f"run an image of SGLang {newest} or older with DDTree's coverage ({lane.tag} lane: CUDA "
               f"{lane.cuda})" if newest and lane else "no release DDTree covers runs on this host")
    supports = f"supports CUDA {driver.cuda}" if driver.cuda else "supports no CUDA this table knows"
    return (f"{host}: its container's image {ref} is built for CUDA {cuda} (read from its {source}): driver "
            f"{driver.branch_text} ({driver.version}) {supports}; CUDA {major} needs driver {floor_text(major)}; "
            f"{covered}")


def lane_summary(driver: Driver) -> str:
    """Which SGLang lanes the driver allows, in words: "the cu129 lane only (SGLang up to 0.5.19)"."""
    lane = driver.newest_lane()
    oldest = LANES[0][1][0]
    if lane is None:
        return (f"no SGLang CUDA lane ({first_release_of_major(oldest.major)}+ needs CUDA {oldest.major}: "
                f"driver {floor_text(oldest.major)})")
    if lane == LANES[-1][1][-1]:  # the newest lane: every release from its first on
        return f"every SGLang lane ({lane.tag}: SGLang {first_release_of_major(lane.major)}+)"
    return f"the {lane.tag} lane only (SGLang up to {last_release_of_major(lane.major)})"


def driver_json(driver: Driver | None, release: str | None, families: Sequence,
                image: tuple[str, str] | None = None) -> dict:
    """status's ``driver`` object (docs/json.md, ``$defs/driver``). ``image``: a container
    host's (CUDA, where it was read) of the image its container runs (``image_cuda``):
    ``image_cuda``, ``image_cuda_from`` and ``image_runs`` (null on a venv host)."""
    cuda, source = image if image is not None else (None, None)
    major = _cuda_major(cuda)
    image_runs = (driver.runs_major(major) if driver is not None and driver.readable and major in DRIVER_FLOOR
                  else None)
    shown = {"image_cuda": cuda or None, "image_cuda_from": source if image is not None else None,
             "image_runs": image_runs}
    if driver is None:
        return {"state": "not-read", "version": None, "cuda": None, "cuda_from": None, "gpus": [], "lane": None,
                "newest_covered": None, "release_runs": None, "error": None, "read": None, **shown}
    state = "found" if driver.readable else ("unreadable" if driver.found else "none")
    lane = driver.newest_lane()
    return {
        "state": state,
        "version": driver.version,
        "cuda": driver.cuda,
        "cuda_from": driver.cuda_from,
        "gpus": list(driver.gpus),
        "lane": lane.tag if lane else None,
        "newest_covered": newest_covered(driver, families, (release,) if release else ()) if driver.readable
        else None,
        "release_runs": driver.runs(release) if driver.readable and release else None,
        "error": driver.error,
        "read": driver.read,
        **shown,
    }


def driver_line(doc: dict, release: str | None) -> str:
    """status's one driver line, from ``driver_json``'s object."""
    state = doc["state"]
    if state == "not-read":
        return "driver: not read (the host's agent did not report it)" + _image_words(doc)
    if state == "none":
        return ("driver: none found (no nvidia-smi on the host: a CPU or demo host); push proceeds with a warning"
                + _image_words(doc))
    if state == "unreadable":
        read = f"; it printed {doc['read']!r}" if doc.get("read") else ""
        return (f"driver: unreadable: {doc['error']}{read}; push refuses this host without --force-driver"
                + _image_words(doc))
    d = Driver(found=True, version=doc["version"], cuda=doc["cuda"])
    cuda = f"CUDA {doc['cuda']}" + (" by the driver table" if doc.get("cuda_from") == "driver table" else "")
    line = f"driver: {doc['version']} ({cuda}): {lane_summary(d)}"
    if release and doc.get("release_runs") is False:
        need = lanes_of(release)[0]
        line += f"; SGLang {release} here needs CUDA {need.major} (driver {floor_text(need.major)})"
    if doc.get("newest_covered"):
        line += f"; newest release DDTree covers here: {doc['newest_covered']}"
    return line + _image_words(doc)


def _image_words(doc: dict) -> str:
    """A container host's image CUDA, said after the driver line (nothing on a venv host)."""
    if doc.get("image_cuda_from") is None:
        return ""
    if not doc.get("image_cuda"):
        return "; the container's image: CUDA unknown (no CUDA_VERSION, label, tag or release lane says it)"
    said = f"; the container's image: CUDA {doc['image_cuda']} (its {doc['image_cuda_from']})"
    if doc.get("image_runs") is False:
        return said + ": this driver cannot run it (push refuses without --force-driver)"
    return said + (": this driver runs it" if doc.get("image_runs") else "")


__all__ = [
    "BRANCH_CUDA",
    "CU129",
    "CU130",
    "DRIVER_FLOOR",
    "KNOWN_RELEASES",
    "LANES",
    "Driver",
    "Lane",
    "cuda_of_branch",
    "cuda_of_image",
    "CUDA_LABELS",
    "image_cuda",
    "image_refusal",
    "tag_cuda",
    "driver_from_fact",
    "driver_json",
    "driver_line",
    "first_release_of_major",
    "lane_label",
    "lane_words",
    "lane_summary",
    "lanes_of",
    "newest_covered",
    "refusal",
]
