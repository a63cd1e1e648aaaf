"""The smoke after a real push, over a real sshd on loopback, on a host whose Python has
the real SGLang 0.5.12.post1 files (and the CPU dependencies its imports need, shared
from the project venv: ddtree_deploy/sandbox/hostenv.py).

- compile, import and cli run for real after a real push of the real DDTree series;
- a broken series fails the smoke and the host is rolled back to pristine, verified by
  sha256 against the release wheel's own bytes;
- the launch level runs over SSH against ddtree_testkit/standin_server.py, a STAND-IN for the
  SGLang server (no GPU here), and leaves no process behind.

The import level skips ``sglang.srt.speculative.dflash_worker`` (and the scheduler, which the
series also patches) through the inventory's ``import_exclude``: on a machine without CUDA
they cannot import (sgl_kernel is a CUDA build); that is said in the inventory and in the
report, and the tree probe then checks the verify width only (tests/e2e/test_smoke_tree.py
resolves the worker class too, with a named kernel stand-in).
"""

from __future__ import annotations

import hashlib
import shutil
import textwrap
from pathlib import Path

import pytest

from ddtree_deploy.engine.series import load_family
from ddtree_deploy.fleets import rollout
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.session import push, status
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.session.plan import Desired, Target
from ddtree_deploy.settings.inventory import load_host

from ddtree_deploy.sandbox import SandboxHost, free_port, hostenv as sglang_host
from ddtree_testkit import STANDIN_SERVER

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
MODELS = REPO / "tests" / "data" / "models"
STANDIN = STANDIN_SERVER


def smoke_table(levels, launch_extra=""):
    return textwrap.dedent(f"""
        [smoke]
        levels = {levels!r}
        # No CUDA here: sgl_kernel (imported by dflash_worker and the scheduler) is a CUDA build.
        import_exclude = ["sglang.srt.speculative.dflash_worker", "sglang.srt.managers.scheduler"]

        [smoke.launch]
        model = "{MODELS / 'tiny-llama'}"
        draft_model = "{MODELS / 'tiny-dflash-draft'}"
        budget = 20
        # CPU host: SGLang's defaults would pick CUDA and a torch_native attention backend.
        extra_args = ["--device", "cpu", "--attention-backend", "triton", "--skip-tokenizer-init"]
        gpu = false   # STAND-IN host: no GPU, so no nvidia-smi check
        ready_timeout_s = 20
        term_grace_s = 3
    """).replace("'", '"') + launch_extra


def make_host(sshd, root: Path, name: str, levels, launch_extra="") -> tuple[SandboxHost, object]:
    env = sglang_host.make_host_env(root / "env")
    test_host = SandboxHost(name=name, server=sshd, python=env.python, site=env.site_packages,
                         state_dir=root / "state")
    path = test_host.inventory(root / "hosts")
    with open(path, "a") as fh:
        fh.write(smoke_table(levels, launch_extra))
    return test_host, load_host(str(path))


def sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def assert_pristine(test_host: SandboxHost, paths) -> None:
    wheel = sglang_host.pristine_files(sglang_host.BASELINE_RELEASE, [p for p in paths
                                                                      if test_host.read(p) is not None])
    for path in paths:
        # sha256 of what is on the host == sha256 of the release's own bytes (absent if new).
        assert sha(test_host.read(path)) == sha(wheel.get(path)), path


def push_and_smoke(host, series, desire=None, **kwargs):
    paths = list(series.touched_paths())
    desire = desire or (lambda facts: desired_for(series, host.name, facts))
    outcome = push.push(host, transport_for(host), paths, desire)
    assert outcome.changed
    return outcome, rollout.after_push(host, lambda: transport_for(host), outcome, series, **kwargs)


