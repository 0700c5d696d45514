"""The offline bridger: second-hop queries for multi-hop questions."""

from __future__ import annotations

import pytest

from ragloop.llm.offline.bridge import OfflineBridger, bridge_entities, uncovered_terms
from ragloop.text.terms import CorpusStats

FILM = (
    "Kiss and Tell is a 1945 American comedy film starring then 17-year-old Shirley Temple as Corliss Archer. "
    "In the film, two teenage girls cause their respective parents much concern."
)
TEMPLE = (
    "Shirley Temple Black was an American actress, singer, dancer, businesswoman, and diplomat. As an adult she "
    "held the government position of Chief of Protocol of the United States."
)
FILLER = [f"An unrelated American paragraph number {i} about rivers and mountains in Europe." for i in range(30)]
STATS = CorpusStats.from_texts([FILM, TEMPLE, *FILLER])
QUESTION = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"


def test_uncovered_terms_are_those_the_context_lacks() -> None:
    """Terms of the question missing from the first-hop passage are reported, with their IDF share."""
    missing, share = uncovered_terms(QUESTION, [FILM], STATS)
    assert {"government", "position", "held"} <= set(missing)
    assert "film" not in missing and 0.25 < share < 1.0
    both, _ = uncovered_terms(QUESTION, [FILM, TEMPLE], STATS)
    assert not {"government", "position", "held"} & set(both)


def test_bridge_entities_skip_common_and_asked_names() -> None:
    """Shirley Temple is a bridge; 'American' (common) and 'Corliss Archer' (asked) are not."""
    names = bridge_entities(QUESTION, [FILM], STATS, min_idf=2.0)
    assert names[0] == "Shirley Temple"
    assert "American" not in names and "Corliss Archer" not in names


def test_follow_up_joins_bridge_and_missing_terms() -> None:
    """The follow-up names the bridge entity and the uncovered part of the question."""
    query = OfflineBridger(STATS).follow_up_sync(QUESTION, [FILM], [QUESTION])
    assert query is not None and query.startswith("Shirley Temple") and "government" in query


def test_no_follow_up_when_covered_or_repeated() -> None:
    """Covered questions, empty context and repeats of tried queries give no follow-up."""
    bridger = OfflineBridger(STATS)
    assert bridger.follow_up_sync("Who starred in Kiss and Tell as Corliss Archer?", [FILM], []) is None
    assert bridger.follow_up_sync(QUESTION, [], []) is None
    first = bridger.follow_up_sync(QUESTION, [FILM], [])
    assert first is not None and bridger.follow_up_sync(QUESTION, [FILM], [first]) is None


@pytest.mark.anyio
async def test_follow_up_is_metered() -> None:
    """Each follow-up counts as an offline judge call."""
    from ragloop.usage import UsageMeter, metering

    with metering(UsageMeter()) as meter:
        await OfflineBridger(STATS).follow_up(QUESTION, [FILM], [])
    assert [(c.judge, c.model) for c in meter.calls] == [("hop", "offline")]


def test_a_bridge_that_leads_nowhere_the_question_asks_is_not_followed() -> None:
    """An entity that shares no chunk with what the question still misses ("Tamper" beside "government
    position") is dropped; with none left there is no hop. Shirley Temple, whose page holds the position, stays."""
    from ragloop.llm.offline.bridge import bridges_to

    tamper = "Tamper Protection is a heading about audit entries. " + FILM
    stats = CorpusStats.from_texts([tamper, TEMPLE, *FILLER])
    assert bridges_to("Shirley Temple", ["govern", "posit"], stats)
    assert not bridges_to("Tamper Protection", ["govern", "posit"], stats)
    lone = "Kiss and Tell is a comedy film with Corliss Archer, filmed near Tamper Lake."
    stats = CorpusStats.from_texts([lone, TEMPLE, *FILLER])
    assert OfflineBridger(stats).follow_up_sync(QUESTION, [lone], []) is None
    assert OfflineBridger(stats, check_bridge=False).follow_up_sync(QUESTION, [lone], []) is not None
