"""The host-side smoke program, run the way a host runs it: a separate interpreter,
a JSON request on stdin, a JSON answer on stdout.

The launch cases start ddtree_testkit/standin_server.py, a STAND-IN for SGLang's server (this
machine has no GPU), and check after every case that no process of the server's group
is left running.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddtree_deploy.hostprog import smoke as smoke_agent
from ddtree_testkit import STANDIN_SERVER

AGENT = Path(smoke_agent.__file__)
STANDIN = STANDIN_SERVER


def run_agent(request: dict, env: dict | None = None, timeout: float = 120) -> dict:
    proc = subprocess.run(
        [sys.executable, str(AGENT)], input=json.dumps(request), capture_output=True,
        text=True, timeout=timeout, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    # Streamed: start/level events (and heartbeats), then the whole answer last.
    assert events[-1]["event"] == "done"
    assert [e["level"] for e in events if e["event"] == "level"] == [r["level"] for r in events[-1]["levels"]]
    events[-1]["events"] = events[:-1]
    return events[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper does not count: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# ---------------------------------------------------------------- compile / import / cli


def test_compile_passes_and_writes_no_bytecode(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    answer = run_agent({"levels": ["compile"], "compile": {"files": [str(good)]}})
    assert answer["ok"] and answer["levels"][0]["status"] == "passed"
    assert not (tmp_path / "__pycache__").exists()


def test_compile_names_file_and_line_and_skips_later_levels(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("x = 1\ndef broken(:\n    pass\n")
    answer = run_agent({"levels": ["compile", "import"], "compile": {"files": [str(good), str(bad)]},
                        "import": {"modules": ["json"]}})
    compile_level, import_level = answer["levels"]
    assert not answer["ok"]
    assert compile_level["status"] == "failed"
    assert compile_level["detail"].startswith(f"{bad}:2: ")
    assert import_level["status"] == "skipped"


def test_compile_missing_file(tmp_path):
    answer = run_agent({"levels": ["compile"], "compile": {"files": [str(tmp_path / "nope.py")]}})
    assert "cannot read" in answer["levels"][0]["detail"]


@pytest.fixture
def fake_pkg(tmp_path):
    """A tiny package on PYTHONPATH, standing for the host's installed SGLang."""
    pkg = tmp_path / "site" / "fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "algo.py").write_text("import enum\nclass Algo(enum.Enum):\n    DFLASH = 1\n    DDTREE = 2\n")
    (pkg / "broken.py").write_text("import fakepkg.does_not_exist\n")
    (pkg / "cli.py").write_text(textwrap.dedent("""
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--speculative-algorithm")
        p.add_argument("--speculative-ddtree-budget")
        p.parse_args()
    """))
    (pkg / "args.py").write_text(textwrap.dedent("""
        import argparse
        class Args:
            def __init__(self, ns):
                if ns.budget < 1:
                    raise ValueError("budget must be >= 1")
                self.width = ns.budget + 1
        def prepare(argv):
            p = argparse.ArgumentParser()
            p.add_argument("--model-path", required=True)
            p.add_argument("--budget", type=int, default=0)
            return Args(p.parse_args(argv))
    """))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    return tmp_path, env


def test_import_checks_modules_and_attribute(fake_pkg):
    tmp, env = fake_pkg
    ok = run_agent({"levels": ["import"], "import": {
        "modules": ["fakepkg.algo"], "attributes": [["fakepkg.algo", "Algo.DDTREE"]]}}, env)
    assert ok["ok"], ok
    assert ok["levels"][0]["evidence"]["files"]["fakepkg.algo"] == str(tmp / "site/fakepkg/algo.py")
    missing = run_agent({"levels": ["import"], "import": {
        "modules": ["fakepkg.algo"], "attributes": [["fakepkg.algo", "Algo.EAGLE9"]]}}, env)
    assert not missing["ok"]
    assert missing["levels"][0]["detail"].startswith("fakepkg.algo.Algo.EAGLE9 does not exist")
    broken = run_agent({"levels": ["import"], "import": {"modules": ["fakepkg.algo", "fakepkg.broken"]}}, env)
    assert broken["levels"][0]["detail"].startswith("import fakepkg.broken failed: ModuleNotFoundError")


