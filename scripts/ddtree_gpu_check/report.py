"""PASS / FAIL / SKIP lines, a summary, and a JSON report rewritten after every check (so a
run killed by its time limit still leaves what it had under $OUT)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

STATUSES = ("PASS", "FAIL", "SKIP")


class Report:
    def __init__(self, mode: str, json_path: Optional[Path] = None, stream=None):
        self.mode = mode
        self.json_path = json_path
        self.stream = stream or sys.stdout
        self.results: List[dict] = []
        self.tables: List[dict] = []
        self.info: dict = {}
        self.started = time.monotonic()

    def record(self, status: str, name: str, detail: str = "", **extra) -> bool:
        assert status in STATUSES, status
        row = {"status": status, "check": name, "detail": detail, **extra}
        self.results.append(row)
        line = f"{status}  {name}" + (f"  {detail}" if detail else "")
        print(line, file=self.stream, flush=True)
        self._save()
        return status == "PASS"

    def table(self, title: str, header: List[str], rows: List[List[str]], note: str = "") -> None:
        self.tables.append({"title": title, "header": header, "rows": rows, "note": note})
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
        print(f"\n{title}", file=self.stream)
        for r in [header, ["-" * w for w in widths], *rows]:
            print("  " + "  ".join(str(c).rjust(w) for c, w in zip(r, widths)), file=self.stream)
        if note:
            print(f"  {note}", file=self.stream)
        print("", file=self.stream, flush=True)
        self._save()

    def note(self, text: str) -> None:
        """A line that is no check (what the run cannot check, and says so), kept in the JSON
        report's info under "notes"."""
        self.info.setdefault("notes", []).append(text)
        print(f"NOTE  {text}", file=self.stream, flush=True)
        self._save()

    def counts(self) -> dict:
        return {s: sum(r["status"] == s for r in self.results) for s in STATUSES}

    def summary(self) -> int:
        c = self.counts()
        skipped = [r["check"] for r in self.results if r["status"] == "SKIP"]
        failed = [r["check"] for r in self.results if r["status"] == "FAIL"]
        if skipped:
            print(f"skipped ({self.mode}): " + "; ".join(skipped), file=self.stream)
        if failed:
            print("failed: " + "; ".join(failed), file=self.stream)
        print(f"{self.mode}, {time.monotonic() - self.started:.0f} s", file=self.stream)
        # Alone on its line, in the plain "N passed, N failed, N skipped" form.
        print(f"gpu-check: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped",
              file=self.stream, flush=True)
        self._save()
        return 1 if c["FAIL"] else 0

    def _save(self) -> None:
        if self.json_path is None:
            return
        doc = {"mode": self.mode, "info": self.info, "counts": self.counts(),
               "results": self.results, "tables": self.tables,
               "elapsed_s": round(time.monotonic() - self.started, 1)}
        tmp = self.json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        tmp.replace(self.json_path)
