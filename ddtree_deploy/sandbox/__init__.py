"""Sandbox hosts on this machine: what the demo, the benchmarks and the tests build hosts from.

A sandbox host is a GPU host without the GPU: a Python environment holding a real SGLang
release's files (``hostenv``), reached through a real OpenSSH sshd on loopback (``sshd``).
It ships in the wheel because ``python -m ddtree_deploy.demo`` runs from an installed
toolkit; nothing else in the package imports it. Standard library only (plus
``ddtree_deploy.base.locations`` / ``releases`` for the wheel cache).
"""

from ddtree_deploy.sandbox.hostenv import (
    BASELINE_RELEASE,
    HostEnv,
    make_host_env,
    make_python_env,
    pristine_files,
    release_wheel,
    run_python,
    write_kernel_standin,
)
from ddtree_deploy.sandbox.sshd import SSHD, SandboxHost, SSHServer, free_port, require_openssh

__all__ = [
    "BASELINE_RELEASE", "HostEnv", "SSHD", "SSHServer", "SandboxHost", "free_port", "make_host_env",
    "make_python_env", "pristine_files", "release_wheel", "require_openssh", "run_python",
    "write_kernel_standin",
]
