"""answer: outcomes, numbered blocks, citations, streaming with fallbacks, salvage past the deadline."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop import END, Graph
from ragloop.events import Correction, RunFinished, Token
from ragloop.llm.offline import OfflineAnswerer
from ragloop.llm.offline.answer import NOT_COVERED
from ragloop.llm.offline.verify import OfflineVerifier
from ragloop.nodes.answer import CUT_BY_TIME, NOT_IN_TIME, build_blocks, decide_outcome, resolve_citations
from ragloop.state import ContextBlock, Decision, Graded, LiveLookup, TurnState, Verdict
from ragloop.testing import FakeAnswerer, make_hit
from ragloop.text.citations import MARKER, MARKER_RUN
from ragloop.text.terms import CorpusStats
from tests.strategies import OFFLINE_CORPUS, turn_node, with_queries

pytestmark = pytest.mark.anyio


class TestAnswer:
    async def test_outcomes(self) -> None:
        """context / partial / none / direct follow the roots' statuses."""
        state = with_queries("a", "b")
        state.queries["a"].status = "enough"
        state.queries["b"].status = "no_context"
        assert decide_outcome(state) == ("partial", ("b",))
        state.queries["b"].status = "enough"
        assert decide_outcome(state) == ("context", ())
        state.queries["a"].status = state.queries["b"].status = "short"
        assert decide_outcome(state) == ("none", ("a", "b"))
        state.decision = Decision(reply="hi")
        assert decide_outcome(state)[0] == "direct"
        assert decide_outcome(TurnState(question="x")) == ("none", ("x",))

    async def test_blocks_fair_and_unique(self) -> None:
        """Blocks interleave the queries, skip irrelevant hits and never repeat a chunk."""
        state = with_queries("a", "b")
        shared = make_hit("shared", chunk_id="s")
        for q, texts in (("a", ["a1", "a2"]), ("b", ["b1"])):
            for t in texts:
                state.graded.append(Graded(q, make_hit(t, chunk_id=t), Verdict("relevant")))
            state.graded.append(Graded(q, shared, Verdict("partial")))
        state.graded.append(Graded("a", make_hit("junk", chunk_id="j"), Verdict("irrelevant")))
        blocks = build_blocks(state, max_blocks=10)
        assert [b.chunk_id for b in blocks] == ["a1", "b1", "a2", "s"]
        assert [b.n for b in blocks] == [1, 2, 3, 4]

    def test_citations_resolved_and_invalid_dropped(self) -> None:
        """[n] markers resolve to blocks; markers naming no block are removed."""
        blocks = [ContextBlock(1, "t", "a.md", "A", "c1"), ContextBlock(2, "u", "b.md", "B", "c2")]
        text, cites, invalid = resolve_citations("Yes [1]. Also [2, 7]. Fake [9].", blocks)
        assert text == "Yes [1]. Also [2]. Fake ."
        assert [c.n for c in cites] == [1, 2] and invalid == [7, 9]

    async def test_streams_tokens_and_falls_back(self) -> None:
        """The primary answerer failing before any token hands over to the fallback."""
        state = with_queries("a")
        state.queries["a"].status = "enough"
        state.graded.append(Graded("a", make_hit("x", chunk_id="x"), Verdict("relevant")))
        node = turn_node("answer", answerer=FakeAnswerer(fail_after=0), fallback=FakeAnswerer())
        assert await node(state) == END
        assert state.answer == "context: [1]" and state.citations[0].chunk_id == "x"
        assert state.errors and "fake answerer failure" in state.errors[0]

    async def test_cut_stream_says_so(self) -> None:
        """A failure after some tokens keeps them and says the answer was cut off."""
        state = with_queries("a")
        state.queries["a"].status = "enough"
        state.graded.append(Graded("a", make_hit("x", chunk_id="x"), Verdict("relevant")))
        await turn_node("answer", answerer=FakeAnswerer(fail_after=1), fallback=FakeAnswerer())(state)
        assert state.answer.startswith("context:") and "cut off" in state.answer
        assert state.outcome == "partial"  # a reply cut short is never reported as a whole answer

    async def test_a_reply_cut_at_the_output_cap_is_partial(self) -> None:
        """The model stops at its output cap (JudgeTruncated) after some tokens: the reply keeps them, says it
        was cut at the output limit, and its outcome is partial, never context."""
        from ragloop.errors import JudgeTruncated

        class Capped:
            async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
                yield "Keys rotate [1] every"
                raise JudgeTruncated("finish_reason length")

        state = _answered()
        await turn_node("answer", answerer=Capped())(state)
        assert "output limit" in state.answer and state.outcome == "partial"


