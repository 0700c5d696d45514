"""Answer-level scoring shared by ``bench_answers.py`` and ``bench_quality.py``: what a user reads first.

Independent of the answerer's own sentence splitting (a change to the answerer cannot move the yardstick):

- :func:`first_unit` is what a reader sees first: the first sentence of prose (with the citation markers right
  after it), or, when the reply opens with a table, its header and first data row, or a leading fenced code
  block whole. A first sentence that ends in a colon goes on into the code block or table it introduces
  ("Pin it with:" and the block under it).
- :func:`has_fact` matches a fact phrase SQuAD-style (lower case, punctuation and articles dropped, whole
  words), after the ``[n]`` markers are removed.
- A question's ``facts`` are groups of alternatives: the reply holds the answer when every group has one
  alternative in it (``answer@any``), and leads with it when the first group's alternative is in the first unit
  (``answer@1``). A comparison has a group per side.
- ``honest-none`` (questions outside the knowledge base): the outcome is ``none`` and nothing is cited;
  ``false-none`` (answerable questions): the outcome is ``none``; ``wrong-context`` (answerable questions):
  the outcome says ``context`` ("answered from the knowledge base") but the reply lacks an expected fact.

:func:`split_set` splits a question set once, seeded, per kind, into a *tuning* half and a *validation* half;
:func:`log_validation` appends every look at a validation half to ``results/validation-log.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import re
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).parent / "data"
VALIDATION_LOG = RESULTS / "validation-log.md"
#: The seed of the tuning/validation split of this work's question sets (never change it after a validation look).
SET_SEED = 22
_MARKERS = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_FENCE = re.compile(r"(?s)\A\s*(```[^\n]*\n.*?\n\s*```)")
_SENTENCE_END = re.compile(r"[.!?](?:\s*\[\d+(?:\s*,\s*\d+)*\])*(?=\s+[\"'(\[`*|A-Z0-9]|\s*$)|\n\s*\n")


def normalise(text: str) -> str:
    """SQuAD-style normalisation: lower case, punctuation to spaces, no articles, single spaces."""
    text = re.sub(r"[^\w\s]", " ", text.casefold())
    return " ".join(_ARTICLES.sub(" ", text).split())


def has_fact(text: str, phrase: str) -> bool:
    """Whether ``phrase`` appears in ``text`` as whole words once both are normalised (markers removed)."""
    want = normalise(phrase)
    return bool(want) and f" {want} " in f" {normalise(_MARKERS.sub(' ', text))} "


def first_unit(reply: str) -> str:
    """What a reader sees first (see the module docstring)."""
    text = reply.strip()
    block = _leading_block(text)
    if block is not None:
        return block
    m = _SENTENCE_END.search(text)
    first = text[: m.end()].strip() if m else text
    if _MARKERS.sub("", first).rstrip().endswith(":"):
        follows = _leading_block(text[len(first) :].strip())
        if follows is not None:
            return f"{first}\n\n{follows}"
    return first


def _leading_block(text: str) -> str | None:
    """A fenced code block whole, or a table's header and first data row, at the start of ``text``."""
    fence = _FENCE.match(text)
    if fence:
        return fence.group(1)
    if text.startswith("|"):
        lines = text.splitlines()
        rows = [ln for ln in lines[1:] if ln.strip().startswith("|") and not re.fullmatch(r"[\s|:-]+", ln)]
        return "\n".join([lines[0], *rows[:1]])
    return None


def facts_found(text: str, facts: Sequence[Sequence[str]]) -> list[bool]:
    """Per group of alternatives: whether one of them is in ``text``."""
    return [any(has_fact(text, alt) for alt in group) for group in facts]


def score(question: Mapping[str, Any], reply_text: str, outcome: str, cited_docs: Sequence[str]) -> dict[str, Any]:
    """One question's row: the answer-level keys and what they were computed from."""
    answerable = question["kind"] != "out_of_kb"
    facts = question.get("facts") or []
    first = first_unit(reply_text)
    row: dict[str, Any] = {
        "id": question["id"],
        "kind": question["kind"],
        "question": question["question"],
        "outcome": outcome,
        "reply_chars": len(reply_text),
        "reply_words": len(reply_text.split()),
        "first_unit": first,
        "cited_docs": list(cited_docs),
    }
    if answerable:
        row["answer_at_1"] = bool(facts) and facts_found(first, facts[:1])[0]
        row["answer_any"] = bool(facts) and all(facts_found(reply_text, facts))
        row["false_none"] = outcome == "none"
        row["wrong_context"] = outcome == "context" and not row["answer_any"]
        sources = question.get("sources") or []
        row["cites_source"] = any(_same_doc(d, s) for d in cited_docs for s in sources) if sources else None
    else:
        row["honest_none"] = outcome == "none" and not cited_docs
    return row


