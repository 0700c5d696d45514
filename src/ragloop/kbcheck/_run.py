"""Running cases against a chat, judging each reply, and the summary: pass rate with a bootstrap interval, JUnit."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from attrs import frozen

from ragloop.errors import RagloopError
from ragloop.kbcheck._cases import Case

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

_MARKS = re.compile(r"\*\*|__|[*`]|(?<!\w)_|_(?!\w)")

__all__ = ["CaseResult", "CheckSummary", "bootstrap_interval", "judge", "junit_xml", "run_cases", "summarize"]


@frozen
class CaseResult:
    """What one case gave.

    Attributes:
        case: The case.
        passed: Whether every expectation held.
        reasons: Why not, one per broken expectation.
        outcome: The turn's outcome (``error`` when the turn could not run).
        cited: The pages the answer cited.
        text: The answer.
        seconds: The turn's wall time.
    """

    case: Case
    passed: bool
    reasons: tuple[str, ...]
    outcome: str
    cited: tuple[str, ...]
    text: str
    seconds: float


def _matches(source: str, expected: str) -> bool:
    expected = expected.strip().lstrip("/")
    return source == expected or source.endswith("/" + expected)


def _plain(text: str) -> str:
    """Text as a reader sees it, for phrase matching: lower case, markdown emphasis and code marks gone, spaces
    collapsed (``retried **8 times**`` says "retried 8 times")."""
    return " ".join(_MARKS.sub("", text).lower().split())


def judge(case: Case, reply: Reply) -> tuple[str, ...]:
    """The case's broken expectations on ``reply`` (empty: it passes); phrases match as a reader sees the text."""
    reasons = []
    cited = [c.source for c in reply.citations]
    if case.expect_sources and not any(_matches(s, e) for s in cited for e in case.expect_sources):
        shown = ", ".join(dict.fromkeys(cited)) or "nothing"
        reasons.append(f"expected one of {', '.join(case.expect_sources)} to be cited; cited: {shown}")
    answer = _plain(reply.text)
    for phrase in case.expect_phrases:
        if _plain(phrase) not in answer:
            reasons.append(f"the answer does not say {phrase!r}")
    if case.expect_outcome is not None and reply.outcome != case.expect_outcome:
        reasons.append(f"outcome was {reply.outcome}, expected {case.expect_outcome}")
    return tuple(reasons)


async def run_cases(rag: ChatRAG, cases: Sequence[Case], *, deadline_s: float | None = None) -> list[CaseResult]:
    """Ask every case's question, one at a time (a check must not depend on what runs beside it), and judge it."""
    out = []
    for case in cases:
        started = time.perf_counter()
        try:
            reply = await rag.ask(
                case.question,
                history=[{"role": r, "content": c} for r, c in case.history],
                filters=dict(case.filters),
                deadline_s=deadline_s,
            )
        except RagloopError as exc:
            seconds = time.perf_counter() - started
            out.append(CaseResult(case, False, (f"the turn failed: {exc}",), "error", (), "", seconds))
            continue
        reasons = judge(case, reply)
        cited = tuple(dict.fromkeys(c.source for c in reply.citations))
        seconds = time.perf_counter() - started
        out.append(CaseResult(case, not reasons, reasons, reply.outcome, cited, reply.text, seconds))
    return out


def bootstrap_interval(
    passed: Sequence[bool], *, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the pass rate (fixed seed: the same results give the same interval).

    With every case passing (or every case failing) it collapses to that rate: resampling cannot show a failure
    that never happened, so read it with the number of cases.
    """
    x = np.asarray(passed, dtype=np.float64)
    if len(x) == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@frozen
class CheckSummary:
    """The pass rate of a run.

    Attributes:
        total: Cases run.
        passed: Cases that passed.
        rate: ``passed / total``.
        low: Lower end of its 95 % bootstrap interval.
        high: Upper end.
    """

    total: int
    passed: int
    rate: float
    low: float
    high: float


def summarize(results: Sequence[CaseResult]) -> CheckSummary:
    """The run's pass rate and its interval."""
    passes = [r.passed for r in results]
    low, high = bootstrap_interval(passes)
    total = len(passes)
    return CheckSummary(total, sum(passes), sum(passes) / total if total else 0.0, low, high)


def junit_xml(results: Sequence[CaseResult], *, suite: str = "ragloop check") -> str:
    """The results as JUnit XML (one ``testcase`` per case, a ``failure`` naming every broken expectation)."""
    failures = sum(not r.passed for r in results)
    seconds = sum(r.seconds for r in results)
    root = ET.Element("testsuites", tests=str(len(results)), failures=str(failures), time=f"{seconds:.3f}")
    counts = {"tests": str(len(results)), "failures": str(failures), "errors": "0", "time": f"{seconds:.3f}"}
    node = ET.SubElement(root, "testsuite", {"name": suite, **counts})
    for r in results:
        case = ET.SubElement(node, "testcase", classname=suite, name=r.case.name, time=f"{r.seconds:.3f}")
        if not r.passed:
            failure = ET.SubElement(case, "failure", message="; ".join(r.reasons), type="ExpectationFailed")
            failure.text = f"question: {r.case.question}\noutcome: {r.outcome}\nanswer: {r.text}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
