"""Gap grouping on a planted-topic log: are all paraphrases of an unanswerable topic put in one gap?

Topics the bundled sample knowledge base does not answer, four paraphrases each (set ``heldout-1``: a
whiteboard, Trello import, video calls; ``heldout-2``: Gantt charts, dark mode, a desktop app, recurring tasks;
``heldout-3``: interface language, keyboard shortcuts, mind maps, email-to-task, printing), are asked through the
offline chat over the sample by several users over a week, mixed with the sample's answerable questions; every
turn goes to a SQLite turn log. With ``--embedder minilm`` (the default) the sample is indexed with MiniLM and the
report is built exactly as ``ragloop gaps --turn-log … --index DIR --since … --min-turns 2`` builds it (each
distinct gap question embedded once; the report's time and the number embedded are printed); with ``--embedder
hash``, as ``ragloop gaps`` builds it without ``--index`` (terms only). For each planted topic it prints the rank
of the report topic holding most of its paraphrases, how many of its 4 that topic holds, any other question in it,
and any paraphrase the chat answered (no gap, so never grouped).

It asserts nothing; it prints the table with the load average and writes
``benchmarks/results/bench_gap_topics-SET.json`` and ``.txt`` (``-SET-hash`` with ``--embedder hash``).

``heldout-1`` and ``heldout-2`` were each written as held out, looked at, and then used by #34 to tune the
grouping (missing terms, retrieval neighbourhood, then the embedding weight and threshold): tuning data now.
``heldout-3`` was written and committed before any run on it, looked at once, and became tuning data too;
``heldout-4`` (voting, voice input, emoji reactions, expenses, gamification) was written and committed before any
run on it: the figure to quote (every look is in ``benchmarks/results/validation-log.md``). ``heldout-5`` (a CRM,
reporting dashboards, intake forms, a browser extension, team workload) was written and committed before any change
of #34 round 5 and any run on it: round 5's held-out set, looked at once, at the end of the round. ``heldout-6``
(OKRs and goals, image and PDF annotation, inventory of equipment, e-signatures, social media posting) was written
and committed by a helper before any change of #34 round 7 and any run on it: round 7's held-out set, to be looked at
once, at the end of the round. ``heldout-7`` (screen-reader accessibility, maps and locations, files in cloud storage,
bulk editing, a referral programme) was written and committed by a helper before any change of #34 round 9 and any
run on it: round 9's held-out set, to be looked at once, at the end of the round. Besides each topic's count it
reports purity: any report topic that mixes a planted topic with another or with other questions.

With ``--llamacpp`` the same logged turns are also grouped as ``ragloop gaps --model`` groups them, the model
being SmolLM2-135M on llama.cpp's own server (``tests/llamacpp_server.py``; ``with_model`` in the results, files
``-smollm2``): what the hint does with the one real model this machine runs.

Usage: ``nice python benchmarks/bench_gap_topics.py [--set heldout-1|…|heldout-7] [--embedder minilm|hash]
[--llamacpp]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

PLANTED: dict[str, list[str]] = {
    "whiteboard": [
        "Is there a whiteboard feature?",
        "Can I draw on a whiteboard in Lumen?",
        "Whiteboard for brainstorming with my team?",
        "How do I open a shared whiteboard?",
    ],
    "trello": [
        "Can I import my boards from Trello?",
        "Trello import?",
        "How do I move from Trello to Lumen?",
        "Does the importer bring over Trello cards?",
    ],
    "video": [
        "Can I start a video call from a task?",
        "Is there built-in video calling?",
        "Video meetings inside Lumen?",
        "How do I call a teammate by video?",
    ],
}
#: A second held-out set, written (and committed) before any result on it was seen, after the first set above had
#: been looked at and become tuning data for the grouping (#34). Several paraphrases share no content word with
#: the rest of their topic ("native app for my laptop" vs "desktop client").
PLANTED_2: dict[str, list[str]] = {
    "gantt": [
        "Is there a Gantt chart view?",
        "Can I see my project as a Gantt chart?",
        "How do I show task dependencies as bars on a timeline?",
        "Gantt view for planning releases?",
    ],
    "darkmode": [
        "Does Lumen have a dark mode?",
        "How do I switch to the dark theme?",
        "Can the app use a black background at night?",
        "Dark mode on the web app?",
    ],
    "desktop": [
        "Is there a desktop app for Windows?",
        "Can I install Lumen on my Mac as an application?",
        "Desktop client download?",
        "Native app for my laptop instead of the browser?",
    ],
    "recurring": [
        "Can a task repeat every week?",
        "How do I make a recurring task?",
        "Recurring tasks on a schedule?",
        "Create the same chore again each Monday?",
    ],
}
#: A third held-out set, written (and committed) before any run on it, after heldout-1 and heldout-2 had both been
#: looked at and become tuning data for the embedding weight and threshold (#34). One paraphrase per topic, at
#: least, shares no content word with the rest of its topic.
PLANTED_3: dict[str, list[str]] = {
    "language": [
        "Can I use Lumen in French?",
        "Is the interface translated into other languages?",
        "How do I change the display language to German?",
        "Spanish version of the product?",
    ],
    "shortcuts": [
        "What are the keyboard shortcuts?",
        "Is there a list of hotkeys?",
        "Can I create a task without touching the mouse?",
        "Keyboard shortcut to jump to search?",
    ],
    "mindmap": [
        "Can I make a mind map?",
        "Mind map view for brainstorming ideas?",
        "How do I sketch connected ideas as bubbles branching from a centre?",
        "Is there mind mapping for planning?",
    ],
    "email": [
        "Can I forward an email to create a task?",
        "Is there an inbox address that turns emails into tasks?",
        "How do I turn a message from Outlook into a to-do?",
        "Email to task?",
    ],
    "print": [
        "How do I print my task list?",
        "Print a project?",
        "Can I get a paper copy of the board?",
        "Printable view of tasks?",
    ],
}
#: A fourth held-out set, written (and committed) before any run on it, after heldout-1, -2 and -3 had all been
#: looked at and become tuning data (#34). Topics the sample knowledge base does not cover and that share no key
#: word with each other; at least one paraphrase per topic shares no content word with the rest of its topic.
PLANTED_4: dict[str, list[str]] = {
    "voting": [
        "Can team members vote on ideas?",
        "Is there a poll feature?",
        "How do I let colleagues upvote a feature request?",
        "Run a quick survey among my teammates?",
    ],
    "voice": [
        "Can I create a task by voice?",
        "Is there speech-to-text dictation?",
        "Dictate a to-do with Siri?",
        "Can I talk to my phone and have it add a reminder?",
    ],
    "emoji": [
        "Can I react to a comment with an emoji?",
        "Thumbs-up reactions on tasks?",
        "How do I add a smiley to someone's update?",
        "Emoji responses in discussions?",
    ],
    "expenses": [
        "Can I attach receipts and track expenses?",
        "Is there expense tracking per project?",
        "How do I log money spent on a job?",
        "Reimbursement claims for travel costs?",
    ],
    "gamification": [
        "Do users earn badges or points for finishing tasks?",
        "Is there a leaderboard?",
        "Gamification to motivate the team?",
        "Can people collect rewards for closing work?",
    ],
}
#: A fifth held-out set, written (and committed) before any change of #34 round 5 and any run on it. Topics the
#: sample knowledge base does not cover and that overlap none of heldout-1..4, worded as different users would ask.
PLANTED_5: dict[str, list[str]] = {
    "crm": [
        "Can I keep track of my sales leads and deals in Lumen?",
        "Is there a CRM module?",
        "Where do I store client contacts with their phone numbers?",
        "Manage a sales pipeline for our customers?",
    ],
    "dashboards": [
        "Is there a reporting dashboard with charts?",
        "Can I get a burndown chart for our sprint?",
        "How do I see a pie chart of tasks by status?",
        "Graph of how many tasks we closed each week, to show management?",
    ],
    "forms": [
        "Can I build a form that creates a task when someone submits it?",
        "Is there a form builder?",
        "Let customers send us bug reports through a web form?",
        "How can people without an account file requests into a project?",
    ],
    "extension": [
        "Is there a Chrome extension?",
        "Firefox add-on for Lumen?",
        "Can I save the web page I'm reading as a task from my browser toolbar?",
        "Browser plugin to clip articles into Lumen?",
    ],
    "workload": [
        "How can I see who on my team is overloaded?",
        "Is there a workload view showing each person's capacity?",
        "Resource planning: how many hours is each teammate booked for this week?",
        "Balance assignments so nobody has too much on their plate?",
    ],
}
#: A sixth held-out set, written (and committed) by a helper before any change of #34 round 7 and any run on it.
#: Topics the sample knowledge base does not cover and that overlap none of heldout-1..5, worded as different users
#: would ask; at least one paraphrase per topic shares no content word with the rest of its topic.
PLANTED_6: dict[str, list[str]] = {
    "okrs": [
        "Can I track OKRs in Lumen?",
        "Is there a goals module for quarterly objectives and key results?",
        "How do I link my tasks to a company goal and see how far along it is?",
        "Where can leadership set targets for the year and watch how close we are?",
    ],
    "annotation": [
        "Can I pin a comment to a spot on an image?",
        "Is there a way to mark up a PDF with notes?",
        "Proofing tool for reviewing design mockups?",
        "How can a reviewer circle the part of a screenshot they want changed?",
    ],
    "inventory": [
        "Can I keep track of our company laptops and equipment in Lumen?",
        "Do you offer asset management?",
        "Inventory of stock items with quantities?",
        "How do I record which monitor was lent to which employee?",
    ],
    "esignature": [
        "Can clients sign a contract electronically in Lumen?",
        "Do you support e-signatures?",
        "Collect signatures on a sales agreement online?",
        "DocuSign-style approval of documents, with the customer's name written by hand?",
    ],
    "social": [
        "Can I schedule Instagram posts from Lumen?",
        "Is there a social media calendar for publishing posts?",
        "How do I plan our tweets and LinkedIn updates and have them go out automatically?",
        "Publish to Facebook at a set time?",
    ],
}
#: #34 round 9's held-out set, written (and committed) by a helper before any change of round 9 and any run on it.
#: Topics the sample knowledge base does not cover and that overlap none of heldout-1..6, worded as different users
#: would ask; at least one paraphrase per topic shares no content word with the rest of its topic.
PLANTED_7: dict[str, list[str]] = {
    "accessibility": [
        "Does Lumen support screen readers like JAWS or NVDA?",
        "Is the web app WCAG 2.1 AA compliant?",
        "Accessibility statement or VPAT for our procurement team?",
        "Can my blind colleague use it to keep track of his work?",
    ],
    "location": [
        "Can I see tasks on a map?",
        "Is there a map view in Lumen that plots where each job site is?",
        "How do I give a task a street address and get driving directions to it?",
        "GPS check-in for field technicians when they arrive at a customer's location?",
    ],
    "cloudstorage": [
        "Can I attach files from Google Drive to a task?",
        "Dropbox integration?",
        "Is there a way to link a OneDrive or SharePoint document in Lumen instead of uploading a copy?",
        "How do I open a spreadsheet kept on Box.com without downloading it first?",
    ],
    "bulkedit": [
        "How do I edit many tasks at once?",
        "Bulk update the assignee on a whole list of tasks?",
        "Can I select 50 tasks in Lumen and change their due date together?",
        "Move thirty cards to Done without dragging each one separately?",
    ],
    "referral": [
        "Do you have a referral programme?",
        "Is there an affiliate program for Lumen that pays commission?",
        "Can I earn credit on our bill by referring other companies to Lumen?",
        "If I recommend you to a friend's startup and they sign up, do I get a free month?",
    ],
}
SETS = {
    "heldout-1": (PLANTED, 5),
    "heldout-2": (PLANTED_2, 11),
    "heldout-3": (PLANTED_3, 17),
    "heldout-4": (PLANTED_4, 23),
    "heldout-5": (PLANTED_5, 29),
    "heldout-6": (PLANTED_6, 35),
    "heldout-7": (PLANTED_7, 41),
}
START = 1_746_403_200.0  # 2025-05-05 00:00 UTC
DAYS = 7


def _traffic(planted: dict[str, list[str]] = PLANTED, seed: int = 5) -> list[tuple[float, str, str]]:
    """(at, user, question): each paraphrase asked 3 times by different users, and the answerable questions."""
    from ragloop.sample import sample_questions_path

    rng = random.Random(seed)
    users = [f"key:user{i:02d}" for i in range(30)]
    out = []
    for questions in planted.values():
        for q in questions:
            for user in rng.sample(users, 3):
                out.append((START + rng.random() * DAYS * 86_400, user, q))
    lines = sample_questions_path().read_text(encoding="utf-8").splitlines()
    answerable = [q["question"] for q in map(json.loads, lines) if q["kind"] != "greeting" and q["expected_sources"]]
    for q in answerable * 2:
        out.append((START + rng.random() * DAYS * 86_400, rng.choice(users), q))
    return sorted(out)


def measure(name: str = "heldout-1", embedder: str = "hash", model: tuple[str, str] | None = None) -> dict[str, Any]:
    """Log the traffic, build the report as ``ragloop gaps`` does (with ``--index`` for a MiniLM index), score
    each planted topic; with ``model`` (base URL, model name) also as ``ragloop gaps --model`` builds it, from the
    same logged turns (``with_model``)."""
    import time

    from ragloop.chat import ChatRAG
    from ragloop.cli import main
    from ragloop.cli._gaps import _embedding
    from ragloop.gaps import build_report
    from ragloop.sample import sample_kb_path
    from ragloop.turn import Turn
    from ragloop.turnlog import TurnLog

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["index", str(sample_kb_path()), "--out", str(tmp / "index"), "--embedder", embedder]) == 0
        clock = {"now": START}
        log = TurnLog.open(f"sqlite:{tmp / 'turns.db'}", clock=lambda: clock["now"])
        rag = ChatRAG(Turn.from_index(tmp / "index"), turn_log=log)
        planted_set, seed = SETS[name]
        traffic = _traffic(planted_set, seed)

        async def run() -> list[str]:
            outcomes = []
            for at, user, question in traffic:
                clock["now"] = at
                outcomes.append((await rag.ask(question, principal=user)).outcome)
            await rag.aclose()
            return outcomes

        outcomes = anyio.run(run)
        reader = TurnLog.open(f"sqlite:{tmp / 'turns.db'}")
        turns = reader.turns(START, START + DAYS * 86_400, brief_answered=True)
        reader.close()
        embed, embedder_name = _embedding(str(tmp / "index")) if embedder != "hash" else (None, None)
        calls: list[int] = []

        def counted(texts: Any) -> Any:
            calls.append(len(texts))
            return embed(texts)

        started = time.perf_counter()
        report = build_report(
            turns,
            since=START,
            until=START + DAYS * 86_400,
            embed=None if embed is None else counted,
            embedder=embedder_name,
            min_turns=2,
            max_topics=20,
        )
        report_s = time.perf_counter() - started
        hinted = None if model is None else _with_model(turns, embed, embedder_name, model, planted_set)
    return {
        "set": name,
        **score(report, turns, planted_set),
        **({} if hinted is None else {"with_model": hinted}),
        "turns": len(turns),
        "gap_outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "topics_listed": len(report.topics),
        "method": report.method,
        "embedder": embedder,
        "report_s": round(report_s, 3),
        "questions_embedded": sum(calls),
        "load": os.getloadavg(),
    }


def _with_model(
    turns: Any, embed: Any, embedder_name: str | None, model: tuple[str, str], planted_set: dict[str, list[str]]
) -> dict[str, Any]:
    """The report ``ragloop gaps --model`` builds from the same turns (the model at ``model``), scored."""
    import time

    import openai

    from ragloop.gaps import build_report, sort_topics

    notes: list[str] = []
    seconds: list[float] = []

    def sort(questions: Any) -> Any:
        async def run() -> Any:
            async with openai.AsyncOpenAI(base_url=model[0], api_key="none", max_retries=0) as client:
                return await sort_topics(client, model[1], questions, timeout_s=600)

        started = time.perf_counter()
        topics = anyio.run(run)
        seconds.append(time.perf_counter() - started)
        notes.append(topics.note)
        return topics

    report = build_report(
        turns, since=START, until=START + DAYS * 86_400, embed=embed, embedder=embedder_name, min_turns=2, sort=sort
    )
    return {**score(report, turns, planted_set), "model": model[1], "note": notes, "model_s": seconds}


def score(report: Any, turns: Any, planted_set: dict[str, list[str]]) -> dict[str, Any]:
    """Each planted topic's best report topic (rank, paraphrases held, foreign questions) and the mixed topics."""
    from ragloop.gaps._build import is_gap

    question_of = {t.row.turn_id: t.row.question for t in turns}
    gap_questions = {t.row.question for t in turns if is_gap(t)}
    planted_of = {q: topic for topic, qs in planted_set.items() for q in qs}
    rows = []
    for topic_name, questions in planted_set.items():
        held = []
        for topic in report.topics:
            inside = {question_of[t] for t in topic.turn_ids}
            held.append((len(inside & set(questions)), topic, inside))
        count, topic, inside = max(held, key=lambda h: (h[0], -h[1].rank))
        others = sorted(q for q in inside if planted_of.get(q) != topic_name)  # type: ignore[arg-type]
        rows.append(
            {
                "topic": topic_name,
                "rank": topic.rank,
                "label": topic.label,
                "paraphrases_grouped": count,
                "of": len(questions),
                "answered_not_gaps": sorted(q for q in questions if q not in gap_questions),
                "other_questions_in_it": others,
                "outcomes": dict(topic.outcomes),
            }
        )
    # Purity: every report topic holding a planted paraphrase holds nothing else (no other planted topic, no
    # answerable or unplanted question).
    mixed = []
    for topic in report.topics:
        inside = {question_of[t] for t in topic.turn_ids}
        kinds = {planted_of.get(q, "(not planted)") for q in inside}  # type: ignore[arg-type]
        if len(kinds) > 1 and kinds - {"(not planted)"}:
            mixed.append({"rank": topic.rank, "label": topic.label, "holds": sorted(kinds)})
    return {
        "fully_grouped": sum(r["paraphrases_grouped"] == r["of"] for r in rows),
        "topics": len(rows),
        "mixed_topics": mixed,
        "planted": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Run it and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", choices=sorted(SETS), default="heldout-4", help="planted set (default heldout-4, the held-out one)"
    )
    parser.add_argument(
        "--embedder",
        choices=("hash", "minilm"),
        default="minilm",
        help="the knowledge base's embedder; minilm: the report is built as `ragloop gaps --index` builds it "
        "(questions embedded with MiniLM), hash: terms only (default minilm)",
    )
    parser.add_argument("--out", type=Path, help="results file (default bench_gap_topics-SET[-hash].json)")
    parser.add_argument(
        "--llamacpp",
        action="store_true",
        help="also group as `ragloop gaps --model` does, with SmolLM2-135M on llama.cpp's server "
        "(tests/llamacpp_server.py), from the same logged turns",
    )
    args = parser.parse_args(argv)
    suffix = ("" if args.embedder == "minilm" else "-hash") + ("-smollm2" if args.llamacpp else "")
    out = args.out or RESULTS / f"bench_gap_topics-{args.set}{suffix}.json"
    if args.llamacpp:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from llamacpp_server import LlamaCppServer

        with LlamaCppServer(n_ctx=8192) as server:
            result = measure(args.set, args.embedder, (server.base_url, server.model))
    else:
        result = measure(args.set, args.embedder)
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "command": " ".join(sys.argv)}
    lines = [
        f"planted-topic grouping, set {result['set']}: {result['fully_grouped']}/{result['topics']} topics fully "
        f"grouped, {len(result['mixed_topics'])} report topics mixing a planted topic with other questions",
        f"{result['turns']} logged turns (outcomes {result['gap_outcomes']}), "
        f"{result['topics_listed']} topics listed; {result['method']}",
        f"index embedder {result['embedder']}; report built in {result['report_s']:.2f} s, "
        f"{result['questions_embedded']} distinct questions embedded",
        f"{'topic':<12} {'rank':>4}  {'grouped':>7}  label / other questions in its topic",
    ]
    for r in result["planted"]:
        others = "; ".join(r["other_questions_in_it"]) or "none"
        answered = "".join(f" [answered, not a gap: {q}]" for q in r.get("answered_not_gaps", []))
        lines.append(
            f"{r['topic']:<12} {r['rank']:>4}  {r['paraphrases_grouped']:>3}/{r['of']:<3}  {r['label']} / {others}"
            + answered
        )
    one, five, fifteen = result["load"]
    for m in result["mixed_topics"]:
        lines.append(f"mixed: rank {m['rank']} {m['label']} holds {', '.join(m['holds'])}")
    hinted = result.get("with_model")
    if hinted is not None:
        lines.append(
            f"with --model ({hinted['model']}, {sum(hinted['model_s']):.1f} s): {hinted['fully_grouped']}/"
            f"{hinted['topics']} topics fully grouped, {len(hinted['mixed_topics'])} mixing; "
            + "; ".join(hinted["note"])
        )
        for r in hinted["planted"]:
            others = "; ".join(r["other_questions_in_it"]) or "none"
            lines.append(f"  {r['topic']:<12} {r['rank']:>4}  {r['paraphrases_grouped']:>3}/{r['of']:<3}  {others}")
        for m in hinted["mixed_topics"]:
            lines.append(f"  mixed: rank {m['rank']} {m['label']} holds {', '.join(m['holds'])}")
    lines.append(f"load average {one:.2f} {five:.2f} {fifteen:.2f}; {meta['cpus']} CPUs; Python {meta['python']}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"result": result, "meta": meta}, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
