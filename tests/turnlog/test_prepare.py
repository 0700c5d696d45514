"""From a finished turn to a stored row: hits and grades, redaction, identity hashing, private mode."""

from __future__ import annotations

import json
import re

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.state import Caller
from ragloop.turnlog import LogPolicy, clean, hash_identity, prepare, question_hash
from ragloop.turnlog._row import row_from_json, row_to_json
from tests.turnlog.conftest import ANSWERED, TERMS, run_turn

pytestmark = pytest.mark.anyio


class TestPendingTurn:
    async def test_best_hits_with_their_best_grade(self, hash_rag: ChatRAG) -> None:
        """The turn hands over at most 8 hits, best confidence first, each with its best grade, and the passages
        of those hits and of every cited chunk."""
        turn = await run_turn(hash_rag, "How many webhook endpoints can a workspace have?")
        assert 0 < len(turn.hits) <= 8
        confidences = [h.confidence for h in turn.hits]
        assert confidences == sorted(confidences, reverse=True)
        assert set(turn.labels.values()) <= {"relevant", "partial", "irrelevant"}
        passage_ids = {cid for cid, _, _ in turn.passages}
        assert {c.chunk_id for c in turn.citations} <= passage_ids


class TestPrepare:
    async def test_row_keeps_what_the_issue_lists(self, hash_rag: ChatRAG) -> None:
        """A row has the time, hashed identities, the question, outcome, queries, hits with scores and grades,
        citations, latency and model calls."""
        turn = await run_turn(hash_rag, ANSWERED, principal="key:abc", caller=Caller(tenant="acme", user="u1"))
        row = prepare(turn, LogPolicy())
        assert row.principal == hash_identity("key:abc") and row.user == hash_identity("u1")
        assert row.tenant == hash_identity("acme") and "acme" not in json.dumps(row_to_json(row))
        assert row.question == ANSWERED and row.terms == TERMS
        assert row.outcome == turn.record.outcome and row.queries and row.hits and row.citations
        assert all(h.label in ("relevant", "partial", "irrelevant") for h in row.hits)
        assert row.seconds == turn.record.seconds and row.models == ("offline",) and row.llm_calls == 0

    async def test_identities_kept_when_configured(self, hash_rag: ChatRAG) -> None:
        """With hash_identities off the principal is stored as given; the salt changes every hash."""
        turn = await run_turn(hash_rag, "How do I rotate an API key?", principal="key:abc")
        assert prepare(turn, LogPolicy(hash_identities=False)).principal == "key:abc"
        assert prepare(turn, LogPolicy(identity_salt="s1")).principal != prepare(turn, LogPolicy()).principal

    async def test_private_mode_keeps_no_question_text(self, hash_rag: ChatRAG) -> None:
        """Without capture_questions nothing stored carries the question's wording: only its hash and terms."""
        question = "Where do I find the Zapier integration for my workspace?"
        row = prepare(await run_turn(hash_rag, question), LogPolicy(capture_questions=False))
        stored = json.dumps(row_to_json(row)) + repr(attrs.astuple(row)[:8])
        assert row.question is None and row.question_hash == question_hash(question)
        assert "zapier" in row.terms
        assert "Where do I find" not in stored and "for my workspace" not in stored

    async def test_redaction_hook_runs_before_terms_and_hash(self, hash_rag: ChatRAG) -> None:
        """The PII hook sees the question first: its output is what the terms, hash and text are taken from;
        credentials are redacted even without a hook."""
        email = re.compile(r"\S+@\S+")

        def hook(text: str) -> str:
            return email.sub("[email]", text)

        turn = await run_turn(hash_rag, "Why is jane.doe@example.com locked out? token=sk-abcdefghijklmnopqrstuv")
        row = prepare(turn, LogPolicy(redact=hook))
        stored = json.dumps(row_to_json(row)) + (row.question or "")
        assert "jane.doe" not in stored and "sk-abcdefghijklmnop" not in stored
        assert row.question is not None and "[email]" in row.question

    async def test_long_question_kept_truncated_and_marked(self, hash_rag: ChatRAG) -> None:
        """A question longer than the log keeps is cut to its start and marked, never silently."""
        turn = await run_turn(hash_rag, "webhook " * 1000)
        row = prepare(turn, LogPolicy(max_question_chars=100))
        assert row.truncated and row.question is not None and len(row.question) == 100

    async def test_json_round_trip(self, hash_rag: ChatRAG) -> None:
        """A row read back from its columns and JSON equals the row written."""
        row = prepare(await run_turn(hash_rag, "Can I pay by bank transfer in euros?"), LogPolicy())
        columns = {n: getattr(row, n) for n in ("turn_id", "at", "principal", "user", "tenant", "outcome")}
        columns |= {"question": row.question, "question_hash": row.question_hash, "seconds": row.seconds}
        assert row_from_json(columns, json.loads(json.dumps(row_to_json(row)))) == row

    async def test_keys_a_later_version_adds_are_ignored(self, hash_rag: ChatRAG) -> None:
        """A row written by a later version (a key more at the top and in each nested record) still reads."""
        row = prepare(await run_turn(hash_rag, ANSWERED), LogPolicy())
        columns = {n: getattr(row, n) for n in ("turn_id", "at", "principal", "user", "tenant", "outcome")}
        columns |= {"question": row.question, "question_hash": row.question_hash, "seconds": row.seconds}
        data = json.loads(json.dumps(row_to_json(row)))
        assert data["queries"] and data["hits"] and data["citations"]
        for key in ("queries", "rewrites", "hits", "citations", "stale"):
            data[key] = [{**item, "added_later": 1} for item in data[key]]
        assert row_from_json(columns, {**data, "added_later": 1}) == row


class TestClean:
    @given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0xE000)))
    def test_clean_text_is_encodable(self, text: str) -> None:
        """Whatever a string holds (lone surrogates, NUL), its cleaned form encodes as UTF-8 and has no NUL."""
        out = clean(text)
        out.encode("utf-8")
        assert "\x00" not in out and len(out) == len(text)
