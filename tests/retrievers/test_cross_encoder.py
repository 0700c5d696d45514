"""Tests for ragloop.retrievers.cross_encoder: /rerank through the scripted server, a tiny ONNX cross-encoder."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers._wordpiece import tokenizer_asset
from ragloop.retrievers.cross_encoder import (
    CrossEncoderRanker,
    OnnxCrossEncoder,
    PairScorer,
    RerankEndpoint,
    _scores_of,
    cross_encoder,
)
from ragloop.retrievers.ranking import Candidates, FusionRanker, Ranker
from ragloop.retrievers.rerank import RerankSettings
from ragloop.state import Chunk, Hit
from ragloop.testing import (
    FakeAnswerer,
    FakeDecider,
    FakeGrader,
    FakeRetriever,
    FakeRewriter,
    ScriptedOpenAIServer,
    make_hit,
    rerank_ok,
    server_error,
)
from ragloop.turn import Judges, Turn, TurnSettings

pytestmark = pytest.mark.anyio

OFF = FusionRanker(features=RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0))


def _hit(cid: str, text: str) -> Hit:
    return Hit(chunk=Chunk(id=cid, text=text, source=f"{cid}.md", title=cid), score=1.0, confidence=0.3)


def _candidates(*texts: str, question: str = "sso setup") -> Candidates:
    return Candidates(question, {question: [_hit(f"c{i}", t) for i, t in enumerate(texts)]}, anchor=question)


class Recording:
    """A scorer that records its calls and scores by a function."""

    def __init__(self, fn: Any = lambda q, d: -len(d)) -> None:
        self.fn, self.calls = fn, []  # type: ignore[var-annotated]

    async def score(self, query: str, documents: Sequence[str]) -> list[float]:
        self.calls.append(list(documents))
        return [self.fn(query, d) for d in documents]


class TestScoresOf:
    @given(st.permutations(range(6)), st.lists(st.floats(-5, 5), min_size=6, max_size=6))
    def test_results_in_any_order_land_on_their_documents(self, order: list[int], values: list[float]) -> None:
        """results[] come best first, not in document order: each score goes to the document its index names."""
        body = {"results": [{"index": i, "relevance_score": values[i]} for i in order]}
        assert _scores_of(body, 6) == values

    def test_documents_left_out_by_top_n_rank_last(self) -> None:
        """A server that answers fewer results than documents: the missing ones score -inf."""
        assert _scores_of({"results": [{"index": 1, "relevance_score": 0.5}]}, 2) == [float("-inf"), 0.5]

    def test_teis_bare_list_is_read_too(self) -> None:
        """TEI's native /rerank answers a bare list of {index, score}."""
        assert _scores_of([{"index": 0, "score": 2.0}], 1) == [2.0]

    @pytest.mark.parametrize(
        "body",
        [
            {},
            {"results": "x"},
            {"results": [{"index": 5, "relevance_score": 1}]},
            {"results": [{"index": 0}]},
            {"results": [{"index": 0, "relevance_score": float("nan")}]},
            {"results": [{"index": True, "relevance_score": 1}]},
        ],
    )
    def test_a_lying_server_is_an_error(self, body: Any) -> None:
        """No results, an index out of range, a missing or non-finite score: RetrievalError, not a guess."""
        with pytest.raises(RetrievalError, match="/rerank answer"):
            _scores_of(body, 1)


