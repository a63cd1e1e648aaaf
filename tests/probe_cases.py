"""The case loop of the probe scripts run in a process of their own (tests/v2_worker_probe.py,
tests/v2_triton_twins.py): each case is ``case_<name>(context)``; one line ``TAG{json}`` maps
every case to "ok" or its traceback. Standard library only."""

from __future__ import annotations

import json
import traceback


def run_cases(tag: str, cases, make_context, namespace: dict, what: str = "setup") -> int:
    """Build the shared context once (a failure there fails every case), run each case."""
    try:
        context = make_context()
    except Exception:
        text = traceback.format_exc()
        print(tag + json.dumps({c: f"{what}: " + text for c in cases}))
        return 0
    results = {}
    for case in cases:
        try:
            namespace["case_" + case](context)
            results[case] = "ok"
        except Exception:
            results[case] = traceback.format_exc()
    print(tag + json.dumps(results))
    return 0
