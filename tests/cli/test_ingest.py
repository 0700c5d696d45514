"""Tests for ragloop.cli._ingest: ``ragloop index`` globs, --explain, the skip summary, progress, openai embedder."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.cli._common import Progress
from ragloop.testing import ScriptedOpenAIServer


def _docs(root: Path) -> Path:
    root.mkdir()
    (root / "reset.md").write_text("# Account\n\n## Reset password\n\nOpen settings and click reset password.\n")
    (root / "guide.html").write_text(
        "<html><body><nav><a href='/'>Home</a></nav><main><h1 id='ship'>Shipping</h1>"
        "<p>Shipping to Europe takes five to seven business days &amp; costs &lt;10 EUR.</p></main>"
        "<footer>Previous | Next</footer></body></html>"
    )
    (root / "logo.png").write_bytes(b"\x89PNG")
    (root / "blob.txt").write_bytes(bytes(range(256)) * 4)
    (root / "drafts").mkdir()
    (root / "drafts" / "wip.md").write_text("# WIP\n\nNot ready.")
    return root


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestIndexSummary:
    def test_json_summary_lists_every_skip_by_kind(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`index --json` names each skipped file with its kind and reason, and counts them by kind."""
        docs = _docs(tmp_path / "docs")
        assert main(["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "hash", "--json"]) == 0
        record = json.loads(capsys.readouterr().out)
        assert (record["files"], record["skipped"]) == (3, 2)
        assert record["skipped_by_kind"] == {"unsupported type": 1, "binary": 1}
        assert {(Path(s["path"]).name, s["kind"]) for s in record["skips"]} == {
            ("logo.png", "unsupported type"),
            ("blob.txt", "binary"),
        }

    def test_text_summary_groups_skips_by_kind(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The text summary says how many files were skipped of each kind and lists them; never '0' when some were."""
        docs = _docs(tmp_path / "docs")
        assert main(["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "hash"]) == 0
        out = capsys.readouterr().out
        assert "skipped 2: 1 binary, 1 unsupported type" in out  # ties in file order
        assert "[unsupported type]" in out and "logo.png" in out and "[binary]" in out

    def test_summary_names_the_runtime_and_its_threads(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The build summary says which runtime embedded, on which activations (int8 on OpenVINO), and with how
        many threads (never more than the cores this process may use), and the CPU seconds beside the wall
        seconds; --json carries the same."""
        import os

        docs = _docs(tmp_path / "docs")
        argv = ["index", str(docs), "--embedder", "minilm", "--quiet"]
        assert main([*argv, "--out", str(tmp_path / "kb")]) == 0
        out = capsys.readouterr().out
        cores = len(os.sched_getaffinity(0))
        threads = min(cores, 4)
        pattern = rf"384-dim, (onnxruntime \(float|openvino \(int8) activations\) with {threads} threads\)"
        assert re.search(pattern, out), out
        assert re.search(r"in [\d.]+s \([\d.]+ CPU-s, file readers included\)", out), out
        assert main([*argv, "--out", str(tmp_path / "kb2"), "--json"]) == 0
        record = json.loads(capsys.readouterr().out)
        assert record["runtime"] in ("onnxruntime", "openvino") and record["threads"] == threads
        assert record["activations"] == ("int8" if record["runtime"] == "openvino" else "float")
        assert record["cpu_seconds"] > 0

    def test_include_and_exclude(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--include and --exclude choose the files; what they leave out is counted, not reported as skipped."""
        docs = _docs(tmp_path / "docs")
        argv = ["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "hash", "--json"]
        assert main([*argv, "--include", "*.md", "--exclude", "drafts/**"]) == 0
        record = json.loads(capsys.readouterr().out)
        assert (record["files"], record["skipped"], record["excluded"]) == (1, 0, 4)

    @pytest.mark.parametrize("as_json", [False, True])
    def test_pypdf_warnings_are_reported_not_printed_to_stderr(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
    ) -> None:
        """A PDF pypdf reads with warnings is indexed; the summary (text and --json) names it with pypdf's
        message, and stderr holds none of pypdf's lines."""
        from tests.retrievers._docs import write_pdf

        docs = tmp_path / "docs"
        docs.mkdir()
        pdf = write_pdf(docs / "manual.pdf", ["Rotate the key every ninety days."])
        data = pdf.read_bytes()
        pdf.write_bytes(data[: data.rfind(b"startxref")] + b"startxref\n999\n%%EOF\n")
        argv = ["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "hash"]
        assert main(argv + (["--json"] if as_json else [])) == 0
        captured = capsys.readouterr()
        assert "startxref" not in captured.err
        if as_json:
            record = json.loads(captured.out)
            assert record["files"] == 1 and {w["path"] for w in record["warnings"]} == {"manual.pdf"}
            assert any("startxref" in w["message"] for w in record["warnings"])
        else:
            assert "warnings about 1 file(s) read anyway" in captured.out
            assert "  manual.pdf: incorrect startxref pointer" in captured.out


class TestExplain:
    def test_explain_shows_cleaned_text_and_chunks(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--explain FILE prints the cleaned text (navigation gone, entities decoded once) and each chunk's tokens."""
        docs = _docs(tmp_path / "docs")
        assert main(["index", "--explain", str(docs / "guide.html")]) == 0
        out = capsys.readouterr().out
        assert "Shipping to Europe takes five to seven business days & costs <10 EUR." in out
        assert "Home" not in out and "Previous" not in out
        assert "--- 1 chunks (limit 256 tokens) ---" in out and "#ship" in out

    def test_explain_json_and_a_skipped_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--explain --json gives the chunks with their token counts; a file that is skipped says why."""
        docs = _docs(tmp_path / "docs")
        assert main(["index", "--explain", str(docs / "reset.md"), "--json", "--max-tokens", "64"]) == 0
        record = json.loads(capsys.readouterr().out)
        assert record["format"] == "markdown" and all(c["tokens"] <= 64 for c in record["chunks"])
        assert main(["index", "--explain", str(docs / "blob.txt")]) == 0
        assert "skipped: binary file" in capsys.readouterr().out

    def test_max_tokens_over_the_embedders_limit_is_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--max-tokens above what the embedder reads would be truncated: refused with one line."""
        docs = _docs(tmp_path / "docs")
        assert main(["index", str(docs), "--out", str(tmp_path / "kb"), "--max-tokens", "999"]) == 2
        assert "over the embedder's limit of 256" in capsys.readouterr().err


class TestProgress:
    def test_terminal_gets_count_rate_and_time_left(self) -> None:
        """On a terminal the line shows done/total, the rate and the time left, and ends with a newline."""
        term = _Terminal()
        bar = Progress("embedding", stream=term, every_s=0.0)
        bar(1, 4)
        bar(4, 4)
        bar.close()
        text = term.getvalue()
        assert "\rembedding: 1/4 (" in text and "left)" in text and "\rembedding: 4/4" in text
        assert text.endswith("\n")

    def test_a_short_run_on_a_pipe_gets_nothing(self) -> None:
        """When the stream is not a terminal and the work ends within the first seconds, nothing is written."""
        pipe = io.StringIO()
        clock = _Clock()
        bar = Progress("reading", stream=pipe, every_s=0.0, clock=clock)
        clock.now = 1.0
        bar(1, 2)
        bar(2, 2)
        bar.close()
        assert pipe.getvalue() == ""

    def test_a_long_run_on_a_pipe_gets_plain_lines_every_10_percent_or_10_s(self) -> None:
        """Not a terminal (CI, nohup, a log file): plain lines, no carriage return or escape, one per 10 % step
        or per 10 s when steps are slow, each with the rate and the time left, and a last line at the end."""
        pipe = io.StringIO()
        clock = _Clock()
        bar = Progress("reading", stream=pipe, clock=clock)
        for done in range(1, 201):  # 200 files at 2 a second: a 10 % step every 10 s
            clock.now += 0.5
            bar(done, 200)
        bar.close()
        lines = pipe.getvalue().splitlines()
        assert "\r" not in pipe.getvalue() and "\x1b" not in pipe.getvalue()
        assert lines[0] == "reading: 20/200 (10%, 2.0/s, 1:30 left)"
        assert len(lines) == 10 and lines[-1] == "reading: 200/200 (100%, 2.0/s, 100s)"
        slow = io.StringIO()
        clock = _Clock()
        bar = Progress("embedding", stream=slow, clock=clock)
        for done in range(1, 4):  # 1,000 items at one each 6 s: a line every ~10 s, not every 10 %
            clock.now += 6.0
            bar(done, 1000)
        assert slow.getvalue().splitlines() == ["embedding: 2/1000 (0%, 0.2/s, 99:48 left)"]

    def test_quiet_writes_nothing_anywhere(self) -> None:
        """``quiet=True`` (``--quiet``) silences a terminal and a pipe alike."""
        for stream in (io.StringIO(), _Terminal()):
            clock = _Clock()
            bar = Progress("reading", stream=stream, quiet=True, clock=clock)
            for done in range(1, 101):
                clock.now += 1.0
                bar(done, 100)
            bar.close()
            assert stream.getvalue() == ""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestOpenAIEmbedder:
    def test_index_and_search_with_an_embeddings_api(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """--embedder openai:MODEL --embedder-base-url URL builds through the real openai SDK (the dimension
        learned from the API), and `search` embeds the query through the same API."""
        docs = _docs(tmp_path / "docs")
        with ScriptedOpenAIServer(embedding_dim=24) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            argv = ["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "openai:emb-small", "--json"]
            assert main([*argv, "--embedder-base-url", server.base_url]) == 0
            record = json.loads(capsys.readouterr().out)
            assert record["embedder"] == "openai:emb-small"
            assert main(["search", str(tmp_path / "kb"), "reset password", "--json", "-k", "1"]) == 0
            hit = json.loads(capsys.readouterr().out.splitlines()[0])
            assert hit["doc_id"] in {"reset.md", "guide.html"}
            assert any(r.path.endswith("/embeddings") for r in server.requests)

    def test_unreachable_api_is_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An embeddings API that cannot be reached is a one-line error naming the flags to check."""
        docs = _docs(tmp_path / "docs")
        argv = ["index", str(docs), "--out", str(tmp_path / "kb"), "--embedder", "openai:x"]
        assert main([*argv, "--embedder-base-url", "http://127.0.0.1:9/v1"]) == 2
        err = capsys.readouterr().err
        assert "--embedder-base-url" in err and len(err.strip().splitlines()) == 1