class TestRerankEndpoint:
    async def test_scores_through_the_scripted_server(self) -> None:
        """The request is the common API (query, documents, top_n, model); the scores come back per document."""
        with ScriptedOpenAIServer() as server:
            endpoint = RerankEndpoint(server.client(), model="bge-reranker")
            scores = await endpoint.score("sso setup", ["nothing here", "sso setup guide", "setup"])
            body = server.rerank_requests[0].body
        assert scores == [0.0, 1.0, 0.5] and isinstance(endpoint, PairScorer)
        assert body == {
            "query": "sso setup",
            "documents": ["nothing here", "sso setup guide", "setup"],
            "top_n": 3,
            "model": "bge-reranker",
        }

    async def test_server_errors_and_timeouts_are_retrieval_errors(self) -> None:
        """A 500 and an answer slower than timeout_s both raise RetrievalError (the node then fails open)."""
        with ScriptedOpenAIServer() as server:
            server.enqueue_rerank(server_error(), rerank_ok(delay_s=2.0))
            endpoint = RerankEndpoint(server.client(), timeout_s=0.2)
            with pytest.raises(RetrievalError, match="InternalServerError"):
                await endpoint.score("q", ["a"])
            with anyio.fail_after(5):
                with pytest.raises(RetrievalError, match="Timeout"):
                    await endpoint.score("q", ["a"])

    async def test_nothing_to_score_sends_nothing(self) -> None:
        """No documents, no request."""
        with ScriptedOpenAIServer() as server:
            assert await RerankEndpoint(server.client()).score("q", []) == []
            assert server.rerank_requests == []


class TestCrossEncoderRanker:
    async def test_head_by_score_tail_as_before(self) -> None:
        """The first depth passages are ordered by score; those after keep the default order behind them."""
        scorer = Recording(lambda q, d: float(d.count("sso")))
        ranker = CrossEncoderRanker(scorer, base=OFF, depth=3)
        out = await ranker.rank(_candidates("x", "sso", "sso sso", "sso sso sso"))
        assert [h.id for h in out] == ["c2", "c1", "c0", "c3"] and isinstance(ranker, Ranker)
        assert scorer.calls == [["x", "sso", "sso sso"]]

    async def test_batched_and_capped(self) -> None:
        """Passages go batch_size at a time, each cut to max_chars; no more than depth are ever sent."""
        scorer = Recording()
        ranker = CrossEncoderRanker(scorer, base=OFF, depth=5, batch_size=2, max_chars=4)
        await ranker.rank(_candidates(*[f"passage {i}" for i in range(9)]))
        assert sorted(map(len, scorer.calls)) == [1, 2, 2] and all(len(d) <= 4 for b in scorer.calls for d in b)

    async def test_a_wrong_number_of_scores_is_an_error(self) -> None:
        """A scorer that answers fewer scores than passages is refused (the node falls back to the default)."""

        class Short:
            async def score(self, query: str, documents: Sequence[str]) -> list[float]:
                return [1.0]

        with pytest.raises(RetrievalError, match="scored 2 of the 3"):
            await CrossEncoderRanker(Short(), base=OFF, batch_size=2).rank(_candidates("a", "b", "c"))


def _turn(ranker: Any, **settings: Any) -> Turn:
    pages = {"alpha": "billing overview", "bravo": "sso setup with saml", "charlie": "sso setup"}

    def hits(query: str) -> list[Hit]:
        return [make_hit(t, source=f"{p}.md", chunk_id=p, confidence=0.3) for p, t in pages.items()]

    judges = Judges(decider=FakeDecider(), grader=FakeGrader(), rewriter=FakeRewriter(), answerer=FakeAnswerer())
    return Turn(FakeRetriever(hits), judges, settings=TurnSettings(**settings)).ranker(ranker)


