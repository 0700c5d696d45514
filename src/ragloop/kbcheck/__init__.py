"""The knowledge-base regression gate behind ``ragloop check``: questions whose answers must keep working.

A docs team writes cases (:mod:`ragloop.kbcheck._cases` gives the format; ``ragloop gaps --export-cases`` drafts
them from the questions users could not get answered) and runs them in CI after every edit to the knowledge base:
each case's question is asked (offline by default: deterministic, no model), its reply judged against the case's
expectations, and the run fails when any case does (or when the pass rate is below ``--min-pass``).
"""

from __future__ import annotations

from ragloop.kbcheck._cases import MAX_DEPTH, OUTCOMES, Case, CasesError, load_cases, parse_cases
from ragloop.kbcheck._run import (
    CaseResult,
    CheckSummary,
    judge,
    junit_xml,
    run_cases,
    summarize,
    wilson_interval,
    xml_text,
)

__all__ = [
    "MAX_DEPTH",
    "OUTCOMES",
    "Case",
    "CaseResult",
    "CasesError",
    "CheckSummary",
    "judge",
    "junit_xml",
    "load_cases",
    "parse_cases",
    "run_cases",
    "summarize",
    "wilson_interval",
    "xml_text",
]
