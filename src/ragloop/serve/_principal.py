"""Who a request is, for the turn log: the one place the serve layer names a principal.

Today a request is the API key it authenticated with (a hash of the bearer key, never the key), or ``anonymous``
on a server without keys. Feedback is accepted only from the principal that asked, so this function is what
scopes ``POST /v1/feedback``.
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request

from ragloop.serve._settings import ServeSettings

__all__ = ["principal_of"]


def principal_of(request: Request, settings: ServeSettings) -> str:
    """``key:`` and 16 hex digits of the SHA-256 of the request's bearer key, or ``anonymous`` (call it after the
    request is authorized: on a server with keys the bearer is then one of them)."""
    if not settings.api_keys:
        return "anonymous"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "anonymous"
    return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:16]
