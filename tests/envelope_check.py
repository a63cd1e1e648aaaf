"""The --json contract as tests check it (docs/json.md): one document on stdout, valid
against docs/json-schema.json, its envelope consistent with the process's exit code.

Shared by tests/e2e/test_json_envelope.py and the tests whose --json runs are too costly to
repeat there (tests/e2e/test_tune_ssh.py): ``from envelope_check import check_envelope``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "docs" / "json-schema.json"
ENVELOPE_KEYS = ["schema", "command", "ok", "exit_code", "error", "hosts"]


@lru_cache(maxsize=1)
def validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check_envelope(stdout: str, exit_code: int, command: str) -> dict:
    """Parse ``stdout`` as exactly one JSON document and check it; return it."""
    decoder = json.JSONDecoder()
    text = stdout.strip()
    assert text, "no JSON on stdout"
    doc, end = decoder.raw_decode(text)
    assert text[end:].strip() == "", f"more than one document (or text) on stdout: {text[end:end + 200]!r}"
    assert isinstance(doc, dict)
    errors = sorted(validator().iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    assert list(doc)[:6] == ENVELOPE_KEYS, list(doc)
    assert doc["schema"] == "ddtree-deploy/2" and doc["command"] == command, (doc["command"], command)
    assert doc["exit_code"] == exit_code, (doc["exit_code"], exit_code, doc["error"])
    assert doc["ok"] is (exit_code == 0) and (doc["error"] is None) is (exit_code == 0), doc["error"]
    for h in doc["hosts"]:
        assert isinstance(h["host"], str) and isinstance(h["ok"], bool), h
    return doc