def test_import_times_out(fake_pkg):
    tmp, env = fake_pkg
    (tmp / "site/fakepkg/slow.py").write_text("import time\ntime.sleep(60)\n")
    answer = run_agent({"levels": ["import"], "import": {"modules": ["fakepkg.slow"], "timeout_s": 1}}, env)
    assert answer["levels"][0]["detail"] == "importing timed out after 1 s"


def cli_request(expect, validate=None):
    return {"levels": ["cli"], "cli": {"argv": ["{python}", "-m", "fakepkg.cli", "--help"],
                                       "expect": expect, "validate": validate}}


def validation(argv, needs):
    return {"module": "fakepkg.args", "function": "prepare", "argv": argv, "needs_paths": needs,
            "report": ["width"]}


def test_cli_lists_flags_and_validates(fake_pkg):
    tmp, env = fake_pkg
    argv = ["--model-path", str(tmp), "--budget", "8"]
    answer = run_agent(cli_request(["--speculative-ddtree-budget"], validation(argv, [str(tmp)])), env)
    assert answer["ok"], answer
    assert answer["levels"][0]["evidence"]["validation"] == {"argv": argv, "fields": {"width": 9}}
    assert answer["levels"][0]["detail"] == "help lists 1 DDTree flags; prepare accepts the launch arguments"


def test_cli_missing_flag(fake_pkg):
    _, env = fake_pkg
    answer = run_agent(cli_request(["--speculative-ddtree-budget", "--speculative-ddtree-topk"]), env)
    assert answer["levels"][0]["detail"] == "the help does not list --speculative-ddtree-topk"


def test_cli_validation_rejects_and_skips_without_model_files(fake_pkg):
    tmp, env = fake_pkg
    answer = run_agent(cli_request([], validation(["--model-path", "m", "--budget", "0"], [str(tmp)])), env)
    assert answer["levels"][0]["detail"] == "prepare rejects the launch arguments: ValueError: budget must be >= 1"
    # A flag the parser does not know: argparse's own message comes back as evidence.
    answer = run_agent(cli_request([], validation(["--model-path", "m", "--bugdet", "3"], [str(tmp)])), env)
    assert answer["levels"][0]["detail"] == "prepare rejects the launch arguments: SystemExit: 2"
    assert "unrecognized arguments: --bugdet 3" in answer["levels"][0]["evidence"]["output"]
    absent = validation(["--model-path", "m"], [str(tmp / "no-model")])
    answer = run_agent(cli_request([], absent), env)
    assert answer["ok"]
    assert answer["levels"][0]["evidence"]["validation"]["skipped"].startswith("model files not on the host")


# ---------------------------------------------------------------------------- launch


def tree_check(budget=8, worker_class="DFlashWorker", prompts=3):
    """The launch request's tree part, as smoke_plan.plan_smoke builds it."""
    return {"budget": budget, "budget_field": "speculative_ddtree_budget", "worker_class": worker_class,
            "prompts": [f"prompt {i}" for i in range(prompts)], "max_new_tokens": 32}


def launch_request(tmp_path, mode="ok", *extra, algorithm="DDTREE", **overrides):
    port = free_port()
    pid_file = tmp_path / "pids"
    spec = {
        "argv": ["{python}", str(STANDIN), "--mode", mode, "--pid-file", str(pid_file),
                 "--model-path", "/models/target", "--speculative-algorithm", algorithm,
                 "--host", "127.0.0.1", "--port", str(port), *extra],
        "host": "127.0.0.1", "port": port, "log_path": str(tmp_path / "smoke" / "server.log"),
        "gpu_check": False, "ready_timeout_s": 20, "poll_s": 0.1, "term_grace_s": 3,
        "probe": {"text": "The capital of France is", "max_new_tokens": 14},
        "expect_algorithm": "DDTREE",
    }
    spec.update(overrides)
    return {"levels": ["launch"], "launch": spec}, pid_file


def launch(tmp_path, *args, **kwargs):
    request, pid_file = launch_request(tmp_path, *args, **kwargs)
    answer = run_agent(request)
    level = dict(answer["levels"][0], server_log=answer.get("server_log"))
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    # The core promise: whatever happened, nothing the server started still runs.
    assert [p for p in pids if alive(p)] == [], level
    if "stopped" in level["evidence"]:
        assert level["evidence"]["stopped"]["left"] == []
    return answer["ok"], level, pids


