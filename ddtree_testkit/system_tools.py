"""The system tools the tests' oracles need: GNU patch, diff, git, make.

``scripts/system-deps.sh`` installs them and `make test` and `.ci/run` run it first, so a
machine that lacks one is a machine that was not set up: a test (or a test module, called at
import) that needs one fails naming the tool and the command that installs it. They used to
skip, and a suite that passes without its oracles does not mean the same on every machine
(issue 28 item 7).
"""

from __future__ import annotations

import shutil

import pytest


def require(*tools: str) -> None:
    """Fail (the test, or the collection of the module that calls it at import) unless every
    tool is on PATH."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found on PATH: the tests need {'it' if len(missing) == 1 else 'them'}; "
                    "install the system tools with `make system-deps` (scripts/system-deps.sh)", pytrace=False)


def python_3_8() -> str | None:
    """A working Python 3.8 interpreter (the oldest a host may have), when this machine has one.

    Not a system tool the project installs (Debian bookworm ships none; pyenv's is found): the
    tests that run a host program under it skip, saying so, where there is none, and a syntax
    check at feature_version (3, 8) runs everywhere."""
    import os
    import subprocess

    for candidate in (os.path.expanduser("~/.pyenv/versions/3.8.18/bin/python3.8"), shutil.which("python3.8")):
        if candidate and os.path.exists(candidate):
            probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                                   capture_output=True, text=True)
            if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
                return candidate  # a working interpreter, not a version manager's shim
    return None
__all__ = ["python_3_8", "require"]
