"""The report from logged turns: which turns count, the cause of each, ranking by users, trend, stale pages,
private logs, and the same report for the same log however it is ordered."""

from __future__ import annotations

import json
import random

import pytest

from ragloop.gaps import build_report, draft_cases, is_gap, turn_cause
from ragloop.state import StaleSource
from ragloop.turnlog import Conflict, LoggedHit, LoggedQuery, LoggedTurn, TurnRow

DAY = 86_400.0
T0 = 1_746_403_200.0  # 2025-05-05


def _turn(
    n: int,
    question: str,
    outcome: str = "none",
    *,
    user: str = "u",
    at: float = T0,
    unfound: tuple[str, ...] = (),
    rating: str | None = None,
    private: bool = False,
    **fields: object,
) -> LoggedTurn:
    from ragloop.text.terms import key_terms

    terms = tuple(t.surface for t in key_terms(question))
    row = TurnRow(
        turn_id=f"t{n:04d}",
        at=at,
        principal=user,
        user=user,
        tenant=None,
        question=None if private else question,
        question_hash=question.lower(),
        terms=terms,
        outcome=outcome,
        unfound=unfound,
        **fields,  # type: ignore[arg-type]
    )
    return LoggedTurn(row, rating=rating)  # type: ignore[arg-type]


def _hit(source: str, confidence: float = 0.5, label: str = "irrelevant") -> LoggedHit:
    return LoggedHit("c-" + source, source, source.removesuffix(".md"), 0.03, confidence, label)


class TestCause:
    @pytest.mark.parametrize(
        ("turn", "cause"),
        [
            (_turn(1, "Zapier app?", unfound=("zapier",), hits=(_hit("a.md"),)), "no_passage"),
            (_turn(2, "Zapier app?"), "no_passage"),  # nothing retrieved at all
            (_turn(3, "Guest invoices?", hits=(_hit("billing.md"),)), "irrelevant"),
            (_turn(4, "Import from Asana?", "partial", unfound=("asana",)), "partial"),
            # the answer step abstained on pages about importing that never name Asana: partly covered
            (
                _turn(
                    8,
                    "Import from Asana?",
                    unfound=("asana",),
                    hits=(_hit("import.md", 0.8, "relevant"),),
                    abstained=True,
                ),
                "partial",
            ),
            (_turn(5, "Price?", "context", rating="down", stale=(StaleSource(1, "p.md", "P", "expired"),)), "stale"),
            (_turn(6, "Price?", "context", rating="down"), "rated_down"),
            (
                _turn(7, "Limit?", "context", rating="down", conflicts=(Conflict("limit", (("a", ("1",)),)),)),
                "contradicting",
            ),
        ],
    )
    def test_cause_of_one_turn(self, turn: LoggedTurn, cause: str) -> None:
        """Each turn's cause follows from its own record, most specific first."""
        assert turn_cause(turn) == cause

    def test_which_turns_are_gaps(self) -> None:
        """none and partial count; context and direct only when rated down."""
        assert is_gap(_turn(1, "q")) and is_gap(_turn(2, "q", "partial"))
        assert not is_gap(_turn(3, "q", "context")) and not is_gap(_turn(4, "hi", "direct"))
        assert is_gap(_turn(5, "q", "context", rating="down"))

    def test_an_outage_is_not_a_gap(self) -> None:
        """A turn that found nothing because every search failed (the store was down) is no gap, even rated down;
        one that found nothing with a search that answered still is."""
        down = LoggedQuery("zapier app", "no_context", 0, 0, None, failed=True)
        answered = LoggedQuery("zapier", "no_context", 0, 0, 0.01)
        assert not is_gap(_turn(1, "Zapier app?", queries=(down,)))
        assert not is_gap(_turn(2, "Zapier app?", queries=(down, down), rating="down"))
        assert is_gap(_turn(3, "Zapier app?", queries=(down, answered)))


