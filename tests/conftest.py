"""Fixtures shared by the whole suite: real SGLang release files, real test data, the sshd.

    release_version   "0.5.12.post1", the baseline release the series is made against
    release_wheel     Path of its cached wheel, verified against PyPI's sha256
                      (downloaded once through ddtree_deploy.release.releases; offline after)
    release_tree      a read-only folder holding the release's package files
                      (the folder that contains sglang/, like site-packages)
    data_dir          tests/data
    test_family_dir   tests/data/patches/test-0.5.12, a small real series
    sshd              a real OpenSSH sshd on loopback for the module (tests/sshd_host.py)
    oracle            (pristine, patched) bytes of the small deploy series, GNU patch's
    host              a fresh sandbox host per test that pushes the small deploy series
    served            a host whose stand-in server runs under supervisord (tests/serve_host.py)
    tuned_host        a host with SGLang 0.5.12.post1 and its series pushed, for `tune`
    tuned_host_0_5_23 the same with 0.5.23 and the v2 series (module scope: tests/tune_host.py)

Tests that need the network only to fill the wheel cache take ``release_wheel``;
once the cache holds the wheel and PyPI's listing, they run offline.

The suite runs in parallel workers (``make test``: pytest-xdist) as well as alone
(``pytest tests/test_x.py``). Each worker has its own temp folders (tmp_path_factory),
sshd ports (free_port) and session fixtures; what a whole run shares is one folder of
sandbox environments (ddtree_deploy/sandbox/hostenv.py SHARE_ENV): each SGLang host venv
is built once per run, under a file lock, and copied (or, read_only, handed out as is).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.release import releases

BASELINE_RELEASE = "0.5.12.post1"
TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"


# The runner's terminal is no input to any test: an xdist worker starts with COLUMNS=80 and
# LINES=24 where a plain run has neither, and the CLI's consoles (ddtree_deploy/cli/app.py)
# take their width when first imported. Tests that want a width set it themselves.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# The helper modules beside the tests (sshd_host, serve_host, the probes) import as top-level
# modules from every test module: this folder on sys.path once, here, for any import mode
# (pytest's default puts it there for conftest.py; the modules no longer each insert it).
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# The fixtures the sshd tests share, registered for every module: a real sshd per module,
# GNU patch's result for the small deploy series, a fresh host per test (sshd_host.py) and a
# host whose stand-in server runs under supervisord (serve_host.py). A module's own fixture of
# the same name wins (test_container_ssh's sshd with its engine, test_lock_cmd's host), and
# `from sshd_host import sshd` in a module still works as before; container_host.py: a
# [container] host (podman, the test image) for the container modules. Imported after the lines
# above: sshd_host imports the CLI, whose consoles take their width when first imported.
from container_host import box, cli_env, engine  # noqa: E402,F401
from serve_host import served  # noqa: E402,F401
from sshd_host import host, oracle, sshd  # noqa: E402,F401
from tune_host import tuned_host, tuned_host_0_5_23  # noqa: E402,F401

# Process-wide callables some library replaces on import (ansible-core: sys.intern, where
# torch._dynamo, imported later by transformers in the same process, then refuses to load;
# socket.getaddrinfo; dataclasses._is_type). With several tests per worker process in any
# order, one test's import must not change the next one's process: see _no_process_patches.
_PROCESS_WIDE = {(sys, "intern"): sys.intern, (socket, "getaddrinfo"): socket.getaddrinfo,
                 (dataclasses, "_is_type"): getattr(dataclasses, "_is_type", None)}


@pytest.fixture(autouse=True)
def _no_process_patches(request: pytest.FixtureRequest):
    """A test that leaves sys.intern (or the others above) replaced fails, naming it, and the
    original is put back: run such code (ansible-core) in a subprocess, e.g. the console
    script, as tests/e2e/test_json_envelope.py does for `inventory from-ansible`."""
    yield
    changed = []
    for (owner, name), original in _PROCESS_WIDE.items():
        if getattr(owner, name, None) is not original:
            setattr(owner, name, original)
            changed.append(f"{owner.__name__}.{name}")
    if changed:
        pytest.fail(f"{request.node.nodeid} replaced {', '.join(changed)} for the whole pytest process "
                    "(ansible-core's import does); run that code in a subprocess", pytrace=False)


# A suite started in the background by a non-interactive shell (`make test &`, a CI runner)
# inherits SIGINT ignored, and so would every CLI process the tests start: the Ctrl-C tests
# (test_interrupt, test_json_envelope, test_serve_ssh) would then see no interrupt at all.
# A handled signal is reset to the default in an exec'd child, so handling it here gives
# each child the SIGINT a terminal's Ctrl-C delivers.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _snapshots_outside_the_repo(tmp_path_factory: pytest.TempPathFactory):
    """No test writes into the repository's snapshot/ folder (its manifests are committed):
    every test, and every process it starts, sees a copy of it instead."""
    import shutil

    copy = tmp_path_factory.mktemp("snapshot-folder") / "snapshot"
    shutil.copytree(Path(__file__).resolve().parent.parent / "snapshot", copy,
                    ignore=shutil.ignore_patterns("files"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDTREE_DEPLOY_SNAPSHOT", str(copy))
        yield copy


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The `sshd` marker follows what a test uses: every test that takes a fixture named
    # sshd (tests/sshd_host.py's or a module's own, directly or through host, tuned_host,
    # ...) is marked, so the pure tests beside them in a module are not.
    for item in items:
        if "sshd" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("sshd"):
            item.add_marker(pytest.mark.sshd)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Parallel workers take whole modules (or per-release units: work_unit) in collection
        # order (`make test`: --dist loadfile --no-loadscope-reorder): the long ones first
        # (those that run a release in a venv, then those with an sshd), so that no long
        # module starts last and runs alone.
        def weight(item: pytest.Item) -> int:
            return 0 if item.get_closest_marker("sglang_env") else 1 if item.get_closest_marker("sshd") else 2

        modules: dict[str, int] = {}
        for item in items:
            path = item.nodeid.split("::", 1)[0]
            modules[path] = min(modules.get(path, 2), weight(item))
        items.sort(key=lambda item: modules[item.nodeid.split("::", 1)[0]])  # stable: file order kept


# The long modules whose expensive module fixture is built once per SGLang release (a probe
# run, a patched release env): under `make test` each release's tests are a unit of work of
# their own, so that one module's releases run on several workers at once (each building
# only its own releases' fixtures) rather than one after another on one worker.
SPLIT_BY_RELEASE = frozenset({
    "tests/integration/test_v2_hybrid.py",
    "tests/integration/test_v2_worker.py",
    "tests/integration/test_v2_server_args.py",
    "tests/integration/test_v2_family.py",
})
_RELEASE_IN_ID = re.compile(r"\[[^\]]*?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)")
# The modules that drive podman (tests/container_host.py): one unit of work, so that under
# `make test` they run one after the other on one worker; podman is flaky when several run
# at once on a machine, even with a storage each.
PODMAN_MODULES = frozenset({
    "tests/e2e/test_container_ssh.py",
    "tests/e2e/test_container_driver_ssh.py",
})
PODMAN_UNIT = "podman: the container modules, one after the other"


def work_unit(nodeid: str) -> str:
    """The unit of work a parallel worker takes for the test ``nodeid``: its whole module (as
    ``--dist loadfile``: module fixtures built once), or, in a module of ``SPLIT_BY_RELEASE``,
    the module's tests of the first release named in the test's parameters (its family for
    test_v2_family: ``sglang-0.5.20-0.5.21`` is the 0.5.20 family's); the ``PODMAN_MODULES``
    together, as one."""
    path = nodeid.split("::", 1)[0]
    if path in PODMAN_MODULES:
        return PODMAN_UNIT
    if path in SPLIT_BY_RELEASE:
        match = _RELEASE_IN_ID.search(nodeid)
        if match:
            return f"{path}:{match.group(1)}"
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with the units of ``work_unit`` (xdist's hook: the controller asks
    it for the scheduler; None lets xdist choose as usual)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ReleaseUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ReleaseUnits(config, log)


# Where the suite's time goes, as CPU rather than wall time (the wall time of a test on a
# shared 2-core machine says more about its neighbours than about it): with
# DDTREE_TEST_CPU=FILE, each worker appends one line per unit of work (``work_unit``) to FILE,
# "<cpu seconds>\t<wall seconds>\t<unit>", where CPU is this process's and its reaped
# children's (the probes, the CLI processes, an sshd with its sessions once it is stopped).
# A session fixture's cost falls on the unit that first asks for it. scripts/test_cpu.py sums
# the file (docs/testing.md, "Where the time goes").
_CPU_FILE = os.environ.get("DDTREE_TEST_CPU")
_cpu_by_unit: dict[str, list[float]] = {}


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if _CPU_FILE:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
        import time

        cpu, wall = _cpu_now(), time.monotonic()
        yield
        spent = _cpu_by_unit.setdefault(work_unit(item.nodeid), [0.0, 0.0])
        spent[0] += _cpu_now() - cpu
        spent[1] += time.monotonic() - wall

    def pytest_sessionfinish(session: pytest.Session) -> None:
        with open(_CPU_FILE, "a", encoding="utf-8") as out:
            for unit, (cpu, wall) in _cpu_by_unit.items():
                out.write(f"{cpu:.1f}\t{wall:.1f}\t{unit}\n")


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of this whole pytest run: its basetemp, or under xdist the folder that
    holds every worker's basetemp (``pytest-N/popen-gwK``)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _sandbox_envs_built_once_per_run(tmp_path_factory: pytest.TempPathFactory):
    """Every sandbox environment (a release venv, a host's bare venv) is built once per run
    and shared by all tests and workers (a folder of the caller's own choosing wins)."""
    from ddtree_deploy.sandbox.hostenv import SHARE_ENV

    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get(SHARE_ENV):
            mp.setenv(SHARE_ENV, str(run_folder(tmp_path_factory) / "sandbox-envs"))
        yield Path(os.environ[SHARE_ENV])


@pytest.fixture(scope="session")
def release_version() -> str:
    return BASELINE_RELEASE


@pytest.fixture(scope="session")
def release_wheel(release_version: str) -> Path:
    try:
        return releases.ensure_wheel(release_version)
    except DeployError as exc:  # offline with an empty cache
        pytest.skip(f"the {release_version} wheel is not cached and PyPI is unreachable: {exc.message}")


def _make_read_only(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    for dirpath, _dirnames, _ in os.walk(root, topdown=False):
        os.chmod(dirpath, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


def _make_writable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, stat.S_IRWXU)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IWUSR)


@pytest.fixture(scope="session")
def release_tree(release_wheel: Path, tmp_path_factory: pytest.TempPathFactory):
    """The release's ``sglang/`` package files, extracted once per session, read-only.

    Read-only so that a test which writes into it fails loudly (root ignores
    permission bits, so tests must still copy before they change anything).
    """
    root = tmp_path_factory.mktemp("release-tree")
    with zipfile.ZipFile(release_wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sglang/")]
        zf.extractall(root, members=members)
    _make_read_only(root)
    yield root
    _make_writable(root)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def test_family_dir() -> Path:
    return DATA / "patches" / "test-0.5.12"
