"""Tests for ragloop.cli._chat: the terminal (plain when piped, markdown on a terminal), the chat commands, line
input and history, and `ragloop chat` fed from a pipe. The pseudo-terminal tests are in test_cli_chat_pty.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from ragloop.chat import Reply
from ragloop.cli._chat._input import LineReader, history_path
from ragloop.cli._chat._session import COMMANDS, ChatSession, help_text
from ragloop.cli._chat._terminal import Terminal
from ragloop.state import Chunk
from tests.reliability._support import offline_rag, small_index

EVIL = "Rotate keys\x1b]52;c;ZXZpbA==\x07 daily\x1b[2J\u202e."
TABLE = "| Plan | Keys |\n|---|---|\n| Team | 10 |\n| Business | 50 |"


class FakeTTY(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _reply(question: str = "How do I rotate an API key?", extra: list[Chunk] | None = None) -> Reply:
    rag = offline_rag(small_index(extra))
    return anyio.run(lambda: rag.ask(question))


def _stream(term: Terminal, reply: Reply) -> None:
    term.begin()
    term.progress("searching…")
    for word in reply.text.split(" "):
        term.token(word + " ")
    term.finish(reply)


class TestTerminalDetection:
    def test_pipes_are_plain(self) -> None:
        """Streams that are not terminals: progress as plain lines, the answer as plain text."""
        term = Terminal.detect(environ={}, out=io.StringIO(), err=io.StringIO())
        assert not term.spinner and not term.rich_answer

    def test_terminal_renders_unless_no_color_or_dumb(self) -> None:
        """On a terminal: spinner and markdown; NO_COLOR keeps the spinner but plain answers; TERM=dumb neither;
        --quiet no spinner."""
        tty = Terminal.detect(environ={}, out=FakeTTY(), err=FakeTTY())
        assert tty.spinner and tty.rich_answer
        no_color = Terminal.detect(environ={"NO_COLOR": "1"}, out=FakeTTY(), err=FakeTTY())
        assert no_color.spinner and not no_color.rich_answer
        dumb = Terminal.detect(environ={"TERM": "dumb"}, out=FakeTTY(), err=FakeTTY())
        assert not dumb.spinner and not dumb.rich_answer
        assert not Terminal.detect(quiet=True, environ={}, out=FakeTTY(), err=FakeTTY()).spinner


class TestTerminalOutput:
    def test_piped_output_is_plain_text_without_escapes(self) -> None:
        """Piped: progress lines on stderr, the answer and a numbered source list on stdout, no escape code and no
        bidi override anywhere, even from a document that carries them."""
        reply = _reply(extra=[Chunk("evil", EVIL + " rotate api key", source="evil.md", title="Evil")])
        out, err = io.StringIO(), io.StringIO()
        _stream(Terminal.detect(environ={}, out=out, err=err), reply)
        assert "  … searching…" in err.getvalue()
        assert "Sources:" in out.getvalue() and "[1]" in out.getvalue()
        for text in (out.getvalue(), err.getvalue()):
            assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text

    def test_quiet_shows_no_progress(self) -> None:
        """--quiet: nothing on stderr."""
        err = io.StringIO()
        _stream(Terminal.detect(quiet=True, environ={}, out=io.StringIO(), err=err), _reply())
        assert err.getvalue() == ""

    def test_terminal_renders_markdown_tables(self) -> None:
        """On a terminal a markdown table is drawn (box characters), not printed as pipes and dashes; document
        escape sequences (OSC 52 clipboard writes, screen clears) never get through rich."""
        reply = _reply(
            "How many API keys per plan?",
            [Chunk("t", f"API keys per plan.\n\n{TABLE}\n\n{EVIL}", source="keys.md", title="Keys")],
        )
        out = FakeTTY()
        _stream(Terminal.detect(environ={}, out=out, err=FakeTTY()), reply)
        shown = out.getvalue()
        assert "|---|" not in shown and "Business" in shown and "Sources" in shown
        assert any(box in shown for box in "━─┃│")
        assert "]52;" not in shown and "\x1b[2J" not in shown and "\x07" not in shown and "\u202e" not in shown

    @pytest.mark.parametrize(
        ("question", "shown"),
        [
            ("hello there", "(direct: answered without searching the sources)"),
            ("What is the airspeed velocity of an unladen swallow?", "(none: the sources do not answer this)"),
        ],
    )
    def test_a_reply_that_is_not_context_shows_its_outcome(self, question: str, shown: str) -> None:
        """A greeting's direct reply and an unanswerable question's reply each say their outcome on a line of
        their own; a full answer from the sources says nothing more."""
        reply = _reply(question)
        out = io.StringIO()
        Terminal.detect(environ={}, out=out, err=io.StringIO()).finish(reply)
        assert reply.outcome in shown and shown in out.getvalue().splitlines()
        full = _reply()
        out = io.StringIO()
        Terminal.detect(environ={}, out=out, err=io.StringIO()).finish(full)
        assert full.outcome == "context" and "(context" not in out.getvalue()

    def test_sources_are_a_short_numbered_list(self) -> None:
        """Each cited source once, numbered, with its link."""
        reply = _reply()
        out = io.StringIO()
        term = Terminal.detect(environ={}, out=out, err=io.StringIO())
        term.link = lambda c: f"https://docs.example/{c.source}"
        term.finish(reply)
        lines = [line.strip() for line in out.getvalue().split("Sources:")[1].strip().splitlines()]
        numbers = [c.n for c in reply.citations]
        assert len(lines) == len(set(numbers)) and all(line.startswith("[") for line in lines)
        assert all("https://docs.example/" in line for line in lines)

    def test_a_page_cited_in_two_sections_is_one_source(self) -> None:
        """A page whose two sections are cited is one numbered line, its other section indented under it."""
        from ragloop.cli._chat._terminal import sources_lines
        from ragloop.state import Citation, CitedSection

        page = Citation(
            1,
            "keys.md",
            "API keys",
            "a",
            "https://d/keys#create",
            (
                CitedSection("Create a key", "https://d/keys#create", "a"),
                CitedSection("Expiry", "https://d/keys#exp", "b"),
            ),
        )
        other = Citation(2, "limits.md", "Limits", "c", "", (CitedSection("", "", "c"),))
        assert sources_lines([page, other], lambda c: c.url or c.source) == [
            "[1] API keys — https://d/keys#create",
            "    § Expiry — https://d/keys#exp",
            "[2] Limits — limits.md",
        ]


class FakeReader:
    """Lines from a list; ``EOFError`` at the end."""

    interactive = False

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        self.forgotten = 0

    def read(self, prompt: str) -> str:
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)

    def pending(self) -> str:
        return ""

    def forget_last(self) -> None:
        self.forgotten += 1


class TestChatSession:
    @staticmethod
    def session(lines: list[str], asked: list[tuple[str, list[dict[str, str]]]]) -> tuple[ChatSession, io.StringIO]:
        reply = _reply()

        async def turn(question: str, history: list[dict[str, str]]) -> Reply:
            asked.append((question, history))
            return reply

        out = io.StringIO()
        term = Terminal.detect(environ={}, out=out, err=io.StringIO())
        return ChatSession(term, FakeReader(lines), turn), out  # type: ignore[arg-type]

    @staticmethod
    def run(session: ChatSession) -> int:
        from anyio.from_thread import start_blocking_portal

        with start_blocking_portal() as portal:
            return session.run(portal)

    def test_questions_carry_the_conversation_and_reset_forgets_it(self) -> None:
        """Each question gets the conversation so far; /reset starts afresh."""
        asked: list[tuple[str, list[dict[str, str]]]] = []
        session, out = self.session(["first?", "second?", "/reset", "third?"], asked)
        assert self.run(session) == 0
        assert [q for q, _ in asked] == ["first?", "second?", "third?"]
        assert asked[0][1] == [] and asked[1][1][0]["content"] == "first?" and asked[2][1] == []
        assert "Conversation forgotten" in out.getvalue()

    def test_unknown_command_lists_the_commands_and_never_searches(self) -> None:
        """ "/frob" and "/help me" are commands: the list is printed, no turn runs."""
        asked: list[tuple[str, list[dict[str, str]]]] = []
        session, out = self.session(["/frob", "/HELP me", "/sources", "/record"], asked)
        assert self.run(session) == 0
        assert asked == []
        text = out.getvalue()
        assert "Unknown command '/frob'" in text and all(name in text for name, _ in COMMANDS)
        assert text.count("No reply yet") == 2

    def test_record_and_sources_of_the_last_reply(self) -> None:
        """/record prints the last reply's decision record as JSON; /sources its citations."""
        asked: list[tuple[str, list[dict[str, str]]]] = []
        session, out = self.session(["How do I rotate an API key?", "/record", "/sources"], asked)
        self.run(session)
        text = out.getvalue()
        assert '"path": [' in text and '"decision": {' in text
        assert text.rstrip().endswith(tuple(c.source for c in session.last.citations))  # type: ignore[union-attr]

    @pytest.mark.parametrize("line", ["/quit", "/exit", "/q", "quit", "exit"])
    def test_quit_ends_the_chat(self, line: str) -> None:
        """/quit (and its aliases, and the words kept from before) end the chat; what follows is not read."""
        asked: list[tuple[str, list[dict[str, str]]]] = []
        session, _ = self.session([line, "never asked?"], asked)
        assert self.run(session) == 0 and asked == []

    def test_a_question_starting_with_a_space_and_slash_is_a_question(self) -> None:
        """ " /etc/hosts permissions?" (a space first) is asked, not taken for a command."""
        asked: list[tuple[str, list[dict[str, str]]]] = []
        session, _ = self.session([" /etc/hosts permissions?"], asked)
        self.run(session)
        assert [q for q, _ in asked] == [" /etc/hosts permissions?"]

    def test_help_names_every_command(self) -> None:
        """/help lists each command with what it does, and how to stop an answer."""
        text = help_text()
        assert all(f"  {name}" in text for name, _ in COMMANDS) and "Ctrl-C" in text


