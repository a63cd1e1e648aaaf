"""``[container]`` hosts with REAL containers: Debian's podman (runc as its runtime) driven by the
container program over a real sshd on loopback, as on a host whose SGLang runs in a container.

The image: a minimal Debian tree with python3 (ddtree_testkit/containers.py: debootstrap,
built once per machine and cached) plus SGLang 0.5.12.post1's real files from its wheel and
the named STAND-IN server (ddtree_testkit/standin_server.py, NOT SGLang), which runs inside
the container as the serving process: it reads a package file at start and reports its
sha256 in /server_info, and serves the DDTree proof's endpoints. The series is the small real
test series (tests/data/deploy_series: two patches and one added file). One image build per
module; each test runs containers of its own (host network, a free port each). The image, the
engine's storage, the container host and the CLI are tests/container_host.py's. podman is
flaky when run in parallel: run this module without xdist.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ddtree_deploy.base.digests import sha256
from ddtree_deploy.release import releases
from ddtree_deploy.sandbox import SSHServer
from ddtree_testkit import containers as ct
from envelope_check import check_envelope
from sshd_host import ADDED, DEPLOY_SERIES, SPEC, UTILS, deploy_series_oracle, wait_stopped

# Shared with test_container_driver_ssh.py (tests/container_host.py; its fixtures box, engine
# and cli_env through conftest.py): this module's sshd and oracle are its own.
from container_host import IMAGE, IMAGE13, Box, cli


@pytest.fixture(scope="module")
def sshd(tmp_path_factory, engine):
    with SSHServer(tmp_path_factory.mktemp("sshd"), env=engine) as server:
        yield server


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, sshd):
    return deploy_series_oracle(sshd, tmp_path_factory.mktemp("oracle"))


def test_status_of_a_container_host_never_deployed(box):
    b = box("ct-status")
    r = cli("status", "--host", b.name)
    assert r.returncode == 0, r.stderr + r.stdout
    out = r.stdout
    assert f"{b.name}: podman container {b.name}" in out
    assert "sglang 0.5.12.post1 at /usr/local/lib/python3.11/dist-packages (inside the container)" in out
    assert "phase: never-deployed: never deployed by ddtree-deploy" in out
    assert f"pristine  {SPEC}" in out and f"pristine  {UTILS}" in out and f"missing   {ADDED}" not in out
    assert f"health http://127.0.0.1:{b.port}/health_generate: 200" in out
    r = cli("status", "--host", b.name, "--json")
    host = check_envelope(r.stdout, r.returncode, "status")["hosts"][0]
    assert host["outcome"] == "fine" and host["container"]["image"] == b.inspect()["Image"]


def test_push_builds_recreates_proves_then_rollback_runs_the_kept_image(box, oracle):
    pristine, patched = oracle
    b = box("ct-push")
    before = b.inspect()
    assert b.serving_sha() == sha256(pristine[SPEC])
    r = cli("push", "--host", b.name)
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"{b.name}: built localhost/ddtree-deploy/{b.name}:ddtree-" in r.stdout
    assert "DDTREE verify width 9 = budget 8 + 1" in r.stdout
    after = b.inspect()
    # A new container of a new image, with the old one's run configuration.
    assert after["Id"] != before["Id"] and after["Image"] != before["Image"]
    assert after["Config"]["Cmd"] == before["Config"]["Cmd"]
    assert after["Config"]["Labels"]["team"] == "inference"
    assert "SGLANG_TEST=1" in after["Config"]["Env"]
    assert after["HostConfig"]["RestartPolicy"] == before["HostConfig"]["RestartPolicy"]
    assert after["HostConfig"]["NetworkMode"] == "host"
    assert b.inspect(b.name + "-ddtree-prev") is None  # the old container was removed once the new one stood
    # The server in the new container runs GNU patch's bytes; the image carries the series' labels.
    assert b.serving_sha() == sha256(patched[SPEC])
    labels = json.loads(ct.podman(b.env, "image", "inspect", after["Image"]).stdout)[0]["Config"]["Labels"]
    assert labels["io.ddtree-deploy.series"] == "sglang-0.5.12"
    # The old image is kept under a tag of ours (never pruned): what rollback runs.
    kept = f"localhost/ddtree-deploy/{b.name}:was-{before['Image'][:12]}"
    assert ct.podman(b.env, "image", "exists", kept, check=False).returncode == 0

    st = cli("status", "--host", b.name)
    assert st.returncode == 0, st.stdout + st.stderr
    assert "phase: deployed: deployed sglang-0.5.12 by run" in st.stdout
    assert f"patched   {SPEC}" in st.stdout and f"patched   {ADDED}" in st.stdout
    again = cli("push", "--host", b.name, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert check_envelope(again.stdout, 0, "push")["hosts"][0]["outcome"] == "already deployed"

    back = cli("rollback", "--host", b.name)
    assert back.returncode == 0, back.stdout + back.stderr
    assert f"runs the kept image {kept}" in back.stdout
    assert b.inspect()["Image"] == before["Image"]
    assert b.serving_sha() == sha256(pristine[SPEC])
    st = cli("status", "--host", b.name)
    assert st.returncode == 0 and "phase: rolled-back" in st.stdout, st.stdout + st.stderr
    again = cli("rollback", "--host", b.name, "--json")
    assert check_envelope(again.stdout, again.returncode, "rollback")["hosts"][0]["outcome"] == "already rolled back"
    # The container's own history and lock, through the container program (history, lock status).
    history = cli("history", "--host", b.name)
    assert history.returncode == 0, history.stdout + history.stderr
    events = [line.split()[1] for line in history.stdout.splitlines()[1:] if not line.startswith("      ")]
    assert events[:4] == ["rollback", "switch", "push", "switch"], history.stdout
    lock = cli("lock", "status", "--host", b.name)
    assert lock.returncode == 0 and f"{b.name}: lock free" in lock.stdout, lock.stdout + lock.stderr


def test_a_failing_new_image_is_rolled_back_and_the_old_one_serves_again(box, oracle):
    pristine, _ = oracle
    # The series adds ADDED: the new image never becomes ready (8 s is its whole chance).
    b = box("ct-fail", unhealthy_with=ADDED, serve={"ready_timeout_s": 8})
    b.wait_healthy()
    before = b.inspect()
    r = cli("push", "--host", b.name)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed, rolled back" in r.stdout + r.stderr
    assert "health failed" in r.stdout and "the old image serves again: healthy" in r.stdout
    after = b.inspect()
    assert after["Id"] == before["Id"] and after["Image"] == before["Image"]  # the very container, back
    assert b.healthy() and b.serving_sha() == sha256(pristine[SPEC])
    st = cli("status", "--host", b.name)
    assert "phase: rolled-back: rolled back automatically after push run" in st.stdout, st.stdout


def test_a_container_recreated_by_hand_is_seen_by_status(box):
    b = box("ct-hand")
    assert cli("push", "--host", b.name).returncode == 0
    ct.podman(b.env, "rm", "-f", b.name)
    b.run()  # someone recreates it from the original image
    b.wait_healthy()
    st = cli("status", "--host", b.name)
    assert st.returncode == 1, st.stdout + st.stderr
    assert "it was recreated outside ddtree-deploy" in st.stdout
    assert "needs attention" in st.stdout + st.stderr
    # rollback refuses to replace what someone else put there; push builds on it again.
    rb = cli("rollback", "--host", b.name)
    assert rb.returncode == 1 and "recreated outside ddtree-deploy" in rb.stdout + rb.stderr
    assert cli("push", "--host", b.name).returncode == 0


def test_refusals_are_one_line_and_change_nothing(box, sshd, engine, tmp_path, cli_env):
    missing = box("ct-missing", run=False)
    r = cli("push", "--host", missing.name)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no container named {missing.name}" in r.stderr
    not_sglang = box("ct-notsglang", run=False)
    ct.podman(engine, "run", "-d", "--init", "--name", not_sglang.name, "--network", "none",
              IMAGE.rsplit(":", 1)[0] + ":debian", "sleep", "600")
    r = cli("push", "--host", not_sglang.name)
    assert r.returncode == 1 and "is not an SGLang container" in r.stderr, r.stdout + r.stderr
    # What does not take a container host says so (exit 2, nothing sent).
    r = cli("restart", "--host", missing.name)
    assert r.returncode == 2 and "`restart` does not take a [container] host" in r.stderr, r.stdout + r.stderr
    # An image whose SGLang is a release no family covers (0.5.13's real files; the test series
    # covers 0.5.12 only): exit 2, before any lock.
    wheel13 = releases.ensure_wheel("0.5.13")
    ctx = ct.sglang_layer(wheel13, [SPEC, UTILS], tmp_path / "layer13")
    ct.podman(engine, "build", "--build-arg", f"BASE={IMAGE.rsplit(':', 1)[0]}:debian", "-t", IMAGE13, str(ctx))
    newer = box("ct-uncovered", image=IMAGE13)
    r = cli("push", "--host", newer.name, "--json")
    doc = check_envelope(r.stdout, r.returncode, "push")
    assert r.returncode == 2 and doc["error"]["code"] == "uncovered-release", r.stdout
    assert "runs SGLang 0.5.13, a release no family covers" in doc["error"]["message"]
    assert not (newer.state_dir / "lock").exists() and newer.inspect()["Image"] == newer.image_id()
    # An engine the host does not have, or whose daemon does not answer: exit 3, the right cause.
    docker = box("ct-docker", run=False, container={"engine": "docker"})
    r = cli("push", "--host", docker.name)
    assert r.returncode == 3, r.stdout + r.stderr
    if shutil.which("docker"):  # this machine has docker's CLI without a daemon
        assert "docker is installed" in r.stderr and "but does not answer" in r.stderr, r.stderr
    else:
        assert "docker is not installed" in r.stderr, r.stderr
    with SSHServer(tmp_path / "sshd-bare", env={**engine, "PATH": "/nonexistent"}) as bare:
        nowhere = Box(bare, engine, tmp_path / "nowhere", "ct-nowhere")
        r = cli("status", "--host", str(nowhere.inventory))
        assert r.returncode == 3 and "podman is not installed on" in r.stderr, r.stdout + r.stderr


def _wait_unlocked(name: str, timeout: float = 120) -> dict:
    """The host's status document once no run holds its lock (the container program, left
    alone by an interrupted run, finishes its step first)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = json.loads(cli("status", "--host", name, "--json").stdout)["hosts"][0]
        if not doc.get("lock"):
            return doc
        assert time.monotonic() < deadline, f"{name}: the lock was never released: {doc.get('lock')}"
        time.sleep(0.5)