class _Stalls:
    """An answerer that streams ``tokens`` and then never finishes (a model that stalls mid-answer)."""

    def __init__(self, *tokens: str) -> None:
        self.tokens = tokens

    async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
        for token in self.tokens:
            yield token
        await anyio.sleep(60)


def _answered(*, direct: str | None = None) -> TurnState:
    """A state with one answered query and its relevant chunk (or a direct reply)."""
    if direct is not None:
        return TurnState(question="hi", decision=Decision(reply=direct))
    state = with_queries("a", question="how often do keys rotate", status="enough")
    state.graded.append(Graded("a", make_hit("Keys rotate every 90 days.", chunk_id="k"), Verdict("relevant")))
    return state


async def _run_past_deadline(node: object, state: TurnState) -> tuple[list[str], TurnState, str]:
    """Run ``node`` as a one-node graph's finish node under a deadline it overruns; its tokens and the trace."""
    graph = Graph({"answer": node}, start="answer", finish="answer", finish_grace_s=0.2)  # type: ignore[dict-item]
    tokens: list[str] = []
    result = None
    with anyio.fail_after(5):
        async for event in graph.stream(state, deadline_s=0.05):
            if isinstance(event, Token):
                tokens.append(event.text)
            elif isinstance(event, RunFinished):
                result = event.result
    assert result is not None
    return tokens, result.state, result.trace[-1].error or ""


class TestSalvage:
    async def test_streamed_tokens_kept_once_and_a_note_added(self) -> None:
        """Cut mid-stream by the deadline: the tokens already sent stay, none is sent twice, a note says why, and
        the outcome is partial (before: context, as if the answer were whole)."""
        node = turn_node("answer", answerer=_Stalls("Keys ", "rotate [1] "))
        tokens, state, error = await _run_past_deadline(node, _answered())
        assert tokens == ["Keys ", "rotate [1] ", CUT_BY_TIME]
        assert state.answer == ("Keys rotate [1] " + CUT_BY_TIME).strip()
        assert state.outcome == "partial" and [c.chunk_id for c in state.citations] == ["k"]  # cut: not context
        assert "salvaged" in error

    async def test_nothing_streamed_gives_the_extractive_answer(self) -> None:
        """Cut before the first token: the extractive answer from the chosen blocks, streamed once, cited."""
        offline = OfflineAnswerer()
        node = turn_node("answer", answerer=_Stalls(), extractive=offline)
        tokens, state, _ = await _run_past_deadline(node, _answered())
        expected = offline.compose(state.question, state.blocks, "context")
        assert tokens == [expected] and state.answer == expected.strip() and "90 days" in state.answer
        assert state.outcome == "context" and [c.chunk_id for c in state.citations] == ["k"]

    async def test_nothing_streamed_without_extractive_says_so(self) -> None:
        """With no composer, the reply is an honest "could not finish in time" and the outcome says none."""
        node = turn_node("answer", answerer=_Stalls())
        tokens, state, _ = await _run_past_deadline(node, _answered())
        assert tokens == [NOT_IN_TIME] and state.answer == NOT_IN_TIME
        assert state.outcome == "none" and state.missing == ("a",) and not state.citations

    async def test_direct_reply_needs_no_composer(self) -> None:
        """A small-talk turn cut before its first token still sends decide's reply."""
        node = turn_node("answer", answerer=_Stalls())
        tokens, state, _ = await _run_past_deadline(node, _answered(direct="Hello!"))
        assert tokens == ["Hello!"] and state.answer == "Hello!" and state.outcome == "direct"

    async def test_salvage_before_anything_was_chosen(self) -> None:
        """Called on a state the answer node never touched, salvage still chooses blocks and answers."""
        state = _answered()
        await turn_node("answer", answerer=_Stalls(), extractive=OfflineAnswerer()).salvage(state)
        assert state.outcome == "context" and state.blocks and "90 days" in state.answer

    async def test_failing_composer_falls_back_to_the_note(self) -> None:
        """A composer that raises is recorded; the reply is the honest note, never empty."""

        class Broken:
            def compose(self, *args: object, **kwargs: object) -> str:
                raise ValueError("no sentences")

        state = _answered()
        await turn_node("answer", answerer=_Stalls(), extractive=Broken()).salvage(state)
        assert state.answer == NOT_IN_TIME and "no sentences" in state.errors[-1]

    def test_default_turn_salvages_with_the_offline_fallback(self) -> None:
        """The default turn's answer node composes with the fallback answerer when it can (the offline one)."""
        offline = OfflineAnswerer()
        assert turn_node("answer", fallback_answerer=offline).extractive is offline
        assert turn_node("answer", fallback_answerer=FakeAnswerer()).extractive is None


