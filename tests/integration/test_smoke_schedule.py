"""The smoke and serve proof of a budget schedule (hostprog/smoke.py ``prove_served``): every
width of ``--speculative-ddtree-budget-schedule`` must have verified. Over real HTTP on
loopback, against a STAND-IN server (a few lines here: the launch level's full stand-in lives in
ddtree_testkit) that runs each ``/generate`` batch at the schedule entry of its size and reports
``/server_info`` as the v2 worker does (ddtree_worker_v2.ddtree_internal_state)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ddtree_deploy.hostprog import smoke
from ddtree_deploy.hostprog.server import StepFailed

SCHEDULE = "1:32/4,4:16/2,8:7/1"  # resolved: thresholds 1, 4, 8; widths 33, 17, 8


class _Server:
    """Runs each /generate batch at the entry of its size (a batch of n requests: one step at
    its entry); ``skip_width`` never runs that width (a server that cannot reach it)."""

    def __init__(self, skip_width=None):
        self.batches, self.skip_width = [], skip_width
        entries = [(int(t), int(b), int(k)) for t, bk in (e.split(":") for e in SCHEDULE.split(","))
                   for b, k in [bk.split("/")]]
        self.entries = [{"threshold": t, "budget": b, "topk": k, "verify_width": b + 1, "steps": 0,
                         "mean_accept_length": None} for t, b, k in entries]
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["text"]
                if isinstance(texts, str):
                    return self._send({"text": "Paris.", "meta_info": {"completion_tokens": 4,
                                                                      "spec_verify_ct": 2}})
                server.batches.append(len(texts))
                entry = [e for e in server.entries if e["threshold"] <= len(texts)][-1]
                if entry["verify_width"] != server.skip_width:
                    entry["steps"] += 1
                    entry["mean_accept_length"] = 2.5
                return self._send([{"text": "x", "meta_info": {"completion_tokens": 8}}
                                   for _ in texts])

            def do_GET(self):
                state = {"ddtree_verify_width": 33, "ddtree_worker_class": "DDTreeWorkerV2",
                         "ddtree_offchain_accepts": 3, "ddtree_schedule": server.entries}
                return self._send({"speculative_algorithm": "DDTREE",
                                   "speculative_ddtree_budget": 32,
                                   "speculative_ddtree_budget_schedule": SCHEDULE,
                                   "internal_states": [state]})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def _spec():
    return {"expect_algorithm": "DDTREE", "probe_timeout_s": 10,
            "tree": {"prompts": ["a", "b", "c"], "max_new_tokens": 8, "budget": None,
                     "budget_field": "speculative_ddtree_budget", "worker_class": "DDTreeWorkerV2"}}


def test_every_width_of_the_schedule_is_sent_a_batch_and_judged():
    server = _Server()
    try:
        evidence = {}
        smoke.prove_served(_spec(), server.base, evidence)
    finally:
        server.close()
    # The tree prompts, then one batch per threshold (prompts cycled to its size).
    assert server.batches == [3, 1, 4, 8]
    assert evidence["schedule_batches"] == [1, 4, 8]
    tree = evidence["tree"]
    assert [(e["threshold"], e["verify_width"]) for e in tree["schedule"]] == [(1, 33), (4, 17), (8, 8)]
    assert all(e["steps"] >= 1 for e in tree["schedule"])
    assert evidence["tree_requests"] == {"prompts": 16, "completion_tokens": 16 * 8}


def test_a_width_that_never_verified_fails_the_proof():
    server = _Server(skip_width=17)
    try:
        with pytest.raises(StepFailed) as failed:
            smoke.prove_served(_spec(), server.base, {})
    finally:
        server.close()
    assert ("ddtree_schedule: the entry from batch 4 (width 17) verified 0 steps after 16 prompts: "
            "not every width of the schedule ran") in str(failed.value)


@pytest.mark.parametrize("info, thresholds", [
    ({"speculative_ddtree_budget_schedule": "1:128/8,8:64/4,32:16/2,64:chain"}, [1, 8, 32, 64]),
    ({"speculative_ddtree_budget_schedule": None}, []),
    ({}, []),
    (None, []),
])
def test_schedule_thresholds_read_from_server_info(info, thresholds):
    assert smoke.schedule_thresholds(info) == thresholds
