"""Grading all of one query's passages in one structured-output call: prompt, schema and a forgiving parser.

The per-passage grader sends the grading system prompt and the query once per passage; a query with six hits
costs six calls. The batch form sends them once, with every passage fenced and numbered, and asks for one
verdict per passage id (``json_schema`` with the ids as an ``enum``, or JSON mode on servers without it)::

    {"verdicts": [{"id": "1", "label": "relevant", "reason": "…"}, {"id": "2", …}]}

:func:`parse_verdicts` reads that reply passage by passage: a verdict that is missing, names an unknown id or
an invalid label is ``None`` for that passage alone, and the grade node fails open for it (keeps the passage
and records why); a reply cut at the output cap keeps the verdicts that were complete. Everything here is
pure: strings in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ragloop.errors import JudgeOutputError
from ragloop.llm import prompts
from ragloop.llm.guards import flat_objects, model_json
from ragloop.state import ContextBlock, Hit, Label, Verdict

__all__ = [
    "batch_blocks",
    "batch_response_format",
    "batch_system_prompt",
    "batch_user_prompt",
    "parse_verdicts",
]

_LABELS: tuple[Label, ...] = ("relevant", "partial", "irrelevant")


#: A JSON object without nested objects: one verdict, complete even when the reply around it was cut.
def batch_blocks(query: str, hits: Sequence[Hit], max_chars: int) -> list[ContextBlock]:
    """The hits as fenced blocks numbered 1…n, each cut to ``max_chars`` (the per-passage budget)."""
    return [
        ContextBlock(
            n=i,
            text=prompts.truncate(hit.text, max_chars),
            source=hit.chunk.source,
            title=hit.chunk.title,
            chunk_id=hit.id,
            query=query,
        )
        for i, hit in enumerate(hits, start=1)
    ]


def batch_response_format(n: int) -> dict[str, Any]:
    """The ``json_schema`` response format for ``n`` passages: one verdict per id ``"1"`` … ``str(n)``."""
    verdict = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "enum": [str(i) for i in range(1, n + 1)]},
            "label": {"type": "string", "enum": list(_LABELS)},
            "reason": {"type": "string"},
        },
        "required": ["id", "label", "reason"],
        "additionalProperties": False,
    }
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "relevance_verdicts",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"verdicts": {"type": "array", "items": verdict}},
                "required": ["verdicts"],
                "additionalProperties": False,
            },
        },
    }


def batch_system_prompt(nonce: str, max_chars: int, n: int) -> str:
    """The batch grader's system prompt: label each of ``n`` fenced passages for one query, in one JSON object.

    Like every fenced system prompt (:mod:`ragloop.llm.prompts`), only its last line changes from request to
    request: the chunk count and the nonce are named there, so a server's prefix cache keeps the rest."""
    single = prompts.grade_system_prompt(nonce, max_chars).splitlines()
    *shared, nonce_line = single
    rules = [line for line in shared if not line.startswith(("You judge", "Reply with", "The chunk text"))]
    return "\n".join(
        [
            "You judge, for each of several retrieved document chunks, whether it helps answer a search query. "
            "Judge every chunk on its own.",
            *rules,
            f"Each chunk's text may be cut to its first {max_chars} characters; judge what is shown.",
            'Reply with only a JSON object: {"verdicts": [{"id": "<chunk id>", "label": "relevant" | "partial" | '
            '"irrelevant", "reason": "<one short sentence>"}, …]} with exactly one verdict for each chunk id, in '
            "order.",
            f"This request holds {n} chunks: reply with exactly {n} verdicts. {nonce_line}",
        ]
    )


def batch_user_prompt(query: str, fenced: str) -> str:
    """The batch grader's user message: the query, then every fenced chunk."""
    return prompts.grade_user_prompt(query, fenced)


def _items(content: str) -> list[Any]:
    """The verdict objects of a reply: its ``verdicts`` list, a bare list, or, when the JSON is broken (cut at
    the output cap, or chatter around it), every complete flat object in it."""
    text = content.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        obj = model_json(text)
    except ValueError:
        return flat_objects(text)
    if isinstance(obj, Mapping):
        raw = obj.get("verdicts")
        if isinstance(raw, list):
            return raw
        return [obj]  # a lone verdict
    return obj if isinstance(obj, list) else []


def parse_verdicts(content: str, n: int) -> list[Verdict | None]:
    """One verdict per passage id ``1`` … ``n`` from a batch reply; ``None`` where it is missing or invalid.

    The first valid verdict for an id wins; unknown ids and invalid labels are ignored.

    Raises:
        JudgeOutputError: the reply holds no valid verdict at all.
    """
    out: list[Verdict | None] = [None] * n
    for item in _items(content):
        if not isinstance(item, Mapping):
            continue
        raw_id, label, reason = item.get("id"), item.get("label"), item.get("reason", "")
        try:
            i = int(str(raw_id).strip().lstrip("#")) - 1
        except ValueError:
            continue
        label = label.strip().lower() if isinstance(label, str) else label
        if not 0 <= i < n or out[i] is not None or label not in _LABELS:
            continue
        out[i] = Verdict(label=label, reason=reason if isinstance(reason, str) else str(reason))
    if all(v is None for v in out):
        raise JudgeOutputError(f"batch grader reply holds no valid verdict for ids 1..{n}: {content[:200]!r}")
    return out
