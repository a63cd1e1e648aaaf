"""Test support shared by tests/ and bench/: never shipped in the wheel, never imported by
ddtree_deploy.

A top-level package of the checkout, like bench/: importable from the repository root
(`python -m bench`, `python -m pytest`; pyproject's [tool.pytest.ini_options] pythonpath
names the root, so a bare `pytest` from anywhere finds it too). What the demo needs at run
time (sandbox hosts, the loopback sshd) is ddtree_deploy.sandbox instead, which the wheel
ships.

    ddtree_testkit.payload(name)   the payload module ``name`` (payload/<name>.py), imported
                                   as a top-level module
    STANDIN_SERVER                 standin_server.py: a STAND-IN for SGLang's HTTP server (the
                                   launch smoke level on CPU); run as a script on a sandbox host
    STANDIN_TUNE_SERVER            standin_tune_server.py: the same for `tune` (its documented
                                   synthetic throughput model); imports standin_server beside it
    ddtree_testkit.ddtree_support  the DDTree core tests' helpers: ddtree_utils, the device,
                                   a tiny float64 Llama, greedy and DDTree decoders
    ddtree_testkit.release_corpus  SGLang's own release diffs (0.5.12 .. 0.5.23) for the patch
                                   engine: tests/integration/test_release_corpus.py and its bench
    ddtree_testkit.system_tools    require(tool): a test's oracle missing fails, never skips;
                                   python_3_8()
    ddtree_testkit.machine         within(took, bound, busy_before): a time bound scaled by how
                                   busy the machine is around the interval; settle(s): a
                                   test's pause before its signal, measuring busy_before

Payload modules are SGLang drop-ins (installed as sglang/srt/speculative/<name>.py on a
host), so on this machine they are imported as top-level modules from the payload folder
that ddtree_deploy.base.locations names (the checkout's payload/, or DDTREE_DEPLOY_PAYLOAD):
one place decides where that folder is, nothing hard-codes a path. A top-level
``ddtree_utils`` can never shadow a real ``sglang``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from ddtree_deploy.base.locations import repo_dir

# Scripts a sandbox host's Python runs by path (stdlib only: the host has no ddtree_testkit).
STANDIN_SERVER = Path(__file__).resolve().with_name("standin_server.py")
STANDIN_TUNE_SERVER = Path(__file__).resolve().with_name("standin_tune_server.py")


def payload(name: str) -> ModuleType:
    """Import payload/<name>.py as the top-level module ``name`` (once per process)."""
    folder = str(repo_dir("payload"))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