class TestInATurn:
    async def test_the_reply_cites_in_the_servers_order(self) -> None:
        """--reranker URL: the turn's blocks and citations follow the /rerank scores of the scripted server."""
        scores = {"billing overview": 0.1, "sso setup with saml": 0.9, "sso setup": 0.5}
        with ScriptedOpenAIServer(rerank=lambda q, docs: [scores[d] for d in docs]) as server:
            rag = ChatRAG(_turn(cross_encoder(f"{server.base_url}/rerank")))
            reply = await rag.ask("sso setup")
            await rag.aclose()  # closes the client cross_encoder made
            assert len(server.rerank_requests) == 1
        assert [c.source for c in reply.citations] == ["bravo.md", "charlie.md", "alpha.md"]
        assert not reply.record.errors

    async def test_a_dead_or_slow_server_fails_open(self) -> None:
        """The server errs, or answers after the turn's rank time limit: the reply comes in the default order,
        and the fault is in the record."""
        default = await ChatRAG(_turn(FusionRanker())).ask("sso setup")
        with ScriptedOpenAIServer() as server:
            server.enqueue_rerank(server_error(), rerank_ok(delay_s=3.0))
            ranker = cross_encoder(server.base_url)
            down = await ChatRAG(_turn(ranker)).ask("sso setup")
            with anyio.fail_after(10):
                slow = await ChatRAG(_turn(ranker, rank_timeout_s=0.2)).ask("sso setup")
            await ranker.aclose()
        for reply, fault in ((down, "InternalServerError"), (slow, "TimeoutError")):
            assert [c.source for c in reply.citations] == [c.source for c in default.citations]
            assert fault in " ".join(reply.record.errors) and "default ranking was used" in " ".join(
                reply.record.errors
            )


def _tiny_cross_encoder(folder: Path, word: str) -> Path:
    """A real ONNX graph over MiniLM's tokenizer: a pair's logit is how often ``word`` occurs in its passage
    (token weights gathered by id, times the attention mask and the segment id, summed)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from tokenizers import Tokenizer

    shutil.copy(tokenizer_asset(), folder / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    wanted = tokenizer.token_to_id(word)
    weights = [0.0] * tokenizer.get_vocab_size()
    weights[wanted] = 1.0
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    nodes = [
        helper.make_node("Gather", ["weights", "input_ids"], ["per_token"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["token_type_ids"], ["segment"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["per_token", "mask"], ["masked"]),
        helper.make_node("Mul", ["masked", "segment"], ["passage"]),
        helper.make_node("ReduceSum", ["passage", "axes"], ["logits"], keepdims=1),
    ]
    init = [
        helper.make_tensor("weights", TensorProto.FLOAT, [len(weights)], weights),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    out = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])]
    graph = helper.make_graph(nodes, "tiny-cross-encoder", ints, out, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    return folder


class TestOnnxCrossEncoder:
    async def test_a_tiny_graph_scores_pairs(self, tmp_path: Path) -> None:
        """The model's logit per (query, passage) pair: the query's own 'setup' does not count (segment 0), each
        'setup' in the passage does; pairs of different lengths are padded together."""
        pytest.importorskip("onnxruntime")
        encoder = OnnxCrossEncoder(_tiny_cross_encoder(tmp_path, "setup"))
        scores = await encoder.score("setup", ["billing", "sso setup", "setup and then setup again, at length"])
        assert scores == [0.0, 1.0, 2.0]

    async def test_through_cross_encoder_path(self, tmp_path: Path) -> None:
        """--reranker PATH: the passage the model scores highest leads the turn's blocks (here the one holding
        'with', which the default ranking does not put first)."""
        pytest.importorskip("onnxruntime")
        default = await ChatRAG(_turn(FusionRanker())).ask("sso setup")
        ranker = cross_encoder(str(_tiny_cross_encoder(tmp_path, "with")))
        reply = await ChatRAG(_turn(ranker)).ask("sso setup")
        assert default.blocks[0].source != "bravo.md"
        assert reply.blocks[0].source == "bravo.md" and not reply.record.errors

    def test_missing_files_and_wrong_models_are_refused(self, tmp_path: Path) -> None:
        """A folder without model.onnx/tokenizer.json, or a model without input_ids: one line saying what is wrong."""
        with pytest.raises(ConfigError, match=r"model\.onnx and its tokenizer\.json; missing"):
            OnnxCrossEncoder(tmp_path)
        (tmp_path / "model.onnx").write_bytes(b"not a model")
        shutil.copy(tokenizer_asset(), tmp_path / "tokenizer.json")
        with pytest.raises(ConfigError, match="could not load the cross-encoder"):
            OnnxCrossEncoder(tmp_path)
