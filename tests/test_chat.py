"""The public chat API over the bundled sample knowledge base, offline (no model, no network)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from attrs import define, evolve

from ragloop.caches import Caches, MemoryCache
from ragloop.chat import ChatRAG, ReplyReady, validate_question
from ragloop.errors import InputError, UnknownFilterKey
from ragloop.events import Progress, RunResult, Token
from ragloop.retrievers.live import SQLiteTicketSource
from ragloop.runner import Graph
from ragloop.sample import sample_questions_path
from ragloop.turn import Turn, TurnRecord, turn_record

pytestmark = pytest.mark.anyio


@pytest.fixture
def rag(sample_cache: Path) -> ChatRAG:
    return ChatRAG.sample(cache_dir=sample_cache)


class TestValidation:
    def test_empty_and_whitespace(self) -> None:
        """An empty or whitespace question is a clear error."""
        for q in ("", "   \n\t "):
            with pytest.raises(InputError, match="question is empty"):
                validate_question(q)

    def test_too_long_is_an_error_not_a_truncation(self) -> None:
        """A 100 KB question is refused with the limit in the message."""
        with pytest.raises(InputError, match=r"102,400 characters; the limit is 8,000"):
            validate_question("a" * 102_400)

    def test_control_chars_and_surrogates_cleaned(self) -> None:
        """Control characters and lone surrogates are replaced, nothing else is lost."""
        assert validate_question("reset\x00 my\x07 password \ud800 now") == "reset my password \ufffd now"

    def test_not_a_string(self) -> None:
        """A non-string question names its type."""
        with pytest.raises(InputError, match="must be a string, got int"):
            validate_question(42)

    async def test_history_and_page_shapes(self, rag: ChatRAG) -> None:
        """Wrong history or page types are clear errors naming the position."""
        with pytest.raises(InputError, match=r"history\[1\] must be a Message"):
            rag.new_state("hi", history=[{"role": "user", "content": "a"}, {"who": "me"}])
        with pytest.raises(InputError, match="history must be a list"):
            rag.new_state("hi", history="user: hi")
        with pytest.raises(InputError, match="page_url must be a string"):
            rag.new_state("hi", page_url=3)
        with pytest.raises(InputError, match="deadline_s must be a positive number"):
            await rag.ask("hi", deadline_s=-1)

    @pytest.mark.parametrize("deadline", [True, False, float("nan"), float("inf"), 0, "5"])
    async def test_a_deadline_that_is_not_a_number_of_seconds_is_refused(self, rag: ChatRAG, deadline: object) -> None:
        """deadline_s=True (an int to Python, a one-second deadline to the turn) is refused like any non-number."""
        with pytest.raises(InputError, match="deadline_s must be a positive number of seconds"):
            await rag.ask("hi", deadline_s=deadline)  # type: ignore[arg-type]

    async def test_junk_url_is_harmless(self, rag: ChatRAG) -> None:
        """A junk page URL still yields an answer."""
        reply = await rag.ask("How long are deleted tasks kept in the trash?", page_url="::::not a url/%%%")
        assert reply.outcome == "context"


class TestSampleTurns:
    async def test_greeting_takes_no_search(self, rag: ChatRAG) -> None:
        """A greeting is answered directly, without retrieval."""
        reply = await rag.ask("Hello!")
        assert reply.outcome == "direct" and reply.record.path == ("decide", "answer")
        assert reply.text and not reply.citations

    async def test_single_topic_cites_the_right_page(self, rag: ChatRAG) -> None:
        """A single-topic question is answered from its page, with a resolved citation."""
        reply = await rag.ask("How many times does Lumen retry a failed webhook delivery?")
        assert reply.outcome == "context"
        assert "8 times" in reply.text
        assert any(c.source == "webhooks.md" for c in reply.citations)
        assert all(f"[{c.n}]" in reply.text for c in reply.citations)

    async def test_two_topics_two_queries(self, rag: ChatRAG) -> None:
        """A two-topic question searches twice and answers both topics from their pages (the audit log's
        retention is on its own page and in the retention table)."""
        reply = await rag.ask("How do I export my workspace data and how long is the audit log kept?")
        assert len(reply.record.decision.queries) == 2
        sources = {c.source for c in reply.citations}
        assert "data-export.md" in sources and sources & {"audit-log.md", "data-retention-and-deletion.md"}
        assert "Export workspace" in reply.text and "1 year" in reply.text

    async def test_ticket_goes_live_and_rejects_neighbours(self, sample_cache: Path) -> None:
        """A ticket question reaches the live source; neighbouring tickets with other ids are rejected."""
        source = SQLiteTicketSource(related=True, require_caller=False)
        rag = ChatRAG.sample(cache_dir=sample_cache, live_sources=(source,))
        reply = await rag.ask("What is the status of ticket #1234?")
        await rag.aclose()
        assert "live" in reply.record.path
        lookup = reply.record.live[0]
        assert lookup.accepted == ("1234",) and lookup.mismatches and "1234" not in lookup.mismatches
        assert any(c.source.endswith("/tickets/1234") for c in reply.citations)
        assert not any(c.source.endswith(f"/tickets/{m}") for m in lookup.mismatches for c in reply.citations)

    async def test_record_is_json_ready(self, rag: ChatRAG) -> None:
        """The decision record serialises to JSON with the documented keys."""
        reply = await rag.ask("What does error E1002 mean?")
        data = json.loads(json.dumps(reply.as_dict()))
        for key in (
            "path",
            "queries",
            "fast_path",
            "grades",
            "fail_open",
            "live",
            "rewrites",
            "stopped_by",
            "llm_calls",
            "tokens",
            "outcome",
        ):
            assert key in data["record"]
        assert data["record"]["llm_calls"] == 0 and data["outcome"] == "context"

    async def test_stream_events(self, rag: ChatRAG) -> None:
        """stream() yields progress, tokens that add up to the reply, and ReplyReady last."""
        events = [e async for e in rag.stream("What is the maximum size of a CSV import file?")]
        assert any(isinstance(e, Progress) and e.kind == "retrieved" for e in events)
        last = events[-1]
        assert isinstance(last, ReplyReady)
        tokens = "".join(e.text for e in events if isinstance(e, Token))
        assert tokens.strip() and last.reply.text.startswith(tokens.strip()[:40])

    async def test_stream_checks_input_before_any_event(self, rag: ChatRAG) -> None:
        """A bad question is refused by the stream() call itself, before a turn starts."""
        with pytest.raises(InputError, match="question is empty"):
            rag.stream("   ")

    async def test_stream_as_context_manager(self, rag: ChatRAG) -> None:
        """`async with rag.stream(q) as events` runs the turn in a task group and ends with ReplyReady."""
        async with rag.stream("What is the maximum size of a CSV import file?") as events:
            seen = [e async for e in events]
        assert isinstance(seen[-1], ReplyReady) and seen[-1].reply.text

    async def test_break_with_stream_still_held_cancels_the_turn(self, rag: ChatRAG, sample_cache: Path) -> None:
        """`break` out of `async for` stops the turn even while the caller still holds the stream object."""
        import anyio

        entered, cancelled = anyio.Event(), anyio.Event()
        decide = rag.nodes["decide"]

        class Hang:
            routes = decide.routes

            async def __call__(self, state: object) -> str:
                entered.set()
                try:
                    await anyio.sleep(30)
                finally:
                    cancelled.set()
                return "answer"

        rag = ChatRAG(Turn.sample(cache_dir=sample_cache).replace("decide", Hang()))
        events = rag.stream("How do I rotate an API key?")
        async for _ in events:
            await entered.wait()
            break
        with anyio.fail_after(2):
            await cancelled.wait()
        await events.aclose()

    async def test_every_sample_question_ends_with_an_outcome(self, rag: ChatRAG) -> None:
        """Every bundled sample question gets an answer and one of the four outcomes."""
        for line in sample_questions_path().read_text().splitlines():
            q = json.loads(line)
            reply = await rag.ask(q["question"], page_url=q.get("page_url"))
            assert reply.outcome in ("context", "partial", "none", "direct")
            assert reply.text and reply.record.stopped_by == "end"


def test_terminal_escapes_are_dropped_whole() -> None:
    """Pasted ANSI colour codes vanish instead of becoming search terms like '[31m'."""
    assert validate_question("\x1b[31mreset\x1b[0m my password") == "reset my password"


class TestClientUrl:
    """Reply.client_dict hands a client only http(s) and relative links (issue 20: front-matter javascript: URLs)."""

    @pytest.mark.parametrize(
        "url",
        ["https://docs.example.com/sso", "http://intranet/x", "/docs/api-keys.md", "guides/sso.md", "x.md#part"],
    )
    def test_http_and_relative_links_pass(self, url: str) -> None:
        """Links a browser opens as pages stay as they are."""
        from ragloop.chat import client_url

        assert client_url(url) == url

    @pytest.mark.parametrize(
        "url",
        [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            "java\tscript:alert(1)",
            " javascript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "vbscript:msgbox",
            "file:///etc/passwd",
            "//evil.example/x",
            "/\\evil.example",
            "https:evil",
            "https:///x",
            "\x01https://x",
        ],
    )
    def test_other_links_are_dropped(self, url: str) -> None:
        """Script, data and file links, protocol-relative links and URLs with controls become None."""
        from ragloop.chat import client_url

        assert client_url(url) is None

    def test_a_front_matter_javascript_url_never_reaches_client_dict(self) -> None:
        """A citation whose document set url: javascript:… has url None in the client shape."""
        from ragloop.chat import Reply
        from ragloop.state import Citation
        from ragloop.turn import DecisionRecord, TokenCounts, TurnRecord

        cites = (
            Citation(1, "evil.md", "Evil", "c1", url="javascript:alert(1)"),
            Citation(2, "https://ok.example/a", "Ok", "c2"),
        )
        decision = DecisionRecord(direct=False, reason="", queries=())
        record = TurnRecord(  # the client shape names the turn (turn_id), so the reply needs its record
            run_id="r1", path=(), timings={}, stopped_by="end", seconds=0.0, decision=decision, queries=(),
            fast_path=False, grades=(), fail_open=0, live=(), rewrites=(), hops=(), outcome="context", missing=(),
            llm_calls=0, tokens=TokenCounts(0, 0, 0), calls=(), errors=(),
        )  # fmt: skip
        reply = Reply("x [1] [2]", "context", cites, (), (), record)
        out = reply.client_dict()
        assert [c["url"] for c in out["citations"]] == [None, "https://ok.example/a"]
        assert out["citations"][0]["source"] == "evil.md"


class TestReadsThroughItsTurn:
    """A chat holds its built turn and reads every part from it: replacing a part changes the next turn."""

    QUESTION = "How many times does Lumen retry a failed webhook delivery?"

    async def test_a_replaced_graph_runs_the_next_ask_and_stream(self, rag: ChatRAG) -> None:
        """``rag.turn = evolve(rag.turn, graph=...)``: ``ask`` and ``stream`` run the new graph."""
        seen: list[str] = []

        def summarize(result: RunResult) -> TurnRecord:
            seen.append(result.run_id)
            return turn_record(result)

        g = rag.turn.graph
        graph = Graph(
            g.nodes, start=g.start, finish=g.finish, edges=g.edges, max_steps=g.max_steps, summarize=summarize
        )
        rag.turn = evolve(rag.turn, graph=graph)
        assert rag.graph is graph and rag.nodes == graph.nodes
        reply = await rag.ask(self.QUESTION)
        assert seen == [reply.turn_id] and "8 times" in reply.text
        async with rag.stream(self.QUESTION) as events:
            last = [e async for e in events][-1]
        assert isinstance(last, ReplyReady) and seen == [reply.turn_id, last.reply.turn_id]

    async def test_replaced_caches_are_the_ones_the_next_ask_uses(self, rag: ChatRAG) -> None:
        """Caches with a reply cache swapped into the built turn: the second ask is answered from it."""
        assert rag.caches is None or rag.caches.replies is None
        rag.turn = evolve(rag.turn, caches=Caches(replies=MemoryCache()))
        first, second = await rag.ask(self.QUESTION), await rag.ask(self.QUESTION)
        assert first.record.cache_hits.get("reply") is None
        assert second.record.cache_hits == {"reply": 1} and second.text == first.text

    async def test_replaced_settings_set_the_next_turns_deadline(self, rag: ChatRAG) -> None:
        """The deadline a turn gets comes from the built turn's settings as they are now."""
        rag.turn = evolve(rag.turn, settings=evolve(rag.settings, deadline_s=float("nan")))
        assert math.isnan(rag.settings.deadline_s or 0.0)
        with pytest.raises(InputError, match="deadline_s must be a positive number"):
            await rag.ask(self.QUESTION)

    async def test_a_replaced_retriever_is_the_one_filters_are_checked_against(self, rag: ChatRAG) -> None:
        """Filter keys are checked against the retriever of the built turn as it is now."""
        with pytest.raises(UnknownFilterKey):
            rag.check_filters({"tier": ("gold",)})
        rag.turn = evolve(rag.turn, retriever=_KnowsKeys(frozenset({"tier"})))
        rag.check_filters({"tier": ("gold",)})
        with pytest.raises(UnknownFilterKey, match="tier"):
            rag.check_filters({"tenant": ("acme",)})


@define
class _KnowsKeys:
    """A retriever that only says which metadata keys it knows (what filter checks read)."""

    keys: frozenset[str]

    def metadata_keys(self) -> frozenset[str]:
        return self.keys

    async def search(self, query: str, k: int, filters: object = None) -> list[object]:
        return []
