"""Running cases against a chat, judging each reply, and the summary: pass rate with a Wilson interval, JUnit XML."""

from __future__ import annotations

import math
import re
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import frozen

from ragloop.errors import RagloopError
from ragloop.kbcheck._cases import Case

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

_MARKS = re.compile(r"\*\*|__|[*`]|(?<!\w)_|_(?!\w)")

__all__ = ["CaseResult", "CheckSummary", "judge", "junit_xml", "run_cases", "summarize", "wilson_interval", "xml_text"]


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


def wilson_interval(passed: int, total: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a pass rate of ``passed`` out of ``total``.

    Unlike a bootstrap it does not collapse when every case passes: 20 of 20 says the rate is at least 0.839 (95 %),
    not that it is 1. ``(0.0, 1.0)`` for no cases: nothing is known.
    """
    if total <= 0:
        return 0.0, 1.0
    if not 0 <= passed <= total:
        raise ValueError(f"passed must be from 0 to total ({total}), got {passed}")
    z = statistics.NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2)
    p = passed / total
    z2n = z * z / total
    centre = (p + z2n / 2) / (1 + z2n)
    half = z * math.sqrt(p * (1 - p) / total + z2n / (4 * total)) / (1 + z2n)
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == total else min(1.0, centre + half)
    return low, high


@frozen
class CheckSummary:
    """The pass rate of a run.

    Attributes:
        total: Cases run.
        passed: Cases that passed.
        rate: ``passed / total``.
        low: Lower end of its 95 % Wilson score interval.
        high: Upper end.
    """

    total: int
    passed: int
    rate: float
    low: float
    high: float


def summarize(results: Sequence[CaseResult]) -> CheckSummary:
    """The run's pass rate and its interval."""
    total, passed = len(results), sum(r.passed for r in results)
    low, high = wilson_interval(passed, total)
    return CheckSummary(total, passed, passed / total if total else 0.0, low, high)


# Characters XML 1.0 cannot carry (C0 controls but tab, newline and return; U+FFFE, U+FFFF) and lone surrogates.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return "\ufffd" if "\ud800" <= char <= "\udfff" else f"\\u{ord(char):04x}"


def xml_text(text: str) -> tuple[str, int]:
    """``text`` as XML 1.0 can carry it, and how many characters were changed.

    A lone surrogate (``"\\ud800"`` in a JSON string) becomes U+FFFD; any other character XML forbids (a control
    character, U+FFFE, U+FFFF) is written as its ``\\uXXXX`` escape, so a reader still sees what was there.
    """
    out, changed = _XML_INVALID.subn(_escape, text)
    return out, changed


def junit_xml(results: Sequence[CaseResult], *, suite: str = "ragloop check") -> str:
    """The results as JUnit XML (one ``testcase`` per case, a ``failure`` naming every broken expectation).

    Always well-formed, whatever the cases and answers hold: text XML cannot carry is changed by :func:`xml_text`,
    and the suite says how much in its ``system-err`` (and a ``ragloop.xml_replaced`` property).
    """
    changed = 0

    def safe(text: str) -> str:
        nonlocal changed
        out, n = xml_text(text)
        changed += n
        return out

    failures = sum(not r.passed for r in results)
    seconds = sum(r.seconds for r in results)
    root = ET.Element("testsuites", tests=str(len(results)), failures=str(failures), time=f"{seconds:.3f}")
    counts = {"tests": str(len(results)), "failures": str(failures), "errors": "0", "time": f"{seconds:.3f}"}
    node = ET.SubElement(root, "testsuite", {"name": safe(suite), **counts})
    properties = ET.SubElement(node, "properties")
    for r in results:
        case = ET.SubElement(node, "testcase", classname=safe(suite), name=safe(r.case.name), time=f"{r.seconds:.3f}")
        if not r.passed:
            failure = ET.SubElement(case, "failure", message=safe("; ".join(r.reasons)), type="ExpectationFailed")
            failure.text = safe(f"question: {r.case.question}\noutcome: {r.outcome}\nanswer: {r.text}")
    ET.SubElement(properties, "property", name="ragloop.xml_replaced", value=str(changed))
    if changed:
        err = ET.SubElement(node, "system-err")
        err.text = (
            f"{changed} character(s) XML cannot carry were replaced: lone surrogates by U+FFFD, "
            "control characters by their \\uXXXX escape"
        )
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
