"""The turn log and ``ragloop gaps``: what logging costs a turn, how long a report of 100k turns takes, and how
well questions are grouped into topics.

1. **Turn log cost.** The offline chat over the bundled sample knowledge base (its default embedder) answers the
   sample questions with and without a SQLite turn log, and on a second chat without one (an A/A control that
   shows the noise floor), interleaved question by question (the order rotates), so machine noise hits all alike.
   It prints each mode's p50 and p95 turn time, the difference at p50 and the median of the paired differences
   (same question, back to back) as a share of the turn without a log (target ≤ 1 %). It also times, outside any
   turn, what a turn itself does (``pending_turn`` + ``TurnLog.record``: the handoff) and what the writer thread
   spends per row in the background (``prepare`` + a batched insert).
2. **Report time.** 100,000 synthetic rows over 30 days (75 % answered; 25 % gaps drawn from 60 topics of 4–9
   question shapes with openers, closers and objects varying the wording: some 16,000 distinct gap questions),
   written straight into a SQLite log, then ``ragloop gaps --turn-log … --since 31d --json --html`` is timed end
   to end (read, group, render) on term vectors alone (target ≤ 30 s on 2 cores). With ``--index`` of the sample
   (its default embedder, MiniLM with the ``[embed]`` extra) the report also embeds every distinct gap question,
   a cost that grows with the distinct questions: it is timed on a 10,000-row log and reported per distinct
   question.
3. **Grouping quality.** Hand-written paraphrases of planted gap topics among singleton gap questions and answered
   background traffic; pairwise precision, recall and F1 of the grouping against the planted topics, and the
   adjusted Rand index. The threshold is chosen on the *development* topics (a grid) and reported on the
   *held-out* topics, whose questions it never saw (the library's defaults are the development picks).

It asserts nothing; it prints tables with the load average and writes ``benchmarks/results/bench_gaps.json``
and ``.txt``.

Usage: ``nice python benchmarks/bench_gaps.py [--turns 150] [--rows 100000] [--skip-report] [--embedder hash]
[--json] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} cores"


# --- 1. turn log cost --------------------------------------------------------------------------------------


def _paired(a: list[float], b: list[float]) -> float:
    """The median of ``a[i] - b[i]``: the same question, asked back to back."""
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


def _sample(embedder: str, cache_dir: str | None) -> Any:
    from ragloop.retrievers.embed import HashEmbedder
    from ragloop.sample import sample_index

    return sample_index(Path(cache_dir) if cache_dir else None, embedder=HashEmbedder() if embedder == "hash" else None)


def turn_log_cost(turns: int, embedder: str = "default", cache_dir: str | None = None) -> dict[str, Any]:
    from ragloop.chat import ChatRAG
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.sample import sample_questions_path
    from ragloop.turn import Turn
    from ragloop.turnlog import LogPolicy, StoredRow, TurnLog, pending_turn, prepare

    index: KnowledgeIndex = _sample(embedder, cache_dir)
    questions = [json.loads(line)["question"] for line in sample_questions_path().read_text().splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        log = TurnLog.open(f"sqlite:{Path(tmp) / 'turns.db'}")
        plain = ChatRAG.from_index(index)
        control = ChatRAG.from_index(index)  # a second chat without a log: the A/A noise floor
        logged = ChatRAG(Turn.from_index(index), turn_log=log)
        chats = (("off", plain), ("control", control), ("on", logged))
        times: dict[str, list[float]] = {name: [] for name, _ in chats}

        async def run() -> None:
            for q in questions[:3]:  # warm-up, untimed
                for _, rag in chats:
                    await rag.ask(q)
            for i in range(turns):
                q = questions[i % len(questions)]
                for name, rag in chats[i % 3 :] + chats[: i % 3]:  # the order rotates
                    started = time.perf_counter()
                    await rag.ask(q)
                    times[name].append(time.perf_counter() - started)
            await log.flush(30)

        anyio.run(run)
        stats = log.stats()

        # What a turn pays itself (the handoff), and what the writer pays per row, timed apart.
        async def one() -> Any:
            result = await plain.graph.run(plain.new_state("How many webhook endpoints can a workspace have?"))
            return result

        result = anyio.run(one)
        from ragloop.turn import turn_record

        state, record = result.state, turn_record(result)
        handoff_log = TurnLog.open(f"sqlite:{Path(tmp) / 'handoff.db'}", max_queue=200_000)
        n = 2_000
        started = time.perf_counter()
        for k in range(n):
            handoff_log.record(
                pending_turn(
                    turn_id=f"h{k}",
                    question=state.question,
                    record=record,
                    citations=state.citations,
                    graded=state.graded,
                    searches=state.searches,
                )
            )
        handoff_us = (time.perf_counter() - started) / n * 1e6
        handoff_log.close(60)
        pending = pending_turn(
            turn_id="w", question=state.question, record=record, citations=state.citations, graded=state.graded
        )
        backend = log.backend
        started = time.perf_counter()
        batch = []
        for k in range(n):
            row = prepare(pending, LogPolicy())
            batch.append(StoredRow(attrs.evolve(row, turn_id=f"w{k}")))
            if len(batch) == 256:
                backend.write(batch, ())
                batch = []
        backend.write(batch, ())
        writer_us = (time.perf_counter() - started) / n * 1e6
        log.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {
        "turns_per_mode": turns,
        "p50_off_ms": off * 1e3,
        "p50_on_ms": on * 1e3,
        "p95_off_ms": float(np.percentile(times["off"], 95) * 1e3),
        "p95_on_ms": float(np.percentile(times["on"], 95) * 1e3),
        "p50_overhead_pct": (on - off) / off * 100,
        "paired_median_diff_pct": _paired(times["on"], times["off"]) / off * 100,
        "control_paired_median_diff_pct": _paired(times["control"], times["off"]) / off * 100,
        "control_p50_ms": statistics.median(times["control"]) * 1e3,
        "handoff_us_per_turn": handoff_us,
        "handoff_pct_of_p50": handoff_us / (off * 1e6) * 100,
        "writer_us_per_row": writer_us,
        "writer_pct_of_p50": writer_us / (off * 1e6) * 100,
        "rows_written": stats.written,
        "rows_dropped": stats.dropped,
        "write_errors": stats.errors,
        "embedder": index.embedder.name,
        "load": _load(),
    }


# --- 2. report time ----------------------------------------------------------------------------------------

_SUBJECTS = (  # noqa: SIM905 - a word block reads better than 70 quoted strings
    "zapier asana trello notion hubspot salesforce teams outlook gmail calendar dropbox box figma miro jira-cloud "
    "gantt timeline kanban swimlane sprint burndown roadmap portfolio workload capacity timesheet invoice-approval "
    "budget forecast okr goal milestone dependency baseline template recurring reminder checklist subtask "
    "priority-matrix heatmap dashboard widget chart-export pdf-export docx-export offline-mode dark-mode "
    "keyboard-shortcuts accessibility screen-reader translation right-to-left emoji-reactions voice-notes "
    "video-calls whiteboard polls forms approvals e-signature"
).split()
_SHAPES = (
    "Does Lumen support {s}?",
    "How do I set up {s} in my workspace?",
    "Is there a {s} integration?",
    "Can I use {s} on the {p} plan?",
    "Why does {s} not work for {w}?",
    "Where do I turn on {s}?",
    "How much does {s} cost per {u}?",
    "Can guests see {s}?",
    "Is {s} available on mobile?",
)
_OPENERS = ("", "", "", "hi, ", "hello! ", "quick question: ", "sorry, ", "hey team, ", "urgent: ", "one more: ")
_CLOSERS = ("", "", "", " thanks", " thanks!", " asap", " for our team", " for my client", " please", " again")
_NOUNS = (  # noqa: SIM905 - as above
    "client project board sprint release launch campaign report budget invoice contract design review hiring "
    "onboarding migration audit roadmap backlog retro standup demo workshop event newsletter website app"
).split()
_ANSWERED = (
    "How do I rotate an API key?",
    "How much does the Business plan cost per seat?",
    "How long are deleted tasks kept in the trash?",
    "How do I set up SSO with Okta?",
    "What does error E1002 mean?",
    "How do I invite a guest to a project?",
    "How do I export my workspace data?",
    "Can we enforce MFA for everyone?",
)


def synthetic_rows(n: int, *, seed: int = 7) -> list[Any]:
    """``n`` rows over 30 days: 75 % answered, 25 % gaps from 60 topics (each topic its own subject word)."""
    from ragloop.text.terms import key_terms
    from ragloop.turnlog import LoggedHit, StoredRow, TurnRow, question_hash

    rng = random.Random(seed)
    now = time.time()
    topics = _SUBJECTS[:60]
    rows = []
    for k in range(n):
        at = now - rng.random() * 30 * 86_400
        user = f"h:{rng.randrange(5_000):024x}"
        if rng.random() < 0.25:
            subject = topics[min(int(rng.paretovariate(1.2)) - 1, len(topics) - 1)].replace("-", " ")
            shapes = _SHAPES[: 4 + hash(subject) % 6]
            question = rng.choice(shapes).format(
                s=subject,
                p=rng.choice(["Team", "Business", "Free"]),
                w=rng.choice(["me", "guests", "admins"]),
                u=rng.choice(["seat", "month", "workspace"]),
            )
            question = rng.choice(_OPENERS) + question
            if rng.random() < 0.5:
                question = question.rstrip("?") + f" for the {rng.choice(_NOUNS)} {rng.randrange(40)}?"
            question += rng.choice(_CLOSERS)
            outcome = rng.choice(["none", "none", "partial"])
            unfound: tuple[str, ...] = (subject.split()[0],)
        else:
            question, outcome, unfound = rng.choice(_ANSWERED), "context", ()
        terms = tuple(t.surface for t in key_terms(question))
        hits = tuple(
            LoggedHit(f"c{j}", f"page-{(hash(question) + j) % 34}.md", "Page", 0.03, rng.random(), "irrelevant")
            for j in range(6)
        )
        rows.append(
            StoredRow(
                TurnRow(
                    turn_id=f"r{k:07d}",
                    at=at,
                    principal=user,
                    user=user,
                    tenant=None,
                    question=question,
                    question_hash=question_hash(question),
                    terms=terms,
                    outcome=outcome,
                    unfound=unfound,
                    hits=hits,
                    seconds=0.02,
                    models=("offline",),
                )
            )
        )
    return rows


REPORT_MODES = ("terms", "terms+index-embedder")


def _log_of(tmp: Path, name: str, rows: int) -> tuple[str, dict[str, Any]]:
    from ragloop.turnlog import SQLiteBackend

    data = synthetic_rows(rows)
    backend = SQLiteBackend(tmp / f"{name}.db")
    for i in range(0, len(data), 5_000):
        backend.write(data[i : i + 5_000], ())
    backend.close()
    facts = {
        "rows": rows,
        "gap_rows": sum(r.row.outcome != "context" for r in data),
        "distinct_gap_questions": len({r.row.question_hash for r in data if r.row.outcome != "context"}),
    }
    return f"sqlite:{tmp / f'{name}.db'}", facts


def _timed_gaps(url: str, tmp: Path, extra: list[str]) -> dict[str, Any]:
    from ragloop.cli import main

    html, report = tmp / "r.html", tmp / "r.json"
    started = time.perf_counter()
    saved = sys.stdout
    with report.open("w") as fh:
        sys.stdout = fh
        try:
            status = main(["gaps", "--turn-log", url, "--since", "31d", "--json", "--html", str(html), *extra])
        finally:
            sys.stdout = saved
    seconds = time.perf_counter() - started
    got = json.loads(report.read_text())
    return {
        "status": status,
        "seconds": seconds,
        "topics_listed": len(got["topics"]),
        "gap_turns": got["gap_turns"],
        "html_bytes": html.stat().st_size,
        "method": got["method"],
        "load": _load(),
    }


def report_time(
    rows: int, embedded_rows: int, embedder: str = "default", cache_dir: str | None = None
) -> dict[str, Any]:
    """``ragloop gaps`` on ``rows`` synthetic rows with term vectors, and on ``embedded_rows`` with ``--index``
    (every distinct gap question embedded at report time: that cost grows with distinct questions, not rows)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        url, facts = _log_of(tmp, "big", rows)
        out["terms"] = {**facts, **_timed_gaps(url, tmp, [])}
        index = tmp / "index"
        _sample(embedder, cache_dir).save(index)  # the sample's default embedder: MiniLM with the [embed] extra
        url, facts = _log_of(tmp, "small", embedded_rows)
        timed = _timed_gaps(url, tmp, ["--index", str(index)])
        per_question = timed["seconds"] / max(facts["distinct_gap_questions"], 1) * 1e3
        out["terms+index-embedder"] = {**facts, **timed, "ms_per_distinct_gap_question": per_question}
    return out


