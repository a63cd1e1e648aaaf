"""The smoke report: the host program's JSON answer read into typed results, and the
lines people see. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.smoke.plan import SmokePlan


@dataclass(frozen=True)
class LevelResult:
    level: str
    status: str  # passed | failed | skipped | not-run
    seconds: float
    detail: str
    evidence: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict:
        return {"level": self.level, "status": self.status, "ok": self.ok,
                "seconds": self.seconds, "detail": self.detail, "evidence": self.evidence}


@dataclass(frozen=True)
class SmokeReport:
    host: str
    levels: tuple[LevelResult, ...]
    python: str | None = None
    log_copy: str | None = None  # where the server log was copied back to, on failure
    note: str | None = None  # what the smoke changed in the host's journal, if anything

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.levels)

    @property
    def failed(self) -> LevelResult | None:
        return next((r for r in self.levels if r.status == "failed"), None)

    def with_log_copy(self, path: str) -> "SmokeReport":
        return replace(self, log_copy=path)

    def to_json(self) -> dict:
        doc = {"host": self.host, "ok": self.ok, "python": self.python,
               "levels": [r.to_json() for r in self.levels], "log_copy": self.log_copy}
        if self.note is not None:
            doc["note"] = self.note
        return doc

    def lines(self) -> list[str]:
        """One line per level, for people (the summary of ``smoke`` and ``push``)."""
        out = [f"{r.level:<8} {r.status:<8} {r.seconds:7.1f} s  {r.detail}" for r in self.levels]
        if self.log_copy:
            out.append(f"server log copied to {self.log_copy}")
        if self.note:
            out.append(self.note)
        return out


def read_answer(host: str, plan: SmokePlan, answer: Mapping[str, Any]) -> SmokeReport:
    """The host-side program's JSON answer -> SmokeReport (a malformed one is a DeployError)."""
    if not isinstance(answer, Mapping) or "levels" not in answer:
        message = answer.get("error") if isinstance(answer, Mapping) else None
        raise DeployError(f"{host}: the smoke program gave no result ({message or 'malformed answer'})")
    results = []
    for item in answer["levels"]:
        try:
            results.append(LevelResult(level=str(item["level"]), status=str(item["status"]),
                                       seconds=float(item["seconds"]), detail=str(item["detail"]),
                                       evidence=dict(item.get("evidence") or {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise DeployError(f"{host}: the smoke program's answer is malformed ({exc!r})") from None
    if [r.level for r in results] != list(plan.levels):
        raise DeployError(f"{host}: the smoke program answered levels {[r.level for r in results]}, "
                          f"asked for {list(plan.levels)}")
    if plan.excluded_modules:
        results = [_note_excluded(r, plan.excluded_modules) for r in results]
    return SmokeReport(host=host, levels=tuple(results), python=answer.get("python"))


def _note_excluded(result: LevelResult, excluded: tuple[str, ...]) -> LevelResult:
    if result.level != "import" or result.status != "passed":
        return result
    note = f"; not imported here (smoke.import_exclude): {', '.join(excluded)}"
    evidence = dict(result.evidence, excluded=list(excluded))
    return LevelResult(result.level, result.status, result.seconds, result.detail + note, evidence)


def run_smoke(host: str, plan: SmokePlan, run: Callable[[dict], Mapping[str, Any]]) -> SmokeReport:
    """Run the plan through ``run`` (request -> the host program's JSON answer)."""
    return read_answer(host, plan, run(plan.request))