@pytest.mark.parametrize("step", ["build", "switch", "verify", "keep"])
def test_ctrl_c_at_every_step_leaves_a_state_status_explains_and_a_rerun_finishes(box, step, oracle, tmp_path,
                                                                                    monkeypatch):
    """The container program stops before each request (the hook ``stop_before_each_request``);
    when it holds ``step``'s request, Ctrl-C reaches the CLI, then the program goes on alone."""
    _, patched = oracle
    b = box(f"ct-int-{step}")
    log = tmp_path / "requests.log"
    monkeypatch.setenv("DDTREE_DEPLOY_TEST_HOOKS", json.dumps({"stop_before_each_request": str(log)}))
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_deploy", "push", "--host", b.name], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    monkeypatch.delenv("DDTREE_DEPLOY_TEST_HOOKS")
    seen, pid = 0, None
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) == seen:
            time.sleep(0.05)
            continue
        pid, op = lines[seen].split()
        pid, seen = int(pid), seen + 1
        wait_stopped(pid, deadline_s=30)
        if op == step:
            break
        os.kill(pid, signal.SIGCONT)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    os.kill(pid, signal.SIGCONT)  # the program handles the request it holds, alone, then sees the link gone
    assert proc.returncode == 130, out + err
    assert f"{b.name}: interrupted waiting for {step}" in err, err
    doc = _wait_unlocked(b.name)
    if step == "build":  # the container was never touched
        assert doc["phase"] == "never-deployed" and doc["outcome"] == "fine", doc
    elif step == "keep":
        assert doc["phase"] == "deployed" and doc["outcome"] == "fine", doc
    else:  # switched and never ended: said, with the two ways on
        assert doc["phase"] == "switched" and doc["outcome"] == "needs attention", doc
        assert "never ended" in doc["explanation"] and "to finish it" in doc["explanation"]
    r = cli("push", "--host", b.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("checked and kept now" in r.stdout) == (step in ("switch", "verify")), r.stdout
    doc = _wait_unlocked(b.name)
    assert doc["phase"] == "deployed" and doc["outcome"] == "fine", doc
    assert b.serving_sha() == sha256(patched[SPEC])


def test_a_program_killed_mid_switch_is_explained_and_finished(box, oracle, monkeypatch):
    """The container program dies between the old container's rename aside and the new one's
    creation: no container has the name; status says where the old one is; push puts it back
    and completes."""
    _, patched = oracle
    b = box("ct-kill")
    monkeypatch.setenv("DDTREE_DEPLOY_TEST_HOOKS", json.dumps({"exit_after_rename": True}))
    r = cli("push", "--host", b.name)
    monkeypatch.delenv("DDTREE_DEPLOY_TEST_HOOKS")
    assert r.returncode == 1, r.stdout + r.stderr
    assert b.inspect() is None and b.inspect(b.name + "-ddtree-prev") is not None
    st = cli("status", "--host", b.name)
    assert st.returncode == 1, st.stdout + st.stderr
    assert "stopped during its switch" in st.stdout and f"kept aside, stopped, as {b.name}-ddtree-prev" in st.stdout
    r = cli("push", "--host", b.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the old container, kept aside as" in r.stdout
    assert b.serving_sha() == sha256(patched[SPEC])


def test_a_slower_image_is_put_back_by_the_speed_analysis(box, tmp_path, monkeypatch):
    """The speed gate on a [container] host (issue 29): the old container sampled before the
    switch, the new one baked after its proof; the series' slow build (the added module carries
    the stand-in's slowdown marker, read at start: 10% slower) is not kept: the old container
    serves again, and the journal's rollback names the analysis."""
    slow = tmp_path / "slow_series"
    shutil.copytree(DEPLOY_SERIES, slow)
    with open(slow / "payload" / "ddtree_deploy_test_marker.py", "a") as fh:
        fh.write("# ddtree-standin: slowdown=0.10\n")
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(slow / "patches"))
    b = box("ct-slow", extra_argv=["--package-file", ADDED, "--enable-metrics", "--metric-names",
                                   "/opt/standin/metric_names.json", "--traffic", "4", "--traffic-tokens", "48",
                                   "--accept-length", "3.0"],
            tables="\n[analysis]\nwindow_s = 3\ninterval_s = 1\nmin_samples = 3\n")
    before = b.inspect()
    r = cli("push", "--host", b.name)
    print(r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "analysis failed: slower than the baseline: output tokens/s" in r.stdout, r.stdout
    assert "the old image serves again: healthy" in r.stdout
    after = b.inspect()
    assert after["Id"] == before["Id"] and after["Image"] == before["Image"]  # the very container, back
    assert b.healthy() and b.info()["stand_in_package"]["sha256"] is None  # no added module: the old files
    history = cli("history", "--host", b.name)
    assert "(AUTOMATIC, after push run" in history.stdout and "speed analysis failed" in history.stdout, \
        history.stdout
    # the bake's before/after as a history `speed` line, as a [serve] host's push writes it
    entries = json.loads(cli("history", "--host", b.name, "--json").stdout)["hosts"][0]["entries"]
    verdict = next(e for e in entries if e["event"] == "speed")
    assert verdict["speed"]["stage"] == "verdict" and verdict["outcome"] == "rolled back", verdict
    assert verdict["phase"] == "rolled-back"  # written once the old container is back
    assert verdict["speed"]["after"]["output_tps"] < 0.95 * verdict["speed"]["before"]["output_tps"], verdict
    assert "rolled back -> rolled-back" in history.stdout and "slower than the baseline" in history.stdout, \
        history.stdout