class TestHistory:
    def test_path_follows_xdg_state_home(self, tmp_path: Path) -> None:
        """$XDG_STATE_HOME/ragloop/chat_history; a relative or empty value falls back to ~/.local/state."""
        assert history_path({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "ragloop" / "chat_history"
        home = Path.home() / ".local" / "state" / "ragloop" / "chat_history"
        assert history_path({"XDG_STATE_HOME": "relative/dir"}) == home
        assert history_path({}) == home

    def test_piped_reader_keeps_no_history(self, tmp_path: Path) -> None:
        """Not a terminal: lines are read plainly and no history file is written."""
        path = tmp_path / "state" / "chat_history"
        reader = LineReader(False, path)
        assert reader.save() is None and not path.exists()

    def test_unwritable_history_is_one_line(self, tmp_path: Path) -> None:
        """A history file that cannot be written is reported in one line, nothing raised."""
        blocker = tmp_path / "file"
        blocker.write_text("x")
        reader = LineReader(True, blocker / "ragloop" / "chat_history")
        problem = reader.save()
        assert problem is not None and problem.startswith("could not save the chat history") and "\n" not in problem


def _run_chat(stdin: str, tmp_path: Path, index: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), HF_HUB_OFFLINE="1", TERM="xterm-256color")
    cmd = [sys.executable, "-m", "ragloop.cli", "chat", "--index", str(index), "--no-live", *extra]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("piped") / "idx"
    small_index().save(path)
    return path


class TestPipedChat:
    def test_piped_chat_is_a_plain_transcript(self, tmp_path: Path, index: Path) -> None:
        """Questions piped in: each is echoed, answered in plain text with its sources, commands work, nothing
        carries an escape code, no history file is written, and the end of input is exit 0."""
        done = _run_chat("How are webhook deliveries retried?\nand how often?\n/sources\n/bogus\n", tmp_path, index)
        assert done.returncode == 0, done.stderr
        assert "you> How are webhook deliveries retried?" in done.stdout and "Sources:" in done.stdout
        assert "Unknown command '/bogus'" in done.stdout
        assert "  … searching…" in done.stderr
        assert "\x1b" not in done.stdout and "\x1b" not in done.stderr
        assert not (tmp_path / "state").exists()

    def test_bad_lines_cost_one_line_not_the_chat(self, tmp_path: Path, index: Path) -> None:
        """A question over the length limit and bytes that are not UTF-8 each get one line; the chat goes on to
        answer the next question and ends with status 0."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        env.update(XDG_STATE_HOME=str(tmp_path / "state"), HF_HUB_OFFLINE="1")
        stdin = b"x" * 9000 + b"\nwebhook \xff\xfe retries?\nHow are webhook deliveries retried?\n"
        cmd = [sys.executable, "-m", "ragloop.cli", "chat", "--index", str(index), "--no-live", "--quiet"]
        done = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=120, check=False)
        out, err = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0, err
        assert "(error: " in err and "Traceback" not in err
        assert "you> webhook \ufffd\ufffd retries?" in out
        assert out.count("Sources:") == 2

    def test_quiet_hides_progress(self, tmp_path: Path, index: Path) -> None:
        """--quiet: no progress lines on stderr."""
        done = _run_chat("How are webhook deliveries retried?\n", tmp_path, index, "--quiet")
        assert done.returncode == 0 and "…" not in done.stderr and "Sources:" in done.stdout


def test_import_ragloop_does_not_import_rich() -> None:
    """rich is imported only when the CLI renders something: not by `import ragloop`, nor by the CLI module."""
    code = "import sys, ragloop, ragloop.cli; print('rich' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


class TestReranker:
    @pytest.fixture(autouse=True)
    def _offline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RAGLOOP_MODEL", "RAGLOOP_RERANKER_API_KEY"):
            monkeypatch.delenv(name, raising=False)

    def test_ask_reranks_through_a_rerank_endpoint(
        self, index: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`ask --reranker URL`: the turn's passages go to the endpoint's /rerank (with the key from the
        environment), and the reply records no fault."""
        import json

        from ragloop.cli import main
        from ragloop.testing import ScriptedOpenAIServer

        monkeypatch.setenv("RAGLOOP_RERANKER_API_KEY", "rk-test")
        with ScriptedOpenAIServer() as server:
            argv = ["ask", "--index", str(index), "--no-live", "--reranker", f"{server.base_url}/rerank", "--json"]
            assert main([*argv, "How are webhook deliveries retried?"]) == 0
            [request] = server.rerank_requests
        reply = json.loads(capsys.readouterr().out)
        assert request.body["query"] == "How are webhook deliveries retried?" and len(request.body["documents"]) >= 2
        assert request.headers["authorization"] == "Bearer rk-test"
        assert reply["citations"] and not reply["record"]["errors"]

    def test_a_path_without_a_model_is_one_line(self, tmp_path: Path, index: Path) -> None:
        """`--reranker DIR` without model.onnx: exit 2 and one line naming the missing files."""
        cmd = [sys.executable, "-m", "ragloop.cli", "ask", "--index", str(index), "--reranker", str(tmp_path), "q"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 2 and "model.onnx and its tokenizer.json; missing" in done.stderr
        assert "Traceback" not in done.stderr