class _Says:
    """An answerer (a model) that streams ``text`` word by word."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
        for word in self.text.split(" "):
            yield word + " "


async def _stream_events(node: object, state: TurnState) -> tuple[list[object], TurnState]:
    graph = Graph({"answer": node}, start="answer", finish="answer")  # type: ignore[dict-item]
    events: list[object] = []
    result = None
    with anyio.fail_after(5):
        async for event in graph.stream(state):
            events.append(event)
            if isinstance(event, RunFinished):
                result = event.result
    assert result is not None
    return events, result.state


class TestCorrection:
    async def test_a_streamed_sentence_verify_removes_is_taken_back_out_loud(self) -> None:
        """The model streams a claim its block does not support; verify removes it: a Correction event names
        it, the stream carries a note after it, and the final reply keeps the note, not the claim."""
        claim = "Keys are stored on the moon forever."
        node = turn_node(
            "answer", answerer=_Says(f"Keys rotate every 90 days. [1] {claim} [1]"), verifier=OfflineVerifier()
        )
        events, state = await _stream_events(node, _answered())
        corrections = [e for e in events if isinstance(e, Correction)]
        assert len(corrections) == 1 and corrections[0].removed == (claim,)
        tokens = "".join(e.text for e in events if isinstance(e, Token))
        assert claim in tokens and tokens.index(claim) < tokens.index("(Correction:")
        assert claim not in state.answer and "moon" not in state.answer
        assert state.answer.startswith("Keys rotate every 90 days. [1]")
        assert state.answer.endswith("(Correction: a sentence shown while this answer was streaming was removed, "
                                     "not supported by the cited passages.)")  # fmt: skip
        assert corrections[0].note == state.answer[state.answer.index("(Correction:") :]

    async def test_nothing_removed_no_correction(self) -> None:
        """A reply verify keeps whole sends no Correction event and no note."""
        node = turn_node("answer", answerer=_Says("Keys rotate every 90 days. [1]"), verifier=OfflineVerifier())
        events, state = await _stream_events(node, _answered())
        assert not any(isinstance(e, Correction) for e in events)
        assert "Correction" not in state.answer


def _paged() -> TurnState:
    """Four relevant blocks of three pages, in block order: a.md (two sections), b.md, a.md again, c.md."""
    state = with_queries("a", question="how do I rotate keys", status="enough")
    for i, (source, score) in enumerate([("a.md", 0.9), ("b.md", 0.8), ("a.md", 0.7), ("c.md", 0.6)], start=1):
        hit = make_hit(f"Keys rotate, part {i}.", score=score, source=source, chunk_id=f"k{i}")
        state.graded.append(Graded("a", hit, Verdict("relevant")))
    return state


class TestClientNumbers:
    """The numbers a client sees: one per page, 1..n in order of first citation, streamed already final."""

    @pytest.mark.parametrize("by_char", [False, True])
    async def test_streamed_final_and_citations_agree(self, by_char: bool) -> None:
        """Block markers [3], [2], [1][3], [4] stream as [1], [2], [1], [3] (blocks 1 and 3 are one page), word
        by word or character by character; the final text is the streamed one, and the citations list each
        page once, numbered as shown, with the sections it cites."""
        said = "Rotate first [3]. Then deploy [2]. Revoke the old key [1][3]. Done [4]."

        class _Chars(_Says):
            async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
                for ch in self.text:
                    yield ch

        node = turn_node("answer", answerer=(_Chars if by_char else _Says)(said))
        events, state = await _stream_events(node, _paged())
        streamed = "".join(e.text for e in events if isinstance(e, Token))
        assert [b.source for b in state.blocks] == ["a.md", "b.md", "a.md", "c.md"]
        assert (
            streamed.strip() == state.answer == "Rotate first [1]. Then deploy [2]. Revoke the old key [1]. Done [3]."
        )
        assert [(c.n, c.source) for c in state.citations] == [(1, "a.md"), (2, "b.md"), (3, "c.md")]
        assert [[s.chunk_id for s in c.sections] for c in state.citations] == [["k3", "k1"], ["k2"], ["k4"]]

    async def test_verify_reads_the_page_a_number_names(self) -> None:
        """A sentence citing a page is checked against that page's cited blocks: supported by its second
        section, it stays (the verifier sees the client's numbers, not the blocks')."""
        state = with_queries("a", question="how do keys rotate", status="enough")
        for i, text in enumerate(["Keys rotate every 90 days.", "Webhooks retry 8 times.", "Old keys are revoked."]):
            hit = make_hit(text, score=1 - i / 10, source="a.md" if i != 1 else "b.md", chunk_id=f"k{i}")
            state.graded.append(Graded("a", hit, Verdict("relevant")))
        said = "Keys rotate every 90 days. [1] Webhooks retry 8 times. [2] Old keys are revoked. [3]"
        node = turn_node("answer", answerer=_Says(said), verifier=OfflineVerifier())
        events, state = await _stream_events(node, state)
        assert not any(isinstance(e, Correction) for e in events)
        assert state.answer == "Keys rotate every 90 days. [1] Webhooks retry 8 times. [2] Old keys are revoked. [1]"
        assert [c.n for c in state.citations] == [1, 2]

    async def test_a_page_whose_sentence_is_taken_back_stays_listed(self) -> None:
        """Verify removes the only sentence citing page 2 after [1] [2] [3] streamed: the citations still run
        1, 2, 3 (the numbers the client was shown, no gap), and the final text cites only listed pages."""
        state = with_queries("a", question="how do keys rotate", status="enough")
        texts = ["Keys rotate every 90 days.", "Webhooks retry 8 times.", "Old keys are revoked."]
        for i, text in enumerate(texts):
            hit = make_hit(text, score=1 - i / 10, source=f"p{i}.md", chunk_id=f"k{i}")
            state.graded.append(Graded("a", hit, Verdict("relevant")))
        said = "Keys rotate every 90 days. [1] Keys are stored on the moon. [2] Old keys are revoked. [3]"
        node = turn_node("answer", answerer=_Says(said), verifier=OfflineVerifier())
        events, state = await _stream_events(node, state)
        assert [e.removed for e in events if isinstance(e, Correction)] == [("Keys are stored on the moon.",)]
        assert "[2]" not in state.answer and "[3]" in state.answer
        assert [(c.n, c.source) for c in state.citations] == [(1, "p0.md"), (2, "p1.md"), (3, "p2.md")]

    async def test_a_second_run_starts_numbering_afresh(self) -> None:
        """The answer node run again on a state it already answered numbers from 1 again (no stale pages)."""
        state = _paged()
        await turn_node("answer", answerer=_Says("Deploy [2]."))(state)
        await turn_node("answer", answerer=_Says("Rotate [4]."))(state)
        assert state.answer == "Rotate [1]." and [(c.n, c.source) for c in state.citations] == [(1, "c.md")]

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.sampled_from(["Keys", "rotate.", "[1]", "[2]", "[3]", "[4]", "[9]", "[1, 3]", "[2][4]", "arr[0]"]),
                 max_size=14),
        st.lists(st.integers(1, 5), max_size=30),
    )  # fmt: skip
    async def test_every_stream_agrees_with_its_reply(self, words: list[str], cuts: list[int]) -> None:
        """Whatever the answerer cites (markers of blocks of one page, of no block, in code) and however its
        tokens split: the streamed text is the final text, the citations are numbered 1..n, one per page, and
        every number in the text is one of them."""
        said = " ".join(words)
        pieces, i = [], 0
        for c in cuts:
            pieces.append(said[i : i + c])
            i += c
        pieces.append(said[i:])

        class _Pieces(_Says):
            async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
                for piece in pieces:
                    yield piece

        events, state = await _stream_events(turn_node("answer", answerer=_Pieces(said)), _paged())
        streamed = "".join(e.text for e in events if isinstance(e, Token))
        assert streamed.strip() == state.answer
        assert [c.n for c in state.citations] == list(range(1, len(state.citations) + 1))
        assert len({c.source for c in state.citations}) == len(state.citations)
        shown = {int(m.group(1)) for run in MARKER_RUN.finditer(state.answer) for m in MARKER.finditer(run.group())}
        assert shown == {c.n for c in state.citations}

    async def test_salvaged_extractive_answer_is_numbered_too(self) -> None:
        """Cut before the first token, the extractive answer streams in the client's numbers as well."""
        node = turn_node("answer", answerer=_Stalls(), extractive=OfflineAnswerer())
        tokens, state, _ = await _run_past_deadline(node, _paged())
        numbers = [int(n) for n in re.findall(r"\[(\d+)\]", "".join(tokens))]
        assert numbers and sorted(set(numbers)) == list(range(1, max(numbers) + 1))
        assert [c.n for c in state.citations] == sorted({c.n for c in state.citations})
        assert len({c.source for c in state.citations}) == len(state.citations)


