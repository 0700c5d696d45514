"""Prompt-prefix reuse on a real model server: the judges' prompts before and after the nonce moved last.

Servers keep the work of a prompt prefix they have processed (llama.cpp's slot cache, vLLM's and SGLang's prefix
caches, OpenAI's prompt caching) and process only what follows it. A fenced system prompt used to name its
request's fresh nonce in its second line, so two grading requests shared a dozen tokens; it now names it in its
last line (``ragloop.llm.prompts``), so every request of a kind shares all the instructions before it.

This script measures what the server processes, on one llama.cpp server (``tests/llamacpp_server.py``,
SmolLM2-135M) for both versions side by side: each round sends the same fixed requests (per question a decision,
two grading calls and an answer, the judges called directly with inputs fixed in advance: see :func:`worker`)
once with ``--before``'s ragloop and once with ``--after``'s (default: this checkout's), in alternating order,
each in its own process. What the server processed comes from its own log (``prompt eval time = … / N tokens``
per request: the tokens it did *not* take from its cache); what was sent comes from the calls' usage (the
server's ``prompt_tokens``). So ``reused`` = 1 − processed / sent, measured the same way for both versions
whatever each records. Two server set-ups: one slot (a request can reuse only the previous request's prefix) and
four slots (llama.cpp sends a request to the slot whose cached prompt is most like it, so each kind of prompt can
stay cached from one question to the next).

Usage::

    git archive <commit before> src | tar -x -C /tmp/before      # the version to compare with
    nice .venv/bin/python benchmarks/bench_prompt_cache.py --before /tmp/before/src [--after DIR]
    .venv/bin/python benchmarks/bench_prompt_cache.py --before /tmp/before/src --layout   # no server: lengths

It asserts nothing; it writes JSON and prints a table. Seconds are the server's own prompt-processing time (its
log), on a shared 2-core machine: compare them only within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: (question, its second search query) per turn-shaped request sequence.
QUESTIONS = (
    ("How much does the Business plan cost per seat?", "Business plan price per seat billed monthly"),
    ("How do I rotate an API key?", "revoke an old API key"),
    ("Which plans include SAML single sign-on?", "set up SAML single sign-on"),
)
#: Output caps (tokens) per judge, as ``bench_turn.py --base-url`` sets them.
CAPS = {"decide": 160, "grade": 48, "rewrite": 24, "answer": 96}
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def worker(base_url: str, model: str, slots: int) -> None:
    """Send :data:`QUESTIONS`' fixed requests to ``base_url`` with the ragloop on ``sys.path``; print one JSON line.

    Per question, the judges are called directly with inputs fixed in advance, so both versions send the same
    requests in the same order and only the prompts' layout differs: a decision (``json_schema`` mode, the page
    known), two grading calls (the question and its second query, each over the index's top 4 hybrid hits) and a
    streamed answer over the first query's 4 hits. (Whole turns would not do: what a weak model writes depends
    on the prompt's wording, so the two versions' turns take different paths and send different passages.)
    With ``slots`` > 1 the two grading calls go out together, as ``grade_concurrency`` sends them."""
    import anyio
    import openai

    from ragloop.llm.openai import OpenAIJudges
    from ragloop.sample import sample_index
    from ragloop.state import ContextBlock, PageContext
    from ragloop.usage import UsageMeter, metering

    index = sample_index()
    retriever = index.retriever("hybrid")
    page = PageContext(url="https://docs.example/lumen/settings", title="Settings")

    async def run() -> list[dict[str, Any]]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=300.0)
        judges = OpenAIJudges.create(
            client, fast_model=model, answer_model=model, timeout_s=300.0, grade_max_chars=600,
            decide_mode="json", max_tokens=CAPS,
        )  # fmt: skip
        out = []
        async with client:
            for question, second in QUESTIONS:
                meter = UsageMeter()
                t0 = time.perf_counter()
                hits = {q: list(await retriever.search(q, 4)) for q in (question, second)}
                with metering(meter):
                    with contextlib.suppress(Exception):  # a weak model's bad JSON is not the point here
                        await judges.decider.decide(question, (), page)

                    async def grade(query: str, passages: list[Any]) -> None:
                        with contextlib.suppress(Exception):
                            await judges.grader.grade_batch(query, passages)

                    if slots > 1:
                        async with anyio.create_task_group() as tg:
                            for query in (question, second):
                                tg.start_soon(grade, query, hits[query])
                    else:
                        for query in (question, second):
                            await grade(query, hits[query])
                    blocks = [
                        ContextBlock(n=i, text=h.chunk.text, source=h.chunk.source, title=h.chunk.title)
                        for i, h in enumerate(hits[question], 1)
                    ]
                    with contextlib.suppress(Exception):  # an answer cut at the cap raises after streaming
                        async for _ in judges.answerer.answer(question, blocks, "context"):
                            pass
                out.append(
                    {
                        "question": question,
                        "wall": time.perf_counter() - t0,
                        "prompt_tokens": meter.prompt_tokens,
                        "calls": [[c.judge, c.prompt_tokens, c.error] for c in meter.calls],
                    }
                )
        return out

    print(json.dumps(anyio.run(run)))


def layout() -> None:
    """Print, as one JSON line, each fenced system prompt's length and the characters two requests of its kind
    share from the start (two nonces; batch grading of 4 passages), for the ragloop on ``sys.path``."""
    from ragloop.llm import batch_grade, prompts
    from ragloop.state import PageContext

    page = PageContext(url="https://docs.example/lumen/settings", title="Settings")

    def kinds(nonce: str) -> dict[str, str]:
        return {
            "grade": prompts.grade_system_prompt(nonce, 600),
            "grade_batch": batch_grade.batch_system_prompt(nonce, 600, 4),
            "answer": prompts.answer_system_prompt("context", nonce),
            "decide_json": prompts.decide_json_system_prompt(page, None, nonce),
        }

    one, two = kinds("9f2c41d07a3b"), kinds("03e5a7c1d9f4")
    out = {}
    for kind, text in one.items():
        shared = next((i for i, (a, b) in enumerate(zip(text, two[kind], strict=False)) if a != b), len(text))
        out[kind] = {"chars": len(text), "shared_chars": shared}
    print(json.dumps(out))


def _server_log_tokens(log: Path, start: int) -> tuple[int, float, int]:
    """From byte ``start`` of the server's log: prompt tokens processed, their milliseconds, requests."""
    text = log.read_bytes()[start:].decode("utf-8", "replace")
    found = [(float(ms), int(n)) for ms, n in _PROMPT_EVAL.findall(text)]
    return sum(n for _, n in found), sum(ms for ms, _ in found), len(found)


