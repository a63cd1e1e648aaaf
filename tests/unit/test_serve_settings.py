"""The inventory's [serve] table (settings/serve.py) and what is asked of the host's serve
program (serve/plan.py): pure, no host. Every bad value is one line naming the file, the
line and the key (toml_input's format), exit 2 before any connection."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli import app
from ddtree_deploy.serve import plan as serve_plan
from ddtree_deploy.settings.inventory import parse_host
from ddtree_deploy.settings.serve import ServeSettings, parse_serve
from ddtree_deploy.settings.smoke import FamilySmoke
from ddtree_deploy.smoke.plan import TREE_PROMPTS

BASE = '[ssh]\nhost = "gpu1"\n\n[host]\npython = "/opt/venv/bin/python"\n\n[serve]\n'
GOOD = 'restart = ["sudo", "-n", "systemctl", "restart", "sglang"]\nurl = "http://127.0.0.1:30000"\n'


def settings(body: str) -> ServeSettings | None:
    host = parse_host(BASE + body, name="gpu1", source="hosts/gpu1.toml")
    return parse_serve(host.serve, source=host.source)


def test_defaults_and_every_key():
    s = settings(GOOD)
    assert s.restart == ("sudo", "-n", "systemctl", "restart", "sglang") and s.url == "http://127.0.0.1:30000"
    assert (s.health_url, s.ready_timeout_s, s.restart_timeout_s, s.poll_s, s.proof, s.budget, s.drain) == \
        ("http://127.0.0.1:30000/health_generate", 600.0, 300.0, 2.0, "tree", None, None)
    s = settings(GOOD.replace(":30000", ":30000/") + 'health_path = "/health"\nready_timeout_s = 90\n'
                 'restart_timeout_s = 30\npoll_s = 0.5\nproof = "width"\nbudget = 64\nprobe_timeout_s = 60\n'
                 'drain = ["/opt/lb/drain", "gpu1"]\ndrain_wait_s = 0\ndrain_timeout_s = 10\n')
    assert (s.url, s.health_url, s.ready_timeout_s, s.restart_timeout_s, s.poll_s, s.proof, s.budget) == \
        ("http://127.0.0.1:30000", "http://127.0.0.1:30000/health", 90.0, 30.0, 0.5, "width", 64)
    assert s.drain == ("/opt/lb/drain", "gpu1") and (s.drain_wait_s, s.drain_timeout_s) == (0.0, 10.0)
    assert parse_serve(parse_host(BASE.replace("\n[serve]\n", ""), name="gpu1", source="x").serve,
                       source="x") is None


@pytest.mark.parametrize("body, message", [
    ("", "line 7: serve: is empty; add restart ="),
    ('url = "http://127.0.0.1:30000"\n', "line 7: serve.restart: missing (required)"),
    ('restart = "systemctl restart sglang"\nurl = "http://h:1"\n',
     "line 8: serve.restart: must be a list of arguments, not the string 'systemctl restart sglang' (it is run "
     "without a shell, so nothing would split it)"),
    ('restart = []\nurl = "http://h:1"\n', "line 8: serve.restart: must not be empty"),
    ('restart = ["systemctl", ""]\nurl = "http://h:1"\n', "line 8: serve.restart: must be a list of non-empty strings"),
    ('restart = ["systemctl", 3]\nurl = "http://h:1"\n', "line 8: serve.restart: must be a list of non-empty strings"),
    ('restart = ["a\\nb"]\nurl = "http://h:1"\n', "line 8: serve.restart: an argument holds a newline"),
    ('restart = ["x"]\n', "line 7: serve.url: missing (required)"),
    ('restart = ["x"]\nurl = "127.0.0.1:30000"\n', "line 9: serve.url: '127.0.0.1:30000' is not an http:// or https:// URL"),
    ('restart = ["x"]\nurl = "ftp://h:1"\n', "is not an http:// or https:// URL with a host"),
    ('restart = ["x"]\nurl = "http://h:1/health_generate"\n', "has a path, query or user part"),
    ('restart = ["x"]\nurl = "http://h:99999"\n', "is not a URL (Port out of range"),
    ('restart = ["x"]\nurl = "http://h:1 ;rm"\n', "holds spaces or control characters"),
    # A host name the host's HTTP client could never use: refused here, before any connection,
    # in a bounded line (issue 28: a 1 MB name aborted the serve program mid-restart).
    ('restart = ["x"]\nurl = "http://' + "a" * (1 << 20) + ':30000"\n',
     "line 9: serve.url: 'http://" + "a" * 53 + "'... (1048589 characters) is longer than 2048 characters"),
    ('restart = ["x"]\nurl = "http://' + "a" * 64 + '.example.org:1"\n', "is not a host name or IP address"),
    ('restart = ["x"]\nurl = "http://a..b:1"\n', "'a..b' is not a host name or IP address"),
    (GOOD + 'health_path = "health"\n', "line 10: serve.health_path: must be a path starting with '/'"),
    (GOOD + "ready_timeout_s = 0\n", "line 10: serve.ready_timeout_s: must be a number of seconds from more than 0"),
    (GOOD + "ready_timeout_s = inf\n", "serve.ready_timeout_s: must be a number of seconds"),
    (GOOD + "ready_timeout_s = nan\n", "serve.ready_timeout_s: must be a number of seconds"),
    (GOOD + "poll_s = 1e12\n", "serve.poll_s: must be a number of seconds from more than 0 to 86400"),
    (GOOD + 'restart_timeout_s = "30"\n', "serve.restart_timeout_s: must be a number of seconds"),
    (GOOD + 'proof = "full"\n', "line 10: serve.proof: must be one of 'tree', 'width', not 'full'"),
    (GOOD + "budget = 0\n", "line 10: serve.budget: must be an integer from 1 to 1024, not 0"),
    (GOOD + "drain_wait_s = 3\n", "line 10: serve.drain_wait_s: set without a drain command"),
    (GOOD + 'drain = "lb off"\n', "serve.drain: must be a list of arguments"),
    (GOOD + "restart_after = 1\n", "line 10: serve.restart_after: unknown key (known keys here: budget, drain"),
])
def test_bad_serve_values_are_one_line_naming_file_line_and_key(body, message):
    with pytest.raises(BadInput) as info:
        settings(body)
    text = info.value.message
    assert text.startswith("hosts/gpu1.toml: ") and message in text and "\n" not in text, text[:500]
    assert len(text) < 600, text[:500]


def test_a_serve_that_is_not_a_table():
    with pytest.raises(BadInput, match="serve: must be a table"):
        parse_host('serve = 3\n[host]\npython = "/p"\n[ssh]\nhost = "h"\n', name="h", source="h.toml")


@pytest.mark.parametrize("command", [["push"], ["rollback"], ["status"], ["restart"], ["push", "--dry-run"]])
def test_a_bad_serve_table_stops_every_command_before_any_connection(tmp_path, command):
    inv = tmp_path / "gpu1.toml"
    # The port is closed: a connection attempt would be exit 1, not 2.
    inv.write_text(BASE.replace('host = "gpu1"', 'host = "127.0.0.1"\nport = 1') + GOOD + "budget = -1\n")
    r = CliRunner().invoke(app, [*command, "--host", str(inv)])
    assert r.exit_code == 2, r.output
    assert "serve.budget: must be an integer from 1 to 1024, not -1" in r.stderr
    assert "connect" not in r.stderr


def test_restart_without_a_serve_table_says_what_to_add(tmp_path):
    inv = tmp_path / "gpu1.toml"
    inv.write_text(BASE.replace("\n[serve]\n", ""))
    r = CliRunner().invoke(app, ["restart", "--host", str(inv), "--json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["error"]["code"] == "bad-input" and "no [serve] table" in doc["error"]["message"]
    assert "restart =" in doc["error"]["hint"]


# ---------------------------------------------------------------- serve_plan


def test_restart_request_is_the_inventory_argv_as_written():
    s = settings(GOOD + 'drain = ["/opt/lb/drain", "--host", "gpu 1; rm -rf /"]\ndrain_wait_s = 5\nbudget = 32\n')
    fam = FamilySmoke(worker_class="DDTreeWorkerV2", budget_field="speculative_ddtree_budget")
    req = serve_plan.restart_request("/opt/venv/bin/python", ["sglang/a.py"], s, proof=serve_plan.proof_spec(s, fam))
    assert req["restart"] == {"argv": ["sudo", "-n", "systemctl", "restart", "sglang"], "timeout_s": 300.0}
    assert req["drain"] == {"argv": ["/opt/lb/drain", "--host", "gpu 1; rm -rf /"], "timeout_s": 120.0, "wait_s": 5.0}
    assert req["health"] == {"url": "http://127.0.0.1:30000/health_generate", "timeout_s": 10.0}
    assert (req["op"], req["python"], req["files"], req["url"]) == (
        "restart", "/opt/venv/bin/python", ["sglang/a.py"], "http://127.0.0.1:30000")
    proof = req["proof"]
    assert proof["expect_algorithm"] == "DDTREE" and proof["probe"]["max_new_tokens"] == 32
    assert proof["tree"] == {"budget": 32, "budget_field": "speculative_ddtree_budget", "worker_class": "DDTreeWorkerV2",
                             "prompts": list(TREE_PROMPTS), "max_new_tokens": 256}
    width = serve_plan.proof_spec(settings(GOOD + 'proof = "width"\n'))
    assert width["probe"] is None and width["tree"]["prompts"] == []
    # The controller's deadline covers every wait the host program has, plus slack.
    assert serve_plan.restart_deadline(req) == 60 + 60 + 300 + 120 + 5 + 600 + 2 + 10 + 2 * 300 + 60
    assert serve_plan.restart_deadline(dict(req, proof=None, drain=None)) == 60 + 60 + 300 + 600 + 2 + 10


def test_serving_states_and_sentences():
    procs = [{"pid": 11, "started_iso": "T1", "before_files": True, "cmdline": ["/v/python", "-m", "sglang.launch_server"],
              "children": [12, 13]},
             {"pid": 20, "started_iso": "T2", "before_files": False, "cmdline": ["/v/python"], "children": []}]
    answer = {"python": "/v/python", "package_root": "/v/site", "files_changed_iso": "T0", "processes": procs,
              "health": {"url": "http://h:1/health_generate", "status": 200}}
    s = serve_plan.serving(answer, "gpu1", serve=True)
    assert s["state"] == "stale"
    assert s["explanation"] == ("serving code older than the files: pid 11 started before the last switch (T0); "
                                "taken as older by the times alone: the history's switches were not read: run "
                                "`ddtree-deploy restart --host gpu1`; health http://h:1/health_generate: 200")
    assert [p["decided_by"] for p in s["processes"]] == ["time", "time"]
    assert "add a [serve] table" in serve_plan.serving(answer, "gpu1")["explanation"]
    s = serve_plan.serving(dict(answer, processes=procs[1:], health=None), "gpu1")
    assert s["state"] == "current" and s["explanation"] == "pid 20 started after the last switch (T0): serving the " \
                                                           "current files"
    s = serve_plan.serving(dict(answer, processes=[], health={"url": "u", "status": None}))
    assert s["state"] == "none" and s["explanation"] == ("no SGLang server process found running /v/python or from "
                                                         "/v/site; health u: no answer")
    assert serve_plan.process_line(procs[0]) == ("pid 11 started T1 (BEFORE the last switch, 2 child process(es)): "
                                                 "/v/python -m sglang.launch_server")