def _log() -> list[LoggedTurn]:
    turns = []
    n = 0
    for i in range(12):  # the big topic: many users, late in the week
        n += 1
        q = ["Does Lumen integrate with Zapier?", "Is there a Zapier integration?", "Zapier integration setup?"][i % 3]
        at = T0 + (4 + i % 3) * DAY
        turns.append(_turn(n, q, user=f"u{i}", at=at, unfound=("zapier",), hits=(_hit("slack.md"),)))
    for i in range(6):  # one user asking about Asana over and over
        n += 1
        turns.append(_turn(n, "Can I import from Asana?", "partial", user="solo", at=T0 + i * DAY, unfound=("asana",)))
    for i in range(5):  # answered; the pricing page is stale
        n += 1
        stale = (StaleSource(1, "pricing.md", "Pricing", "expired", "billing", None, "2020-01-01"),)
        turns.append(_turn(n, "How much is Business?", "context", user=f"p{i}", at=T0 + i * DAY, stale=stale))
    n += 1
    turns.append(_turn(n, "Lonely question about rockets", user="x", at=T0))
    answered = [
        "How do I rotate an API key?",
        "How do I set up SSO?",
        "What does error E1002 mean?",
        "How do I invite a guest?",
        "How do I export my data?",
        "Where is the audit log?",
    ]
    for i in range(36):  # the background the IDF is taken against: most traffic is answered
        n += 1
        turns.append(_turn(n, answered[i % 6], "context", user=f"b{i}", at=T0 + (i % 7) * DAY))
    return turns


class TestReport:
    def test_topics_ranked_by_users(self) -> None:
        """The topic most users hit comes first even with fewer turns per user; a one-turn topic is not listed."""
        report = build_report(_log(), since=T0, until=T0 + 7 * DAY)
        zapier, asana = report.topics
        assert "zapier" in zapier.label.split(" · ") and asana.label.startswith("asana")
        assert (zapier.users, zapier.turns, zapier.cause, zapier.trend) == (12, 12, "no_passage", "rising")
        assert zapier.missing_terms == ("zapier",) and zapier.pages[0].source == "slack.md"
        assert (asana.users, asana.turns, asana.cause, asana.missing_terms) == (1, 6, "partial", ("asana",))
        assert report.unclustered == 1 and report.gap_turns == 19 and report.turns == 60
        assert sum(report.daily_gaps) == 19 and len(report.days) == 7

    def test_stale_pages_with_owners(self) -> None:
        """Stale pages cited in the period are listed, most cited first, with owner and date."""
        [page] = build_report(_log(), since=T0, until=T0 + 7 * DAY).stale
        assert (page.source, page.owner, page.valid_until, page.citations, page.users) == (
            "pricing.md",
            "billing",
            "2020-01-01",
            5,
            5,
        )

    def test_period_bounds(self) -> None:
        """Only turns with since <= at < until count."""
        report = build_report(_log(), since=T0 + 4 * DAY, until=T0 + 5 * DAY)
        assert report.turns == 6 + 5 and report.days == ("2025-05-09",)

    def test_same_log_same_report(self) -> None:
        """Shuffled input gives the identical report, byte for byte."""
        turns = _log()
        first = json.dumps(build_report(turns, since=T0, until=T0 + 7 * DAY).as_dict())
        random.Random(3).shuffle(turns)
        assert json.dumps(build_report(turns, since=T0, until=T0 + 7 * DAY).as_dict()) == first

    def test_private_log_shows_terms_and_exports_no_cases(self) -> None:
        """A log without questions still groups by terms; its examples are terms, and no draft case is made."""
        turns = [
            _turn(i, "Does Lumen integrate with Zapier?", user=f"u{i}", unfound=("zapier",), private=True)
            for i in range(4)
        ]
        report = build_report(turns, since=T0, until=T0 + DAY)
        [topic] = report.topics
        assert not topic.questions_kept and topic.examples == ("lumen integrate zapier",)
        assert draft_cases(report) == []

    def test_draft_cases_expect_a_full_answer(self) -> None:
        """Draft cases are the topics' questions expecting a context outcome, with a note to complete them."""
        cases = draft_cases(build_report(_log(), since=T0, until=T0 + 7 * DAY))
        assert "Zapier" in cases[0]["question"]
        assert all(c["expect_outcome"] == "context" and "add expect_sources" in c["note"] for c in cases)

    def test_embeddings_join_paraphrases_without_shared_words(self) -> None:
        """With an embedder, two questions with no word in common but one meaning fall into one topic."""
        turns = [_turn(1, "Zapier connector?", user="a"), _turn(2, "Automation glue service?", user="b")]
        assert build_report(turns, since=T0, until=T0 + DAY).topics == ()

        def embed(texts: object) -> object:
            import numpy as np

            return np.ones((len(texts), 4), dtype=np.float32) / 2  # type: ignore[arg-type]

        [topic] = build_report(turns, since=T0, until=T0 + DAY, embed=embed, embedder="same").topics  # type: ignore[arg-type]
        assert topic.users == 2 and "embeddings" in build_report(turns, since=T0, until=T0 + DAY, embed=embed).method  # type: ignore[arg-type]


