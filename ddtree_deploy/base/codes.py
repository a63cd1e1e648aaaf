"""Every machine-readable error code and journal phase, named in one place.

The string values are an interface: they appear in ``--json`` output, the Ansible
collection (ansible/ddtree/plugins/plugin_utils/toolkit.py) matches on them, and the
host programs (ddtree_deploy/hostprog/) name them from here: this module ships to hosts
with them (hostprog/bundle.py), so it stays stdlib-only and Python 3.8
(tests/integration/test_hostprog.py). They are plain ``str``
constants, not an ``Enum``: an error code arriving from the agent is a plain string,
and a str-mixin Enum hashes by member name (``"locked" in {Code.LOCKED}`` would be
False) and formats differently across Python 3.10-3.12.
"""

from __future__ import annotations


class Code:
    """``DeployError.code`` values."""

    # generic (errors.py, the CLI)
    FAILED = "failed"
    BAD_INPUT = "bad-input"
    USAGE = "usage"  # the command line itself is wrong (click's UsageError): the envelope's code
    INTERNAL = "internal"  # an unexpected exception, caught so that one host cannot abandon the others
    # reaching the host (remote/: link_errors.py, host_keys.py, program.py)
    CONNECT = "connect"
    AUTH = "auth"
    HOST_KEY = "host-key"
    CONNECTION_LOST = "connection-lost"
    TIMEOUT = "timeout"
    REPLY_TOO_LARGE = "reply-too-large"
    AGENT = "agent"
    PROTOCOL = "protocol"
    # push / rollback before the switch (push.py, decide.py, desired.py, plan.py, the CLI)
    LOCKED = "locked"
    NO_VERSION = "no-version"
    NOT_PRISTINE = "not-pristine"
    CHECK_FAILED = "check-failed"
    DRIFT = "drift"
    OTHER_SERIES = "other-series"
    NO_BACKUP = "no-backup"
    # raised by the agent on the host
    NO_SGLANG = "no-sglang"
    BAD_STATE_DIR = "bad-state-dir"
    BAD_PATH = "bad-path"
    UNSAFE_FILE = "unsafe-file"
    PREFLIGHT = "preflight"
    PERMISSION = "permission"
    NO_SPACE = "no-space"
    BACKUP = "backup"
    VERIFY = "verify"
    SWITCH = "switch"  # the switch failed and every switched file was switched back
    SWITCH_MIXED = "switch-mixed"  # ... and switching back failed too: the host is mixed
    FAILED_UNCHANGED = "failed-unchanged"
    CHANGED = "changed"  # a mark found the journal at another run / phase
    LOST_LOCK = "lost-lock"  # the run's deploy lock was released (by force) or broken under it: it stopped
    OS_ERROR = "os-error"  # an unexpected OSError in the agent
    # smoke (smoke/run.py, rollout.py)
    NOT_DEPLOYED = "not-deployed"
    SMOKE_AGENT = "smoke-agent"
    UNKNOWN_FAMILY = "unknown-family"
    # the host's NVIDIA driver, read before a push (release/cuda_lanes.py, session/driver_gate.py)
    DRIVER_TOO_OLD = "driver-too-old"  # the driver cannot run the host's SGLang release's CUDA lane
    DRIVER_UNREADABLE = "driver-unreadable"  # nvidia-smi answered, but not with a driver version
    # restarting the host's server (serve/run.py)
    SERVE_AGENT = "serve-agent"  # the serve program failed or answered garbage
    # the host programs' own (hostprog/server.py's server start and stop, for the launch level and tune): a host failure, not the series'
    GPU = "gpu"  # no usable GPU (nvidia-smi missing or failing, none with the free memory asked for)
    PORT = "port"  # the server's port is taken
    START = "start"  # the server's program cannot be started
    LEFT_RUNNING = "left-running"  # processes outlived TERM and KILL of the server's group
    SERIES_CHANGED = "series-changed"  # the deployed series changed under a tune (or a push took the lock)
    TUNE_LOCKED = "tune-locked"  # another tune holds the tune lock
    BAD_DATASET = "bad-dataset"  # tune --dataset names no file on the host
    # the release cache (releases.py, matrix_run.py)
    NETWORK = "network"
    DIGEST = "digest"  # a downloaded wheel's sha256 is not PyPI's
    CACHE = "cache"  # the download cache cannot be written (no space, no permission)
    # image (image.py)
    NO_BUILDER = "no-builder"
    BUILD_FAILED = "build-failed"
    # [container] hosts (hostprog/container.py, containers/): refusals before any change
    NO_ENGINE = "no-engine"  # the engine's CLI (docker, podman) is not installed on the host
    ENGINE_DOWN = "engine-down"  # installed, but its daemon (or service) does not answer
    NO_CONTAINER = "no-container"  # no container of that name on the host
    NOT_SGLANG = "not-sglang"  # the container's interpreter finds no sglang package
    UNCOVERED = "uncovered-release"  # the image's SGLang is a release no family covers
    ENGINE_FAILED = "engine-failed"  # an engine command (build, create, start, rename...) failed
    CONTAINER_AGENT = "container-agent"  # the container program failed or answered garbage
    # a run stopped by Ctrl-C or SIGTERM (inflight.py, the CLI's envelope)
    INTERRUPTED = "interrupted"


