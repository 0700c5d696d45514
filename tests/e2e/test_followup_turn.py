"""A follow-up through the model path: the real ``openai`` SDK against the scripted server, over the sample index.

The history reaches the decide call with the follow-up last, the decide prompt asks for the whole question, and
the model's standalone query (not the elliptical text) is what the turn searches, grades and records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.chat import ChatRAG
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream, tool_calls, verdicts

pytestmark = pytest.mark.anyio

FIRST = "How many API requests per minute can a key make on the Team plan?"
FIRST_REPLY = "A key on the Team plan can make 300 requests per minute [1]."
STANDALONE = "API requests per minute per key on the Business plan"


def _model(request: RecordedRequest) -> ScriptedResponse:
    if request.judge == "decide":
        return tool_calls([("search", {"query": STANDALONE})])
    if request.judge == "grade":
        return verdicts(request, lambda text: "relevant" if "1,000" in text else "irrelevant")
    return stream("On Business a key can make 1,000 requests per minute [1].", chunk_size=8)


class TestModelFollowUp:
    async def test_history_reaches_the_model_and_the_standalone_query_is_searched(self, sample_cache: Path) -> None:
        """ "and on Business?" with the first turn as history: the decide request carries both earlier messages
        before the follow-up and the write-it-out instruction; the turn searches and grades the model's
        standalone query and answers from the rate-limit page."""
        from ragloop.sample import sample_index

        index = sample_index(sample_cache)
        history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": FIRST_REPLY}]
        async with ScriptedOpenAIServer(matcher=_model) as server, server.client() as client:
            rag = ChatRAG.from_index(index, client, fast_model="fast", answer_model="answer", live_sources=())
            reply = await rag.ask("and on Business?", history=history)
            requests = list(server.chat_requests)
        decide = next(r for r in requests if r.judge == "decide")
        assert [(m["role"], m["content"]) for m in decide.messages[1:]] == [
            ("user", FIRST),
            ("assistant", FIRST_REPLY),
            ("user", "and on Business?"),
        ]
        assert "write it out whole" in decide.messages[0]["content"]
        assert reply.record.decision is not None and reply.record.decision.queries == (STANDALONE,)
        assert reply.record.queries[0].text == STANDALONE
        graded = [r for r in requests if r.judge == "grade"]
        assert graded and all(STANDALONE in str(r.messages) for r in graded)
        assert "and on Business" not in str([r.messages for r in graded])
        assert reply.outcome == "context"
        assert {c.source for c in reply.citations} <= {"api-rate-limits.md", "plans-and-pricing.md"}
        assert "1,000" in reply.text
