"""sha256, the one content hash of the toolkit: file identity in plans, snapshots, manifests,
release wheels and check reports. Pure (sha256_file reads the file it is given).

The host programs (ddtree_deploy/hostprog/) run on hosts without this package, so their
wire module keeps its own few lines of hashlib; everything else hashes through here.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256(data: bytes) -> str:
    """The hex digest of ``data`` (what plans, manifests and the agent compare)."""
    return hashlib.sha256(data).hexdigest()


def sha256_or_none(data: bytes | None) -> str | None:
    """sha256 of ``data``, None for an absent file."""
    return None if data is None else sha256(data)


def sha256_file(path: Path) -> str:
    """The hex digest of a file, read in chunks (a wheel can be hundreds of MiB)."""
    digest = hasher()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_record(data: bytes) -> str:
    """The digest as a wheel's RECORD writes it: urlsafe base64 without padding (PEP 376/427)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def hasher() -> "hashlib._Hash":
    """An incremental sha256, for content hashed while it streams (downloads, a series' id)."""
    return hashlib.sha256()