# Codes the deploy agent itself raises (its AgentErrors, hostprog/); tests/unit/test_codes.py checks both ways.
AGENT_CODES = frozenset({
    Code.NO_SGLANG, Code.BAD_STATE_DIR, Code.BAD_PATH, Code.UNSAFE_FILE, Code.PREFLIGHT, Code.PERMISSION,
    Code.NO_SPACE, Code.BACKUP, Code.VERIFY, Code.SWITCH, Code.SWITCH_MIXED, Code.FAILED_UNCHANGED,
    Code.CHANGED, Code.LOCKED, Code.PROTOCOL, Code.OS_ERROR, Code.LOST_LOCK,
})

# Codes that can only be raised before the apply request is sent: the host is provably
# untouched (errors.changed_by_code). The push's stages before its apply request say the
# same of every error they see, whatever its code (session/push.py, ``DeployError.known``).
BEFORE_CHANGE = frozenset({
    Code.AUTH, Code.HOST_KEY, Code.LOCKED, Code.DRIFT, Code.OTHER_SERIES, Code.CHECK_FAILED, Code.NO_VERSION,
    Code.BAD_INPUT, Code.NO_BACKUP, Code.PREFLIGHT, Code.PERMISSION, Code.NO_SPACE, Code.UNSAFE_FILE,
    Code.BAD_STATE_DIR, Code.CHANGED, Code.NO_ENGINE, Code.ENGINE_DOWN, Code.NO_CONTAINER, Code.NOT_SGLANG,
    Code.UNCOVERED, Code.DRIVER_TOO_OLD, Code.DRIVER_UNREADABLE,
})
UNREACHABLE = frozenset({Code.CONNECT})


class Phase:
    """The host journal's ``phase`` (JOURNAL_PHASES), plus ``never-deployed`` for a host without one."""

    STAGED = "staged"
    SWITCHING = "switching"
    SWITCHED = "switched"  # files patched; the smoke has not passed yet
    DEPLOYED = "deployed"
    ROLLED_BACK = "rolled-back"
    NEVER_DEPLOYED = "never-deployed"


# In the journal's order (the agent's state.PHASES is this tuple).
JOURNAL_PHASES = (Phase.STAGED, Phase.SWITCHING, Phase.SWITCHED, Phase.DEPLOYED, Phase.ROLLED_BACK)

__all__ = ["AGENT_CODES", "BEFORE_CHANGE", "Code", "JOURNAL_PHASES", "Phase", "UNREACHABLE"]
