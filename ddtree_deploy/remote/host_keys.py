"""Host keys: known_hosts read bounded, OpenSSH fingerprints, and the strict policy.

An unknown key is refused with its fingerprint unless the user trusts new hosts (then it is
appended to known_hosts as one line); a changed key is always refused, with the
``ssh-keygen -R`` line that clears it. Only this module and ssh.py import paramiko.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from pathlib import Path

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError


def load_host_keys(keys, data: bytes) -> None:
    """known_hosts' lines into paramiko's ``HostKeys`` (what ``HostKeys.load`` does, from bytes
    we read bounded: it opens the path itself, reads without a bound and decodes with the
    locale's codec). A line paramiko cannot parse is skipped, as ssh and paramiko do."""
    from paramiko.hostkeys import HostKeyEntry

    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except Exception:  # noqa: BLE001 - paramiko's SSHException, or a decoder's error on garbage
            continue
        if entry is None or entry.key is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


class HostKeyRefused(DeployError):
    code = Code.HOST_KEY


def fingerprint(key) -> str:
    """OpenSSH's SHA256 fingerprint of a paramiko key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def strict_policy(label: str, known: Path, *, trust_new_host: bool):
    """paramiko's policy for a key known_hosts does not hold: refused with its fingerprint, or,
    when the user trusts new hosts, accepted and appended to ``known`` as one line."""
    import paramiko

    class Strict(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            if not trust_new_host:
                raise HostKeyRefused(
                    f"{label}: unknown host key for {hostname}: {key.get_name()} {fingerprint(key)} (not in {known})",
                    hint="check the fingerprint with the host's owner (on the host: "
                    "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then rerun with --trust-new-host",
                )
            client.get_host_keys().add(hostname, key.get_name(), key)
            # Append one line: rewriting the file through paramiko would drop what it
            # cannot parse (markers, comments) from the user's known_hosts.
            known.parent.mkdir(parents=True, exist_ok=True)
            line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line()
            with open(known, "a", encoding="utf-8") as fh:
                fh.write(line)

    return Strict()


def changed_key(label: str, host: str, port: int, known: Path, exc) -> HostKeyRefused:
    """A key that is not the one known_hosts holds for ``host`` (paramiko's BadHostKeyException)."""
    name = exc.hostname
    if name == host and port != 22:
        # known_hosts keys a non-default port as [host]:port, and so must ssh-keygen -R.
        name = f"[{name}]:{port}"
    return HostKeyRefused(
        f"{label}: HOST KEY CHANGED for {name}: got {fingerprint(exc.key)}, "
        f"known_hosts has {fingerprint(exc.expected_key)}; refusing to connect",
        hint=f"if the change is expected: ssh-keygen -f {shlex.quote(str(known))} -R {shlex.quote(name)}, then "
        "rerun with --trust-new-host",
    )


__all__ = ["HostKeyRefused", "changed_key", "fingerprint", "load_host_keys", "strict_policy"]
