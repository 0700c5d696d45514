"""The JSON schemas of the MCP tools' inputs and outputs, and the "answer from the knowledge base" prompt."""

from __future__ import annotations

from typing import Any

import mcp_types as types

__all__ = ["ASK_INPUT", "ASK_OUTPUT", "PROMPT", "SEARCH_INPUT", "SEARCH_OUTPUT", "prompt_text"]

_FILTERS: dict[str, Any] = {
    "type": "object",
    "description": "Metadata filters that narrow the search: a key to one value or a list of allowed values",
    "additionalProperties": {
        "anyOf": [
            {"type": "string", "maxLength": 256},
            {"type": "array", "items": {"type": "string", "maxLength": 256}, "minItems": 1, "maxItems": 100},
        ]
    },
    "maxProperties": 32,
}

SEARCH_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 2000, "description": "What to search for"},
        "k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5, "description": "How many hits"},
        "filters": _FILTERS,
    },
    "required": ["query"],
    "additionalProperties": False,
}

SEARCH_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "hits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The passage (chunk) id"},
                    "doc_id": {"type": "string", "description": "The document it belongs to"},
                    "title": {"type": "string"},
                    "url": {"type": ["string", "null"], "description": "An http(s) or relative link, or null"},
                    "snippet": {"type": "string", "description": "The passage's first 400 characters"},
                    "score": {"type": "number", "description": "Higher is better"},
                    "resource": {"type": "string", "description": "The document's ragloop://doc/{id} resource"},
                },
                "required": ["id", "doc_id", "title", "url", "snippet", "score", "resource"],
            },
        }
    },
    "required": ["hits"],
}

ASK_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "question": {"type": "string", "minLength": 1, "description": "The user's question"},
        "history": {
            "type": "array",
            "description": "Earlier messages of the conversation, oldest first",
            "items": {
                "type": "object",
                "properties": {"role": {"enum": ["user", "assistant"]}, "content": {"type": "string"}},
                "required": ["role", "content"],
                "additionalProperties": False,
            },
            "maxItems": 99,
        },
        "filters": _FILTERS,
    },
    "required": ["question"],
    "additionalProperties": False,
}

ASK_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "turn_id": {"type": "string", "description": "The turn, for POST /v1/feedback (a rating of the answer)"},
        "feedback": {"type": "boolean", "description": "True when the server keeps a turn log and takes ratings"},
        "text": {"type": "string", "description": "The answer, with [n] citation markers"},
        "outcome": {
            "enum": ["context", "partial", "none", "direct"],
            "description": "context: answered from the documents; partial: some parts found nothing (see "
            "missing); none: nothing relevant found; direct: no search needed",
        },
        "citations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "title": {"type": "string"},
                    "source": {"type": "string"},
                    "url": {"type": ["string", "null"]},
                    "sections": {
                        "type": "array",
                        "description": "The parts of the page the answer cites (its first is the citation's url)",
                        "items": {
                            "type": "object",
                            "properties": {"title": {"type": "string"}, "url": {"type": ["string", "null"]}},
                            "required": ["title", "url"],
                        },
                    },
                },
                "required": ["n", "title", "source", "url"],
            },
        },
        "missing": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["turn_id", "text", "outcome", "citations", "missing"],
}

PROMPT = types.Prompt(
    name="answer_from_kb",
    title="Answer from the knowledge base",
    description="Answer a question from the knowledge base only, citing its documents",
    arguments=[types.PromptArgument(name="question", description="The question to answer", required=True)],
)


def prompt_text(question: str) -> str:
    """The prompt's one user message for ``question``."""
    return (
        "Answer the question below from the knowledge base only. Call the `ask` tool with the question (or the "
        "`search` tool to read passages yourself), keep the [n] citation markers and list the sources at the end. "
        "If the outcome is 'none', say that the knowledge base has nothing on it; if 'partial', say which parts "
        "are missing. Do not answer from memory.\n\nQuestion: " + question
    )
