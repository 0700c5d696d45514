"""The decide judge over an OpenAI-compatible server: native tool calls, or ``json_schema`` structured output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
import openai
from attrs import define, field

from ragloop.errors import JudgeOutputError, JudgeTruncated, ToolsDropped
from ragloop.llm import prompts
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget
from ragloop.llm.guards import is_small_talk, model_json, query_problem, reply_problem
from ragloop.llm.openai._call import (
    ServerCompat,
    _cap,
    _Chat,
    _finish_reason,
    _Meter,
    _normal,
    _positive,
    _stream_chunks,
)
from ragloop.state import Decision, Message, PageContext

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = ["DecideMode", "OpenAIDecider", "parse_search_calls"]

#: How the decider asks for its searches: ``tools`` (a ``search`` tool), ``json`` (a JSON reply, for servers
#: without tools) or ``auto`` (tools until the server drops them, then ``json``).
DecideMode = Literal["auto", "tools", "json"]


def parse_search_calls(calls: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Turn ``(tool name, JSON arguments)`` pairs into deduplicated search queries.

    Raises:
        JudgeOutputError: a call names another tool, its arguments are not a JSON object, or its
            ``query`` is missing, not a string, or blank.
    """
    queries: list[str] = []
    seen: set[str] = set()
    for name, arguments in calls:
        if name != "search":
            raise JudgeOutputError(f"decider called an unknown tool {name!r}; the only tool is 'search'")
        try:
            args = model_json(arguments or "{}")
        except ValueError as exc:
            raise JudgeOutputError(
                f"decider sent malformed JSON arguments to 'search': {arguments[:200]!r} ({exc})"
            ) from exc
        query = args.get("query") if isinstance(args, dict) else None
        if not isinstance(query, str) or not query.strip():
            raise JudgeOutputError(f"decider called 'search' without a non-empty string 'query': {arguments[:200]!r}")
        query = " ".join(query.split())
        if _normal(query) not in seen:
            seen.add(_normal(query))
            queries.append(query)
    return tuple(queries)


def _usable_queries(queries: Sequence[str], who: str) -> tuple[tuple[str, ...], list[str]]:
    """The queries that pass :func:`~ragloop.llm.guards.query_problem`, and why the others did not."""
    kept: list[str] = []
    rejected: list[str] = []
    for q in queries:
        problem = query_problem(q)
        if problem is None:
            kept.append(" ".join(q.split()))
        else:
            rejected.append(f"{q[:60]!r}: {problem}")
    if not kept:
        raise JudgeOutputError(f"{who}: no usable search query ({'; '.join(rejected) or 'none given'})")
    return tuple(kept), rejected


