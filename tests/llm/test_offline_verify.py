"""The offline verifier and the answer node's bounded verify step."""

from __future__ import annotations

from typing import Any

import pytest

from ragloop.llm.offline.verify import OfflineVerifier, reply_sentences
from ragloop.nodes.answer import verify_reply
from ragloop.retrievers.embed import HashEmbedder
from ragloop.state import ContextBlock, Decision, TurnState, Verification

pytestmark = pytest.mark.anyio

TEMPLE = ContextBlock(
    1,
    "Shirley Temple was an American actress and diplomat. She served as Chief of Protocol of the United States.",
    title="Shirley Temple",
)
FILM = ContextBlock(2, "Kiss and Tell is a 1945 American comedy film starring Shirley Temple as Corliss Archer.")
QUESTION = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"


class TestReplySentences:
    def test_cited_sentences_and_their_blocks(self) -> None:
        """Sentences carrying [n] come back with their block numbers; uncited notes are skipped."""
        text = "One thing [1]. Another [1][2].\n\nI could not confirm: x."
        assert reply_sentences(text) == [("One thing .", (1,)), ("Another .", (1, 2))]


class TestOfflineVerifier:
    async def test_supported_reply_covering_the_question(self) -> None:
        """A reply quoting its blocks and naming every key term of the question passes."""
        reply = (
            "Kiss and Tell is a 1945 American comedy film starring Shirley Temple as Corliss Archer. [2] "
            "She served as Chief of Protocol of the United States, a government position she held. [1]"
        )
        found = await OfflineVerifier().verify(QUESTION, reply, [TEMPLE, FILM])
        assert found.unsupported == ()
        assert found.checked == 2

    async def test_unsupported_sentence_is_listed(self) -> None:
        """A sentence whose terms the cited block lacks is unsupported."""
        reply = "Shirley Temple was an American actress. [1] She was elected mayor of Paris in 1990. [1]"
        found = await OfflineVerifier().verify("Who was Shirley Temple?", reply, [TEMPLE])
        assert found.unsupported == ("She was elected mayor of Paris in 1990.",)

    async def test_uncovered_terms_are_named(self) -> None:
        """Key terms of the question that the reply never mentions are uncovered; framing words are not."""
        reply = "Kiss and Tell is a 1945 American comedy film starring Shirley Temple as Corliss Archer. [2]"
        found = await OfflineVerifier().verify(QUESTION, reply, [TEMPLE, FILM])
        assert {"government", "position", "held"} <= set(found.uncovered)
        assert "film" not in found.uncovered

    @pytest.mark.parametrize("adverb", ["already", "just", "ever", "yet", "anyway"])
    async def test_an_adverb_around_the_question_is_never_uncovered(self, adverb: str) -> None:
        """ "Can I send back earbuds I already opened?" answered from the returns page is not ``partial`` for want
        of "already": an adverb a user says around what they ask about is no key term."""
        block = ContextBlock(1, "Worn shoes, opened earphones and gift cards cannot be returned.", title="Returns")
        reply = "Worn shoes, opened earphones and gift cards cannot be returned. [1]"
        found = await OfflineVerifier().verify(f"Can I {adverb} return opened earphones?", reply, [block])
        assert found.uncovered == ()

    async def test_current_is_still_a_term(self) -> None:
        """ "currently" is no framing word: its stem is "current", which names what "current incidents" asks about."""
        block = ContextBlock(1, "Past incidents are listed on the status page.", title="Status")
        reply = "Past incidents are listed on the status page. [1]"
        found = await OfflineVerifier().verify("Where can I see current incidents?", reply, [block])
        assert found.uncovered == ("current",)

    async def test_dense_support_rescues_a_paraphrase(self) -> None:
        """With an embedder, a sentence identical in meaning to a block sentence is supported by cosine."""
        sentence = "Shirley Temple was an American actress and diplomat."
        block = ContextBlock(1, sentence)
        strict = OfflineVerifier(min_support=1.01)
        assert (await strict.verify("x", f"{sentence} [1]", [block])).unsupported
        dense = OfflineVerifier(min_support=1.01, min_cosine=0.99, embedder=HashEmbedder())
        assert (await dense.verify("x", f"{sentence} [1]", [block])).unsupported == ()


class TestVerifyStep:
    def _state(self, answer: str) -> TurnState:
        state = TurnState(question=QUESTION, decision=Decision(queries=(QUESTION,)))
        state.outcome, state.blocks, state.answer = "context", (TEMPLE, FILM), answer
        return state

    async def test_unsupported_sentence_dropped_and_outcome_downgraded(self) -> None:
        """The verify step drops the unsupported sentence, says so, and turns context into partial naming
        the uncovered terms; the record keeps what it found."""
        state = self._state(
            "Kiss and Tell is a 1945 American comedy film starring Shirley Temple as Corliss Archer. [2] "
            "She was elected mayor of Paris in 1990. [1]"
        )
        await verify_reply(OfflineVerifier(), state)
        assert "mayor" not in state.answer
        assert "(Correction: a sentence shown while this answer was streaming was removed" in state.answer
        assert state.outcome == "partial"
        assert "government" in state.missing
        assert "The passages I found don't mention “government”" in state.answer
        assert state.verification is not None and state.verification.downgraded

    async def test_covered_reply_keeps_context(self) -> None:
        """A supported reply covering the question keeps outcome context and its text."""
        text = (
            "In the 1945 American comedy film Kiss and Tell, the woman who portrayed Corliss Archer was Shirley "
            "Temple. [2] She served as Chief of Protocol of the United States, a government position she held. [1]"
        )
        state = self._state(text)
        await verify_reply(OfflineVerifier(), state)
        assert state.outcome == "context" and state.answer == text
        assert state.verification == Verification(checked=2)

    async def test_failing_verifier_leaves_the_reply(self) -> None:
        """A verifier that raises is recorded as an error; the reply and outcome stay."""

        class Broken:
            async def verify(self, question: str, reply: str, blocks: object) -> Verification:
                raise RuntimeError("boom")

        state = self._state("Anything [1].")
        await verify_reply(Broken(), state)  # type: ignore[arg-type]
        assert state.outcome == "context" and state.answer == "Anything [1]."
        assert state.errors and "boom" in state.errors[0]


