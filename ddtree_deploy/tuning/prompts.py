"""The operator's prompt sample: what `tune` (and the analysis load step) measure with, instead of
random token ids, which say nothing about acceptance.

Two kinds of file, read on this machine (``read_prompts``; the parse is pure):

- **JSONL**, one request per line, each one of:
  ``"a prompt"`` (a JSON string), ``{"prompt": "..."}`` (or ``"text"``), or a chat:
  ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (or ShareGPT's
  ``"conversations"`` with ``from``/``value``); an object may carry ``"category": "code"``.
  A chat becomes one prompt: its turns up to the last user turn, contents joined by a blank
  line (the chat template is not applied: the same text is sent in every configuration);
- **SGLang request dumps** (``--dump-requests-folder``: ``*.pkl`` files of
  ``{"server_args", "requests": [(request, output, created, finished), ...]}``): each
  request's ``text`` (a batch request gives each of its texts); a request that carries
  only token ids is skipped and counted. The file is a pickle, so it is read with an
  unpickler that never calls anything it names: every class or function in the file comes
  back as an inert record of its arguments and state (``_Inert``), so a hostile file
  cannot run code here. Dumps have no category.

Prompts shorter than two words are skipped (SGLang's benchmark drops prompts under two
tokens, and a request it drops would count as one that never completed).

``custom_lines`` writes a category's prompts as SGLang's benchmark reads its ``custom``
dataset (0.5.12.post1 and 0.5.23 read it identically): one conversation per line, the
prompt as the user turn and an empty assistant turn (the output length is fixed with
``--sharegpt-output-len``).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ddtree_deploy.base.errors import BadInput

MAX_PROMPT_BYTES = 16 << 20  # a prompt file or dump, at most (it travels to the host in one request)
UNCATEGORIZED = "all"


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = UNCATEGORIZED


@dataclass(frozen=True)
class PromptSample:
    source: str
    prompts: tuple[Prompt, ...]
    kind: str  # "jsonl" | "dump"
    skipped: int = 0  # requests that gave no usable prompt (token ids only, under two words)
    digest: str = ""  # sha256 of the file's bytes: a resumed sweep must use the same sample

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted({p.category for p in self.prompts}))

    def by_category(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self.prompts:
            out.setdefault(p.category, []).append(p.text)
        return dict(sorted(out.items()))

    def shares(self, requests: int) -> tuple[tuple[str, int], ...]:
        """(category, requests per benchmark run): ``requests`` split by each category's share
        of the sample, at least one each, never more than the category has (the benchmark
        sends each prompt once)."""
        counts = Counter(p.category for p in self.prompts)
        total = sum(counts.values())
        return tuple((c, max(1, min(n, round(requests * n / total)))) for c, n in sorted(counts.items()))

    def describe(self) -> str:
        cats = self.by_category()
        parts = ", ".join(f"{c} {len(v)}" for c, v in cats.items()) if len(cats) > 1 else "no categories"
        skipped = f"; {self.skipped} skipped" if self.skipped else ""
        return f"{self.source}: {len(self.prompts)} prompts ({parts}){skipped}"


def _bad(source: str, line: int | None, what: str, todo: str) -> BadInput:
    at = f":{line}" if line is not None else ""
    return BadInput(f"{source}{at}: {what}; {todo}")


_FORMS = ('a JSON string, {"prompt": "..."}, {"text": "..."} or {"messages": [{"role": "user", "content": "..."}]}, '
          'with an optional "category"')


def _chat(turns: Any, source: str, n: int) -> str:
    if not isinstance(turns, list) or not turns:
        raise _bad(source, n, "messages must be a non-empty list of turns", f"write each line as {_FORMS}")
    texts, last_user = [], -1
    for turn in turns:
        if not isinstance(turn, dict):
            raise _bad(source, n, f"a turn is not an object: {str(turn)[:60]!r}", f"write each line as {_FORMS}")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if isinstance(content, list):  # OpenAI's content parts: their text parts
            content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise _bad(source, n, "a turn has no text content", f"write each line as {_FORMS}")
        texts.append(content)
        if role in ("user", "human"):
            last_user = len(texts)
    if last_user < 0:
        raise _bad(source, n, "the chat has no user turn", "end each chat with the user's turn to answer")
    return "\n\n".join(t for t in texts[:last_user] if t)


def parse_jsonl(text: str, *, source: str) -> PromptSample:
    prompts, skipped = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise _bad(source, n, "not a JSON line", f"write each line as {_FORMS}") from None
        category = UNCATEGORIZED
        if isinstance(doc, str):
            prompt = doc
        elif isinstance(doc, dict):
            if "category" in doc:
                category = doc["category"]
                if not isinstance(category, str) or not category.strip() or len(category) > 40 \
                        or not category.replace("-", "").replace("_", "").isalnum():
                    raise _bad(source, n, f"category {category!r} is not a short name (letters, digits, - and _)",
                               'e.g. "category": "code"')
            if isinstance(doc.get("prompt", doc.get("text")), str):
                prompt = doc.get("prompt", doc.get("text"))
            elif "messages" in doc or "conversations" in doc:
                prompt = _chat(doc.get("messages", doc.get("conversations")), source, n)
            else:
                raise _bad(source, n, "no prompt in this line", f"write each line as {_FORMS}")
        else:
            raise _bad(source, n, f"a JSON {type(doc).__name__} is not a prompt", f"write each line as {_FORMS}")
        if len(prompt.split()) < 2:
            skipped += 1
            continue
        prompts.append(Prompt(prompt, category))
    if not prompts:
        raise _bad(source, None, "no usable prompt in the file (each needs two words at least)",
                   f"write one request per line as {_FORMS}")
    return PromptSample(source=source, prompts=tuple(prompts), kind="jsonl", skipped=skipped,
                        digest=hashlib.sha256(text.encode()).hexdigest())


# ----------------------------------------------------------------------------- SGLang's dumps


class _Inert:
    """What every class or function named in a dump becomes: its arguments and state, kept."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.state = args, {}

    def __new__(cls, *args: Any, **kwargs: Any):
        return object.__new__(cls)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = state if isinstance(state, dict) else {"state": state}

    def __call__(self, *args: Any, **kwargs: Any) -> "_Inert":  # a function named in the file, "called"
        return _Inert(*args)


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Never the real thing: a dump's classes live in sglang (not importable here) and a
        # hostile file's "classes" would be os.system and the like.
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a request dump")


