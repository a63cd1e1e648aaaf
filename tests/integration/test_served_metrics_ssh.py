"""The served figures end to end: the serve program's ``metrics`` op over a real OpenSSH sshd on
loopback (ddtree_deploy.sandbox), the controller's parse, against a server run by a real
supervisord (ddtree_testkit/supervised.py).

The server is the named STAND-IN for SGLang (ddtree_testkit/standin_server.py with
``--enable-metrics``; no GPU here): it exports SGLang 0.5.12.post1's pinned metric names
(the sandbox host has that release's files) from the synthetic speed model of
ddtree_testkit/standin_metrics.py, driven by its own synthetic clients. The figures the
controller reads must be the model's: its accept length, its clients running, its tokens/s
(within the timing overhead of a loaded machine: sleeps only overshoot), and a SLOW BUILD
(the marker the stand-in reads from a deployed file at start) measurably slower by the
model's factor after a restart on those files.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.sandbox import free_port
from ddtree_deploy.serve import metrics_run
from ddtree_deploy.serve.figures import ServedFigures, Unavailable, figures_line
from ddtree_deploy.settings.inventory import load_host
from ddtree_testkit import STANDIN_SERVER
from ddtree_testkit.standin_metrics import Model, write_names
from ddtree_testkit.supervised import Supervised

from sshd_host import SPEC, UTILS  # noqa: E402

pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in as a GPU host's would")
pytestmark = pytest.mark.sshd

RELEASE = "0.5.12.post1"
CLIENTS, TOKENS, ACCEPT, BUDGET, TOPK = 4, 48, 3.0, 8, 4
SLOWDOWN = 0.30


@pytest.fixture(scope="module")
def served(sshd, tmp_path_factory):
    """One sandbox host whose stand-in serves with metrics and its own traffic, under supervisord."""
    root = tmp_path_factory.mktemp("metrics")
    host = sshd.add_host("m1", root / "m1", files=[SPEC, UTILS])
    names = root / "names.json"
    write_names(names, RELEASE)
    port = free_port()
    argv = [str(host.python), str(STANDIN_SERVER), "--model-path", "/models/target", "--speculative-algorithm",
            "DDTREE", "--speculative-ddtree-budget", str(BUDGET), "--speculative-ddtree-topk", str(TOPK),
            "--port", str(port), "--package-file", SPEC, "--enable-metrics", "--metric-names", str(names),
            "--traffic", str(CLIENTS), "--traffic-tokens", str(TOKENS), "--accept-length", str(ACCEPT)]
    sup = Supervised(root / "sup", "sglang", argv)
    bare_port = free_port()  # the same server without --enable-metrics
    bare = Supervised(root / "sup-bare", "bare", [str(host.python), str(STANDIN_SERVER), "--model-path", "/m",
                                                  "--speculative-algorithm", "DDTREE", "--port", str(bare_port)])
    with sup, bare:
        inventory = host.inventory(root / "hosts", smoke_levels=[])
        yield {"host": host, "h": load_host(str(inventory)), "url": f"http://127.0.0.1:{port}", "sup": sup,
               "bare_url": f"http://127.0.0.1:{bare_port}"}


def measure(s, *, interval_s: float = 3.0, scrapes: int = 3) -> list[ServedFigures]:
    out = metrics_run.sample_windows(s["h"], transport_for(s["h"]), url=s["url"], release=RELEASE,
                                     interval_s=interval_s, scrapes=scrapes)
    assert all(isinstance(w, ServedFigures) for w in out), out
    return out


def model(slowdown: float = 0.0) -> Model:
    return Model(names={}, model="m", algorithm="DDTREE", width=BUDGET + 1, accept_length=ACCEPT, slowdown=slowdown)


def test_the_figures_are_the_models_and_a_slow_build_serves_slower(served):
    import time

    time.sleep(1.5)  # the clients' first requests finish: the gauges have a second behind them
    fast = measure(served)
    assert len(fast) == 2
    for w in fast:
        print("\n" + figures_line(w))
        assert (w.release, w.algorithm, w.budget, w.topk, w.verify_width) == (RELEASE, "DDTREE", BUDGET, TOPK, BUDGET + 1)
        assert w.num_draft_tokens is None  # 0.5.12.post1 has no spec_num_draft_tokens
        assert w.running == CLIENTS and w.queue == 0
        assert w.accept_length == pytest.approx(ACCEPT, abs=0.25)
        assert w.accept_rate == pytest.approx((w.accept_length - 1) / BUDGET, abs=0.01)
        # Sleeps overshoot on a loaded machine: at most the model's speed, not far below it.
        assert 0.6 * model().expected_tps(CLIENTS, TOKENS) <= w.output_tps <= 1.05 * model().expected_tps(CLIENTS,
                                                                                                          TOKENS)
        assert w.requests > 0 and w.aborted == 0 and w.error_rate == 0
        assert w.itl_p50_ms is not None and w.itl_p99_ms >= w.itl_p50_ms and w.ttft_p50_ms is not None
    # The slow build: the marker in a deployed file, the server restarted on it (supervisorctl).
    path = served["host"].site / SPEC
    original = path.read_bytes()
    path.write_bytes(original + f"\n# ddtree-standin: slowdown={SLOWDOWN}\n".encode())
    try:
        subprocess.run(served["sup"].restart_argv, check=True, capture_output=True, timeout=60)
        time.sleep(2.5)
        slow = measure(served)
    finally:
        path.write_bytes(original)
    ratio = (sum(w.output_tps for w in slow) / len(slow)) / (sum(w.output_tps for w in fast) / len(fast))
    print(f"slow build: {figures_line(slow[-1])}; tokens/s ratio {ratio:.3f} (model {1 - SLOWDOWN:.2f})")
    assert ratio == pytest.approx(1 - SLOWDOWN, abs=0.08)
    assert min(w.itl_p50_ms for w in slow) > max(w.itl_p50_ms for w in fast)
    assert all(w.accept_length == pytest.approx(ACCEPT, abs=0.25) for w in slow)  # slower, not worse at accepting


def test_a_server_without_metrics_says_so_and_names_the_flag(served):
    f = metrics_run.served_figures(served["h"], transport_for(served["h"]), url=served["bare_url"], release=RELEASE,
                                   window_s=1.0)
    assert isinstance(f, Unavailable), f
    assert f.line == (f"{served['bare_url']}/metrics answered 404: the server runs without --enable-metrics; add "
                      "--enable-metrics to the server's launch command to see its figures")


def test_the_answer_carries_only_the_pinned_metrics(served):
    from ddtree_deploy.release.metric_names import names_for
    from ddtree_deploy.serve import metrics

    request = metrics.scrape_request(served["h"].python, served["url"], names_for(RELEASE), interval_s=1.0)
    doc = metrics_run.scrape(served["h"], transport_for(served["h"]), request)
    assert doc["metrics"] == "ok" and [s["status"] for s in doc["scrapes"]] == [200, 200]
    assert doc["scrapes"][1]["t"] - doc["scrapes"][0]["t"] == pytest.approx(1.0, abs=0.5)
    kept = {line.split("{")[0].split(" ")[0] for s in doc["scrapes"] for line in s["text"].splitlines()
            if not line.startswith("#")}
    assert kept <= {n + suffix for n in metrics.wanted(names_for(RELEASE)) for suffix in ("", "_bucket", "_sum",
                                                                                          "_count")}
    assert doc["server_info"]["speculative_algorithm"] == "DDTREE" and json.dumps(doc)  # plain JSON
