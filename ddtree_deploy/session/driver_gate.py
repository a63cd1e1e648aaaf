"""The push's driver check: can this host's NVIDIA driver run the SGLang release it has?

Runs on the push's first, unlocked read (Want.resolve), before the series is checked and
before any lock or write: a host whose driver cannot run its release's CUDA lane (SGLang
0.5.20+ on a pre-580 driver) is refused in one line, exit 2, with the newest release DDTree
covers there (release/cuda_lanes.py). ``force`` (``push --force-driver``) turns a refusal
into a warning line. A host without nvidia-smi (a CPU or demo host, the sandbox hosts) is
not refused: it gets a warning line and the push goes on, since there is no driver to
judge and the series may still be checked and switched there. nvidia-smi output that is no
driver version is refused like a driver too old (what was read, in one line).

A ``[container]`` host (fleets/container_gate.py) is checked the same way, on the host's
own nvidia-smi (the container program's ``inspect``, outside the container), against the
CUDA of the image its container runs (``ImageCuda``: its CUDA_VERSION, else its CUDA label,
else its tag, else the release's lane), before its series is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.series import families
from ddtree_deploy.release.cuda_lanes import (Driver, driver_from_fact, driver_json, driver_line, image_refusal,
                                              refusal)

FORCE = "--force-driver"
_FORCE_HINT = f"or push anyway with {FORCE} (the smoke's launch level is then the only proof)"


@dataclass(frozen=True)
class DriverVerdict:
    """What the check said of one host: the driver it read (None: not asked) and the
    warning line to print (None: nothing to say)."""

    driver: Driver | None
    warning: str | None = None


@dataclass(frozen=True)
class ImageCuda:
    """A container host's image and its CUDA (release/cuda_lanes.py ``image_cuda``): what its
    driver must run, in place of the release's lane."""

    ref: str
    cuda: str  # "" when nothing says it
    source: str  # "env CUDA_VERSION", "label ...", "tag", "release lane", "unknown"


def check(host: str, facts: dict, *, force: bool = False, image: ImageCuda | None = None) -> DriverVerdict:
    """The driver check on a host's facts; BadInput (exit 2, nothing changed) when refused.
    ``image`` (a [container] host): the driver is checked against the CUDA of the image its
    container runs (read from the image: container_gate.py), not against the release's lane."""
    driver = driver_from_fact(facts.get("driver"))
    release = facts.get("sglang_version")
    if driver is None:  # the read did not ask (an agent from before the driver fact)
        return DriverVerdict(None)
    if not driver.found:
        return DriverVerdict(driver, f"{host}: no NVIDIA driver found (no nvidia-smi on the host): pushing "
                                     "without the driver check")
    if not driver.readable:
        read = f"; it printed {driver.read!r}" if driver.read else ""
        line = f"{host}: {driver.error}{read}"
        if force:
            return DriverVerdict(driver, f"{line}; pushing anyway ({FORCE})")
        raise BadInput(f"{line}; nothing was changed", code=Code.DRIVER_UNREADABLE,
                       hint=f"run nvidia-smi on the host and fix its driver install, {_FORCE_HINT}")
    if image is not None:
        why = image_refusal(host, image.ref, image.cuda, image.source, driver, families())
    else:
        why = refusal(host, release, driver, families()) if release else None
    if why is None:
        return DriverVerdict(driver)
    if force:
        return DriverVerdict(driver, f"{why}; pushing anyway ({FORCE})")
    what = "run an image its driver runs (a -cu129 tag for CUDA 12)" if image is not None else \
        "install a release its driver runs"
    raise BadInput(f"{why}; nothing was changed", code=Code.DRIVER_TOO_OLD,
                   hint=f"upgrade the host's NVIDIA driver, or {what}, {_FORCE_HINT}")


def read_driver(host, transport) -> Driver | None:
    """One host's driver alone, over an open transport (the agent's ``driver`` op: no SGLang
    needed on the host's interpreter): what ``image --host`` checks a base image against."""
    from ddtree_deploy.session.status import ask

    return driver_from_fact(ask(host, transport, {"op": "driver"}).get("driver"))


def status_of(facts: dict, image: ImageCuda | None = None) -> dict:
    """status's ``driver`` object for a host (docs/json.md, ``$defs/driver``), its ``line``
    (what status prints) included; ``image``: a [container] host's image CUDA."""
    release = facts.get("sglang_version")
    doc = driver_json(driver_from_fact(facts.get("driver")), release, families(),
                      (image.cuda, image.source) if image is not None else None)
    doc["line"] = driver_line(doc, release)
    return doc


__all__ = ["FORCE", "DriverVerdict", "ImageCuda", "check", "read_driver", "status_of"]
