"""The tune tests' hosts over sshd, for tests/e2e/test_tune_ssh.py (0.5.12.post1), tests/integration/test_tune_deadline.py
and tests/e2e/test_tune_v2_family_ssh.py (0.5.23): one host per file, so that `--dist loadfile` runs
the two hosts' long sweeps on two workers at once.

A host Python with the real SGLang release and the real DDTree series pushed for real
(``tuned_host``: 0.5.12.post1 and the sglang-0.5.12 family; ``tuned_host_0_5_23``: 0.5.23 and
the v2 family), a model folder with a real ``transformers`` fast tokenizer built here (a
word-level vocabulary; no download), the inventory's launch table for the tune STAND-IN server
(ddtree_testkit/standin_tune_server.py: no GPU here), and the CLI helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_deploy.engine.series import load_family
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.sandbox import SandboxHost, free_port, hostenv as sglang_host
from ddtree_deploy.session import push
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.settings.inventory import load_host
from ddtree_testkit import STANDIN_TUNE_SERVER

REPO = Path(__file__).resolve().parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
STANDIN = STANDIN_TUNE_SERVER
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

        # The launch settings tune uses. STAND-IN server (no GPU here): see ddtree_testkit/standin_tune_server.py.
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
    outcome = push.push(host, transport_for(host), list(series.touched_paths()),
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


def tune_args(inventory: Path, out: Path, *extra: str) -> list[str]:
    return ["tune", "--host", str(inventory), "--baseline", "none", "--budgets", "16", "--topk", "2",
            "--concurrency", "2", "--requests", "4", "--input-len", "16", "--output-len", "16",
            "--repeats", "0", "--out", str(out), *extra]


def start_cli(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"}, start_new_session=True)


def proc_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


CHAT = ["w1 w2 w3 w4 w5 w6", "w10 w11 w12 w13", "w20 w21 w22 w23 w24", "w30 w31 w32", "w40 w41 w42 w43",
        "w50 w51 w52 w53 w54 w55"]
CODE = ["w299 w60 w61 w62", "w299 w70 w71 w72 w73", "w299 w80 w81", "w299 w90 w91 w92", "w299 w100 w101",
        "w299 w110 w111 w112"]


def prompt_file(path: Path) -> Path:
    """Two categories: chat (plain prompts and a chat) and code, whose prompts hold the word the
    stand-in's acceptance bonus names (``--accept-bonus w299=0.8``: code accepts more per step)."""
    lines = [json.dumps({"prompt": p, "category": "chat"}) for p in CHAT[:-1]]
    lines.append(json.dumps({"messages": [{"role": "system", "content": "w5 w6"},
                                          {"role": "user", "content": CHAT[-1]}], "category": "chat"}))
    lines += [json.dumps({"prompt": p, "category": "code"}) for p in CODE]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tuned_host_0_5_23(sshd, tmp_path_factory):
    """A host with the real 0.5.23 release and the real v2 series (sglang-0.5.20) pushed."""
    root = tmp_path_factory.mktemp("tunehost23")
    env = sglang_host.make_host_env(root / "env", version="0.5.23")
    test_host = SandboxHost(name="gpu23", server=sshd, python=env.python, site=env.site_packages,
                            state_dir=root / "state")
    inventory = test_host.inventory(root / "hosts")
    host = load_host(str(inventory))
    series = load_family(REPO / "patches" / "sglang-0.5.20")
    outcome = push.push(host, transport_for(host), list(series.touched_paths()),
                          lambda facts: desired_for(series, host.name, facts))
    assert outcome.changed and outcome.phase == "deployed"
    return {"root": root, "inventory": inventory, "base": inventory.read_text(), "model": make_model(root / "model"),
            "test_host": test_host}