@define
class OpenAIDecider:
    """Decides whether to search: with native tool calling, or with structured output (``json_schema``).

    ``mode="tools"`` offers a ``search(query)`` tool (parallel calls); ``mode="json"`` asks for
    ``{"action": "search" | "reply", "queries": [...], "reply": "..."}`` under a ``json_schema`` grammar, for
    servers without tool support; ``mode="auto"`` (the default) starts with tools and switches to ``json``
    for good once the server answers a question that needs a search in plain text (tools dropped).

    A direct reply is accepted only when it is well-formed text, complete (``finish_reason="stop"``) and the
    question is small talk; a model that replies to anything else, or writes garbage, raises
    :class:`JudgeOutputError` so the node falls back to the offline decider. Tool calls cut by the output cap
    are dropped and the complete ones kept.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call (built and closed by the caller).
        model: Model name; a fast, cheap one is enough.
        timeout_s: Longest time for one call, the SDK's retries included; the turn's deadline may cut it
            further (see :class:`~ragloop.llm.budget.CallBudget`).
        glossary: Abbreviation → expansion, rendered into the system prompt.
        max_history: How many earlier conversation messages to send.
        stream: Request a streamed completion and assemble tool calls from their deltas (for servers and
            proxies that only stream); the Decision is the same.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        mode: ``auto``, ``tools`` or ``json`` (see above).
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=20.0, validator=_positive)
    glossary: Mapping[str, str] = field(factory=dict)
    max_history: int = 6
    stream: bool = False
    temperature: float | None = 0.0
    mode: DecideMode = field(default="auto", validator=attrs.validators.in_(("auto", "tools", "json")))
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["decide"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["decide"])
    compat: ServerCompat = field(factory=ServerCompat)

    @property
    def mode_in_use(self) -> Literal["tools", "json"]:
        """The mode the next call uses: ``json`` when set so, or in ``auto`` once tools were dropped."""
        if self.mode == "json" or (self.mode == "auto" and self.compat.tools_dropped):
            return "json"
        return "tools"

    def _chat(self) -> _Chat:
        return _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )

    def _messages(
        self, question: str, history: Sequence[Message], page: PageContext, json_mode: bool
    ) -> list[dict[str, Any]]:
        nonce = prompts.new_nonce()
        system = prompts.decide_system_prompt(page, self.glossary, nonce)
        if json_mode:
            system = prompts.decide_json_system_prompt(page, self.glossary, nonce)
        return [
            {"role": "system", "content": system},
            *prompts.history_messages(history, self.max_history),
            {"role": "user", "content": prompts.decide_user_prompt(question, page, nonce)},
        ]

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Return ``Decision(queries=…)`` or, for small talk, ``Decision(reply=…)``.

        Raises:
            JudgeOutputError: malformed, empty, cut or unusable output; a reply to a question that needs a
                search (:class:`ToolsDropped` in ``tools`` mode).
            JudgeTimeout: the call ran past its budget.
            JudgeError: the server failed after the client's retries.
        """
        if self.mode_in_use == "json":
            return await self._decide_json(question, history, page)
        try:
            return await self._decide_tools(question, history, page)
        except ToolsDropped as exc:
            if self.mode != "auto":
                raise
            self.compat.tools_dropped = True
            decision = await self._decide_json(question, history, page)
            return Decision(
                queries=decision.queries,
                reply=decision.reply,
                reason=f"{decision.reason}; switched to json_schema decide: {exc}",
            )

    async def _decide_tools(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        messages = self._messages(question, history, page, json_mode=False)
        params: dict[str, Any] = {"tools": [prompts.SEARCH_TOOL], "tool_choice": "auto", "parallel_tool_calls": True}
        chat = self._chat()
        if self.stream:
            with _Meter("decide", self.model) as meter:
                content, calls, finish = await _streamed_message(chat, "decide", messages, params, meter)
                return self._decision(question, content, calls, finish)
        return await chat.complete("decide", messages, lambda c: self._parse_completion(question, c), **params)

    def _parse_completion(self, question: str, completion: ChatCompletion) -> Decision:
        message = completion.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in (message.tool_calls or ()) if c.type == "function"]
        return self._decision(question, message.content or "", calls, _finish_reason(completion))

    def _decision(self, question: str, content: str, calls: Sequence[tuple[str, str]], finish: str | None) -> Decision:
        if calls:
            return self._from_calls(calls, finish)
        if finish == "content_filter":
            raise JudgeOutputError(f"decider: model {self.model!r} output was filtered (finish_reason=content_filter)")
        if finish == "length":
            cut = (
                f"decider: model {self.model!r} wrote text without a search call and stopped at the output cap "
                f"({self.max_tokens} tokens); a cut reply is never shown"
            )
            if is_small_talk(question):
                raise JudgeTruncated(cut)
            raise ToolsDropped(f"{cut}, and the question needs a search: the server may have dropped the tools")
        if not content.strip():
            raise JudgeOutputError(f"decider: model {self.model!r} returned neither a search call nor a reply")
        problem = reply_problem(content)
        if problem is not None:
            raise ToolsDropped(
                f"decider: model {self.model!r} wrote no tool call, and its text is no reply ({problem}); "
                "the server may not parse or offer tools for this model"
            )
        if not is_small_talk(question):
            raise ToolsDropped(
                f"decider: model {self.model!r} answered a question that needs a search in plain text, without "
                "calling 'search'; the server may have dropped the tools (a chat template without tool support)"
            )
        return Decision(reply=content.strip(), reason="model replied without searching (small talk)")

    def _from_calls(self, calls: Sequence[tuple[str, str]], finish: str | None) -> Decision:
        complete: list[tuple[str, str]] = []
        dropped: list[str] = []
        for name, arguments in calls:
            try:
                parse_search_calls([(name, arguments)])
            except JudgeOutputError as exc:
                if finish != "length":
                    raise
                dropped.append(str(exc))
                continue
            complete.append((name, arguments))
        if not complete:
            raise JudgeTruncated(
                f"decider: model {self.model!r} stopped at the output cap ({self.max_tokens} tokens) before any "
                "complete search call"
            )
        queries, rejected = _usable_queries(parse_search_calls(complete), f"decider ({self.model!r})")
        reason = f"model called search {len(calls)}x"
        if dropped:
            reason += f"; output cut at the cap: kept {len(complete)} complete call(s), dropped {len(dropped)}"
        if rejected:
            reason += f"; rejected {len(rejected)} unusable quer(ies): {'; '.join(rejected)}"
        return Decision(queries=queries, reason=reason)

    async def _decide_json(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        messages = self._messages(question, history, page, json_mode=True)
        response_format = dict(prompts.DECIDE_RESPONSE_FORMAT)
        return await self._chat().complete(
            "decide", messages, lambda c: self._parse_json(question, c), response_format=response_format
        )

    def _parse_json(self, question: str, completion: ChatCompletion) -> Decision:
        finish = _finish_reason(completion)
        content = completion.choices[0].message.content or ""
        if finish == "content_filter":
            raise JudgeOutputError(f"decider: model {self.model!r} output was filtered (finish_reason=content_filter)")
        try:
            obj = model_json(content)
        except ValueError as exc:
            cut = f" (cut at the output cap of {self.max_tokens} tokens)" if finish == "length" else ""
            err = JudgeTruncated if finish == "length" else JudgeOutputError
            raise err(f"decider: json_schema reply is not JSON{cut}: {content[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise JudgeOutputError(f"decider: json_schema reply is not an object: {content[:200]!r}")
        action, reply, raw = obj.get("action"), obj.get("reply"), obj.get("queries")
        queries = [q for q in raw if isinstance(q, str)] if isinstance(raw, list) else []
        if action == "reply" and isinstance(reply, str) and is_small_talk(question) and reply_problem(reply) is None:
            return Decision(reply=reply.strip(), reason="model replied without searching (small talk, json_schema)")
        who = f"decider ({self.model!r}, json_schema)"
        kept, rejected = _usable_queries(queries, who)
        reason = f"model asked for {len(kept)} search(es) (json_schema)"
        if action == "reply":
            reason += "; its direct reply was refused: the question is not small talk"
        if rejected:
            reason += f"; rejected {len(rejected)} unusable quer(ies): {'; '.join(rejected)}"
        return Decision(queries=kept, reason=reason)


async def _streamed_message(
    chat: _Chat, judge: str, messages: list[dict[str, Any]], params: dict[str, Any], meter: _Meter
) -> tuple[str, list[tuple[str, str]], str | None]:
    """Run a streamed completion; return its text, its tool calls assembled from deltas by index, and the
    finish reason."""
    text: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    finish: str | None = None
    async for chunk in _stream_chunks(chat, judge, messages, params, meter):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or ():
                if call.function is not None:
                    if call.function.name:
                        names[call.index] = call.function.name
                    arguments.setdefault(call.index, []).append(call.function.arguments or "")
    calls = [(names.get(i, ""), "".join(arguments.get(i, []))) for i in sorted(set(names) | set(arguments))]
    return "".join(text), calls, finish
