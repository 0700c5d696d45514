"""``ragloop doctor``: what an OpenAI-compatible endpoint supports, probed with the requests ragloop sends.

Each probe is one small request with an output cap; none needs more than a few tokens:

- ``models``: ``GET /models``;
- ``server``: llama.cpp's ``/props`` when there is one (parallel slots, whether the chat template has tools);
- ``tool calls``: a ``search`` tool with ``tool_choice="required"`` — *honoured* (a tool call came back) or
  *dropped* (plain text: the server left the tools out of the prompt, e.g. a chat template without tools);
- ``json_schema``: a structured-output request — *enforced* (valid JSON of the schema) or rejected;
- ``streaming``: ``stream=True`` with ``stream_options.include_usage`` — chunks, time to first token, usage;
- ``output cap``: ``max_completion_tokens`` honoured, or rejected with ``max_tokens`` working instead;
- ``decide mode``: what :class:`~ragloop.llm.openai.OpenAIDecider` in ``auto`` mode will use: ``tools``
  when tool calls are honoured, ``json`` when they are dropped but ``json_schema`` works, else ``offline``.

This module imports ``openai``; import it only where the doctor is wanted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

import anyio
import openai
from attrs import asdict, frozen

from ragloop._redact import hide_password
from ragloop.llm import prompts
from ragloop.llm.guards import model_json

__all__ = ["DoctorReport", "Probe", "diagnose"]

Status = Literal["ok", "warn", "fail", "info"]
_QUESTION = "Search the documentation for: how do I rotate an API key?"
_SCHEMA: Mapping[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "doctor_probe",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}


@frozen
class Probe:
    """One finding.

    Attributes:
        name: What was probed.
        status: ``ok``, ``warn`` (works with a caveat, or ragloop works around it), ``fail`` or ``info``.
        detail: What the server did, in words.
        seconds: Wall time of the probe's request.
    """

    name: str
    status: Status
    detail: str
    seconds: float = 0.0


@frozen
class DoctorReport:
    """What :func:`diagnose` found.

    Attributes:
        base_url: The endpoint probed.
        model: The model requested.
        probes: The findings, in probe order.
        decide_mode: ``tools``, ``json`` or ``offline``.
        slots: Parallel slots the server reports (llama.cpp's ``/props``), else ``None``.
    """

    base_url: str
    model: str
    probes: tuple[Probe, ...]
    decide_mode: str
    slots: int | None = None

    def lines(self) -> list[str]:
        """The report as aligned text lines (what ``ragloop doctor`` prints)."""
        out = [f"endpoint      {self.base_url}", f"model         {self.model}"]
        out += [f"{p.name:<13} {p.status:<4}  {p.detail}" for p in self.probes]
        return out

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``ragloop doctor --json``)."""
        return asdict(self)


def _create(client: openai.AsyncOpenAI) -> Any:
    """``chat.completions.create``, tried once more after a dropped connection or a 5xx (never after a timeout:
    a hung server must not cost two). doctor's client makes no retries of its own, so that one transient failure
    is not reported as a missing capability."""
    create: Any = client.chat.completions.create  # Any: the SDK's overloads want TypedDict messages and tools

    async def once_more(**kwargs: Any) -> Any:
        try:
            return await create(**kwargs)
        except openai.APITimeoutError:
            raise
        except (openai.APIConnectionError, openai.InternalServerError):
            await anyio.sleep(0.2)
            return await create(**kwargs)

    return once_more


def _error(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    message = str(exc)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            message = str(inner["message"])
    return f"HTTP {status}: {message[:160]}" if status else f"{type(exc).__name__}: {message[:160]}"


async def _models(client: openai.AsyncOpenAI) -> Probe:
    t0 = time.perf_counter()
    try:
        page = await client.models.list()
    except openai.APIError as exc:
        return Probe("models", "warn", f"not listed ({_error(exc)}); chat may still work", time.perf_counter() - t0)
    ids = [m.id for m in page.data]
    shown = ", ".join(ids[:3]) + (f" (+{len(ids) - 3} more)" if len(ids) > 3 else "")
    return Probe("models", "ok" if ids else "warn", shown or "none listed", time.perf_counter() - t0)


async def _props(client: openai.AsyncOpenAI) -> tuple[Probe | None, int | None, bool | None]:
    """llama.cpp's ``/props``: the server probe, its slots, and whether its chat template renders tool calls."""
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    t0 = time.perf_counter()
    try:
        import httpx2  # the openai SDK's own HTTP library

        async with httpx2.AsyncClient(timeout=10.0) as http:
            response = await http.get(f"{root}/props")
        data = response.json() if response.status_code == 200 else None
    except Exception:  # noqa: BLE001 — /props is llama.cpp's extra: any failure just means "not llama.cpp"
        data = None
    if not isinstance(data, dict):
        return None, None, None
    slots = data.get("total_slots")
    caps = data.get("chat_template_caps") or {}
    tools = caps.get("supports_tool_calls")
    detail = f"llama.cpp, {slots} slot(s)"
    if tools is not None:
        detail += f"; chat template {'has' if tools else 'has no'} tool support"
    if isinstance(slots, int):
        detail += f" (set TurnSettings(grade_concurrency={slots}))"
    probe = Probe("server", "info", detail, time.perf_counter() - t0)
    return probe, slots if isinstance(slots, int) else None, tools if isinstance(tools, bool) else None


async def _tools(client: openai.AsyncOpenAI, model: str, cap: int, template_tools: bool | None = None) -> Probe:
    """The ``tool calls`` probe; ``template_tools`` is what ``/props`` said of the chat template (None: unknown)."""
    t0 = time.perf_counter()
    try:
        completion = await _create(client)(
            model=model,
            messages=[{"role": "user", "content": _QUESTION}],
            tools=[prompts.SEARCH_TOOL],
            tool_choice="required",
            max_completion_tokens=cap,
            temperature=0.0,
        )
    except openai.APIError as exc:
        return Probe("tool calls", "fail", f"rejected ({_error(exc)})", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if not completion.choices:
        return Probe("tool calls", "fail", "no choices in the reply", seconds)
    message = completion.choices[0].message
    calls = [c for c in message.tool_calls or () if c.type == "function"]
    if calls:
        first = calls[0].function
        return Probe("tool calls", "ok", f"honoured: {first.name}({first.arguments[:60]})", seconds)
    text = (message.content or "").strip().replace("\n", " ")
    if template_tools:  # the server offered the tools: the model did not use them
        why = "not called: the model answered in plain text although the chat template offers tools"
        return Probe("tool calls", "warn", f"{why} ({text[:50]!r}…); a stronger model or template is needed", seconds)
    return Probe(
        "tool calls",
        "warn",
        f"dropped: the model answered in plain text ({text[:50]!r}…); the chat template has no tools",
        seconds,
    )


async def _json_schema(client: openai.AsyncOpenAI, model: str, cap: int) -> Probe:
    t0 = time.perf_counter()
    try:
        completion = await _create(client)(
            model=model,
            messages=[{"role": "user", "content": 'Is Paris in France? Answer {"answer": "yes"} or {"answer": "no"}.'}],
            response_format=dict(_SCHEMA),
            max_completion_tokens=cap,
            temperature=0.0,
        )
    except openai.APIError as exc:
        return Probe("json_schema", "fail", f"rejected ({_error(exc)})", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    content = completion.choices[0].message.content if completion.choices else None
    try:
        obj = model_json(content or "")
    except ValueError:
        return Probe("json_schema", "warn", f"accepted, but the output is not JSON: {(content or '')[:50]!r}", seconds)
    if isinstance(obj, dict) and obj.get("answer") in ("yes", "no"):
        return Probe("json_schema", "ok", f"enforced: {content}", seconds)
    return Probe("json_schema", "warn", f"accepted, JSON does not match the schema: {(content or '')[:50]!r}", seconds)


async def _streaming(client: openai.AsyncOpenAI, model: str, cap: int) -> Probe:
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage = None
    try:
        response = await _create(client)(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=cap,
            temperature=0.0,
        )
        async with response:
            async for chunk in response:
                chunks += 1
                if first is None and any(c.delta.content for c in chunk.choices):
                    first = time.perf_counter() - t0
                usage = chunk.usage or usage
    except openai.APIError as exc:
        return Probe("streaming", "fail", f"failed ({_error(exc)})", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    ttft = f"first token after {first:.2f}s" if first is not None else "no text"
    if usage is None:
        return Probe("streaming", "warn", f"{chunks} chunks, {ttft}, no usage chunk (tokens not metered)", seconds)
    return Probe("streaming", "ok", f"{chunks} chunks, {ttft}, usage reported", seconds)


async def _cap(client: openai.AsyncOpenAI, model: str) -> Probe:
    messages = [{"role": "user", "content": "Count from one to fifty in words."}]
    t0 = time.perf_counter()
    for param in ("max_completion_tokens", "max_tokens"):
        try:
            completion = await _create(client)(
                model=model,
                messages=messages,
                temperature=0.0,
                **{param: 5},
            )
        except openai.APIStatusError as exc:
            if param == "max_completion_tokens" and exc.status_code in (400, 422):
                continue
            return Probe("output cap", "fail", f"rejected ({_error(exc)})", time.perf_counter() - t0)
        except openai.APIError as exc:
            return Probe("output cap", "fail", f"failed ({_error(exc)})", time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        used = completion.usage.completion_tokens if completion.usage else None
        finish = completion.choices[0].finish_reason if completion.choices else None
        honoured = (used is not None and used <= 5) or finish == "length"
        what = f"{param}=5: {used} tokens, finish_reason={finish}"
        if param == "max_tokens":
            return Probe("output cap", "warn", f"max_completion_tokens rejected; {what} (ragloop switches)", seconds)
        return Probe(
            "output cap", "ok" if honoured else "warn", ("honoured, " if honoured else "ignored, ") + what, seconds
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def diagnose(client: openai.AsyncOpenAI, model: str, *, max_tokens: int = 48) -> DoctorReport:
    """Probe ``client``'s endpoint with ``model``; every request is capped at ``max_tokens`` (the output-cap
    probe at 5). Requests run one after another, so a one-slot server is not flooded."""
    probes: list[Probe] = [await _models(client)]
    server, slots, template_tools = await _props(client)
    if server is not None:
        probes.append(server)
    tools = await _tools(client, model, max_tokens, template_tools)
    schema = await _json_schema(client, model, max_tokens)
    probes += [tools, schema, await _streaming(client, model, max_tokens), await _cap(client, model)]
    mode = "tools" if tools.status == "ok" else "json" if schema.status == "ok" else "offline"
    why = {
        "tools": "native tool calls",
        "json": "json_schema decide (tools are dropped; auto mode switches after the first plain-text reply)",
        "offline": "the offline decider (neither tool calls nor json_schema work)",
    }[mode]
    probes.append(Probe("decide mode", "ok" if mode != "offline" else "warn", f"{mode}: {why}"))
    # The endpoint as printed: a URL's user info (``https://user:pw@host``) never reaches the report.
    return DoctorReport(hide_password(str(client.base_url)), model, tuple(probes), mode, slots)