def _same_doc(doc: str, source: str) -> bool:
    return doc == source or doc.endswith("/" + source) or source.endswith("/" + doc)


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The set's figures: answer@1, answer@any, false-none (answerable), honest-none (outside), reply length."""
    answerable = [r for r in rows if r["kind"] != "out_of_kb"]
    outside = [r for r in rows if r["kind"] == "out_of_kb"]
    comparisons = [r for r in answerable if r["kind"] == "comparison"]

    def share(items: Sequence[Mapping[str, Any]], key: str) -> float | None:
        judged = [r[key] for r in items if r.get(key) is not None]
        return sum(bool(v) for v in judged) / len(judged) if judged else None

    lengths = [r["reply_chars"] for r in answerable] or [0]
    return {
        "answerable": len(answerable),
        "out_of_kb": len(outside),
        "answer_at_1": share(answerable, "answer_at_1"),
        "answer_any": share(answerable, "answer_any"),
        "false_none": share(answerable, "false_none"),
        "wrong_context": share(answerable, "wrong_context"),
        "cites_source": share(answerable, "cites_source"),
        "comparison_answer_any": share(comparisons, "answer_any"),
        "honest_none": share(outside, "honest_none"),
        "reply_chars_median": statistics.median(lengths),
        "reply_chars_mean": statistics.mean(lengths),
        "outcomes": _counts(r["outcome"] for r in rows),
    }


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


def load_set(path: Path) -> list[dict[str, Any]]:
    """A question set: one JSON object a line (``id``, ``kind``, ``question``, ``facts``, ``sources``)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        if r.get("kind") not in ("answerable", "comparison", "out_of_kb"):
            raise ValueError(f"{path}: question {r.get('id')!r} has kind {r.get('kind')!r}")
    return rows


def split_set(rows: Sequence[Mapping[str, Any]], seed: int = SET_SEED) -> dict[str, list[str]]:
    """Question ids split once into ``tuning`` and ``validation`` halves: per kind, the sorted ids shuffled
    with ``random.Random(seed)``, first half tuning (so both halves hold each kind)."""
    out: dict[str, list[str]] = {"tuning": [], "validation": []}
    for kind in sorted({r["kind"] for r in rows}):
        ids = sorted(r["id"] for r in rows if r["kind"] == kind)
        random.Random(f"{seed}:{kind}").shuffle(ids)
        mid = (len(ids) + 1) // 2
        out["tuning"] += ids[:mid]
        out["validation"] += ids[mid:]
    return {
        "tuning": sorted(out["tuning"]),
        "validation": sorted(out["validation"]),
        "all": sorted(r["id"] for r in rows),
    }


def commit() -> str:
    """The checkout's short commit, with ``+dirty`` when the tree has uncommitted changes."""
    root = Path(__file__).parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def load_average() -> str:
    """The 1/5/15-minute load average, for the record beside every figure."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def log_validation(script: str, dataset: str, note: str, figures: Mapping[str, Any], out: Path) -> None:
    """Append one look at a validation half to :data:`VALIDATION_LOG` (created with its header if new)."""
    VALIDATION_LOG.parent.mkdir(parents=True, exist_ok=True)
    if not VALIDATION_LOG.exists():
        VALIDATION_LOG.write_text(
            "# Validation looks\n\n"
            "Every run of a benchmark on a validation half, appended by the script itself (at most one per "
            "finished change; thresholds are never chosen from these rows).\n\n"
            "| when (UTC) | commit | script | set | change | figures | results file | load |\n"
            "|---|---|---|---|---|---|---|---|\n",
            encoding="utf-8",
        )
    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M")
    shown = ", ".join(f"{k} {_fmt(v)}" for k, v in figures.items())
    rel = out.relative_to(Path(__file__).parent) if out.is_relative_to(Path(__file__).parent) else out
    line = f"| {when} | {commit()} | {script} | {dataset} | {note} | {shown} | {rel} | {load_average()} |\n"
    with VALIDATION_LOG.open("a", encoding="utf-8") as fh:
        fh.write(line)


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def unsupported_facts(questions: Sequence[Mapping[str, Any]], pages: Mapping[str, str]) -> list[str]:
    """Problems of a question set against its pages (doc id → text): an answerable question whose fact group
    no listed page holds, a listed page that does not exist, or a question outside the knowledge base that
    lists facts. Empty when the set is sound."""
    problems = []
    for q in questions:
        if q["kind"] == "out_of_kb":
            if q.get("facts") or q.get("sources"):
                problems.append(f"{q['id']}: outside the knowledge base but lists facts or sources")
            continue
        texts = []
        for source in q.get("sources") or []:
            found = [text for doc, text in pages.items() if _same_doc(doc, source)]
            if not found:
                problems.append(f"{q['id']}: source {source!r} is not a page of the corpus")
            texts += found
        for group in q.get("facts") or [[]]:
            if not any(has_fact(t, alt) for t in texts for alt in group):
                problems.append(f"{q['id']}: no listed page holds any of {group}")
    return problems