def _texts(obj: Any) -> list[Any]:
    state = obj.state if isinstance(obj, _Inert) else obj if isinstance(obj, dict) else {}
    text = state.get("text")
    return text if isinstance(text, list) else [text]


def parse_dump(data: bytes, *, source: str) -> PromptSample:
    try:
        doc = _InertUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed pickle: one line, never a traceback
        raise _bad(source, None, f"not an SGLang request dump ({type(exc).__name__}: {str(exc)[:80]})",
                   "give a .pkl file from SGLang's --dump-requests-folder, or a JSONL prompt file") from None
    requests = doc.get("requests") if isinstance(doc, dict) else None
    if not isinstance(requests, list):
        raise _bad(source, None, "a pickle without the dump's requests list",
                   "give a .pkl file from SGLang's --dump-requests-folder")
    prompts, skipped = [], 0
    for entry in requests:
        obj = entry[0] if isinstance(entry, (tuple, list)) and entry else entry
        for text in _texts(obj):
            if isinstance(text, str) and len(text.split()) >= 2:
                prompts.append(Prompt(text))
            else:
                skipped += 1  # token ids only, or too short
    if not prompts:
        raise _bad(source, None, f"none of the dump's {len(requests)} requests carries a text prompt",
                   "dump requests sent as text, or give a JSONL prompt file")
    return PromptSample(source=source, prompts=tuple(prompts), kind="dump", skipped=skipped,
                        digest=hashlib.sha256(data).hexdigest())


def read_prompts(path: str | Path) -> PromptSample:
    """A prompt file or request dump on this machine, parsed (one BadInput line on any problem)."""
    p = Path(path).expanduser()
    try:
        if p.stat().st_size > MAX_PROMPT_BYTES:
            raise _bad(str(path), None, f"over {MAX_PROMPT_BYTES >> 20} MiB", "give a sample of the traffic, not all of it")
        data = p.read_bytes()
    except OSError as exc:
        raise _bad(str(path), None, f"cannot read the prompt file ({exc.strerror or exc})",
                   "give a JSONL prompt file or an SGLang request dump (.pkl)") from None
    if p.suffix == ".pkl" or data[:1] == b"\x80":
        return parse_dump(data, source=str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(str(path), None, "not UTF-8 text", "save the prompt file as UTF-8 JSONL") from None
    return parse_jsonl(text, source=str(path))


def custom_lines(texts: Iterable[str]) -> str:
    """Prompts as SGLang's benchmark reads its ``custom`` dataset (one conversation a line)."""
    return "".join(json.dumps({"conversations": [{"role": "user", "content": t},
                                                  {"role": "assistant", "content": ""}]}) + "\n" for t in texts)


def probe_texts(sample: PromptSample, per_category: int) -> dict[str, list[str]]:
    """The first ``per_category`` prompts of each category: the acceptance probe's requests."""
    return {c: texts[:per_category] for c, texts in sample.by_category().items()}


__all__ = ["MAX_PROMPT_BYTES", "Prompt", "PromptSample", "UNCATEGORIZED", "custom_lines", "parse_dump",
           "parse_jsonl", "probe_texts", "read_prompts"]
