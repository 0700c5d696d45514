"""Content gaps: what users asked that the knowledge base did not answer, grouped into topics a docs team can fix.

``ragloop gaps --turn-log URL`` reads the turn log (:mod:`ragloop.turnlog`), keeps the turns of the period that
ended ``none`` or ``partial`` or were rated down, groups their questions into topics (:mod:`ragloop.gaps._cluster`
says how and why), ranks the topics by how many users hit them and explains each: a label of its most distinctive
terms, counts and trend, typical questions, the cause, and the existing pages nearest to it. Causes
(:data:`CAUSES`), from a turn's own record:

- ``contradicting``: cited pages state different values for something the question asks (the values are shown);
- ``no_passage``: nothing was found: the question's key terms appear in none of the retrieved passages;
- ``irrelevant``: passages with the question's terms were found, but every one was graded irrelevant;
- ``partial``: the answer covered part of the question (the uncovered terms are shown);
- ``stale``: answered, rated down, and resting on a page past its ``valid_until`` or too old;
- ``rated_down``: answered from the knowledge base, and users rated it down.

The report also lists the stale pages answers cited in the period, with their owners. The same log gives the same
report: turns are ordered by time and id, and every tie is broken by name.

Each topic is also a gap with a life (:mod:`ragloop.gaps._lifecycle`): a stable id, a status (``open``,
``fixed`` once its questions replay as answered with ``ragloop replay --mark-gaps``, ``reopened``), first and last
seen, turns per week, and the feedback on its turns; ``ragloop gaps`` keeps that state in the turn log's database.

With a configured model (``ragloop gaps --model``) the model also sorts the distinct gap questions into topics once
per report, a hint the grouping weighs (:mod:`ragloop.gaps._topics`); without one nothing leaves the machine.
"""

from __future__ import annotations

from typing import Any

from ragloop.gaps._build import DEFAULT_THRESHOLD, DENSE_THRESHOLD, build_report, is_gap, turn_cause
from ragloop.gaps._cluster import (
    ATTACH_FLOOR,
    ATTACH_MARGIN,
    NEIGHBOUR_WEIGHT,
    NEIGHBOURS,
    attach_lone,
    average_linkage,
    cluster,
    combine,
    lexical_vectors,
    neighbourhood_vectors,
    with_neighbourhood,
)
from ragloop.gaps._html import CAUSE_NAMES, report_html
from ragloop.gaps._lifecycle import STATUSES, apply_lifecycle, assign_ids, next_status, weekly
from ragloop.gaps._report import CAUSES, Cause, GapReport, NearPage, StalePage, Topic
from ragloop.gaps._topics import MODEL_SHARE, ModelTopics, parse_topics, sort_topics

__all__ = [
    "ATTACH_FLOOR",
    "ATTACH_MARGIN",
    "CAUSES",
    "CAUSE_NAMES",
    "DEFAULT_THRESHOLD",
    "DENSE_THRESHOLD",
    "MODEL_SHARE",
    "NEIGHBOURS",
    "NEIGHBOUR_WEIGHT",
    "STATUSES",
    "Cause",
    "GapReport",
    "ModelTopics",
    "NearPage",
    "StalePage",
    "Topic",
    "apply_lifecycle",
    "assign_ids",
    "attach_lone",
    "average_linkage",
    "build_report",
    "cluster",
    "combine",
    "draft_cases",
    "is_gap",
    "lexical_vectors",
    "neighbourhood_vectors",
    "next_status",
    "parse_topics",
    "report_html",
    "sort_topics",
    "turn_cause",
    "weekly",
    "with_neighbourhood",
]


def draft_cases(report: GapReport, *, per_topic: int = 3) -> list[dict[str, Any]]:
    """Draft ``ragloop check`` cases from the topics' example questions, for a docs writer to complete.

    Each expects a full answer (``expect_outcome: context``), so it fails until the gap is fixed; the writer adds
    ``expect_sources`` (the page that now answers it) and ``expect_phrases``. Topics of a log that keeps no
    questions (``capture_questions=False``) have no questions to export and are left out.
    """
    out: list[dict[str, Any]] = []
    for t in report.topics:
        if t.questions_kept:
            for question in t.examples[:per_topic]:
                out.append(
                    {
                        "question": question,
                        "expect_outcome": "context",
                        "expect_sources": [],
                        "expect_phrases": [],
                        "note": f"draft from ragloop gaps: topic {t.rank} '{t.label}' ({CAUSE_NAMES[t.cause]}); "
                        "add expect_sources and expect_phrases once the knowledge base answers it",
                    }
                )
    return out
