"""`tune --apply`: write the chosen budget and top-K into the host's inventory file.

``tomlkit`` edits the document in place, so every comment, blank line and key order of
the file stays as the person who wrote it left it; only the two values change (or are
added at the end of ``[smoke.launch]``). The change is always shown as a unified diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from ddtree_deploy.base.errors import BadInput


def edit_launch(text: str, *, budget: int, topk: int, source: str = "<inventory>") -> str:
    """The inventory text with ``[smoke.launch]`` budget/topk set (pure)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise BadInput(f"{source}: not valid TOML ({exc}); fix the file before --apply") from None
    smoke = doc.get("smoke")
    launch = smoke.get("launch") if smoke is not None and hasattr(smoke, "get") else None
    if launch is None or not hasattr(launch, "__setitem__"):
        raise BadInput(f"{source}: no [smoke.launch] table to write the budget and top-K into")
    launch["budget"] = budget
    launch["topk"] = topk
    return tomlkit.dumps(doc)


def apply_launch(path: Path, *, budget: int, topk: int) -> dict:
    """Rewrite ``path`` (atomically: temp file + rename) and return what changed."""
    before = path.read_text(encoding="utf-8")
    after = edit_launch(before, budget=budget, topk=topk, source=str(path))
    diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"{path} (before)", tofile=f"{path} (after)"))
    if after == before:
        return {"written": False, "file": str(path), "diff": "", "budget": budget, "topk": topk,
                "why": "the inventory already has these values"}
    tmp = path.with_name(f".{path.name}.tune-tmp")
    tmp.write_text(after, encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return {"written": True, "file": str(path), "diff": diff, "budget": budget, "topk": topk}