# --- 3. grouping quality -----------------------------------------------------------------------------------

DEV_TOPICS: dict[str, list[str]] = {
    "zapier": [
        "Does Lumen integrate with Zapier?",
        "Is there a Zapier app for Lumen?",
        "Is Lumen on Zapier?",
        "Where do I find the Zapier connector?",
        "Can I connect Zapier to Lumen?",
        "Zapier integration?",
    ],
    "gantt": [
        "How do I view my project as a Gantt chart?",
        "Is there a Gantt view?",
        "Does Lumen have Gantt charts?",
        "How do I export a Gantt chart?",
        "Can I see tasks on a Gantt chart timeline?",
    ],
    "asana": [
        "Can I import my projects from Asana?",
        "Import Asana tasks into Lumen",
        "Does the importer support Asana?",
        "How do I migrate from Asana to Lumen?",
        "Will Asana attachments come over in the import?",
    ],
    "sms": [
        "Can notifications be sent by SMS?",
        "Do you send SMS notifications?",
        "Can Lumen notify me by SMS?",
        "Can I get a text message when a task is assigned?",
        "SMS alerts for mentions?",
    ],
    "dark": [
        "Is there a dark mode?",
        "How do I turn on dark mode?",
        "Dark theme for the web app?",
        "Can I switch Lumen to a dark theme?",
        "Does the mobile app have dark mode?",
    ],
    "recurring": [
        "Can I create recurring tasks?",
        "How do I make a task repeat every week?",
        "Repeating tasks?",
        "Set a task to recur monthly",
        "Do recurring tasks copy their subtasks?",
    ],
}
TEST_TOPICS: dict[str, list[str]] = {
    "msteams": [
        "Is there a Microsoft Teams integration?",
        "Can Lumen post notifications to Microsoft Teams?",
        "How do I connect Lumen with MS Teams?",
        "Teams app for Lumen?",
        "Send task updates to a Teams channel",
    ],
    "timetracking": [
        "Can I track time on tasks?",
        "Is there a built-in timer for tasks?",
        "How do I log hours?",
        "Time tracking per project?",
        "Can I export timesheets?",
    ],
    "calendar": [
        "Does Lumen sync with Google Calendar?",
        "Can due dates show up in my Google Calendar?",
        "Calendar sync for tasks?",
        "How do I subscribe to my tasks in Outlook calendar?",
        "Two-way calendar sync?",
    ],
    "domain": [
        "Can I use my own domain for the status page?",
        "Custom domain for the status page?",
        "How do I put the status page on status.mycompany.com?",
        "CNAME for the status page?",
    ],
    "pdf": [
        "Can I export a task as PDF?",
        "Print a project to PDF",
        "How do I save a board as a PDF?",
        "PDF export of tasks?",
        "Download tasks as a PDF file",
    ],
    "merge": [
        "Can I merge two workspaces?",
        "How do I combine two workspaces into one?",
        "Merge workspaces after an acquisition?",
        "Move everything from one workspace into another",
    ],
    "swimlanes": [
        "Does the board view have swimlanes?",
        "Kanban swimlanes by assignee?",
        "How do I add swimlanes to a board?",
        "Group board cards into swimlanes",
    ],
    "offline": [
        "Does the mobile app work offline?",
        "Can I edit tasks without internet?",
        "Offline mode?",
        "Will changes sync after I was offline?",
        "Use Lumen on a plane without wifi",
    ],
}
DEV_NOISE = [
    "What is the capital of Australia?",
    "Is Lumen HIPAA compliant in Canada?",
    "Who founded Lumen?",
    "Can I pay with bitcoin?",
    "Is there an API for the audit log retention?",
    "How do I rename the trash?",
]
TEST_NOISE = [
    "What is the weather in Paris?",
    "Can I get a refund after a year?",
    "Does Lumen have a Linux app?",
    "Is there a student discount?",
    "Can I change my workspace URL twice?",
    "Who owns my data in China?",
]


