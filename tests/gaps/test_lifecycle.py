"""A gap's life between runs: stable ids, open → fixed → reopened, first/last seen, weeks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.gaps import assign_ids, next_status, weekly
from ragloop.turnlog import GapRecord


class TestIds:
    def test_same_topic_same_id(self) -> None:
        """A topic that grew keeps the id of the gap it shares most turns with; a new topic gets a new id."""
        first = assign_ids([("t1", "t2"), ("t3", "t4")], {})
        members = {"t1": first[0], "t2": first[0], "t3": first[1], "t4": first[1]}
        second = assign_ids([("t5", "t6"), ("t3", "t4", "t7"), ("t1", "t2", "t8")], members)
        assert second[1:] == [first[1], first[0]] and second[0] not in first
        assert all(g.startswith("g-") and len(g) == 12 for g in second)

    def test_a_split_gives_the_id_to_the_bigger_part(self) -> None:
        """Two topics drawing on one old gap: the one with more of its turns keeps the id."""
        members = {f"t{i}": "g-old0000000" for i in range(5)}
        ids = assign_ids([("t0", "t1"), ("t2", "t3", "t4")], members)
        assert ids[1] == "g-old0000000" and ids[0] != "g-old0000000"

    def test_ids_without_state_are_deterministic(self) -> None:
        """With no state saved, the same topics give the same ids (from their earliest turn id)."""
        assert assign_ids([("b", "a"), ("c",)], {}) == assign_ids([("a", "b"), ("c",)], {})

    @given(
        st.lists(st.sets(st.integers(0, 40), min_size=1, max_size=6), min_size=1, max_size=6),
        st.dictionaries(st.integers(0, 40), st.sampled_from(["g-aaaaaaaaaa", "g-bbbbbbbbbb"]), max_size=30),
    )
    def test_unique_and_order_free(self, groups: list[set[int]], known: dict[int, str]) -> None:
        """Every topic (disjoint, as grouping makes them) gets an id, no two share one, and listing the topics in
        reverse gives each the same id."""
        seen: set[int] = set()
        topics = []
        for g in groups:
            if g - seen:
                topics.append(tuple(f"t{i}" for i in sorted(g - seen)))
                seen |= g
        members = {f"t{i}": g for i, g in known.items()}
        ids = assign_ids(topics, members)
        assert len(ids) == len(topics) and len(set(ids)) == len(ids)
        assert assign_ids(topics[::-1], members)[::-1] == ids


def _rec(status: str, at: float) -> GapRecord:
    return GapRecord("g-1", "zapier", status, at, 0.0, 10.0)


TURNS = [("t1", 5.0), ("t2", 10.0)]


class TestStatus:
    def test_new_gap_is_open(self) -> None:
        """A gap seen for the first time is open since its first turn."""
        assert next_status(None, TURNS, {}) == ("open", 5.0)

    def test_fixed_when_every_replayed_question_is_answered_after_the_last_turn(self) -> None:
        """All of its turns answered in a replay after its latest turn: fixed, since that replay."""
        assert next_status(_rec("open", 5.0), TURNS, {"t1": (20.0, True), "t2": (20.0, True)}) == ("fixed", 20.0)
        assert next_status(_rec("open", 5.0), TURNS, {"t1": (20.0, True), "t2": (20.0, False)}) == ("open", 5.0)
        assert next_status(_rec("open", 5.0), TURNS, {"t1": (8.0, True)}) == ("open", 5.0)  # t2 came after it

    def test_fixed_stays_fixed_with_its_date(self) -> None:
        """A later replay that still answers keeps the date it was fixed."""
        assert next_status(_rec("fixed", 20.0), TURNS, {"t1": (30.0, True), "t2": (30.0, True)}) == ("fixed", 20.0)

    def test_reopened_by_a_failing_replay_or_a_new_turn(self) -> None:
        """Fixed, then a replay no longer answers, or a new gap turn comes: reopened, since then."""
        assert next_status(_rec("fixed", 20.0), TURNS, {"t1": (30.0, False), "t2": (30.0, False)}) == (
            "reopened",
            30.0,
        )
        later = [*TURNS, ("t3", 25.0)]
        assert next_status(_rec("fixed", 20.0), later, {"t1": (20.0, True), "t2": (20.0, True)}) == ("reopened", 25.0)

    def test_reopened_then_fixed_again(self) -> None:
        """A reopened gap whose questions replay as answered again is fixed again."""
        assert next_status(_rec("reopened", 30.0), TURNS, {"t1": (40.0, True), "t2": (40.0, True)}) == ("fixed", 40.0)


class TestWeekly:
    def test_weeks_start_on_monday(self) -> None:
        """Days are summed into their ISO week, keyed by its Monday."""
        days = ["2025-05-03", "2025-05-04", "2025-05-05", "2025-05-06"]  # Sat, Sun, Mon, Tue
        assert weekly(days, [1, 2, 3, 4]) == (("2025-04-28", 3), ("2025-05-05", 7))
