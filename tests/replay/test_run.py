"""Replaying logged turns: one ask per distinct question and filters, the logged filters only, skips, bounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import InputError
from ragloop.replay import replay_turns
from ragloop.turnlog import LoggedCitation, LoggedTurn, TurnRow

pytestmark = pytest.mark.anyio


class _Reply:
    def __init__(self, outcome: str, pages: tuple[str, ...]) -> None:
        self.outcome = outcome
        self.citations = tuple(_Cite(p) for p in pages)


class _Cite:
    def __init__(self, source: str) -> None:
        self.source = source


class FakeChat:
    """Answers from a table keyed by (question, tenant filter); records every ask; sleeps a question-dependent
    while, so that replies finish out of order."""

    def __init__(self, answers: Mapping[tuple[str, str | None], tuple[str, tuple[str, ...]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.in_flight = self.most_in_flight = 0

    async def ask(self, question: str, *, filters: dict[str, Any], deadline_s: float | None = None) -> _Reply:
        self.asked.append((question, filters))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await anyio.sleep((hash(question) % 5) / 1000)
        self.in_flight -= 1
        tenant = filters.get("tenant", (None,))[0]
        if question == "refused":
            raise InputError("no chunk has the filter key 'tenant'")
        outcome, pages = self.answers.get((question, tenant), ("none", ()))
        return _Reply(outcome, pages)


def turn(n: int, question: str | None, outcome: str = "none", pages: tuple[str, ...] = (), **kw: Any) -> LoggedTurn:
    """A logged turn ``t<n>`` at time ``n``."""
    row = TurnRow(
        turn_id=f"t{n:05d}",
        at=float(n),
        principal="p",
        user="u",
        tenant=None,
        question=question,
        question_hash="h",
        terms=(),
        outcome=outcome,
        citations=tuple(LoggedCitation(i + 1, p, p, f"{p}#0") for i, p in enumerate(pages)),
        **kw,
    )
    return LoggedTurn(row)


ACME = (("tenant", ("acme",)),)


class TestReplay:
    async def test_verdicts_and_grouping(self) -> None:
        """A question asked three times is asked once and stands for its three turns; its latest turn is the
        'before'; the logged filters are what it is asked with."""
        chat = FakeChat({("zapier?", "acme"): ("context", ("zapier.md",)), ("keys?", None): ("context", ("k.md",))})
        turns = [
            turn(1, "zapier?", filters=ACME),
            turn(2, "keys?", "context", ("k.md",)),
            turn(3, "zapier?", filters=ACME),
            turn(4, "zapier?", "partial", ("a.md",), filters=ACME),
            turn(5, "zapier?"),  # the same question without the tenant wall: another question
        ]
        report = await replay_turns(chat, turns)  # type: ignore[arg-type]
        assert sorted(chat.asked, key=repr) == sorted(
            [("zapier?", {"tenant": ("acme",)}), ("keys?", {}), ("zapier?", {})], key=repr
        )
        by = {(i.question, i.filters): i for i in report.items}
        fixed = by[("zapier?", ACME)]
        assert fixed.verdict == "fixed" and fixed.turn_ids == ("t00001", "t00003", "t00004")
        assert fixed.before.outcome == "partial" and fixed.after.pages == ("zapier.md",)
        assert by[("zapier?", ())].verdict == "same"  # acme's page never answers an unwalled question
        assert by[("keys?", ())].verdict == "same"
        assert report.turns == 5 and not report.broken

    async def test_gone_page_and_refused_question_break(self) -> None:
        """With the knowledge base's pages given, an answer resting on a deleted page is broken; a turn the new
        knowledge base refuses (a filter key it lacks) is an error, broken when it had been answered."""
        chat = FakeChat({("keys?", None): ("context", ("k2.md",))})
        turns = [turn(1, "keys?", "context", ("k.md",)), turn(2, "refused", "context", ("r.md",))]
        report = await replay_turns(chat, turns, pages={"k2.md", "r.md"})  # type: ignore[arg-type]
        assert [(i.question, i.verdict, i.after.outcome) for i in report.items] == [
            ("keys?", "broken", "context"),
            ("refused", "broken", "error"),
        ]
        assert report.broken

    async def test_unreplayable_turns_counted(self) -> None:
        """A turn without its question (capture_questions=False) or with a truncated one is skipped and counted."""
        turns = [
            turn(1, None),
            turn(2, "long", truncated=True),
            turn(3, None),
            turn(4, "ok?"),
            turn(5, "old", filters=None),
        ]
        report = await replay_turns(FakeChat({}), turns)  # type: ignore[arg-type]
        assert [i.question for i in report.items] == ["ok?"]
        assert dict(report.skipped) == {
            "no question kept (the log was written with capture_questions=False)": 2,
            "question truncated in the log (longer than it keeps)": 1,
            "logged before turns kept their filters: its walls are unknown": 1,
        }

    def test_a_row_from_before_filters_were_kept_reads_as_unknown(self) -> None:
        """A stored row without the filters key (an older ragloop wrote it) reads back with filters None; a new
        row with no filters reads back as ()."""
        from ragloop.turnlog._row import row_from_json, row_to_json

        row = turn(1, "q").row
        columns = {"turn_id": "t1", "at": 1.0, "principal": "p", "user": "u", "outcome": "none", "question_hash": "h"}
        data = row_to_json(row)
        assert row_from_json(columns, data).filters == ()
        assert row_from_json(columns, {k: v for k, v in data.items() if k != "filters"}).filters is None

    async def test_limit_keeps_the_latest_and_concurrency_is_bounded(self) -> None:
        """--limit N replays the latest N turns; no more than `concurrency` questions are in flight; progress
        counts every question once, ending at the total."""
        chat = FakeChat({})
        seen: list[tuple[int, int]] = []
        turns = [turn(n, f"q{n}") for n in range(50)]
        report = await replay_turns(chat, turns, limit=20, concurrency=3, progress=lambda d, t: seen.append((d, t)))  # type: ignore[arg-type]
        assert {i.question for i in report.items} == {f"q{n}" for n in range(30, 50)}
        assert chat.most_in_flight <= 3 and len(chat.asked) == 20
        assert [d for d, _ in seen] == list(range(1, 21)) and {t for _, t in seen} == {20}

    async def test_bad_bounds(self) -> None:
        """A limit or concurrency below 1 is refused."""
        with pytest.raises(ValueError, match="at least 1"):
            await replay_turns(FakeChat({}), [], limit=0)  # type: ignore[arg-type]


class TestDeterminism:
    @settings(max_examples=25, deadline=None)
    @given(st.permutations([turn(n, f"q{n % 7}", ("none", "context")[n % 2], (f"p{n % 3}.md",)) for n in range(21)]))
    def test_same_report_whatever_the_order(self, turns: list[LoggedTurn]) -> None:
        """The same turns in any order, replies finishing in any order, give the same report."""
        answers = {(f"q{k}", None): ("context", (f"p{k % 2}.md",)) for k in range(7)}

        async def run() -> Any:
            return await replay_turns(FakeChat(answers), turns, concurrency=4)  # type: ignore[arg-type]

        first = anyio.run(run)
        assert first.items == anyio.run(run).items
        reference = anyio.run(lambda: replay_turns(FakeChat(answers), sorted(turns, key=lambda t: t.row.at)))  # type: ignore[arg-type]
        assert first.items == reference.items
