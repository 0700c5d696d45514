"""`ragloop chat` through a pseudo-terminal (pexpect), as a person uses it: commands, Ctrl-C, Ctrl-D, history.

The chat runs as a child process on a small saved index (hash embedder, no live source, no planner). The turns
that need to be in flight when Ctrl-C arrives use a model: the scripted OpenAI-compatible server in this process,
whose answer to a question with "slow" in it comes only after 30 seconds.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from pexpect.fdpexpect import fdspawn

from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream, tool_calls, verdicts
from tests.reliability._support import small_index

PROMPT = "you> "
SLOW_S = 30.0


def _model(request: RecordedRequest) -> ScriptedResponse:
    question = str(request.messages[-1]["content"])
    if request.judge == "decide":
        return tool_calls([("search", {"query": question})])
    if request.judge == "grade":
        return verdicts(request, "relevant")
    answer = stream("Failed deliveries are retried **8 times** [1].", chunk_size=6)
    slow = any("slow" in str(m.get("content", "")) for m in request.messages if m.get("role") == "user")
    return answer.delayed(SLOW_S) if slow and "fast" not in question else answer


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chat-index") / "idx"
    small_index().save(path)
    return path


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(matcher=_model) as srv:
        yield srv


def _env(tmp_path: Path, server: ScriptedOpenAIServer | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_", "NO_COLOR"))}
    env.update(TERM="xterm-256color", XDG_STATE_HOME=str(tmp_path / "state"), HF_HUB_OFFLINE="1")
    if server is not None:
        env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="sk-test", RAGLOOP_MODEL="fast")
    return env


#: The child runs as at a terminal: a tiny Python takes the pseudo-terminal as its controlling terminal (so a
#: Ctrl-C typed there is SIGINT to it), restores SIGINT's default (a test run started in the background without
#: job control, ``pytest … &`` from a script, ignores SIGINT, and an ignored signal stays ignored across exec),
#: and then execs ``ragloop chat``.
_AS_FROM_A_TERMINAL = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'ragloop.cli', *sys.argv[1:]])"
)


class _Terminal(fdspawn):
    """``ragloop chat`` on a pseudo-terminal, with what the tests use of ``pexpect.spawn``.

    Started by :mod:`subprocess`, never by ``pexpect.spawn``: that forks and then runs Python in the child
    before its exec (``pty.fork``, the window size, closing descriptors), and in an xdist worker that has run
    other files (onnxruntime's threads, test servers' threads) the forked child died there with SIGSEGV, before
    writing a byte, for every test of a file (twice: with a ``preexec_fn``, and again without one). Subprocess
    forks and execs in C.
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the child holds the only copy: its exit is EOF here
        super().__init__(master, timeout=60, encoding="utf-8")
        self.exitstatus: int | None = None
        self.signalstatus: int | None = None

    def _control(self, which: int) -> None:
        self.send(termios.tcgetattr(self.child_fd)[6][which].decode())

    def sendeof(self) -> None:
        self._control(termios.VEOF)

    def sendintr(self) -> None:
        self._control(termios.VINTR)

    def sendcontrol(self, char: str) -> int:
        return self.send(chr(ord(char.lower()) - ord("a") + 1))

    def close(self) -> None:
        super().close()
        if self.proc.returncode is not None:
            return
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.exitstatus, self.signalstatus = (code, None) if code >= 0 else (None, -code)


_RUNNING: list[_Terminal] = []


@pytest.fixture(autouse=True)
def _no_chat_left_running() -> Iterator[None]:
    """A test that fails half way leaves no ``ragloop chat`` behind."""
    yield
    while _RUNNING:
        child = _RUNNING.pop()
        if child.proc.poll() is None:
            child.proc.kill()
        child.close()


def _spawn(tmp_path: Path, index_dir: Path, server: ScriptedOpenAIServer | None = None) -> _Terminal:
    child = _Terminal(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, "chat", "--index", str(index_dir), "--no-live"],
        _env(tmp_path, server),
    )
    _RUNNING.append(child)
    try:
        child.expect_exact(PROMPT)
    except pexpect.EOF:
        child.close()
        raise AssertionError(
            f"ragloop chat ended before its prompt: exit {child.exitstatus}, signal {child.signalstatus}, "
            f"wrote {child.before!r}"
        ) from None
    return child


def _ended(child: _Terminal) -> int | None:
    child.expect(pexpect.EOF, timeout=20)
    child.close()
    return child.exitstatus


