"""Judges and the retrieval planner over any OpenAI-compatible chat server (OpenAI, vLLM, Ollama, llama.cpp).

Each judge takes an ``openai.AsyncOpenAI`` client built by the caller (never here), a model name, a timeout
and an output cap. A call's total time, the client's own retries (``max_retries``, for 429 and 5xx answers)
included, is its timeout cut to a share of what is left of the turn's deadline, so the offline fallbacks
behind it still run in time (:mod:`ragloop.llm.budget`). Every request carries its output cap as
``max_completion_tokens`` (``max_tokens`` for servers that reject it), and every ``finish_reason`` is read:
complete tool calls survive a cut, a cut answer says so, an empty or filtered answer fails so the offline
answerer takes over. Every call, failed ones too, is recorded on the turn's usage meter with the
server-reported token counts.

Failures surface as :class:`~ragloop.errors.JudgeError` subclasses the nodes can fail open on:

- :class:`~ragloop.errors.JudgeTimeout`: the call (or a stalled stream) ran past its budget;
- :class:`~ragloop.errors.JudgeOutputError`: unparseable or unusable output (bad tool arguments, bad JSON,
  empty choices, a malformed stream chunk, garbage queries, a plain-text reply to a question that needs a
  search); :class:`~ragloop.errors.JudgeTruncated` when it stopped at the output cap;
- :class:`~ragloop.errors.JudgeError`: HTTP errors after the retries, connection failures, cut streams.

One judge a module, one call path for all (``_call``: budget, output cap and its ``max_tokens`` fallback,
the non-JSON guard, finish-reason metering, error redaction), which :class:`OpenAIPlanner` and
:class:`OpenAISQLWriter` use too. This package imports ``openai``; import it only where a model is used.
"""

from __future__ import annotations

from ragloop.errors import ToolsDropped
from ragloop.llm.openai._answer import OpenAIAnswerer
from ragloop.llm.openai._call import ServerCompat
from ragloop.llm.openai._decide import DecideMode, OpenAIDecider, parse_search_calls
from ragloop.llm.openai._grade import OpenAIGrader, parse_verdict
from ragloop.llm.openai._judges import OpenAIJudges
from ragloop.llm.openai._plan import OpenAIPlanner, OpenAISQLWriter, plan_from_json
from ragloop.llm.openai._rewrite import OpenAIRewriter, clean_query

__all__ = [
    "DecideMode",
    "OpenAIAnswerer",
    "OpenAIDecider",
    "OpenAIGrader",
    "OpenAIJudges",
    "OpenAIPlanner",
    "OpenAIRewriter",
    "OpenAISQLWriter",
    "ServerCompat",
    "ToolsDropped",
    "clean_query",
    "parse_search_calls",
    "parse_verdict",
    "plan_from_json",
]