def _ari(truth: list[int], pred: list[int]) -> float:
    n = len(truth)
    table = Counter(zip(truth, pred, strict=True))
    comb = lambda x: x * (x - 1) / 2  # noqa: E731
    index = sum(comb(v) for v in table.values())
    a = sum(comb(v) for v in Counter(truth).values())
    b = sum(comb(v) for v in Counter(pred).values())
    expected = a * b / comb(n) if n > 1 else 0.0
    top = (a + b) / 2
    return (index - expected) / (top - expected) if top != expected else 1.0


def _pairs(truth: list[int], pred: list[int]) -> tuple[float, float, float]:
    same_t = {(i, j) for i in range(len(truth)) for j in range(i) if truth[i] == truth[j]}
    same_p = {(i, j) for i in range(len(pred)) for j in range(i) if pred[i] == pred[j]}
    both = len(same_t & same_p)
    precision = both / len(same_p) if same_p else 1.0
    recall = both / len(same_t) if same_t else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def _grouping(topics: dict[str, list[str]], noise: list[str], embed: Any, threshold: float) -> dict[str, float]:
    """Group the gap questions as ``build_report`` does (terms against the whole traffic, plus embeddings)."""
    from ragloop.gaps import ATTACH_FLOOR, ATTACH_MARGIN, cluster, combine, lexical_vectors
    from ragloop.text.terms import key_terms, stem

    questions = [q for qs in topics.values() for q in qs] + noise
    truth = [i for i, qs in enumerate(topics.values()) for _ in qs] + list(range(len(topics), len(topics) + len(noise)))
    background = [q for q in _ANSWERED for _ in range(30)]  # answered traffic, for the IDF
    stems = [[stem(t.surface) for t in key_terms(q)] for q in questions]
    df: Counter[str] = Counter()
    for ts in [*stems, *([stem(t.surface) for t in key_terms(q)] for q in background)]:
        df.update(set(ts))
    lexical = lexical_vectors(stems, df, len(questions) + len(background))
    vectors = combine(lexical, np.asarray(embed(questions), dtype=np.float32)) if embed is not None else lexical
    attach = (ATTACH_FLOOR, ATTACH_MARGIN) if embed is not None else None  # as build_report: with embeddings
    pred = cluster(vectors, [1.0] * len(questions), threshold, attach=attach)
    precision, recall, f1 = _pairs(truth, pred)
    return {"precision": precision, "recall": recall, "f1": f1, "ari": _ari(truth, pred), "groups": len(set(pred))}


