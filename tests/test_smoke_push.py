"""`ddtree-deploy push` runs the host's smoke levels after its switch and rolls back by
itself when one fails (`--no-rollback` keeps the new files). Through the CLI, on a
local-transport host whose Python has the real SGLang 0.5.12.post1 files and imports them
(CPU dependencies shared from the project venv: tests/sglang_host.py).

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

import sglang_host

pytestmark = pytest.mark.sglang_env

REPO = Path(__file__).resolve().parent.parent
BROKEN = "sglang/srt/speculative/ddtree_broken.py"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    root = tmp_path_factory.mktemp("push-smoke")
    env = sglang_host.make_host_env(root / "env")
    inv = root / "h1.toml"
    inv.write_text(f'transport = "local"\n[host]\npython = "{env.python}"\nstate_dir = "{root / "state"}"\n'
                   '[smoke]\nlevels = ["compile", "import"]\n'
                   '# No CUDA here: sgl_kernel (imported by dflash_worker) loads libnvrtc at import time.\n'
                   'import_exclude = ["sglang.srt.speculative.dflash_worker"]\n')
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
    from ddtree_deploy.series import load_family

    paths = [p for p in load_family(family).touched_paths() if p != BROKEN and "ddtree_utils" not in p]
    wheel = sglang_host.pristine_files(sglang_host.BASELINE_RELEASE, paths)
    return (all(hashlib.sha256((site / p).read_bytes()).digest() == hashlib.sha256(wheel[p]).digest()
                for p in paths)
            and not (site / BROKEN).exists() and not (site / "sglang/srt/speculative/ddtree_utils.py").exists())


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