def test_launch_ok_reports_algorithm_and_accept_length(tmp_path):
    ok, level, pids = launch(tmp_path, "ok", "--child", "--accept-length", "3.5")
    assert ok, level
    ev = level["evidence"]
    assert len(pids) == 2  # server and its worker child, both gone
    assert ev["speculative_algorithm"] == "DDTREE"
    assert ev["accept_length"] == round(14 / 4, 3)  # 14 tokens over ceil(14 / 3.5) verifies
    assert ev["avg_spec_accept_length"] == 3.5
    assert ev["ready_by"] == "/health_generate 200"
    assert ev["stopped"]["signals"] == ["SIGTERM"]
    assert ev["gpus"].startswith("not checked")
    assert "ready in" in level["detail"] and "accept length 3.5" in level["detail"]


def test_launch_slow_start_waits_and_keeps_talking(tmp_path):
    request, _ = launch_request(tmp_path, "ok", "--ready-after", "1.5")
    answer = run_agent(dict(request, heartbeat_s=0.3))
    assert answer["ok"], answer
    assert answer["levels"][0]["evidence"]["ready_s"] >= 1.5
    # Heartbeats while waiting: an SSH read timeout never mistakes a slow start for a dead link.
    assert [e["event"] for e in answer["events"]].count("wait") >= 3


def test_launch_die_at_start_reports_exit_and_log_tail(tmp_path):
    ok, level, _ = launch(tmp_path, "die-at-start")
    assert not ok
    assert level["detail"] == "the server exited with code 3 before it was ready"
    assert any("told to die at start" in line for line in level["evidence"]["log_tail"])
    # The whole log comes back with a failed launch, to be kept on the controller.
    assert "told to die at start" in level["server_log"]


def test_launch_never_ready_times_out_and_kills_group(tmp_path):
    ok, level, pids = launch(tmp_path, "never-ready", "--child", ready_timeout_s=1.5)
    assert not ok
    assert level["detail"] == "the server was not ready after 1.5 s"
    assert level["evidence"]["last_health_status"] == 503
    assert any("listening on" in line for line in level["evidence"]["log_tail"])
    assert len(pids) == 2


def test_launch_empty_text_fails(tmp_path):
    ok, level, _ = launch(tmp_path, "empty-text")
    assert not ok and level["detail"] == "POST /generate returned empty text"


def test_launch_term_ignored_needs_kill(tmp_path):
    ok, level, pids = launch(tmp_path, "ignore-term", "--child", term_grace_s=1)
    assert ok, level
    assert level["evidence"]["stopped"]["signals"] == ["SIGTERM", "SIGKILL"]
    assert len(pids) == 2


def test_launch_ready_by_log_line(tmp_path):
    ok, level, _ = launch(tmp_path, "log-only")
    assert ok, level
    assert level["evidence"]["ready_by"] == "log line"


def test_launch_falls_back_to_get_server_info(tmp_path):
    ok, level, _ = launch(tmp_path, "old-info")
    assert ok, level
    assert level["evidence"]["server_info_endpoint"] == "/get_server_info"


def test_launch_wrong_algorithm_fails(tmp_path):
    ok, level, _ = launch(tmp_path, "wrong-algo")
    assert not ok
    assert level["detail"] == "the server reports speculative_algorithm='DFLASH', not DDTREE"


def test_launch_gpu_check_without_nvidia_smi_starts_nothing(tmp_path):
    request, pid_file = launch_request(tmp_path, gpu_check=True)
    env = dict(os.environ, PATH=str(tmp_path))  # no nvidia-smi on this PATH (nor on this machine)
    answer = run_agent(request, env)
    assert answer["levels"][0]["detail"].startswith("nvidia-smi not found on the host")
    assert not pid_file.exists()


def test_launch_gpu_check_parses_nvidia_smi(tmp_path):
    # A stand-in nvidia-smi (this machine has none) printing the real query format.
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '0, NVIDIA H200, 1200, 143771'\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    request, _ = launch_request(tmp_path, gpu_check=True, min_free_mib=40000)
    answer = run_agent(request, env)
    assert answer["levels"][0]["detail"] == "no GPU has 40000 MiB free (another server running?)"
    assert answer["levels"][0]["evidence"]["gpus"][0]["name"] == "NVIDIA H200"