def grouping_quality(minilm: bool = True) -> dict[str, Any]:
    from ragloop.gaps import DEFAULT_THRESHOLD, DENSE_THRESHOLD
    from ragloop.retrievers.embed import HashEmbedder

    embedders: list[tuple[str, Any, float]] = [("terms", None, DEFAULT_THRESHOLD)]
    embedders.append(("terms+hash-512", HashEmbedder().embed_sync, DENSE_THRESHOLD))
    try:
        from ragloop.retrievers.embed import MiniLMEmbedder

        if minilm:
            embedders.append(("terms+minilm", MiniLMEmbedder().embed_sync, DENSE_THRESHOLD))
    except Exception as exc:  # noqa: BLE001 — the [embed] extra is optional; the table says it is missing
        print(f"(MiniLM not available: {exc})", file=sys.stderr)
    grid = [round(0.1 + 0.05 * i, 2) for i in range(11)]
    out: dict[str, Any] = {}
    for name, embed, default in embedders:
        dev = {t: _grouping(DEV_TOPICS, DEV_NOISE, embed, t) for t in grid}
        best = max(grid, key=lambda t: (dev[t]["f1"], -abs(t - default)))
        out[name] = {
            "dev_grid_f1": {str(t): round(dev[t]["f1"], 3) for t in grid},
            "dev_best_threshold": best,
            "library_default": default,
            "held_out_at_default": _grouping(TEST_TOPICS, TEST_NOISE, embed, default),
            "held_out_at_dev_best": _grouping(TEST_TOPICS, TEST_NOISE, embed, best),
        }
    return out


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60, help="turns per mode for the turn-log cost")
    parser.add_argument("--rows", type=int, default=100_000, help="synthetic rows for the report time")
    parser.add_argument("--embedded-rows", type=int, default=10_000, help="rows for the report with --index")
    parser.add_argument("--skip-report", action="store_true")
    parser.add_argument("--grouping-only", action="store_true", help="only the grouping quality (writes --out)")
    parser.add_argument("--embedder", choices=("default", "hash"), default="default", help="the sample index's")
    parser.add_argument("--cache-dir", help="where the sample index is cached (~/.cache/ragloop)")
    parser.add_argument("--out", default=str(RESULTS / "bench_gaps.json"), help="results file (.txt beside it)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object, last")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)
        lines.append(text)

    q = grouping_quality(minilm=args.embedder == "default")
    results["grouping"] = q
    say("grouping quality: pairwise F1 / ARI on held-out topics (threshold chosen on the development topics)")
    say(f"{'vectors':<16} {'default':>7} {'dev best':>8} {'P':>6} {'R':>6} {'F1':>6} {'ARI':>6}   (at dev best)")
    for name, r in q.items():
        h, b = r["held_out_at_default"], r["held_out_at_dev_best"]
        say(
            f"{name:<16} {r['library_default']:>7} {r['dev_best_threshold']:>8} {h['precision']:>6.3f} "
            f"{h['recall']:>6.3f} {h['f1']:>6.3f} {h['ari']:>6.3f}   (F1 {b['f1']:.3f}, ARI {b['ari']:.3f})"
        )
    say(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.grouping_only:
        results["command"] = " ".join(sys.argv)
        out = Path(args.out)
        out.write_text(json.dumps({"result": q, "meta": results}, indent=2) + "\n", encoding="utf-8")
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return 0
    say()
    cost = turn_log_cost(args.turns, args.embedder, args.cache_dir)
    results["turn_log_cost"] = cost
    say(f"turn log cost: {cost['turns_per_mode']} offline turns per mode, interleaved ({cost['embedder']})")
    say(f"  {cost['load']}")
    say(
        f"  p50 without log {cost['p50_off_ms']:.2f} ms, with log {cost['p50_on_ms']:.2f} ms: "
        f"{cost['p50_overhead_pct']:+.2f} %"
    )
    say(f"  p95 without log {cost['p95_off_ms']:.2f} ms, with log {cost['p95_on_ms']:.2f} ms")
    say(
        f"  median of the paired differences (same question, back to back): "
        f"{cost['paired_median_diff_pct']:+.2f} % of p50; the same for a second chat without a log (the noise "
        f"floor): {cost['control_paired_median_diff_pct']:+.2f} %"
    )
    say(
        f"  in the turn (pending_turn + record): {cost['handoff_us_per_turn']:.1f} us "
        f"= {cost['handoff_pct_of_p50']:.3f} % of p50"
    )
    say(
        f"  writer thread per row (prepare + batched insert), in the background: {cost['writer_us_per_row']:.1f} us "
        f"= {cost['writer_pct_of_p50']:.2f} % of p50"
    )
    say(f"  rows written {cost['rows_written']}, dropped {cost['rows_dropped']}, write errors {cost['write_errors']}")
    if not args.skip_report:
        say()
        rep = report_time(args.rows, args.embedded_rows, args.embedder, args.cache_dir)
        results["report_time"] = rep
        say("report time: `ragloop gaps --since 31d --json --html` on synthetic logs")
        for name in REPORT_MODES:
            r = rep[name]
            say(
                f"  {name:<22} {r['rows']:>7,} rows ({r['gap_rows']:,} gap rows, {r['distinct_gap_questions']:,} "
                f"distinct gap questions): {r['seconds']:6.1f} s, {r['topics_listed']} topics; {r['load']}"
            )
            say(f"  {'':<22} {r['method']}")
        per = rep["terms+index-embedder"]["ms_per_distinct_gap_question"]
        say(f"  with --index the report embeds each distinct gap question: {per:.1f} ms per distinct question here")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
