"""Scripted answers to grading requests, per passage or per query (the batch form of one call per query)."""

from __future__ import annotations

from collections.abc import Callable

from ragloop.testing._recorded import RecordedRequest
from ragloop.testing._script import ScriptedResponse, json_reply

#: What starts each fenced passage of a grading prompt (see :mod:`ragloop.llm.prompts`).
_OPEN = "<<<UNTRUSTED_CONTEXT id="


def passages_of(request: RecordedRequest) -> list[str]:
    """The fenced passages of a grading request's user message, in order (their ids are 1…n)."""
    user = str(request.messages[-1].get("content") or "") if request.messages else ""
    return [part.split(">>>\n", 1)[-1].split("\n<<<END_UNTRUSTED_CONTEXT", 1)[0] for part in user.split(_OPEN)[1:]]


def is_batch(request: RecordedRequest) -> bool:
    """True for a per-query grading request (``OpenAIGrader.grade_batch``): it asks for ``verdicts``."""
    body = request.body if isinstance(request.body, dict) else {}
    fmt = body.get("response_format") or {}
    if (fmt.get("json_schema") or {}).get("name") == "relevance_verdicts":
        return True
    system = str(request.messages[0].get("content") or "") if request.messages else ""
    return '{"verdicts"' in system


def verdicts(request: RecordedRequest, label: str | Callable[[str], str], reason: str = "scripted") -> ScriptedResponse:
    """Answer a grading request, per-passage or batch, with ``label`` for every passage (or ``label(passage)``)."""
    pick = label if callable(label) else (lambda _text: label)
    passages = passages_of(request)
    if not is_batch(request):
        return json_reply({"label": pick(passages[0] if passages else ""), "reason": reason})
    items = [{"id": str(i), "label": pick(text), "reason": reason} for i, text in enumerate(passages, start=1)]
    return json_reply({"verdicts": items})
