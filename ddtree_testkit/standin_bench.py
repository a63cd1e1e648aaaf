"""What SGLang's own serving benchmark asks of a server, in SGLang's shapes: the part the two
STAND-IN servers share (NOT SGLang). ddtree_testkit/standin_tune_server.py (tune's sweeps) and
ddtree_testkit/standin_server.py (the serving host's server, driven by the speed gate's load
step) each decode with their own speed model; the endpoints and the stream are these.

Read from ``sglang/bench_serving.py`` (0.5.12.post1) and ``sglang/benchmark/serving.py`` (0.5.23):

- ``GET /v1/models``: ``{"data": [{"id": <model path>}]}`` (the model name, and the tokenizer
  loaded when the benchmark is given no ``--model``); ``GET /get_model_info`` likewise;
- ``POST /flush_cache`` (``--flush-cache``; 0.5.23's adds ``?timeout=``): 200;
- ``POST /generate`` with ``"stream": true``: ``data: {"text": <cumulative text>, "meta_info":
  {"completion_tokens", "spec_verify_ct"}}`` chunks, one per decoding step (a speculative step's
  accepted tokens together), then ``data: [DONE]``.

Stdlib only: a sandbox host's Python runs the stand-ins as scripts beside this file.
"""

import json


def model_reply(path, model_path):
    """The reply to GET ``path`` when it is one of the model endpoints, else None."""
    if path == "/v1/models":
        return {"object": "list", "data": [{"id": model_path, "object": "model"}]}
    if path == "/get_model_info":
        return {"model_path": model_path, "is_generation": True}
    return None


def is_flush(path):
    return path.split("?")[0] == "/flush_cache"


def max_new_tokens(body, default=16):
    return int((body.get("sampling_params") or {}).get("max_new_tokens", default))


class Stream(object):
    """One streamed ``/generate`` reply on ``handler`` (a BaseHTTPRequestHandler)."""

    def __init__(self, handler):
        self.handler = handler
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()

    def step(self, text, completion_tokens, verify_ct):
        chunk = {"text": text, "meta_info": {"completion_tokens": completion_tokens, "spec_verify_ct": verify_ct}}
        self.handler.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.handler.wfile.flush()

    def end(self):
        self.handler.wfile.write(b"data: [DONE]\n\n")
        self.handler.wfile.flush()
        self.handler.close_connection = True
