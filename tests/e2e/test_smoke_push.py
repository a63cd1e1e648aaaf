"""`ddtree-deploy push` runs the host's smoke levels after its switch and rolls back by
itself when one fails (`--no-rollback` keeps the new files). Through the CLI, on a
local-transport host whose Python has the real SGLang 0.5.12.post1 files and imports them
(CPU dependencies shared from the project venv: ddtree_deploy/sandbox/hostenv.py).

The series is the real one plus one new module whose import fails: `check` is clean (it
compiles), so only the smoke can catch it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app

from ddtree_deploy.sandbox import hostenv as sglang_host

pytestmark = pytest.mark.sglang_env

REPO = Path(__file__).resolve().parent.parent.parent
BROKEN = "sglang/srt/speculative/ddtree_broken.py"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    root = tmp_path_factory.mktemp("push-smoke")
    env = sglang_host.make_host_env(root / "env")
    inv = root / "h1.toml"
    inv.write_text(f'transport = "local"\n[host]\npython = "{env.python}"\nstate_dir = "{root / "state"}"\n'
                   '[smoke]\nlevels = ["compile", "import"]\n'
                   '# No CUDA here: sgl_kernel (imported by dflash_worker and the scheduler) is a CUDA build.\n'
                   'import_exclude = ["sglang.srt.speculative.dflash_worker", "sglang.srt.managers.scheduler"]\n')
    family = root / "patches" / "sglang-0.5.12"
    shutil.copytree(REPO / "patches" / "sglang-0.5.12", family)
    shutil.copytree(REPO / "payload", root / "payload")
    (root / "payload" / "ddtree_broken.py").write_text("from sglang.srt.speculative.ddtree_missing import Tree\n")
    with open(family / "series", "a") as fh:
        fh.write(f"add payload/ddtree_broken.py {BROKEN}\n")
    return inv, env.site_packages, family


def push(monkeypatch, inv, family, *extra):
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(family.parent.parent / "snapshot"))
    result = CliRunner().invoke(app, ["push", "--host", str(inv), "--family", str(family), "--json", *extra])
    return result.exit_code, json.loads(result.stdout)["hosts"][0]


def pristine(site: Path, family: Path) -> bool:
    from ddtree_deploy.engine.series import AddEntry, load_family

    series = load_family(family)
    added = [e.dest for e in series.entries if isinstance(e, AddEntry)]  # new files: gone again
    paths = [p for p in series.touched_paths() if p not in added]
    wheel = sglang_host.pristine_files(sglang_host.BASELINE_RELEASE, paths)
    return (all(hashlib.sha256((site / p).read_bytes()).digest() == hashlib.sha256(wheel[p]).digest()
                for p in paths)
            and BROKEN in added and not any((site / p).exists() for p in added))


def test_failed_smoke_rolls_back_then_no_rollback_keeps(monkeypatch, host):
    inv, site, family = host
    code, doc = push(monkeypatch, inv, family)
    assert code == 1 and doc["ok"] is False
    assert [(l["level"], l["status"]) for l in doc["smoke"]["levels"]] == [("compile", "passed"), ("import", "failed")]
    assert doc["smoke"]["levels"][1]["detail"].startswith(
        "import sglang.srt.speculative.ddtree_broken failed: ModuleNotFoundError")
    assert doc["auto_rollback"]["done"] is True
    assert doc["auto_rollback"]["outcome"]["backup_id"] == doc["backup_id"]
    assert pristine(site, family)  # every file back to the wheel's bytes, the new ones gone

    code, doc = push(monkeypatch, inv, family, "--no-rollback")
    assert code == 1 and doc["auto_rollback"] == {"done": False, "outcome": None, "error": None,
                                                  "kept_new_files": True}
    assert (site / BROKEN).exists()  # kept for debugging


def test_a_rerun_on_a_switched_host_smokes_again_and_rolls_back(monkeypatch, host):
    """The --no-rollback push above left the host `switched` (the journal names the failed
    level); status explains it; pushing the same series again switches nothing, runs the
    smoke again, and its failure rolls back as after a fresh push."""
    inv, site, family = host
    status = CliRunner().invoke(app, ["status", "--host", str(inv), "--family", str(family), "--json"])
    doc = json.loads(status.stdout)["hosts"][0]
    assert doc["phase"] == "switched", doc
    assert "the smoke has not passed (it failed at import)" in doc["explanation"]
    assert f"`ddtree-deploy rollback --host {doc['host']}`" in doc["explanation"]

    code, doc = push(monkeypatch, inv, family)
    assert code == 1 and doc["changed"] is False and doc["smoke_pending"]
    assert [(l["level"], l["status"]) for l in doc["smoke"]["levels"]] == [("compile", "passed"), ("import", "failed")]
    assert doc["auto_rollback"]["done"] is True and doc["phase"] == "rolled-back"
    assert pristine(site, family)
    journal = json.loads((inv.parent / "state" / "journal.json").read_text())
    assert journal["phase"] == "rolled-back" and journal["run_id"] == doc["auto_rollback"]["outcome"]["run_id"]


def test_the_smoke_runs_while_the_journal_says_switched(monkeypatch, host, tmp_path):
    """Observed from inside the smoke: a module whose import reads the host's journal and
    fails with its phase. Between the switch and the smoke the phase is `switched`."""
    inv, site, family = host
    phased = tmp_path / "patches" / "sglang-0.5.12"
    shutil.copytree(REPO / "patches" / "sglang-0.5.12", phased)
    shutil.copytree(REPO / "payload", tmp_path / "payload")
    journal = inv.parent / "state" / "journal.json"
    (tmp_path / "payload" / "ddtree_phase.py").write_text(
        f"import json\nwith open({str(journal)!r}) as f:\n    phase = json.load(f)['phase']\n"
        "raise ImportError('journal phase during the smoke: ' + phase)\n")
    module = "sglang/srt/speculative/ddtree_phase.py"
    with open(phased / "series", "a") as fh:
        fh.write(f"add payload/ddtree_phase.py {module}\n")
    code, doc = push(monkeypatch, inv, phased)
    assert code == 1 and doc["changed"], doc
    failed = doc["smoke"]["levels"][1]
    assert failed["status"] == "failed" and "journal phase during the smoke: switched" in failed["detail"], failed
    assert doc["auto_rollback"]["done"] is True and not (site / module).exists() and pristine(site, family)
