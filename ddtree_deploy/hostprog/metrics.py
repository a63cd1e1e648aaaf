"""The host side of the served figures: scrapes of the serving server's ``/metrics`` and one
read of its ``/server_info``, as raw text and times. No parsing of the figures here: the
controller parses (serve/metrics.py, with a well-kept Prometheus parser); this side only
asks, times and trims.

Stdlib only, Python 3.8, shipped with the serve program (hostprog/serve.py's ``metrics``
op). Request::

    {"op": "metrics", "python": ..., "url": "http://127.0.0.1:30000",
     "interval_s": 10, "scrapes": 2,        # N scrapes, interval_s apart: N - 1 windows
     "timeout_s": 10,                       # each GET, at most
     "names": ["sglang:num_running_reqs", ...] | null}   # keep only these metrics' lines

Answer (``ok``: the op ran; whether the server had figures is ``metrics``)::

    {"ok": true, "url", "metrics": "ok" | "missing" | "unreachable" | "error" | "stopped",
     "detail": null | "one line",
     "scrapes": [{"t": epoch seconds, "mono": monotonic seconds, "status", "text", "error"}],
     "server_info": {...the keys the figures read...} | null}

A server without ``/metrics`` (404: SGLang started without ``--enable-metrics``) answers
``metrics: "missing"`` after the first scrape; one that does not answer, or answers
something else, stops the scrapes there (``unreachable`` / ``error``), so a server that
dies during a bake is seen at the next scrape. ``names`` keeps the answer small: SGLang's
full text is hundreds of kilobytes, the figures read a dozen metrics; the lines kept are
the Prometheus text of those metrics exactly as the server wrote them (``# HELP``,
``# TYPE`` and the samples, histogram buckets included).
"""

import time

MAX_TEXT = 4 << 20  # bytes of one /metrics answer kept, at most
SUFFIXES = ("", "_bucket", "_sum", "_count", "_total")
INFO_KEYS = ("speculative_algorithm", "speculative_ddtree_budget", "speculative_ddtree_topk",
             "speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk",
             "enable_metrics", "version", "model_path")
STATE_KEYS = ("avg_spec_accept_length", "ddtree_verify_width", "ddtree_worker_class")


def get_text(url, timeout):
    """One GET: (status or None, body text or None, error or None)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read(MAX_TEXT + 1).decode("utf-8", "replace"), None
    except urllib.error.HTTPError as exc:
        return exc.code, None, "HTTP %d" % exc.code
    except (urllib.error.URLError, OSError) as exc:
        return None, None, str(getattr(exc, "reason", exc))[:300]


def metric_of(line):
    """The metric name a line of the Prometheus text is about (None: a blank or other comment)."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") else None
    end = len(line)
    for sep in ("{", " "):
        i = line.find(sep)
        if i != -1:
            end = min(end, i)
    return line[:end] or None


def keep_lines(text, names):
    """The lines of ``text`` about the metrics in ``names`` (their samples by every suffix a
    histogram or counter adds), in their order; ``names`` None keeps everything."""
    if names is None:
        return text
    wanted = set()
    for name in names:
        for suffix in SUFFIXES:
            wanted.add(name + suffix)
    out = [line for line in text.splitlines() if metric_of(line) in wanted]
    return "\n".join(out) + ("\n" if out else "")


def server_info(base, timeout):
    """The keys of /server_info (or the older /get_server_info) the figures read; None."""
    import json

    for endpoint in ("/server_info", "/get_server_info"):
        status, body, _ = get_text(base + endpoint, timeout)
        if status != 200 or body is None:
            continue
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if isinstance(doc, dict) and "decode" in doc and isinstance(doc["decode"], list) and doc["decode"]:
            doc = doc["decode"][0]  # a disaggregated router: the decode side speculates
        if not isinstance(doc, dict):
            return None
        info = {k: doc.get(k) for k in INFO_KEYS if k in doc}
        states = doc.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            info["internal_states"] = [{k: states[0][k] for k in STATE_KEYS if k in states[0]}]
        info["endpoint"] = endpoint
        return info
    return None


def _wait_until(when, stop):
    """Sleep until ``when`` (monotonic); why ``stop`` says to stop meanwhile, else None."""
    while True:
        why = stop() if stop is not None else None
        delay = when - time.monotonic()
        if why or delay <= 0:
            return why
        time.sleep(min(delay, 0.1) if stop is not None else delay)


def scrape(request, emitter=None, stop=None):
    """``scrapes`` GETs of /metrics, ``interval_s`` apart (by the monotonic clock, from the
    first one's midpoint), then one read of /server_info. A long run beats
    (``emitter.current``) so the controller's silence limit never fires on it. ``stop``
    (hostprog/load.py: the load step failed, the controller went away): None, or why the
    scrapes stop now (``metrics: "stopped"``, its reason the ``detail``), looked at between
    scrapes and every 0.1 s of a wait."""
    base = request["url"].rstrip("/")
    interval = float(request.get("interval_s", 10))
    count = max(1, int(request.get("scrapes", 2)))
    timeout = float(request.get("timeout_s", 10))
    names = request.get("names")
    answer = {"ok": True, "url": base, "metrics": "ok", "detail": None, "scrapes": [], "server_info": None}
    if emitter is not None:
        emitter.current, emitter.started = "metrics", time.monotonic()
    # Scrape i is due ``i x interval`` after the first scrape's midpoint, not after the start:
    # a slow first answer (a cold server) would otherwise shorten the window between the
    # midpoints, the one the figures divide by. So that window is never shorter than asked,
    # and longer by at most half a later scrape's round trip.
    anchor = time.monotonic()
    try:
        for i in range(count):
            why = _wait_until(anchor + i * interval, stop)
            if why:
                answer.update(metrics="stopped", detail=why)
                break
            sent = time.monotonic()
            status, text, error = get_text(base + "/metrics", timeout)
            got = time.monotonic()
            mid = (sent + got) / 2  # the server's counters were read somewhere in between
            if i == 0:
                anchor = mid
            record = {"t": round(time.time() - (got - mid), 3), "mono": round(mid, 3), "status": status,
                      "text": None, "error": error}
            answer["scrapes"].append(record)
            if status == 404:
                answer.update(metrics="missing", detail="%s/metrics answered 404: the server runs without "
                                                        "--enable-metrics" % base)
                break
            if status is None:
                answer.update(metrics="unreachable", detail="%s/metrics: nothing answered (%s)" % (base, error))
                break
            if status != 200 or text is None:
                answer.update(metrics="error", detail="%s/metrics answered %s" % (base, status))
                break
            if len(text) > MAX_TEXT:
                answer.update(metrics="error", detail="%s/metrics answered over %d bytes" % (base, MAX_TEXT))
                break
            record["text"] = keep_lines(text, names)
        answer["server_info"] = server_info(base, timeout)
    finally:
        if emitter is not None:
            emitter.current = None
    return answer
