"""live: ask live sources (ticket system, catalogue, …) for the short queries that carry their signal."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import error_text
from ragloop.events import Progress
from ragloop.policy import EDGES, LIVE, RoutingPolicy, is_short, next_step
from ragloop.retrievers.live import LiveSource, lookup_for, record_hit, split_matches
from ragloop.runner import emit
from ragloop.state import Graded, LiveLookup, TurnState, Verdict

__all__ = ["MAX_RECORD_CHARS", "Live", "record_hit", "split_matches"]

log = get_logger("ragloop.nodes.live")
#: A record's title and link are one line each: longer ones are cut (a title) or dropped (a link), recorded.
_MAX_TITLE_CHARS = 300
_MAX_URL_CHARS = 2_000

#: Longest live record text handed to the answer by default (characters).
MAX_RECORD_CHARS = 8_000


@define
class Live:
    """Runs live sources for short queries whose text carries their signal; rejects id mismatches.

    Attributes:
        sources: The live sources.
        policy: Where the turn goes next (:func:`ragloop.policy.next_step`).
        timeout_s: Time limit per lookup; a slow or failing source is recorded and the turn goes on.
        max_record_chars: Longest record text handed on (characters); a longer one is cut, and the cut recorded.
    """

    sources: Sequence[LiveSource]
    policy: RoutingPolicy = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    max_record_chars: int = field(default=MAX_RECORD_CHARS, kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[LIVE], init=False)

    async def __call__(self, state: TurnState) -> str:
        jobs = [
            (q, source, source.signals(q.text))
            for q in state.queries.values()
            if is_short(q) and not q.live_tried
            for source in self.sources
        ]
        jobs = [(q, s, ids) for q, s, ids in jobs if ids]

        caller = state.caller

        async def one(q_text: str, source: LiveSource, ids: tuple[str, ...]) -> None:
            try:
                with anyio.fail_after(self.timeout_s):
                    records = list(await lookup_for(source, q_text, ids, caller))
            except Exception as exc:  # noqa: BLE001 — fail-open: a down source must not sink the turn
                error = f"{error_text(exc)}"
                log.warning("live.failed", source=source.name, error=error)
                state.live.append(LiveLookup(q_text, source.name, ids, error=error))
                return
            accepted, rejected = split_matches(ids, records)
            state.live.append(
                LiveLookup(q_text, source.name, ids, tuple(r.id for r in accepted), tuple(r.id for r in rejected))
            )
            if rejected:
                log.info("live.mismatch", source=source.name, requested=list(ids), got=[r.id for r in rejected])
            query = state.queries[q_text]
            for record in accepted:
                if len(record.text) > self.max_record_chars:
                    state.errors.append(
                        f"live: {source.name} record {record.id[:40]} cut from {len(record.text):,} to "
                        f"{self.max_record_chars:,} characters"
                    )
                    record = attrs.evolve(record, text=record.text[: self.max_record_chars] + " …")
                if len(record.title) > _MAX_TITLE_CHARS or len(record.url or "") > _MAX_URL_CHARS:
                    state.errors.append(f"live: {source.name} record {record.id[:40]} title or url cut to size")
                    url = record.url if len(record.url or "") <= _MAX_URL_CHARS else None
                    record = attrs.evolve(record, title=record.title[:_MAX_TITLE_CHARS] + "…", url=url)
                hit = record_hit(record, q_text)
                query.hits.append(hit)
                verdict = Verdict("relevant", reason=f"{source.name}: exact id {record.id}", score=1.0)
                state.graded.append(Graded(q_text, hit, verdict))
            if accepted:
                query.status = "enough"

        async with anyio.create_task_group() as tg:
            for q, source, ids in jobs:
                q.live_tried = True
                tg.start_soon(one, q.text, source, ids)
        await emit(
            Progress(
                node="live",
                kind="live",
                message=f"asked {len(jobs)} live source(s)",
                data={"lookups": [attrs.asdict(lookup) for lookup in state.live]},
            )
        )
        return next_step(state, self.policy, after=LIVE)