def test_a_table_is_cited_by_the_marker_on_the_line_after_it() -> None:
    """A quoted table followed by its own `[n]` line counts as a cited sentence of block n."""
    from ragloop.llm.offline.verify import reply_sentences

    reply = "Items go to the trash. [1]\n\n| Data | Kept for |\n|---|---|\n| Trash | 30 days |\n\n[2]"
    found = reply_sentences(reply)
    assert found[0] == ("Items go to the trash.", (1,))
    assert found[1][1] == (2,) and "| Trash | 30 days |" in found[1][0]


class _Synonyms:
    """An embedder where the words of one group share a direction (a stand-in for MiniLM's word similarity)."""

    name = "synonyms"
    dim = 4
    GROUPS = ({"guarantee", "warranty"}, {"laptop"}, {"phone"})

    async def embed(self, texts: list[str]) -> Any:
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            group = next((g for g, words in enumerate(self.GROUPS) if text.lower() in words), len(self.GROUPS))
            out[i, group] = 1.0
        return out


class TestCoverageByMeaning:
    @pytest.mark.anyio
    async def test_a_term_said_in_other_words_is_covered(self) -> None:
        """ "guarantee" is covered by a reply about the "warranty" when the embedder says they mean the same;
        without an embedder it stays uncovered, and a term nothing means ("phone") stays uncovered with one."""
        block = ContextBlock(1, "Every laptop carries a two-year warranty.", title="Warranty")
        reply = "Every laptop carries a two-year warranty. [1]"
        meant = await OfflineVerifier(embedder=_Synonyms()).verify(
            "How long is the guarantee on a laptop?", reply, [block]
        )
        assert meant.uncovered == ()
        exact = await OfflineVerifier().verify("How long is the guarantee on a laptop?", reply, [block])
        assert exact.uncovered == ("guarantee",)
        # every sentence shares one direction in this stand-in: the lead-means rule is off to test words alone
        words = OfflineVerifier(embedder=_Synonyms(), min_lead_cosine=None)
        other = await words.verify("Is the phone covered?", reply, [block])
        assert other.uncovered == ("phone",)


class _Cosines:
    """An embedder giving each known text a unit vector at a set cosine to the question's (the first text)."""

    name = "cosines"
    dim = 256

    def __init__(self, question: str, cosines: dict[str, float]) -> None:
        self.question, self.cosines = question, cosines

    async def embed(self, texts: list[str]) -> Any:
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            if text == self.question or text in self.cosines:
                c = self.cosines.get(text, 1.0)
                out[i, :2] = [c, float(np.sqrt(max(0.0, 1.0 - c * c)))]
            else:  # any other text (a word): a direction of its own, unrelated to every other
                out[i, 2 + sum(map(ord, text)) % (self.dim - 2)] = 1.0
        return out


class TestFillerIsNotPartial:
    BLOCK = ContextBlock(
        1,
        "Every plan includes the free weights area and the group classes; the sauna is included only in Annual.",
        title="Memberships",
    )
    REPLY = "Every plan includes the free weights area and the group classes; the sauna is included only in Annual. [1]"
    QUESTION = "Is the sauna part of the monthly deal?"

    @pytest.mark.anyio
    async def test_a_lead_that_means_the_question_leaves_nothing_missing(self) -> None:
        """ "deal" only frames the question the lead answers (cosine 0.71 under MiniLM): no gap is named, so the
        reply stays ``context`` (failed before: ``partial``, "The passages I found don't mention “deal”")."""
        lead = self.REPLY.removesuffix(" [1]")
        found = await OfflineVerifier(embedder=_Cosines(self.QUESTION, {lead: 0.71})).verify(
            self.QUESTION, self.REPLY, [self.BLOCK]
        )
        assert found.uncovered == ()

    @pytest.mark.anyio
    async def test_a_lead_about_something_else_still_names_the_gap(self) -> None:
        """Under ``min_lead_cosine`` (a lead about the opening hours for "parking", 0.43), or without an
        embedder, the uncovered term is named as before."""
        block = ContextBlock(1, "The club is open from 6 am to 10 pm on weekdays.", title="Opening hours")
        reply = "The club is open from 6 am to 10 pm on weekdays. [1]"
        question = "Is there parking at the club?"
        far = OfflineVerifier(embedder=_Cosines(question, {reply.removesuffix(" [1]"): 0.43}))
        assert (await far.verify(question, reply, [block])).uncovered == ("parking",)
        assert (await OfflineVerifier().verify(question, reply, [block])).uncovered == ("parking",)
