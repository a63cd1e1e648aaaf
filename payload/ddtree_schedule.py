"""DDTREE's per-batch-size budget schedule: the grammar, and the entry a batch runs with.

Installed by the ``sglang-0.5.20`` family as ``sglang/srt/speculative/ddtree_schedule.py`` (the
v2 plugin resolves ``--speculative-ddtree-budget-schedule`` with it, the v2 worker picks each
decode step's entry with it); the toolkit reads this very file for ``tune --apply``
(``ddtree_deploy/settings/budget_schedule.py`` loads it by path), so the server and the tool
that writes schedules share one grammar. Standard library only, no SGLang, no torch.

    SCHEDULE  := ENTRY ("," ENTRY)*
    ENTRY     := THRESHOLD ":" BUDGET ["/" TOPK]  |  THRESHOLD ":" "chain"

    1:128/8,8:64/4,32:16/2,64:chain

Each entry serves the running batches from its THRESHOLD up to the next entry's threshold
minus one (the last: up to max_running_requests). The first threshold is 1 (every batch size
has an entry), thresholds rise strictly. BUDGET is the draft-tree nodes per request (the target
verifies BUDGET + 1 tokens), TOPK the candidates kept per draft position (default min(BUDGET,
8)); ``chain`` is top-K 1 with the budget the draft block allows, block - 1 (DFlash's chain,
verified through the same tree path), resolved once the block is known (``resolve``).

What a schedule must also satisfy with the model and the GPU in hand (the CUDA tree ABI per
entry, the memory rule per entry) is the plugin's to check; this module refuses what the text
alone shows, in one line naming the entry, and repairs what it can so the refusal can name a
schedule that works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

FLAG = "--speculative-ddtree-budget-schedule"
CHAIN = "chain"
#: The most entries a schedule may have: each distinct (budget, top-K) is one verify state on
#: the server (its own target attention backend and CUDA graphs, built at start-up).
MAX_ENTRIES = 8
#: The per-depth cap when an entry names none (the plugin's DEFAULT_MAX_TOPK).
DEFAULT_TOPK = 8

_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*(?:(chain)|(\d+)\s*(?:/\s*(\d+))?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Entry:
    """One schedule entry: the running batches from ``threshold`` up serve this tree."""

    threshold: int
    budget: Optional[int]  # None: a chain not yet resolved against the draft block
    topk: Optional[int]  # None: the default, min(budget, DEFAULT_TOPK)
    chain: bool = False

    @property
    def width(self) -> int:
        """The target's verify width, budget + 1 (a resolved entry)."""
        if self.budget is None:
            raise ValueError(f"schedule entry {self.text()!r} is not resolved (the draft block)")
        return self.budget + 1

    def text(self) -> str:
        if self.chain and self.budget is None:
            return f"{self.threshold}:{CHAIN}"
        if self.topk is None:
            return f"{self.threshold}:{self.budget}"
        return f"{self.threshold}:{self.budget}/{self.topk}"


class ScheduleError(ValueError):
    """A schedule refused by its text: ``entry`` (the entry's text as written), ``why``, and
    ``repaired``, the schedule with that fault mended (entries, not yet resolved)."""

    def __init__(self, entry: str, why: str, repaired: Tuple[Entry, ...]):
        self.entry, self.why, self.repaired = entry, why, tuple(repaired)
        super().__init__(refusal(entry, why, repaired))


def refusal(entry: str, why: str, works: Sequence[Entry]) -> str:
    """The one line every schedule refusal has: the entry, why, and a schedule that works."""
    return f"DDTREE: {FLAG} entry {entry!r}: {why}; use {FLAG} {format_schedule(works)}"


def format_schedule(entries: Sequence[Entry]) -> str:
    return ",".join(entry.text() for entry in entries)