def test_real_series_passes_compile_import_cli(sshd, tmp_path):
    test_host, host = make_host(sshd, tmp_path, "h-ok", ["compile", "import", "cli"])
    series = load_family(FAMILY, payload_dir=REPO / "payload")
    outcome, after = push_and_smoke(host, series, log_dir=tmp_path / "logs")
    report = after.report
    assert after.ok and after.rollback is None, report.lines()
    assert [(r.level, r.status) for r in report.levels] == [("compile", "passed"), ("import", "passed"),
                                                            ("cli", "passed")]
    compiled = report.levels[0].evidence
    assert compiled["root"] == str(test_host.site) and compiled["files"] == len(series.touched_paths())
    imported = report.levels[1].evidence
    assert "sglang.srt.speculative.dflash_worker" in imported["excluded"]
    assert imported["files"]["sglang.srt.speculative.spec_info"] == str(
        test_host.site / "sglang/srt/speculative/spec_info.py")
    # The tree probe ran through the real ServerArgs; the worker class is not resolved on a host
    # that cannot import its module, and the report says so (tests/e2e/test_smoke_tree.py resolves it).
    assert ("; DDTREE verify width 25 = budget 24 + 1; worker class not checked: "
            "sglang.srt.speculative.dflash_worker is excluded here (smoke.import_exclude)") in report.levels[1].detail
    cli = report.levels[2].evidence
    assert "--speculative-ddtree-budget" in cli["flags"]
    # ServerArgs really validated DDTREE for the tiny model: the budget sets the verify width.
    fields = cli["validation"]["fields"]
    assert fields["speculative_algorithm"] == "DDTREE" and fields["speculative_ddtree_budget"] == 20
    assert fields["speculative_num_draft_tokens"] == 21 and report.levels[2].detail.endswith(
        "verify width 21 = budget 20 + 1")
    # The host is still deployed (nothing rolled back) and `smoke` alone agrees.
    assert status.status(host, transport_for(host))["phase"] == "deployed"
    again = rollout.smoke_host(host, lambda: transport_for(host), levels=["compile"], patches_dir=FAMILY.parent)
    assert again.ok and again.levels[0].evidence["files"] == len(series.touched_paths())

    # The launch level over SSH, against the STAND-IN server (no GPU here).
    pid_file = tmp_path / "pids"
    port = free_port()
    test_host2, host2 = make_host(sshd, tmp_path / "h2", "h-launch", ["launch"], launch_extra=textwrap.dedent(f"""
        port = {port}
        command = ["{{python}}", "{STANDIN}", "--child", "--pid-file", "{pid_file}", "--model-path", "{{model}}",
                   "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{{draft_model}}",
                   "--speculative-ddtree-budget", "{{budget}}", "--port", "{{port}}", "{{extra_args}}"]
    """))
    outcome2, launched = push_and_smoke(host2, series, log_dir=tmp_path / "logs")
    assert launched.ok, launched.report.lines()
    ev = launched.report.levels[0].evidence
    assert ev["speculative_algorithm"] == "DDTREE" and ev["accept_length"] > 1
    # The stand-in's report, judged: the family's worker class, width budget + 1, off-chain accepts.
    assert ev["tree"]["verify_width"] == 21 and ev["tree"]["worker_class"] == "DFlashWorker"
    assert ev["tree"]["offchain_accepts"] >= 1
    assert ev["argv"][-7:] == ["--port", str(port), "--device", "cpu", "--attention-backend", "triton",
                               "--skip-tokenizer-init"]
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and not any(Path(f"/proc/{p}").exists() and _running(p) for p in pids)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def broken_family(tmp_path: Path) -> Path:
    """The real series plus one new module whose import fails: `check` is clean (it compiles)."""
    folder = tmp_path / "family"
    shutil.copytree(FAMILY, folder)
    payload = tmp_path / "payload"
    shutil.copytree(REPO / "payload", payload)
    (payload / "ddtree_broken.py").write_text("from sglang.srt.speculative.ddtree_missing import Tree\n")
    with open(folder / "series", "a") as fh:
        fh.write("add payload/ddtree_broken.py sglang/srt/speculative/ddtree_broken.py\n")
    return folder


def test_import_error_fails_smoke_and_rolls_back_to_pristine(sshd, tmp_path):
    test_host, host = make_host(sshd, tmp_path, "h-imp", ["compile", "import", "cli"])
    series = load_family(broken_family(tmp_path), payload_dir=tmp_path / "payload")
    outcome, after = push_and_smoke(host, series, log_dir=tmp_path / "logs")
    assert not after.ok
    assert [r.status for r in after.report.levels] == ["passed", "failed", "skipped"]
    assert after.report.failed.detail.startswith(
        "import sglang.srt.speculative.ddtree_broken failed: ModuleNotFoundError")
    assert after.rollback is not None and after.rollback.backup_id == outcome.backup_id
    assert any("rolled back automatically" in line for line in after.lines())
    assert_pristine(test_host, series.touched_paths())
    assert test_host.read("sglang/srt/speculative/ddtree_broken.py") is None
    assert status.status(host, transport_for(host))["phase"] == "rolled-back"


def test_syntax_error_fails_compile_and_rolls_back_unless_told_not_to(sshd, tmp_path):
    """FAULT INJECTION: the check is bypassed with a hand-made Desired, standing for a host
    interpreter that rejects what the controller's accepted (e.g. an older Python). The
    push, the smoke and the rollback are all real."""
    test_host, host = make_host(sshd, tmp_path, "h-syn", ["compile", "import"])
    series = load_family(FAMILY, payload_dir=REPO / "payload")
    paths = list(series.touched_paths())

    def broken_desire(facts):
        good = desired_for(series, host.name, facts)
        bad = b"def broken(:\n    pass\n"
        targets = tuple(Target(t.path, t.pristine, sha(bad), bad, t.mode) if t.path.endswith("spec_info.py")
                        else t for t in good.targets)
        return Desired(good.series, good.series_id, good.sglang_version, good.snapshot, targets)

    # --no-rollback keeps the broken files for debugging.
    outcome, kept = push_and_smoke(host, series, broken_desire, auto_rollback=False)
    assert kept.kept and kept.rollback is None
    assert kept.report.failed.level == "compile"
    assert kept.report.failed.detail == f"{test_host.site}/sglang/srt/speculative/spec_info.py:1: invalid syntax"
    assert test_host.read("sglang/srt/speculative/spec_info.py") == b"def broken(:\n    pass\n"
    assert kept.to_json()["auto_rollback"]["kept_new_files"] is True
    push.rollback(host, transport_for(host))
    assert_pristine(test_host, paths)

    outcome, after = push_and_smoke(host, series, broken_desire)
    assert after.rollback is not None and not after.ok
    assert after.to_json()["auto_rollback"]["done"] is True
    assert_pristine(test_host, paths)