def _wait_for_answer_request(server: ScriptedOpenAIServer, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(r.judge == "answer" for r in server.chat_requests) < count:
        assert time.monotonic() < deadline, "the answer request never reached the server"
        time.sleep(0.05)


class TestCommands:
    def test_help_reset_unknown_and_quit(self, tmp_path: Path, index_dir: Path) -> None:
        """/help lists every command, an unknown /command gets the list (never a search), /reset forgets,
        /sources and /record speak of the last reply, /quit leaves with status 0."""
        child = _spawn(tmp_path, index_dir)
        child.sendline("/help")
        for name in ("/help", "/reset", "/sources", "/record", "/quit"):
            child.expect_exact(name)
        child.expect_exact(PROMPT)
        child.sendline("/frobnicate")
        child.expect_exact("Unknown command '/frobnicate'. Commands: /help /reset /sources /record /quit")
        child.expect_exact(PROMPT)
        assert "searching" not in child.before
        child.sendline("/sources")
        child.expect_exact("No reply yet")
        child.sendline("How are failed webhook deliveries retried?")
        child.expect_exact("Sources")
        child.expect_exact("[1] Webhooks")
        child.expect_exact(PROMPT)
        child.sendline("/sources")
        child.expect_exact("[1] Webhooks — webhooks.md")
        child.sendline("/record")
        child.expect_exact('"path"')
        child.expect_exact(PROMPT)
        child.sendline("/reset")
        child.expect_exact("Conversation forgotten")
        child.expect_exact(PROMPT)
        child.sendline("/sources")
        child.expect_exact("No reply yet")
        child.sendline("/quit")
        assert _ended(child) == 0


class TestInterrupts:
    def test_ctrl_c_mid_answer_cancels_the_turn_then_the_next_question_works(
        self, tmp_path: Path, index_dir: Path, server: ScriptedOpenAIServer
    ) -> None:
        """Ctrl-C while the model is still writing cancels the turn (the answer request is abandoned, not waited
        for), the prompt comes back within seconds, and the next question is answered."""
        child = _spawn(tmp_path, index_dir, server)
        child.sendline("a slow question about webhook retries")
        _wait_for_answer_request(server, 1)
        started = time.monotonic()
        child.sendintr()
        child.expect_exact("(cancelled)", timeout=10)
        child.expect_exact(PROMPT, timeout=10)
        assert time.monotonic() - started < SLOW_S / 3
        deadline = time.monotonic() + 10
        while server.stats.requests_aborted < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.stats.requests_aborted >= 1, server.stats  # the model call itself was cancelled
        child.sendline("a fast question about webhook retries")
        child.expect_exact("8 times", timeout=30)
        child.expect_exact(PROMPT)
        child.sendeof()
        assert _ended(child) == 0
        answers = [r for r in server.chat_requests if r.judge == "answer"]
        # The cancelled turn left no trace in the conversation the next question carried.
        assert not any("slow" in str(m.get("content")) for m in answers[-1].messages[1:-1])

    def test_ctrl_c_at_an_empty_prompt_clears_the_line_and_stays(self, tmp_path: Path, index_dir: Path) -> None:
        """Ctrl-C at an empty prompt clears the line and prompts again, as Python's REPL and bash do; the first
        time it says how to leave, the second time it does not; Ctrl-D then leaves with status 0."""
        child = _spawn(tmp_path, index_dir)
        child.sendintr()
        child.expect_exact("(to leave: Ctrl-D or /quit)")
        child.expect_exact(PROMPT)
        child.sendintr()
        child.expect_exact(PROMPT)
        assert "to leave" not in (child.before or "")
        child.sendeof()
        assert _ended(child) == 0
        assert "Traceback" not in (child.before or "")

    def test_ctrl_c_on_a_half_typed_line_drops_the_line(self, tmp_path: Path, index_dir: Path) -> None:
        """Ctrl-C with something typed drops that line and prompts again; Ctrl-D then leaves with status 0."""
        child = _spawn(tmp_path, index_dir)
        child.send("half a quest")
        time.sleep(0.2)
        child.sendintr()
        child.expect_exact(PROMPT)
        child.sendeof()
        assert _ended(child) == 0

    def test_ctrl_d_exits(self, tmp_path: Path, index_dir: Path) -> None:
        """Ctrl-D at the prompt ends the chat with status 0."""
        child = _spawn(tmp_path, index_dir)
        child.sendeof()
        assert _ended(child) == 0


class TestHistory:
    def test_history_file_is_private_and_recalls_questions(self, tmp_path: Path, index_dir: Path) -> None:
        """Questions go to $XDG_STATE_HOME/ragloop/chat_history (mode 0600), /quit does not; the next chat
        recalls the last question with the up arrow."""
        child = _spawn(tmp_path, index_dir)
        child.sendline("How are failed webhook deliveries retried?")
        child.expect_exact("Sources")
        child.expect_exact(PROMPT)
        child.sendline("/quit")
        assert _ended(child) == 0
        path = tmp_path / "state" / "ragloop" / "chat_history"
        lines = path.read_text().splitlines()
        assert "How are failed webhook deliveries retried?" in lines and "/quit" not in lines
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        again = _spawn(tmp_path, index_dir)
        again.send("\x1b[A")  # up arrow
        again.expect_exact("How are failed webhook deliveries retried?")
        again.sendcontrol("u")
        again.sendeof()
        assert _ended(again) == 0
