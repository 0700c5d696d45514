"""Where the OpenAI-compatible judges lived before :mod:`ragloop.llm.openai`: their names, re-exported."""

from __future__ import annotations

from ragloop.llm.openai import (
    DecideMode,
    OpenAIAnswerer,
    OpenAIDecider,
    OpenAIGrader,
    OpenAIJudges,
    OpenAIRewriter,
    ServerCompat,
    ToolsDropped,
    clean_query,
    parse_search_calls,
    parse_verdict,
)

__all__ = [
    "DecideMode",
    "OpenAIAnswerer",
    "OpenAIDecider",
    "OpenAIGrader",
    "OpenAIJudges",
    "OpenAIRewriter",
    "ServerCompat",
    "ToolsDropped",
    "clean_query",
    "parse_search_calls",
    "parse_verdict",
]
