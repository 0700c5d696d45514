"""``ragloop doctor`` against the scripted server: each probe reads what the server did."""

from __future__ import annotations

import json

import anyio
import pytest

from ragloop.cli import main
from ragloop.llm.doctor import diagnose
from ragloop.testing import ScriptedOpenAIServer, error, json_reply, reply, stream, tool_calls

pytestmark = pytest.mark.anyio


def by_name(report: object) -> dict[str, tuple[str, str]]:
    return {p.name: (p.status, p.detail) for p in report.probes}  # type: ignore[attr-defined]


async def test_a_capable_server_uses_tool_calls() -> None:
    """Tool calls honoured, json_schema enforced, usage streamed, the cap honoured: decide mode tools."""
    script = [
        tool_calls([("search", {"query": "rotate api key"})]),
        json_reply({"answer": "yes"}),
        stream("Hello there!"),
        reply("one two three four five", finish_reason="length", usage=(9, 5)),
    ]
    async with ScriptedOpenAIServer(script=script) as server, server.client() as client:
        report = await diagnose(client, "m", max_tokens=16)
        bodies = [r.body for r in server.chat_requests]
    probes = by_name(report)
    assert report.decide_mode == "tools" and probes["tool calls"][0] == "ok"
    assert probes["json_schema"] == ("ok", 'enforced: {"answer": "yes"}')
    assert probes["streaming"][0] == "ok" and "usage reported" in probes["streaming"][1]
    assert probes["output cap"][0] == "ok" and probes["models"][0] == "ok"  # GET /v1/models lists the scripted model
    assert [b.get("max_completion_tokens") for b in bodies] == [16, 16, 16, 5]


async def test_dropped_tools_mean_json_decide() -> None:
    """A plain-text answer to a required tool call is reported as dropped; json_schema works: decide mode json."""
    script = [
        reply("To rotate a key, use npm."),
        json_reply({"answer": "no"}),
        stream("Hi"),
        reply("one two", usage=(9, 2)),
    ]
    async with ScriptedOpenAIServer(script=script) as server, server.client() as client:
        report = await diagnose(client, "m")
    probes = by_name(report)
    assert probes["tool calls"][0] == "warn" and probes["tool calls"][1].startswith("dropped")
    assert report.decide_mode == "json" and probes["decide mode"][1].startswith("json")


async def test_old_server_rejecting_max_completion_tokens() -> None:
    """A 400 naming max_completion_tokens: the probe retries with max_tokens and says ragloop switches;
    a server with neither tools nor json_schema leaves the offline decider."""
    script = [
        error(400, "tools are not supported"),
        error(400, "response_format is not supported"),
        stream("Hi"),
        error(400, "Unrecognized request argument supplied: max_completion_tokens"),
        reply("one", usage=(9, 1)),
    ]
    async with ScriptedOpenAIServer(script=script) as server, server.client() as client:
        report = await diagnose(client, "m")
        last = server.chat_requests[-1].body
    probes = by_name(report)
    assert probes["output cap"][0] == "warn" and "ragloop switches" in probes["output cap"][1]
    assert last.get("max_tokens") == 5 and "max_completion_tokens" not in last
    assert report.decide_mode == "offline" and probes["tool calls"][0] == "fail"


def test_cli_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """``ragloop doctor --json`` against a URL given on the command line prints the report as JSON."""
    script = [tool_calls([("search", {"query": "q"})]), json_reply({"answer": "yes"}), stream("Hi"), reply("a")]
    with ScriptedOpenAIServer(script=script) as server:
        status = main(["doctor", "--base-url", server.base_url, "--model", "m", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["decide_mode"] == "tools" and out["model"] == "m"


def test_cli_without_an_endpoint_says_what_to_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No base URL, key or model: exit status 2 and a message naming the variables."""
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RAGLOOP_MODEL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor"]) == 2
    assert "RAGLOOP_MODEL" in capsys.readouterr().err


def test_report_lines_are_aligned() -> None:
    """The text report has one line per probe after the endpoint and model."""

    async def run() -> list[str]:
        script = [tool_calls([("search", {"query": "q"})]), json_reply({"answer": "yes"}), stream("Hi"), reply("a")]
        async with ScriptedOpenAIServer(script=script) as server, server.client() as client:
            return (await diagnose(client, "m")).lines()

    lines = anyio.run(run)
    assert lines[1] == "model         m" and lines[-1].startswith("decide mode   ok    tools")


async def test_one_transient_server_error_is_tried_again() -> None:
    """A 500 on one probe is tried once more (doctor's client makes no retries), so it is not reported as a
    missing capability."""
    script = [
        tool_calls([("search", {"query": "rotate api key"})]),
        json_reply({"answer": "yes"}),
        stream("Hello there!"),
        error(500, "slot busy"),
        reply("one two three four five", finish_reason="length", usage=(9, 5)),
    ]
    async with ScriptedOpenAIServer(script=script) as server, server.client(max_retries=0) as client:
        report = await diagnose(client, "m", max_tokens=16)
        sent = len(server.chat_requests)
    assert by_name(report)["output cap"][0] == "ok" and sent == 5


class TestToolsProbeWording:
    """What the tool-calls probe says when the model answers in plain text."""

    async def test_plain_text_under_a_tool_template_is_not_called_not_dropped(self) -> None:
        """/props said the template offers tools: the finding blames the model, never a template without tools."""
        from ragloop.llm.doctor import _tools

        async with ScriptedOpenAIServer(script=[reply("To rotate a key, use npm.")]) as server, server.client() as c:
            offered = await _tools(c, "m", 16, template_tools=True)
        assert offered.status == "warn" and offered.detail.startswith("not called")
        assert "has no tools" not in offered.detail

    async def test_plain_text_without_props_is_dropped(self) -> None:
        """Unknown template (no /props): plain text reads as tools dropped, as before."""
        from ragloop.llm.doctor import _tools

        async with ScriptedOpenAIServer(script=[reply("To rotate a key, use npm.")]) as server, server.client() as c:
            unknown = await _tools(c, "m", 16)
        assert unknown.detail.startswith("dropped")


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_redacts_the_credentials_in_openai_base_url(
    as_json: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPENAI_BASE_URL with user info (``http://user:password@host``): the report shows ``***@``, never the
    password, as text and as JSON."""
    script = [tool_calls([("search", {"query": "q"})]), json_reply({"answer": "yes"}), stream("Hi"), reply("a")]
    with ScriptedOpenAIServer(script=script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url.replace("http://", "http://ops:Tr0ub4dor-pw@"))
        monkeypatch.setenv("RAGLOOP_MODEL", "m")
        main(["doctor", *(["--json"] if as_json else [])])
    out = capsys.readouterr()
    assert "Tr0ub4dor-pw" not in out.out + out.err
    assert "http://***@127.0.0.1" in out.out