STATS = CorpusStats.from_texts(OFFLINE_CORPUS)


def _found(question: str, *texts: str, roots: tuple[str, ...] = ("a",)) -> TurnState:
    """A state whose roots were answered by relevant hits of ``texts`` (confidence 0.8)."""
    state = with_queries(*roots, question=question, status="enough")
    for i, text in enumerate(texts):
        hit = make_hit(text, confidence=0.8, chunk_id=f"c{i}", title="Widgets")
        state.graded.append(Graded(roots[i % len(roots)], hit, Verdict("relevant")))
    return state


class TestAbstain:
    async def test_unsupported_passages_end_in_an_honest_none(self) -> None:
        """The search found passages, but about something else: outcome none, no block, nothing cited, and the
        reply says the knowledge base does not cover it, naming what it never mentions."""
        state = _found("How do I deploy Widgets on Kubernetes?", OFFLINE_CORPUS[0], OFFLINE_CORPUS[3])
        await turn_node("answer", answerer=OfflineAnswerer(STATS))(state)
        assert state.outcome == "none" and state.blocks == () and state.citations == ()
        assert state.missing == ("Kubernetes",) and state.abstention is not None
        assert state.answer.startswith(NOT_COVERED.split(",")[0]) and "“Kubernetes”" in state.answer
        assert not re.search(r"\[\d+\]", state.answer)

    async def test_supported_passages_are_answered(self) -> None:
        """Passages that answer the question are quoted and cited as before."""
        state = _found("How do I configure SSO in the admin console?", OFFLINE_CORPUS[0])
        await turn_node("answer", answerer=OfflineAnswerer(STATS))(state)
        assert state.outcome == "context" and state.citations and state.abstention is None

    async def test_the_other_parts_of_a_question_are_still_answered(self) -> None:
        """A name the corpus never mentions in one part of a two-part question: partial, naming it."""
        state = _found(
            "How do I configure SSO, and does it work with Kubernetes?",
            OFFLINE_CORPUS[0],
            OFFLINE_CORPUS[1],
            roots=("configure SSO", "does SSO work with Kubernetes"),
        )
        await turn_node("answer", answerer=OfflineAnswerer(STATS))(state)
        assert state.outcome == "partial" and "Kubernetes" in state.missing and state.citations

    async def test_exact_records_are_never_abstained_on(self) -> None:
        """A turn whose context came from a live lookup (a ticket) is answered whatever the score."""
        state = _found("What is the status of ticket #1234?", "Ticket 1234 is open: E2002 clock skew.")
        state.live.append(LiveLookup("ticket 1234", "tickets", ("1234",), accepted=("1234",)))
        await turn_node("answer", answerer=OfflineAnswerer(STATS))(state)
        assert state.outcome == "context" and state.abstention is None

    async def test_a_failing_abstainer_leaves_the_outcome(self) -> None:
        """An abstainer that raises is recorded; the reply is written as without one."""

        class Broken:
            def abstain(self, *args: object) -> None:
                raise ValueError("no statistics")

        state = _found("How do I configure SSO?", OFFLINE_CORPUS[0])
        await turn_node("answer", answerer=OfflineAnswerer(STATS), abstainer=Broken())(state)
        assert state.outcome == "context" and "no statistics" in state.errors[0]

    def test_the_default_turn_abstains_with_the_offline_answerer(self) -> None:
        """The default turn's answer node abstains through the offline answerer, first or as the fallback."""
        offline = OfflineAnswerer(STATS)
        assert turn_node("answer", answerer=offline).abstainer is offline
        assert turn_node("answer", fallback_answerer=offline).abstainer is offline
        assert turn_node("answer").abstainer is None

    @settings(max_examples=60, deadline=None)
    @given(
        st.sampled_from(OFFLINE_CORPUS).flatmap(
            lambda doc: st.tuples(
                st.just(doc),
                st.lists(
                    st.sampled_from([*doc.split(), "Kubernetes", "Trello", "how", "do", "I"]), min_size=1, max_size=8
                ),
                st.lists(st.sampled_from(OFFLINE_CORPUS), min_size=1, max_size=3),
            )
        )
    )
    async def test_abstaining_cites_nothing_and_answering_cites_only_what_it_quotes(
        self, case: tuple[str, list[str], list[str]]
    ) -> None:
        """Whatever the question and the passages: a reply with outcome none cites nothing and holds no
        marker; any other reply cites only blocks it quotes (each cited piece is text of a block of the page
        its number names)."""
        _, words, texts = case
        state = _found(" ".join(words) + "?", *texts)
        await turn_node("answer", answerer=OfflineAnswerer(STATS))(state)
        if state.outcome == "none":
            assert state.citations == () and not re.search(r"\[\d+\]", state.answer)
            return
        by_id = {b.chunk_id: b for b in state.blocks}
        page = {c.n: [by_id[s.chunk_id] for s in c.sections] for c in state.citations}
        for piece, n in re.findall(r"(.*?)\[(\d+)\]", state.answer, flags=re.DOTALL):
            assert any(_quotes(piece, b) for b in page[int(n)]), (piece, [b.text for b in page[int(n)]])


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _quotes(piece: str, block: ContextBlock) -> bool:
    """Every line of ``piece`` (a table's separator aside) is text of ``block``; a first line may carry the
    subject it was quoted after ("Widgets: it …")."""
    body = _norm(block.text + " " + block.title)
    for i, line in enumerate(ln for ln in piece.strip().splitlines() if ln.strip() and not set(ln) <= set("|-: ")):
        if i == 0 and ": " in line and _norm(line.split(": ", 1)[1]) in body:
            continue
        if _norm(line) not in body:
            return False
    return True
