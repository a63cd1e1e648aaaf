"""`ddtree-deploy tune` end to end: a real sshd on loopback, a host Python with the real
SGLang 0.5.12.post1 release and the real DDTree series pushed, and SGLang's OWN
``python -m sglang.bench_serving`` from that release driving the load.

The server is tests/standin_tune_server.py, a STAND-IN for SGLang's server (no GPU here):
its throughput and accept length follow the synthetic model documented there, so the
sweep's choice is known in advance. The tokenizer bench_serving loads is a real
``transformers`` fast tokenizer built here (a word-level vocabulary; no download).

Each bench_serving run starts SGLang's interpreter (torch and transformers imports: 10-20
s on two shared cores), so the grids here are small.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_deploy import deploy
from ddtree_deploy.desired import desired_for
from ddtree_deploy.inventory import load_host
from ddtree_deploy.series import load_family
from ddtree_deploy.transport import transport_for

import sglang_host
from sshd_host import SSHServer, free_port
from sshd_host import TestHost as SandboxHost  # aliased: pytest would try to collect a Test* class

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]

REPO = Path(__file__).resolve().parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
STANDIN = REPO / "tests" / "standin_tune_server.py"
CLI = [sys.executable, "-m", "ddtree_deploy"]


def make_model(dest: Path) -> Path:
    """A model folder bench_serving can load a tokenizer from: a real fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "tok": 3}
    vocab.update({f"w{i}": 4 + i for i in range(300)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(dest))
    shutil.copy(REPO / "tests" / "data" / "models" / "tiny-llama" / "config.json", dest / "config.json")
    return dest


def launch_table(model: Path, port: int, extra: list[str]) -> str:
    command = ["{python}", str(STANDIN), "--model-path", "{model}", "--speculative-algorithm", "DDTREE",
               "--speculative-draft-model-path", "{draft_model}", "--speculative-ddtree-budget", "{budget}",
               "--speculative-ddtree-topk", "{topk}", "--host", "{host}", "--port", "{port}", "{extra_args}"]
    return textwrap.dedent(f"""

        [smoke]
        levels = ["compile"]

        # The launch settings tune uses. STAND-IN server (no GPU here): see tests/standin_tune_server.py.
        [smoke.launch]
        model = {json.dumps(str(model))}   # the model folder (a tokenizer only)
        draft_model = {json.dumps(str(model))}
        budget = 64   # what the host runs today
        port = {port}
        command = {json.dumps(command)}
        extra_args = {json.dumps(extra)}
        gpu = false   # STAND-IN host: no nvidia-smi check
        ready_timeout_s = 30
        term_grace_s = 3
    """)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with SSHServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def tuned_host(sshd, tmp_path_factory):
    """One host with the real release and the real series deployed (pushed for real)."""
    root = tmp_path_factory.mktemp("tunehost")
    env = sglang_host.make_host_env(root / "env")
    test_host = SandboxHost(name="gpu1", server=sshd, python=env.python, site=env.site_packages,
                            state_dir=root / "state")
    inventory = test_host.inventory(root / "hosts")
    base = inventory.read_text()
    host = load_host(str(inventory))
    series = load_family(FAMILY)
    outcome = deploy.push(host, transport_for(host), list(series.touched_paths()),
                          lambda facts: desired_for(series, host.name, facts))
    assert outcome.changed and outcome.phase == "deployed"
    model = make_model(root / "model")
    return {"root": root, "inventory": inventory, "base": base, "model": model, "test_host": test_host}


def write_inventory(h: dict, extra: list[str], port: int | None = None) -> tuple[Path, int]:
    port = port or free_port()
    h["inventory"].write_text(h["base"] + launch_table(h["model"], port, extra))
    return h["inventory"], port


def run_cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def pids(pid_file: Path) -> list[int]:
    return [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sweep_chooses_the_model_optimum_records_an_oom_and_applies(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    # Budget 32 "does not fit": the stand-in exits at start with CUDA's OOM message.
    inventory, port = write_inventory(h, ["--oom-budget", "32", "--pid-file", str(pid_file)])
    original = inventory.read_text()
    out = tmp_path / "out"
    started = time.monotonic()
    proc = run_cli(["tune", "--host", str(inventory), "--baseline", "dflash,none", "--budgets", "2,8,32",
                    "--topk", "2", "--concurrency", "4", "--requests", "8", "--input-len", "16",
                    "--output-len", "32", "--out", str(out), "--apply", "--json"])
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    runs = [(r["config"], r["stage"], r["status"]) for r in doc["runs"]]
    # Baselines, coarse budgets (2 and 32: every other budget, ends kept), refine next to
    # the best (8), then the noise repeats of the best two and the dflash baseline.
    assert runs == [("dflash", "baseline", "ok"), ("none", "baseline", "ok"),
                    ("ddtree-b2-k2", "coarse", "ok"), ("ddtree-b32-k2", "coarse", "failed"),
                    ("ddtree-b8-k2", "refine", "ok"),
                    ("ddtree-b8-k2", "repeat", "ok"), ("ddtree-b2-k2", "repeat", "ok"),
                    ("dflash", "repeat", "ok")], runs
    failed = doc["runs"][3]
    assert failed["error"].startswith("OOM: the server exited with code 1 before it was ready"), failed
    choice = doc["choice"]
    # The model: B=8 K=2 ~ +19% over the DFlash chain, ~+30% over B=2 (tests/standin_tune_server.py).
    assert (choice["best"], choice["budget"], choice["topk"]) == ("ddtree-b8-k2", 8, 2)
    assert choice["gain_pct"] > 5 and choice["second"] == "ddtree-b2-k2"
    assert choice["noise_pct"] is not None and set(choice["noise_runs"]) == {"ddtree-b8-k2", "ddtree-b2-k2", "dflash"}
    ranked = [row["config"] for row in doc["ranking"]["4"]]
    assert ranked[0] == "ddtree-b8-k2" and ranked[-1] == "ddtree-b32-k2"
    top = doc["ranking"]["4"][0]
    assert top["ratio"]["dflash"] > 1.05 and top["ratio"]["none"] > top["ratio"]["dflash"]
    for key in ("output_tps", "request_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        assert top[key] > 0, key
    # Mean accept length from /server_info (the model: B=8 K=2 -> 2.77; sampled).
    assert 2.0 < top["accept_length"] < 3.5
    # Results file: header, then one line per finished configuration, in order.
    lines = (out / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header" and len(lines) == 1 + len(runs)
    png = (out / "tune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # --apply: budget and topk written, everything else of the file kept byte for byte.
    assert doc["apply"]["written"] and "+budget = 8" in doc["apply"]["diff"]
    after = inventory.read_text()
    assert after == original.replace("budget = 64   # what the host runs today",
                                     "budget = 8   # what the host runs today").rstrip("\n") + "\ntopk = 2\n" \
        or after == original.replace("budget = 64   # what the host runs today",
                                     "budget = 8   # what the host runs today").replace(
                                         "term_grace_s = 3\n", "term_grace_s = 3\ntopk = 2\n")
    assert "--apply:" in proc.stderr and "-budget = 64" in proc.stderr
    # Nothing left running; the tune lock released; only tune/ added to the state dir.
    for pid in pids(pid_file):
        assert not alive(pid), pid
    state = h["test_host"].state_dir
    assert not (state / "tune" / "lock").exists()
    print(f"\ntune sweep: {len(runs)} launches in {seconds:.0f} s")
