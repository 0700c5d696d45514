"""Every judge a turn asks, in one bundle: :class:`Judges`, offline or through an OpenAI-compatible client.

The bundle is where judge choice lives: :meth:`Judges.offline` (no model, no network: the IR judges built from
the corpus' statistics) or :meth:`Judges.openai` (model judges with the offline decider and answerer behind
them as fallbacks), or a :class:`Judges` of your own. A turn that plans gets its planner here too
(:meth:`Judges.planners`): the sources it plans over are only known when the turn is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from ragloop._log import get_logger
from ragloop.errors import ConfigError, error_text
from ragloop.llm.planner import OfflinePlanner, Planner, SchemaSource
from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.llm.scoped import (
    ScopedAnswerer,
    ScopedBridger,
    ScopedDecider,
    ScopedGrader,
    ScopedKnowledge,
    ScopedRewriter,
)
from ragloop.nodes.answer import Verifier
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.meaning import MeaningScale
from ragloop.retrievers.scope import Corpus
from ragloop.retrievers.sources import Source

if TYPE_CHECKING:
    import openai

__all__ = ["Judges", "PlanModel"]

log = get_logger("ragloop.turn")

#: Decide queries at most, as :class:`~ragloop.turn.TurnSettings` sets it by default.
_MAX_QUERIES = 4
#: Scopes whose corpus-derived judges are kept (see :class:`~ragloop.llm.scoped.ScopedKnowledge`).
_MAX_SCOPES = 32


def _scale(
    meaning: Callable[[Sequence[int] | None], MeaningScale | None] | None, positions: Sequence[int] | None
) -> MeaningScale | None:
    """The dense threshold of the chunks at ``positions`` (``None`` without a way to measure it, or when
    measuring fails: the judges then go by terms alone, as before there was a scale)."""
    if meaning is None:
        return None
    try:
        return meaning(positions)
    except Exception as exc:  # noqa: BLE001 — fail-open: without a scale the judges go by terms alone
        log.warning("meaning_scale_failed", error=error_text(exc))
        return None


def _texts(texts: Sequence[str] | Corpus) -> tuple[Sequence[str], Corpus | None]:
    """The texts, and the corpus to scope by when they come with metadata (``None``: nothing to scope)."""
    if isinstance(texts, Corpus):
        return texts.texts, texts if texts.has_metadata else None
    return texts, None


@frozen
class PlanModel:
    """The model a turn plans with, once its plan sources are known (see :meth:`Judges.planners`).

    Attributes:
        client: The ``openai.AsyncOpenAI`` client.
        model: The model name.
        timeout_s: Per-request timeout.
        compat: What the server accepts, shared with the judges of the same client (``None``: learn afresh).
    """

    client: Any
    model: str
    timeout_s: float
    compat: Any = None


@frozen
class Judges:
    """The judges of one turn and their fallbacks.

    Attributes:
        decider: Decides whether to search, and the queries.
        grader: Grades each retrieved chunk.
        rewriter: Rewrites a query that came up short.
        answerer: Writes the streamed reply.
        fallback_decider: Used when ``decider`` fails (the offline one behind a model).
        fallback_answerer: Used when ``answerer`` fails before its first token; an extractive one (the offline
            answerer) also ends a reply the deadline cut short.
        bridger: Proposes follow-up (second-hop) searches; ``None``: no hops.
        verifier: Checks each finished reply; ``None``: no check.
        planner: Plans retrieval across the plan sources; ``None``: :meth:`planners` makes one.
        fallback_planner: Used when ``planner`` fails or plans something invalid.
        plan_model: The model :meth:`planners` plans with when ``planner`` is not given; ``None``: offline.
        offline_only: True when no judge calls a model (what :meth:`offline` builds).
        knowledge: The corpus-derived judges per caller scope, when the judges were built from a
            :class:`~ragloop.retrievers.scope.Corpus` with metadata (``None``: one set for every caller).
    """

    decider: Decider
    grader: Grader
    rewriter: Rewriter
    answerer: Answerer
    fallback_decider: Decider | None = None
    fallback_answerer: Answerer | None = None
    bridger: Bridger | None = None
    verifier: Verifier | None = None
    planner: Planner | None = None
    fallback_planner: Planner | None = None
    plan_model: PlanModel | None = None
    offline_only: bool = False
    knowledge: ScopedKnowledge[Judges] | None = None

    @classmethod
    def offline(
        cls,
        texts: Sequence[str] | Corpus,
        *,
        glossary: Mapping[str, str] | None = None,
        max_queries: int = _MAX_QUERIES,
        embedder: Embedder | None = None,
        max_scopes: int = _MAX_SCOPES,
    ) -> Judges:
        """The offline judges over a corpus: no model, no network.

        Given a :class:`~ragloop.retrievers.scope.Corpus` (texts with metadata), every turn's judges know only
        the chunks its filters let it find: statistics, mined glossary, calibration and "never mentioned"
        checks are built per scope (:class:`~ragloop.llm.scoped.ScopedKnowledge`). Plain texts give one set of
        judges for every caller.

        Args:
            texts: Every chunk's text (or the corpus, with metadata): the statistics the judges score with.
            glossary: Extra abbreviations (``{"SSO": "single sign-on"}``), over those mined from the texts.
            max_queries: Most queries the decider makes (``TurnSettings.max_queries``).
            embedder: The index's embedder: the verifier's semantic support check, and the judges' evidence by
                meaning when ``texts`` is a corpus that measures its scale (:attr:`Corpus.meaning
                <ragloop.retrievers.scope.Corpus.meaning>`; an index's and a Postgres store's do), or is too small
                to calibrate on.
            max_scopes: Most caller scopes whose judges are kept at once.
        """
        from ragloop.llm.offline import OfflineAnswerer, OfflineDecider, OfflineGrader, OfflineRewriter
        from ragloop.llm.offline.answer import AbstainRule
        from ragloop.llm.offline.answer._abstain import SMALL_MEANING
        from ragloop.llm.offline.bridge import OfflineBridger
        from ragloop.llm.offline.verify import OfflineVerifier
        from ragloop.text.terms import CorpusStats

        def build(visible: Sequence[str], positions: Sequence[int] | None = None) -> Judges:
            stats = CorpusStats.from_texts(visible)
            # On a scope too small to calibrate on, the grader also judges by meaning (the index's embedder).
            grader = OfflineGrader.calibrate(stats, visible).with_embedder(embedder)
            if grader.small_corpus:
                # ... it abstains on its own evidence scale (see AbstainRule.small), and its answerer may quote
                # a sentence that means the question without sharing its words.
                rule, meaning_at = AbstainRule.small(), SMALL_MEANING if embedder is not None else None
            else:
                # A larger one measures how close by meaning a passage must come to count (its own headings,
                # leave one document out: ragloop.retrievers.meaning); without a scale, terms alone decide.
                scale = _scale(meaning, positions) if embedder is not None else None
                meaning_at = scale.threshold if scale is not None else None
                grader, rule = evolve(grader, dense_at=meaning_at), AbstainRule(dense_at=meaning_at)
            return cls(
                decider=OfflineDecider(stats, glossary=dict(glossary or {}), max_queries=max_queries),
                grader=grader,
                rewriter=OfflineRewriter(stats),
                answerer=OfflineAnswerer(
                    stats,
                    abstain_rule=rule,
                    embedder=embedder if meaning_at is not None else None,
                    meaning_at=meaning_at,
                ),
                bridger=OfflineBridger(stats),  # with a model, the model decider writes bridge queries itself
                verifier=OfflineVerifier(embedder=embedder),
                offline_only=True,
            )

        meaning = texts.meaning if isinstance(texts, Corpus) else None
        plain, corpus = _texts(texts)
        base = build(plain)
        if corpus is None:
            return base
        known = ScopedKnowledge(corpus, build, base=base, max_scopes=max_scopes, positioned=True)
        return evolve(
            base,
            decider=ScopedDecider(known, "decider"),
            grader=ScopedGrader(known, "grader"),
            rewriter=ScopedRewriter(known, "rewriter"),
            answerer=ScopedAnswerer(known, "answerer"),
            bridger=ScopedBridger(known, "bridger"),
            knowledge=known,
        )

    @classmethod
    def openai(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        cls,
        client: openai.AsyncOpenAI,
        texts: Sequence[str] | Corpus,
        *,
        fast_model: str | None,
        answer_model: str | None = None,
        timeout_s: float = 20.0,
        glossary: Mapping[str, str] | None = None,
        max_queries: int = _MAX_QUERIES,
        grade_max_chars: int = 2000,
        max_tokens: Mapping[str, int | None] | None = None,
        max_scopes: int = _MAX_SCOPES,
    ) -> Judges:
        """Model judges through an OpenAI-compatible client, the offline decider and answerer behind them.

        ``fast_model`` decides, grades, rewrites and plans; ``answer_model`` (default: ``fast_model``) answers.
        A failing model still yields an answer: the offline decider and answerer take over. Given a
        :class:`~ragloop.retrievers.scope.Corpus`, the glossary the model decider is shown and the offline
        fallbacks are the turn's scope's (as in :meth:`offline`); the other model judges see only the turn's
        own passages.

        Args:
            client: An ``openai.AsyncOpenAI`` client (built, configured and closed by the caller).
            texts: Every chunk's text, for the offline fallbacks and the decider's glossary.
            fast_model: Model for decide, grade, rewrite and plan.
            answer_model: Model for the answer.
            timeout_s: Per-call timeout.
            glossary: Extra abbreviations over those mined from the texts.
            max_queries: Most queries the offline decider makes.
            grade_max_chars: Chunk text budget of a grade request.
            max_tokens: Output caps by judge name over the defaults (see ``OpenAIJudges.create``).
            max_scopes: Most caller scopes whose glossary and fallbacks are kept at once.

        Raises:
            ConfigError: No ``fast_model``.
        """
        if not fast_model:
            raise ConfigError("pass fast_model (and optionally answer_model) together with an llm client")
        from ragloop.llm.offline import OfflineAnswerer, OfflineDecider
        from ragloop.llm.openai import OpenAIJudges
        from ragloop.text.terms import CorpusStats

        plain, corpus = _texts(texts)
        stats = CorpusStats.from_texts(plain)
        offline_decider = OfflineDecider(stats, glossary=dict(glossary or {}), max_queries=max_queries)
        model = OpenAIJudges.create(
            client,
            fast_model=fast_model,
            answer_model=answer_model or fast_model,
            timeout_s=timeout_s,
            glossary=offline_decider.terms_glossary,
            grade_max_chars=grade_max_chars,
            max_tokens=max_tokens,
        )
        base = cls(
            decider=model.decider,
            grader=model.grader,
            rewriter=model.rewriter,
            answerer=model.answerer,
            fallback_decider=offline_decider,
            fallback_answerer=OfflineAnswerer(stats),
            plan_model=PlanModel(client, fast_model, timeout_s, compat=model.decider.compat),
        )
        if corpus is None:
            return base

        def build(visible: Sequence[str]) -> Judges:
            scoped = CorpusStats.from_texts(visible)
            fallback = OfflineDecider(scoped, glossary=dict(glossary or {}), max_queries=max_queries)
            decider = evolve(model.decider, glossary=fallback.terms_glossary)  # the same client and compat
            return evolve(base, decider=decider, fallback_decider=fallback, fallback_answerer=OfflineAnswerer(scoped))

        known = ScopedKnowledge(corpus, build, base=base, max_scopes=max_scopes)
        return evolve(
            base,
            decider=ScopedDecider(known, "decider"),
            fallback_decider=ScopedDecider(known, "fallback_decider"),
            fallback_answerer=ScopedAnswerer(known, "fallback_answerer"),
            knowledge=known,
        )

    def planners(self, sources: Mapping[str, Source], live: Sequence[LiveSource]) -> tuple[Planner, Planner | None]:
        """The plan node's planner over ``sources`` and its fallback.

        ``planner`` and ``fallback_planner`` when given; otherwise the model planner (with ``plan_model``)
        backed by the offline planner, or the offline planner alone. The offline planner plans over the first
        source with a schema (the SQL source) and looks live sources up by name.
        """
        if self.planner is not None:
            return self.planner, self.fallback_planner
        sql = next((s for s in sources.values() if isinstance(s, SchemaSource)), None)
        offline = OfflinePlanner(sql, live={s.name: s.name for s in live})
        if self.plan_model is None:
            return offline, None
        from ragloop.llm.openai import OpenAIPlanner, ServerCompat

        pm, described = self.plan_model, tuple(sources.values())
        compat = pm.compat if isinstance(pm.compat, ServerCompat) else ServerCompat()
        return OpenAIPlanner(pm.client, pm.model, described, timeout_s=pm.timeout_s, compat=compat), offline
