"""Calibrates the characters-per-token estimate of :class:`ragloop.text.tokens.CharEstimate` against a real
tokenizer: SmolLM2's, through llama.cpp's ``/tokenize`` (the server of ``tests/llamacpp_server.py``).

It counts the tokens of every chunk of the bundled sample knowledge base, of the judges' prompts as a turn
sends them (grading batches of six chunks, answer prompts with eight fenced blocks), and of a few chat
messages, and reports characters per token for each group and overall, with how far the default estimate is
off per text (median and worst, in per cent). It asserts nothing; it writes
``benchmarks/results/token_calibration.json``.

Usage: ``python benchmarks/calibrate_tokens.py [--base-url http://127.0.0.1:8089]`` (without ``--base-url`` it
starts llama.cpp itself).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ragloop.llm import batch_grade, prompts
from ragloop.retrievers.embed import HashEmbedder
from ragloop.sample import sample_index
from ragloop.state import ContextBlock, Hit
from ragloop.text.tokens import DEFAULT_CHARS_PER_TOKEN, CharEstimate

RESULTS = Path(__file__).parent / "results"
CHAT = [
    "Hi there!",
    "How much does the Business plan cost per seat?",
    "Compare the plan pricing and how to set up SSO with SAML.",
    "What is the status of ticket #1234? It has been open since Tuesday and nobody answered.",
    "Thanks, that helped. Can you also tell me how to rotate an API key without downtime?",
]


def tokenize(root: str, text: str) -> int:
    body = json.dumps({"content": text, "add_special": False}).encode()
    request = urllib.request.Request(f"{root}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return len(json.loads(response.read())["tokens"])


def texts() -> dict[str, list[str]]:
    index = sample_index(Path("/tmp/ragloop-calibrate"), embedder=HashEmbedder())
    chunks = [c.text for c in index.chunks]
    hits = [Hit(chunk=c, score=1.0) for c in index.chunks]
    nonce = "0123456789ab"
    grading = []
    for start in range(0, len(hits) - 5, 6):
        group = hits[start : start + 6]
        fenced = prompts.fence_blocks(batch_grade.batch_blocks("plan pricing", group, 2000), nonce)
        grading.append(
            batch_grade.batch_system_prompt(nonce, 2000, 6)
            + "\n"
            + batch_grade.batch_user_prompt("plan pricing", fenced)
        )
    answers = []
    for start in range(0, len(hits) - 7, 8):
        blocks = [
            ContextBlock(n=i, text=h.text, source=h.chunk.source, title=h.chunk.title)
            for i, h in enumerate(hits[start : start + 8], start=1)
        ]
        answers.append(
            prompts.answer_system_prompt("context", nonce)
            + "\n"
            + prompts.answer_user_prompt("How does it work?", blocks, "context", (), nonce)
        )
    return {"chunks": chunks, "grading_prompts": grading, "answer_prompts": answers, "chat_messages": CHAT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running llama.cpp server's root URL")
    parser.add_argument("--out", default=str(RESULTS / "token_calibration.json"))
    args = parser.parse_args()
    groups = texts()
    estimate = CharEstimate()

    def measure(root: str) -> dict[str, Any]:
        report: dict[str, Any] = {}
        all_chars = all_tokens = 0
        errors: list[float] = []
        for name, items in groups.items():
            counts = [tokenize(root, t) for t in items]
            chars = sum(len(t) for t in items)
            errs = [100 * (estimate.count(t) - n) / n for t, n in zip(items, counts, strict=True) if n]
            errors += errs
            all_chars, all_tokens = all_chars + chars, all_tokens + sum(counts)
            report[name] = {
                "texts": len(items),
                "chars": chars,
                "tokens": sum(counts),
                "chars_per_token": chars / sum(counts),
                "estimate_error_pct_median": statistics.median(errs),
                "estimate_error_pct_min": min(errs),
                "estimate_error_pct_max": max(errs),
            }
        report["overall"] = {
            "chars": all_chars,
            "tokens": all_tokens,
            "chars_per_token": all_chars / all_tokens,
            "estimate_error_pct_median": statistics.median(errors),
            "estimate_error_pct_min": min(errors),
            "estimate_error_pct_max": max(errors),
        }
        return report

    if args.base_url:
        groups_report = measure(args.base_url.rstrip("/").removesuffix("/v1"))
    else:
        from llamacpp_server import LlamaCppServer

        with LlamaCppServer() as server:
            groups_report = measure(server.root)
    report = {
        "tokenizer": "SmolLM2-135M-Instruct (llama.cpp /tokenize, no special tokens)",
        "estimate": estimate.name,
        "default_chars_per_token": DEFAULT_CHARS_PER_TOKEN,
        "groups": groups_report,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"tokenizer: {report['tokenizer']}; estimate {estimate.name}")
    print(
        f"{'group':<16}{'texts':>6}{'chars':>9}{'tokens':>8}{'chars/tok':>10}{'est. err median':>17}"
        f"{'min':>7}{'max':>7}"
    )
    for name, g in groups_report.items():
        print(
            f"{name:<16}{g.get('texts', ''):>6}{g['chars']:>9}{g['tokens']:>8}{g['chars_per_token']:>10.2f}"
            f"{g['estimate_error_pct_median']:>16.1f}%{g['estimate_error_pct_min']:>6.0f}%{g['estimate_error_pct_max']:>6.0f}%"
        )


if __name__ == "__main__":
    main()
