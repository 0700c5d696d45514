"""The model path's answers, through the real ``openai`` SDK against the scripted OpenAI-compatible server: the
answer prompt asks for the answer first and honest abstention, and what the model sends back is held to the same
rules as the offline answer (no citation without a block, an abstaining reply cites nothing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ragloop.chat import ChatRAG, Reply
from ragloop.llm.prompts import ANSWER_FIRST, NOT_COVERED_REPLY
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, reply, stream, tool_calls, verdicts

pytestmark = pytest.mark.anyio


def _matcher(query: str, answer: str) -> Callable[[RecordedRequest], ScriptedResponse]:
    def match(request: RecordedRequest) -> ScriptedResponse:
        if request.judge == "decide":
            return tool_calls([("search", {"query": query})])
        if request.judge == "grade":
            return verdicts(request, "relevant")
        if request.judge == "rewrite":
            return reply(query)
        return stream(answer, chunk_size=4)

    return match


async def _ask(cache: Path, question: str, query: str, answer: str) -> tuple[Reply, list[RecordedRequest]]:
    async with (
        ScriptedOpenAIServer(matcher=_matcher(query, answer)) as server,
        server.client(max_retries=0) as client,
    ):
        rag = ChatRAG.sample(client, cache_dir=cache, fast_model="fast", answer_model="answer")
        result = await rag.ask(question)
        await rag.aclose()
        return result, [r for r in server.chat_requests if r.judge == "answer"]


def _markers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\[(\d+)\]", text)}


async def test_the_answer_prompt_asks_for_the_answer_first(sample_cache: Path) -> None:
    """The answer request carries the answer-first rules and the fenced, numbered blocks."""
    result, answers = await _ask(
        sample_cache, "How many times is a failed webhook retried?", "webhook retries", "Lumen retries 8 times [1]."
    )
    (request,) = answers
    system, user = str(request.messages[0]["content"]), str(request.messages[-1]["content"])
    assert ANSWER_FIRST in system and NOT_COVERED_REPLY in system
    assert "UNTRUSTED_CONTEXT" in user and "id=1" in user
    assert result.outcome == "context" and _markers(result.text) == {1} and result.citations


async def test_a_citation_of_a_block_that_does_not_exist_never_reaches_the_reply(sample_cache: Path) -> None:
    """The model cites [42] when only a few blocks were given: the marker is dropped, in the stream and the reply."""
    result, _ = await _ask(
        sample_cache, "How many times is a failed webhook retried?", "webhook retries", "Retried 8 times [1][42]."
    )
    assert 42 not in _markers(result.text) and {c.n for c in result.citations} <= {b.n for b in result.blocks}
    assert any("42" in e for e in result.record.errors)


async def test_a_model_that_says_the_docs_do_not_cover_it_makes_an_honest_none(sample_cache: Path) -> None:
    """Given blocks, the model finds no answer and says so (and cites a block anyway): the outcome is none and
    the reply cites nothing."""
    result, _ = await _ask(
        sample_cache,
        "How many times is a failed webhook retried?",
        "webhook retries",
        f"{NOT_COVERED_REPLY} The passages are about something else [1].",
    )
    assert result.outcome == "none" and not result.citations and not _markers(result.text)
    assert result.text.startswith(NOT_COVERED_REPLY)


async def test_weak_context_is_never_sent_to_the_model_as_an_answer(sample_cache: Path) -> None:
    """A question the knowledge base does not cover: the offline abstention makes the turn 'none' before the
    model answers, so the model gets no context blocks and the none prompt, and whatever it cites is dropped."""
    result, answers = await _ask(
        sample_cache,
        "How do I deploy Lumen on Kubernetes?",
        "deploy Lumen on Kubernetes",
        "Sure: use the Helm chart [1].",
    )
    (request,) = answers
    assert "UNTRUSTED_CONTEXT" not in str(request.messages[-1]["content"])
    assert NOT_COVERED_REPLY in str(request.messages[0]["content"])
    assert result.outcome == "none" and not result.citations and not _markers(result.text)
    assert result.record.abstention is not None and result.record.abstention.unknown == ("Kubernetes",)