def parse(text: str) -> Tuple[Entry, ...]:
    """The entries of ``text``, or ScheduleError on the first fault the text shows."""
    raw = [part for part in str(text).split(",")]
    if not str(text).strip():
        raise ScheduleError(str(text), "the schedule is empty", (Entry(1, 64, None),))
    entries, bad = [], None
    for part in raw:
        match = _ENTRY.match(part)
        if match is None:
            bad = bad or (part.strip(), "is not THRESHOLD:BUDGET[/TOPK] or THRESHOLD:chain")
            continue
        threshold, chain, budget, topk = match.groups()
        entry = Entry(int(threshold), None if chain else int(budget),
                      None if topk is None else int(topk), chain=bool(chain))
        if entry.threshold < 1:
            bad = bad or (part.strip(), "a batch threshold is at least 1")
            continue
        if entry.budget is not None and entry.budget < 1:
            bad = bad or (part.strip(), "a budget is at least 1")
            entry = Entry(entry.threshold, 1, entry.topk)
        if entry.topk is not None and entry.topk < 1:
            bad = bad or (part.strip(), "a top-K is at least 1")
            entry = Entry(entry.threshold, entry.budget, 1, entry.chain)
        entries.append(entry)
    fixed = _repair(entries)
    if bad is not None:
        raise ScheduleError(bad[0], bad[1], fixed)
    for before, entry in zip(entries, entries[1:]):
        if entry.threshold == before.threshold:
            raise ScheduleError(entry.text(), f"repeats the batch threshold {entry.threshold}",
                                fixed)
        if entry.threshold < before.threshold:
            raise ScheduleError(entry.text(), f"its batch threshold {entry.threshold} comes "
                                f"after {before.threshold}: thresholds must rise", fixed)
    if entries[0].threshold != 1:
        raise ScheduleError(entries[0].text(), f"the first entry starts at batch "
                            f"{entries[0].threshold}, so smaller batches have no entry (the first "
                            "threshold is 1)", fixed)
    if len(entries) > MAX_ENTRIES:
        raise ScheduleError(entries[MAX_ENTRIES].text(), f"a schedule holds at most {MAX_ENTRIES} "
                            "entries (each is a verify state with its own CUDA graphs)", fixed)
    return tuple(entries)


def _repair(entries: Sequence[Entry]) -> Tuple[Entry, ...]:
    """Sorted by threshold, the first of each threshold kept, the first threshold made 1, at
    most MAX_ENTRIES; an empty one becomes the single-budget default."""
    seen, out = set(), []
    for entry in sorted(entries, key=lambda e: e.threshold):
        if entry.threshold not in seen:
            seen.add(entry.threshold)
            out.append(entry)
    if not out:
        return (Entry(1, 64, None),)
    first = out[0]
    out[0] = Entry(1, first.budget, first.topk, first.chain)
    return tuple(out[:MAX_ENTRIES])


def resolve(entries: Sequence[Entry], draft_block: int,
            default_topk: int = DEFAULT_TOPK) -> Tuple[Entry, ...]:
    """Every entry explicit: ``chain`` -> budget block - 1, top-K 1; a missing top-K ->
    min(budget, default_topk); a top-K above the budget clamped to it (a tree of B nodes has
    at most B siblings anywhere)."""
    out = []
    for entry in entries:
        if entry.chain:
            out.append(Entry(entry.threshold, max(int(draft_block) - 1, 1), 1, chain=True))
            continue
        topk = default_topk if entry.topk is None else entry.topk
        out.append(Entry(entry.threshold, entry.budget, min(topk, entry.budget)))
    return tuple(out)


def pick(entries: Sequence[Entry], batch_size: int) -> int:
    """The index of the entry that serves a running batch of ``batch_size`` requests: the last
    one whose threshold is at most the batch (the first for an empty batch)."""
    index = 0
    for i, entry in enumerate(entries):
        if entry.threshold <= batch_size:
            index = i
    return index


def ranges(entries: Sequence[Entry], max_batch: int) -> Tuple[Tuple[int, int], ...]:
    """(first, last) running batch each entry serves when at most ``max_batch`` requests run;
    an entry above ``max_batch`` serves none: (threshold, threshold - 1)."""
    out = []
    for i, entry in enumerate(entries):
        nxt = entries[i + 1].threshold - 1 if i + 1 < len(entries) else int(max_batch)
        out.append((entry.threshold, min(nxt, int(max_batch))))
    return tuple(out)


def from_table(rows: Sequence[Tuple[int, object]]) -> str:
    """A schedule from a per-concurrency table (``tune``'s): ``rows`` of (running batch,
    (budget, top-K) or ``"chain"``), any order; the first concurrency becomes threshold 1 and
    runs of equal choices merge into one entry. The result parses (ScheduleError otherwise)."""
    entries = []
    for batch, choice in sorted(rows, key=lambda row: int(row[0])):
        if isinstance(choice, str) and choice.lower() == CHAIN:
            entry = Entry(int(batch), None, None, chain=True)
        else:
            budget, topk = choice
            entry = Entry(int(batch), int(budget), None if topk is None else int(topk))
        if entries and (entries[-1].budget, entries[-1].topk, entries[-1].chain) == (
                entry.budget, entry.topk, entry.chain):
            continue
        entries.append(entry)
    if entries:
        entries[0] = Entry(1, entries[0].budget, entries[0].topk, entries[0].chain)
    text = format_schedule(entries)
    parse(text)
    return text


__all__ = ["CHAIN", "DEFAULT_TOPK", "Entry", "FLAG", "MAX_ENTRIES", "ScheduleError",
           "format_schedule", "from_table", "parse", "pick", "ranges", "refusal", "resolve"]
