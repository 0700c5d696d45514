"""Where the model planner lived before :mod:`ragloop.llm.openai`: its names, re-exported."""

from __future__ import annotations

from ragloop.llm.openai._plan import OpenAIPlanner, OpenAISQLWriter, plan_from_json

__all__ = ["OpenAIPlanner", "OpenAISQLWriter", "plan_from_json"]