def test_launch_refuses_port_in_use(tmp_path):
    request, pid_file = launch_request(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", request["launch"]["port"]))
        busy.listen()
        answer = run_agent(request)
    assert "is already in use" in answer["levels"][0]["detail"]
    assert not pid_file.exists()


def test_bad_request_exits_2():
    proc = subprocess.run([sys.executable, str(AGENT)], input='{"levels": ["fly"]}',
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"] == "unknown levels: ['fly']"


def test_compile_resolves_package_relative_paths_where_the_interpreter_finds_the_package(fake_pkg):
    tmp, env = fake_pkg
    answer = run_agent({"levels": ["compile"], "compile": {"package": "fakepkg", "files": ["fakepkg/algo.py"]}}, env)
    assert answer["ok"] and answer["levels"][0]["evidence"]["root"] == str(tmp / "site")
    gone = run_agent({"levels": ["compile"], "compile": {"package": "nopkg", "files": ["nopkg/x.py"]}}, env)
    assert "cannot find the nopkg package" in gone["levels"][0]["detail"]


def test_dropped_connection_still_stops_the_server(tmp_path):
    """SSH gone mid-launch (SIGHUP, pipes closed): the program finishes the level and stops the group."""
    import signal
    import time

    request, pid_file = launch_request(tmp_path, "ok", "--child", "--ready-after", "1.5")
    proc = subprocess.Popen([sys.executable, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdin.write((json.dumps(request) + "\n").encode())
    proc.stdin.close()
    assert json.loads(proc.stdout.readline())["event"] == "start"
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and len(pid_file.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.stdout.close()  # the client is gone: nobody reads the answer
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 0
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and [p for p in pids if alive(p)] == []
    assert "ready to roll" in (tmp_path / "smoke" / "server.log").read_text()  # it ran to the end


# ------------------------------------------------- launch: tree verify really ran
# Each case serves one way a partial port would look from /server_info (the STAND-IN
# server's modes); the level must fail on it with one line naming the key and the values.

WHERE = "/server_info internal_states"


def test_launch_tree_verify_proven(tmp_path):
    ok, level, _ = launch(tmp_path, "ok", "--speculative-ddtree-budget", "8", tree=tree_check())
    assert ok, level
    ev = level["evidence"]
    assert ev["tree_requests"] == {"prompts": 3, "completion_tokens": 3 * 32}
    # Stand-in arithmetic: the probe (14 tokens, 4 verifies) counts 1, each prompt (32 tokens,
    # 10 verifies) 3: what matters is that the level read the server's count after its requests.
    assert ev["tree"] == {"verify_width": 9, "budget": 8, "worker_class": "DFlashWorker", "offchain_accepts": 10}
    assert level["detail"].endswith("DDTREE verify width 9 = budget 8 + 1, DFlashWorker, 10 off-chain accepts")


def test_launch_tree_budget_from_server_info_when_the_inventory_sets_none(tmp_path):
    # No budget flag, no inventory budget: the server's own (default 64) is what it runs.
    ok, level, _ = launch(tmp_path, "ok", tree=dict(tree_check(), budget=None))
    assert ok, level
    assert level["evidence"]["tree"]["verify_width"] == 65


@pytest.mark.parametrize("mode, extra, tree, detail", [
    ("block-width", (), {},
     f"{WHERE}[0].ddtree_verify_width is 16, expected 9 (budget 8 + 1): the server does not verify a DDTree tree"),
    ("chain-worker", ("--worker-class", "DDTreeWorkerV2"), {"worker_class": "DDTreeWorkerV2"},
     f"{WHERE}[0].ddtree_worker_class is 'DFlashWorkerV2', expected DDTreeWorkerV2: DDTREE is not served by "
     "the family's tree worker"),
    ("no-offchain", (), {},
     f"{WHERE}: ddtree_offchain_accepts is 0 after the probe and 3 more prompts (96 tokens): no verify step "
     "accepted a path off the first-ranked chain, so no tree verify was seen"),
    ("no-tree-keys", (), {},
     f"{WHERE}[0] has no ddtree_verify_width, ddtree_worker_class, ddtree_offchain_accepts: the deployed series "
     "does not report its tree verify (a partial port, or a worker without the DDTree report)"),
])
def test_launch_tree_failures(tmp_path, mode, extra, tree, detail):
    ok, level, pids = launch(tmp_path, mode, "--speculative-ddtree-budget", "8", *extra,
                             tree=dict(tree_check(), **tree))
    assert not ok
    assert level["detail"] == detail
    assert "internal_states" in level["evidence"]  # (launch() checked that no process is left)


def test_launch_tree_worker_class_of_the_chain_fails_for_the_v1_name_too(tmp_path):
    # The worker class the server reports must be the family's, whatever the mode: a server
    # reporting the v2 chain worker fails a family that expects the patched v1 DFlashWorker.
    ok, level, _ = launch(tmp_path, "ok", "--speculative-ddtree-budget", "8", "--worker-class", "EAGLEWorker",
                          tree=tree_check())
    assert not ok
    assert level["detail"] == (f"{WHERE}[0].ddtree_worker_class is 'EAGLEWorker', expected DFlashWorker: DDTREE "
                               "is not served by the family's tree worker")


def test_launch_tree_unknown_budget_is_one_line(tmp_path):
    ok, level, _ = launch(tmp_path, "ok", tree=dict(tree_check(), budget=None, budget_field="tree_budget"))
    assert not ok
    assert level["detail"] == ("/server_info: tree_budget is None, and the inventory sets no [smoke.launch] "
                               "budget: cannot tell the verify width to expect; set budget")


# ------------------------------------------- import / cli: the tree probe's release path
# A tiny package standing for a release's server args and algorithm registry, built like
# 0.5.23's: DDTREE exists only once the plugins are loaded, ServerArgs resolves in
# resolve_once() into a stash that only the resolution view reads. So the probe passes only
# when it takes the release's own path in launch_server's order. (The real releases:
# tests/e2e/test_smoke_tree.py.) FAKE_MODE picks a partial port.

FAKE_RELEASE = textwrap.dedent("""
    import argparse, json, os
    MODE = os.environ.get("FAKE_MODE", "tree")
    REGISTERED = []

    def load_plugins():
        REGISTERED.append("DDTREE")

    class Args:
        def __init__(self, ns):
            self.ns, self._stash = ns, None
            self.speculative_algorithm = ns.speculative_algorithm

        def resolve_once(self):
            if self.ns.budget < 1 or MODE == "reject":
                raise ValueError("DDTREE needs a tree-mask attention backend")
            with open(os.path.join(self.ns.speculative_draft_model_path, "config.json")) as fh:
                block = json.load(fh)["block_size"]
            width = block if MODE == "chain-width" else self.ns.budget + 1
            self._stash = {"speculative_num_draft_tokens": width, "speculative_ddtree_budget": self.ns.budget}

    class View:
        def __init__(self, args):
            self._args = args

        def __getattr__(self, name):
            stash = self._args._stash or {}
            return stash[name] if name in stash else getattr(self._args, name)

    def prepare(argv):
        p = argparse.ArgumentParser()
        for flag in ("--model-path", "--speculative-algorithm", "--speculative-draft-model-path"):
            p.add_argument(flag, required=True)
        p.add_argument("--budget", type=int, default=64)
        p.add_argument("--skip-tokenizer-init", action="store_true")
        p.add_argument("--disable-radix-cache", action="store_true")
        return Args(p.parse_args(argv))

    class TreeWorker:
        DDTREE_TREE_VERIFY = True

    class ChainWorker:
        pass

    def describe(args):
        # The family's hybrid report (ddtree_hybrid.describe on a real release): None for a
        # pure-attention model; FAKE_MODE hybrid-topk1 / hybrid-no-hook break the tree path.
        if "hybrid" not in args.ns.model_path:
            return None
        topk = 1 if MODE in ("hybrid-topk1", "hybrid-chain") else 8
        return {"recurrent_kind": "gdn", "recurrent_config": "Qwen3NextConfig", "tree_path": topk > 1,
                "commit_hook": "fakepkg.release.commit", "commit_hook_found": MODE != "hybrid-no-hook",
                "speculative_eagle_topk": topk, "ddtree_topk": 1 if MODE == "hybrid-chain" else 8}

    class Algo:
        @classmethod
        def from_string(cls, name):
            if name not in REGISTERED:
                raise ValueError("Unknown speculative algorithm name: " + name)
            return cls()

        def create_worker(self, args):
            if MODE == "worker-raises":
                raise RuntimeError("refusing to serve DDTREE as a linear chain")
            return ChainWorker if MODE == "chain-worker" else TreeWorker
""")
FAKE_PATHS = {"plugins": ["fakepkg.release", "load_plugins"], "parse": ["fakepkg.release", "prepare"],
              "resolve": "resolve_once", "view": ["fakepkg.release", "View"],
              "algorithm": ["fakepkg.release", "Algo"]}


def fake_tree_probe(**family):
    from ddtree_deploy.settings import smoke as smoke_settings
    from ddtree_deploy.smoke import plan as smoke_plan

    excluded = family.pop("excluded", ())
    fam = smoke_settings.FamilySmoke(**{"budget_flag": "--budget", "worker_class": "TreeWorker", "probe_args": (),
                               "worker_module": "fakepkg.release", **family})
    return dict(smoke_plan.tree_probe(fam, excluded), **FAKE_PATHS)


def run_tree_probe(fake_pkg, mode="tree", probe=None):
    tmp, env = fake_pkg
    (tmp / "site/fakepkg/release.py").write_text(FAKE_RELEASE)
    request = {"levels": ["import"], "import": {"modules": ["fakepkg.algo"], "tree": probe or fake_tree_probe()}}
    answer = run_agent(request, dict(env, FAKE_MODE=mode))
    return answer["ok"], answer["levels"][0]


def test_tree_probe_takes_the_release_path(fake_pkg):
    ok, level = run_tree_probe(fake_pkg)
    assert ok, level
    assert level["detail"] == ("1 modules imported; DDTREE verify width 25 = budget 24 + 1; "
                               "DDTREE -> TreeWorker (DDTREE_TREE_VERIFY = True)")
    tree = level["evidence"]["tree"]
    assert tree["worker"] == {"name": "TreeWorker", "module": "fakepkg.release", "marker": "True", "tree": True}
    # The tiny config folders were written on the host and named in the argv.
    assert tree["argv"][1].endswith("/model") and tree["argv"][5].endswith("/draft_model")


@pytest.mark.parametrize("mode, detail", [
    ("chain-width", "DDTREE probe: speculative_num_draft_tokens resolved to 16, expected 25 (--budget 24 + 1): "
                    "that is the draft block, so DDTREE verifies a chain (the linear DFlash path)"),
    ("chain-worker", "DDTREE probe: DDTREE resolves to worker class fakepkg.release.ChainWorker, expected "
                     "TreeWorker (the family's [smoke] worker_class)"),
    ("worker-raises", "DDTREE probe: SpeculativeAlgorithm.from_string('DDTREE').create_worker failed: "
                      "RuntimeError: refusing to serve DDTREE as a linear chain"),
])
def test_tree_probe_partial_ports(fake_pkg, mode, detail):
    ok, level = run_tree_probe(fake_pkg, mode)
    assert not ok and level["detail"] == detail


def test_tree_probe_marker_and_rejection_and_exclusion(fake_pkg):
    # No worker_class in the family: the marker alone decides.
    ok, level = run_tree_probe(fake_pkg, "chain-worker", fake_tree_probe(worker_class=None))
    assert not ok and level["detail"] == (
        "DDTREE probe: DDTREE resolves to fakepkg.release.ChainWorker, whose DDTREE_TREE_VERIFY is None, not "
        "True: that worker does not verify a tree (silently linear)")
    ok, level = run_tree_probe(fake_pkg, "reject")
    assert not ok and level["detail"] == ("DDTREE probe: the release's ServerArgs rejects DDTREE with --budget 24 "
                                          "(tiny config folders): ValueError: DDTREE needs a tree-mask attention "
                                          "backend")
    ok, level = run_tree_probe(fake_pkg, "chain-worker", fake_tree_probe(excluded=("fakepkg.release",)))
    assert ok and level["detail"].endswith("; DDTREE verify width 25 = budget 24 + 1; worker class not checked: "
                                           "fakepkg.release is excluded here (smoke.import_exclude)")


HYBRID_SAID = ("hybrid Qwen3NextConfig (gdn): recurrent tree path on (speculative_eagle_topk 8 > 1), accepted "
               "node's state committed by fakepkg.release.commit")


@pytest.mark.parametrize("mode, detail", [
    ("tree", "1 modules imported; DDTREE verify width 25 = budget 24 + 1; DDTREE -> TreeWorker "
             "(DDTREE_TREE_VERIFY = True); " + HYBRID_SAID),
    ("hybrid-topk1", "DDTREE probe on the tiny hybrid target (Qwen3-Next: GDN layers): speculative_eagle_topk "
                     "resolved to 1, so the hybrid backend's recurrent tree path is off and a tree would be "
                     "verified as a chain"),
    ("hybrid-no-hook", "DDTREE probe on the tiny hybrid target (Qwen3-Next: GDN layers): fakepkg.release.commit "
                       "is not in this release: the accepted node's recurrent state would not be committed"),
    # Top-K 1 (the tree is a chain): no tree path needed, said so.
    ("hybrid-chain", "1 modules imported; DDTREE verify width 25 = budget 24 + 1; DDTREE -> TreeWorker "
                     "(DDTREE_TREE_VERIFY = True); hybrid Qwen3NextConfig (gdn): top-K 1: the tree is a chain, "
                     "served by the recurrent chain path, accepted node's state committed by "
                     "fakepkg.release.commit"),
])
def test_tree_probe_of_a_family_serving_hybrid_targets(fake_pkg, mode, detail):
    probe = fake_tree_probe(hybrid_report=("fakepkg.release", "describe"))
    ok, level = run_tree_probe(fake_pkg, mode, probe)
    assert level["detail"] == detail and ok == (mode in ("tree", "hybrid-chain")), level
    if ok:  # the tiny hybrid config was written on the host and resolved
        assert level["evidence"]["tree"]["hybrid"]["argv"][1].endswith("/hybrid_model")


def test_cli_validation_resolves_through_the_release_path(fake_pkg):
    tmp, env = fake_pkg
    (tmp / "site/fakepkg/release.py").write_text(FAKE_RELEASE)
    draft = tmp / "draft"
    draft.mkdir()
    (draft / "config.json").write_text('{"block_size": 16}')
    argv = ["--model-path", str(tmp), "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", str(draft), "--budget", "20"]
    validate = {"module": "fakepkg.release", "function": "prepare", "argv": argv, "needs_paths": [str(tmp)],
                "report": ["speculative_num_draft_tokens", "speculative_ddtree_budget"],
                "plugins": FAKE_PATHS["plugins"], "resolve": "resolve_once", "view": FAKE_PATHS["view"],
                "width": {"field": "speculative_num_draft_tokens", "budget": None,
                          "budget_field": "speculative_ddtree_budget", "budget_flag": "--budget"}}
    answer = run_agent(cli_request([], validate), env)
    assert answer["ok"], answer
    assert answer["levels"][0]["detail"].endswith("prepare accepts the launch arguments; verify width 21 = "
                                                  "budget 20 + 1")
    answer = run_agent(cli_request([], validate), dict(env, FAKE_MODE="chain-width"))
    assert answer["levels"][0]["detail"] == ("the launch arguments resolve speculative_num_draft_tokens to 16, "
                                             "expected 21 (--budget 20 + 1): DDTREE would not verify its tree")
    # A family serving hybrid targets reports the host's model: nothing for a pure-attention one,
    # the recurrent tree path for a hybrid one, and a failure when that path is off.
    validate["hybrid_report"] = ["fakepkg.release", "describe"]
    answer = run_agent(cli_request([], validate), env)
    assert answer["levels"][0]["detail"].endswith("verify width 21 = budget 20 + 1"), answer
    hybrid = tmp / "hybrid-model"
    hybrid.mkdir()
    validate = dict(validate, argv=[str(hybrid) if a == str(tmp) else a for a in argv],
                    needs_paths=[str(hybrid)])
    answer = run_agent(cli_request([], validate), env)
    assert answer["levels"][0]["detail"].endswith("verify width 21 = budget 20 + 1; " + HYBRID_SAID), answer
    answer = run_agent(cli_request([], validate), dict(env, FAKE_MODE="hybrid-topk1"))
    assert answer["levels"][0]["detail"] == (
        "the launch arguments: speculative_eagle_topk resolved to 1, so the hybrid backend's recurrent tree "
        "path is off and a tree would be verified as a chain")