def measure(before: Path, after: Path, rounds: int, slots_list: list[int]) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from llamacpp_server import LlamaCppServer

    variants = {"before": before, "after": after}
    configs = []
    for slots in slots_list:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "server.log"
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
            with LlamaCppServer(n_ctx=4096, slots=slots, log_path=log) as server:
                for r in range(rounds):
                    order = list(variants) if r % 2 == 0 else list(reversed(variants))
                    for name in order:
                        start = log.stat().st_size
                        env = {**os.environ, "PYTHONPATH": str(variants[name])}
                        cmd = [sys.executable, __file__, "--worker", "--base-url", server.base_url]
                        cmd += ["--model", server.model, "--slots", str(slots)]
                        t0 = time.perf_counter()
                        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
                        if done.returncode != 0:
                            raise SystemExit(f"{name} worker failed:\n{done.stderr[-3000:]}")
                        time.sleep(0.5)  # the server writes its timing lines after the response
                        turns = json.loads(done.stdout.strip().splitlines()[-1])
                        processed, prompt_ms, requests = _server_log_tokens(log, start)
                        sent = sum(t["prompt_tokens"] for t in turns)
                        runs[name].append(
                            {
                                "round": r,
                                "seconds": time.perf_counter() - t0,
                                "turns": turns,
                                "prompt_tokens_sent": sent,
                                "prompt_tokens_processed": processed,
                                "prompt_ms_server": prompt_ms,
                                "requests": requests,
                            }
                        )
                        print(
                            f"slots {slots} round {r} {name:<6} sent {sent:>6} processed {processed:>6} "
                            f"prompt {prompt_ms / 1000:6.1f} s  requests {requests}",
                            file=sys.stderr,
                            flush=True,
                        )
            summary = {}
            for name, rs in runs.items():
                sent = sum(x["prompt_tokens_sent"] for x in rs)
                processed = sum(x["prompt_tokens_processed"] for x in rs)
                summary[name] = {
                    "prompt_tokens_sent": sent,
                    "prompt_tokens_processed": processed,
                    "reused": round(1 - processed / sent, 4) if sent else None,
                    "prompt_s_server": round(sum(x["prompt_ms_server"] for x in rs) / 1000, 2),
                    "sequence_wall_median_s": round(statistics.median(t["wall"] for x in rs for t in x["turns"]), 2),
                    "requests": sum(x["requests"] for x in rs),
                }
            configs.append({"slots": slots, "runs": runs, "summary": summary})
    return {"configs": configs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="an exported src/ of the version to compare with")
    parser.add_argument(
        "--after", type=Path, default=ROOT / "src", help="the src/ to measure (default: this checkout's)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds per version (alternating order)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4], help="server set-ups: parallel slots")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_prompt_cache.json")
    parser.add_argument(
        "--layout", action="store_true", help="only each prompt's length and shared prefix, per version (no server)"
    )
    parser.add_argument("--layout-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layout_worker:
        layout()
        return
    if args.layout:
        _layouts(args)
        return
    if args.worker:
        worker(args.base_url, args.model, args.slots[0])
        return
    if args.before is None or not (args.before / "ragloop").is_dir():
        parser.error("--before must be an exported src/ folder holding ragloop/ (see the module docstring)")
    load = os.getloadavg()
    result = measure(args.before.resolve(), args.after.resolve(), args.rounds, args.slots)
    meta = {
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "questions": list(QUESTIONS),
        "caps": CAPS,
        "load_average_start": [round(x, 2) for x in load],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    lines = [
        f"# {meta['command']}  ({meta['machine']}; load {meta['load_average_start']} -> {meta['load_average_end']})",
        "# llama.cpp + SmolLM2-135M; per version: prompt tokens the requests sent, those the server processed (its "
        "log), the share it reused from its cache, its prompt-processing seconds, the median sequence (one question)",
        f"{'slots':>5}  {'version':<7} {'sent':>7} {'processed':>9} {'reused':>7} {'prompt s':>8} "
        f"{'seq s':>7} {'requests':>8}",
    ]
    for config in result["configs"]:
        for name, s in config["summary"].items():
            lines.append(
                f"{config['slots']:>5}  {name:<7} {s['prompt_tokens_sent']:>7} {s['prompt_tokens_processed']:>9} "
                f"{s['reused']:>7.3f} {s['prompt_s_server']:>8.1f} {s['sequence_wall_median_s']:>7.1f} "
                f"{s['requests']:>8}"
            )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **result}, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".txt").write_text(text, encoding="utf-8")


def _layouts(args: argparse.Namespace) -> None:
    """``--layout``: the prompts' lengths and shared prefixes for ``--before`` and ``--after``, printed and written
    beside ``--out`` as ``-layout.txt``."""
    if args.before is None or not (args.before / "ragloop").is_dir():
        raise SystemExit("--before must be an exported src/ folder holding ragloop/ (see the module docstring)")
    lines = [
        f"# python {' '.join(sys.argv)}",
        "# each fenced system prompt: its characters, and those two requests of its kind share from the start",
        f"{'kind':<12} {'version':<7} {'chars':>6} {'shared':>7} {'share':>6}",
    ]
    found = {}
    for name, src in (("before", args.before), ("after", args.after)):
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        cmd = [sys.executable, __file__, "--layout-worker"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])
    for kind in found["after"]:
        for name in ("before", "after"):
            k = found[name][kind]
            lines.append(
                f"{kind:<12} {name:<7} {k['chars']:>6} {k['shared_chars']:>7} {k['shared_chars'] / k['chars']:>6.3f}"
            )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(str(args.out).removesuffix(".json") + "-layout.txt").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
