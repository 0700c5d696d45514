"""The offline judges satisfy the judgment Protocols."""

from __future__ import annotations

from ragloop.llm.offline import OfflineAnswerer, OfflineDecider, OfflineGrader, OfflineRewriter
from ragloop.llm.protocols import Answerer, Decider, Grader, Rewriter
from ragloop.text.terms import CorpusStats


def test_offline_judges_satisfy_the_protocols() -> None:
    """Each offline judge is an instance of its runtime-checkable Protocol."""
    stats = CorpusStats.from_texts(["single sign-on setup", "billing"])
    assert isinstance(OfflineDecider(stats), Decider)
    assert isinstance(OfflineGrader(stats), Grader)
    assert isinstance(OfflineRewriter(stats), Rewriter)
    assert isinstance(OfflineAnswerer(stats), Answerer)
