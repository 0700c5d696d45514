"""``POST /v1/feedback``: ``{"turn_id", "rating": "up" | "down", "comment"?}`` on one of the caller's turns.

200 when recorded; 400 for a bad body (naming the field); 404 for a turn id the turn log does not hold for this
principal (another principal's turn is not told apart from no turn) or when the server keeps no turn log; 503 when
the log's database cannot be reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from ragloop.errors import InputError, TurnLogError
from ragloop.serve._stream import Rejected

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG
    from ragloop.serve._metrics import Metrics

__all__ = ["feedback_response"]

_FIELDS = ("turn_id", "rating", "comment")


def _body(body: Mapping[str, Any]) -> tuple[str, str, str | None]:
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise Rejected(
            400, f"unknown field {unknown[0]!r:.60}; send turn_id, rating and an optional comment", param=unknown[0]
        )
    turn_id, rating, comment = body.get("turn_id"), body.get("rating"), body.get("comment")
    if not isinstance(turn_id, str) or not turn_id:
        raise Rejected(400, "turn_id is required: the turn_id of the reply being rated", param="turn_id")
    if rating not in ("up", "down"):
        raise Rejected(400, "rating must be 'up' or 'down'", param="rating")
    if comment is not None and not isinstance(comment, str):
        raise Rejected(400, "comment must be a string", param="comment")
    return turn_id, str(rating), comment


async def feedback_response(rag: ChatRAG, body: Mapping[str, Any], principal: str, metrics: Metrics) -> Response:
    """Record the feedback in ``body`` for ``principal``, or raise :class:`Rejected` saying why not."""
    turn_id, rating, comment = _body(body)
    if getattr(rag, "turn_log", None) is None:
        metrics.feedback.labels(result="no_turn_log").inc()
        raise Rejected(
            404, "this server keeps no turn log, so there is no turn to rate (serve --turn-log URL)", code="no_turn_log"
        )
    try:
        recorded = await rag.feedback(turn_id, rating, comment=comment, principal=principal)  # type: ignore[arg-type]
    except InputError as exc:
        metrics.feedback.labels(result="invalid").inc()
        raise Rejected(400, str(exc), param="comment" if "comment" in str(exc) else "turn_id") from None
    except TurnLogError:
        metrics.feedback.labels(result="unavailable").inc()
        raise Rejected(
            503,
            "the turn log cannot be reached just now; try again later",
            kind="server_error",
            code="turn_log_unavailable",
        ) from None
    if not recorded:
        metrics.feedback.labels(result="unknown_turn").inc()
        raise Rejected(404, f"no turn {turn_id!r:.80} of yours to rate", param="turn_id", code="unknown_turn")
    metrics.feedback.labels(result="recorded").inc()
    return JSONResponse({"status": "recorded", "turn_id": turn_id, "rating": rating})