class TestStoredEmbeddings:
    def test_stored_vectors_of_the_same_embedder_are_used(self) -> None:
        """Questions whose turns carry an embedding by the named embedder are not embedded again; the others are."""
        import attrs
        import numpy as np

        v = np.ones(4, dtype=np.float32) / 2
        stored = attrs.evolve(_turn(1, "Zapier connector?", user="a"), embedding=v, embedder="mini")
        other = attrs.evolve(_turn(2, "Automation glue service?", user="b"), embedding=v, embedder="another")
        asked: list[str] = []

        def embed(texts: list[str]) -> np.ndarray:
            asked.extend(texts)
            return np.tile(v, (len(texts), 1))

        [topic] = build_report([stored, other], since=T0, until=T0 + DAY, embed=embed, embedder="mini").topics  # type: ignore[arg-type]
        assert asked == ["Automation glue service?"] and topic.users == 2


class TestNeighbourhoodGrouping:
    """Paraphrases that share little (one common word, each its own missing term) but land on the same pages are
    one topic; the same questions landing on different pages are not (#34)."""

    @staticmethod
    def _log(same_pages: bool) -> list[LoggedTurn]:
        background = [
            _turn(100 + i, f"How do I set up {w}?", "context", hits=(_hit(f"{w}.md", 0.9),))
            for i, w in enumerate(["sso", "saml", "scim", "webhooks", "billing", "export", "api", "audit"])
        ]
        kanban = (_hit("import-csv.md", 0.8), _hit("boards.md", 0.6))
        other = (_hit("calendar.md", 0.8), _hit("mobile.md", 0.6))
        gaps = [
            _turn(1, "Kanban board migration?", user="a", unfound=("kanban",), hits=kanban),
            _turn(2, "Kanban board migration?", user="b", unfound=("kanban",), hits=kanban),
            _turn(3, "Trello board cards?", user="c", unfound=("trello",), hits=kanban if same_pages else other),
            _turn(4, "Trello board cards?", user="d", unfound=("trello",), hits=kanban if same_pages else other),
        ]
        return background + gaps

    def test_same_neighbourhood_joins_paraphrases(self) -> None:
        report = build_report(self._log(True), since=T0, until=T0 + DAY, min_turns=2)
        topic = next(t for t in report.topics if "t0001" in t.turn_ids)
        assert {"t0001", "t0003"} <= set(topic.turn_ids)
        assert "retrieval-neighbourhood" in report.method

    def test_different_neighbourhoods_stay_apart(self) -> None:
        report = build_report(self._log(False), since=T0, until=T0 + DAY, min_turns=2)
        topic = next(t for t in report.topics if "t0001" in t.turn_ids)
        assert "t0003" not in topic.turn_ids

    def test_a_term_no_page_mentions_weighs_more(self) -> None:
        """Two questions sharing only the term no page mentions ("whiteboard") are one topic because that term
        counts twice; with no ``unfound`` recorded the same two stay apart (their other words outweigh it)."""
        q1, q2 = "Open shared whiteboard colleagues quickly today?", "Whiteboard feature?"
        background = [_turn(10 + i, f"Set up {w}?", "context") for i, w in enumerate(["sso", "saml", "scim", "api"])]

        def log(unfound: tuple[str, ...]) -> list[LoggedTurn]:
            return [_turn(1, q1, user="a", unfound=unfound), _turn(2, q2, user="b", unfound=unfound), *background]

        def together(report: object) -> bool:
            return any({"t0001", "t0002"} <= set(t.turn_ids) for t in report.topics)  # type: ignore[attr-defined]

        assert together(build_report(log(("whiteboard",)), since=T0, until=T0 + DAY, min_turns=2))
        assert not together(build_report(log(()), since=T0, until=T0 + DAY, min_turns=2))
