"""The app's limits and switches."""

from __future__ import annotations

import math
import re

from attrs import field, frozen

from ragloop.errors import ConfigError
from ragloop.serve._principals import ApiKey, KeyRing
from ragloop.serve._quota import SessionQuota
from ragloop.serve._sessions import SessionLimits

#: Longest chat page title.
MAX_TITLE_CHARS = 80
_COLOUR = re.compile(r"#[0-9A-Fa-f]{3}|#[0-9A-Fa-f]{6}|[A-Za-z]{3,30}")


@frozen
class ServeSettings:
    """Limits and switches of the app.

    Attributes:
        max_concurrent_turns: Turns that may run at once; one more gets 429 with ``Retry-After``.
        max_turns_per_key: Turns one principal may run at once (429 ``key_busy`` over it), so that one key
            never takes every slot. ``None``: ``max_concurrent_turns`` shared out over the configured
            principals, up to four: all of them for one principal, half for two, a third for three, a quarter
            for four or more (rounded up).
        session_quota: Sessions per principal (over it the principal's own oldest session goes), in all (over
            it: 429) and their idle expiry, for the default in-memory store (``ragloop serve`` passes it to
            the SQL stores too).
        mcp_sessions_per_key: MCP sessions (``/mcp``) one principal may hold open; one more ``initialize``
            gets 429 ``too_many_sessions`` until one closes (DELETE) or goes idle.
        mcp_max_sessions: MCP sessions open in all (the SDK's own cap; 503 over it).
        mcp_idle_s: An MCP session with no request for this long is closed.
        feedback_per_key: Feedback requests one principal may make per ``feedback_window_s`` (429 over it), so
            one key cannot fill the turn log's feedback table.
        feedback_window_s: The window of ``feedback_per_key``, in seconds.
        retry_after_s: The ``Retry-After`` value sent with 429, in seconds.
        deadline_s: Time limit of one turn (the turn then answers with what it has); ``None``: the rag's own.
        deadline_grace_s: A turn still running this long after ``deadline_s`` is stuck: it is cancelled and
            the client gets 504 (or, mid-stream, an error event).
        max_body_bytes: Largest request body (413 above it).
        max_messages: Most messages in one request (history plus question).
        max_message_chars: Longest history message, in characters (the question's limit is the rag's own).
        history: Caps on the history a turn sees (oldest dropped first), for sessions and sent history alike.
        api_keys: Bearer keys that may call the API, each its own principal (no tenant); empty and no ``keys``:
            no authentication (every caller is the one principal ``anonymous``).
        keys: API keys with their principals, tenants and filters (:func:`~ragloop.serve.load_keys`).
        tenant_key: The chunk metadata key a principal's tenant filters on.
        cors_origins: Origins allowed to call the API from a browser; empty: CORS off.
        allowed_hosts: ``Host`` header values served (``docs.example.com``, ``*.example.com``, ``127.0.0.1``;
            any port); another host gets 400 before anything runs. Empty: any host.
        body_timeout_s: Longest time a request body may take to arrive (408 and the connection closed after).
        ready_interval_s: ``/readyz`` probes the model, the store and the session store at most this often.
        keepalive_s: An event stream that has sent nothing for this long gets a ``: keep-alive`` comment (proxies
            such as nginx cut streams idle for 60 s); ``None``: never.
        model_name: The model id reported by the OpenAI-compatible endpoint.
        page: Serve the chat page at ``/``.
        page_title: The chat page's title and heading (a help centre embedding it names its product);
            ``None``: "Ask the docs".
        page_colour: The page's accent colour, ``#rgb``/``#rrggbb`` or a CSS colour name; ``None``: the default
            blue (light) and its dark-mode variant.
        mcp: Serve the MCP endpoint at ``/mcp`` (streamable HTTP; needs the app's lifespan).
    """

    max_concurrent_turns: int = 64
    max_turns_per_key: int | None = None
    session_quota: SessionQuota = field(factory=SessionQuota)
    mcp_sessions_per_key: int = 100
    mcp_max_sessions: int = 1_000
    mcp_idle_s: float = 1_800.0
    feedback_per_key: int = 60
    feedback_window_s: float = 60.0
    retry_after_s: int = 1
    deadline_s: float | None = 60.0
    deadline_grace_s: float = 15.0
    max_body_bytes: int = 256_000
    max_messages: int = 100
    max_message_chars: int = 32_000
    history: SessionLimits = field(factory=SessionLimits)
    api_keys: tuple[str, ...] = ()
    keys: tuple[ApiKey, ...] = ()
    tenant_key: str = "tenant"
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    body_timeout_s: float = 10.0
    ready_interval_s: float = 5.0
    keepalive_s: float | None = 15.0
    model_name: str = "ragloop"
    page: bool = True
    page_title: str | None = None
    page_colour: str | None = None
    mcp: bool = True

    def __attrs_post_init__(self) -> None:
        if self.max_concurrent_turns < 1:
            raise ConfigError(f"max_concurrent_turns must be at least 1, got {self.max_concurrent_turns}")
        for name in ("max_turns_per_key", "mcp_sessions_per_key", "mcp_max_sessions", "feedback_per_key"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")
        for name in ("mcp_idle_s", "feedback_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.deadline_s is not None and (isinstance(self.deadline_s, bool) or not self.deadline_s > 0):
            raise ConfigError(f"deadline_s must be a positive number of seconds or None, got {self.deadline_s}")
        if self.max_messages < 1:
            raise ConfigError(f"max_messages must be at least 1 (the question), got {self.max_messages}")
        if any(not key for key in self.api_keys):
            raise ConfigError("api_keys must not contain an empty key")
        if not self.body_timeout_s > 0:
            raise ConfigError(f"body_timeout_s must be a positive number of seconds, got {self.body_timeout_s}")
        if self.keepalive_s is not None and not self.keepalive_s > 0:
            raise ConfigError(f"keepalive_s must be a positive number of seconds or None, got {self.keepalive_s}")
        if not self.tenant_key:
            raise ConfigError("tenant_key must name a metadata key, e.g. 'tenant'")
        if self.page_title is not None and not (0 < len(self.page_title.strip()) <= MAX_TITLE_CHARS):
            raise ConfigError(f"page_title must be 1-{MAX_TITLE_CHARS} characters, got {len(self.page_title)}")
        if self.page_colour is not None and not _COLOUR.fullmatch(self.page_colour):
            raise ConfigError(
                f"page_colour must be #rgb, #rrggbb or a CSS colour name such as 'teal', got {self.page_colour!r:.40}"
            )
        self.keyring()  # a bad key, a repeated key or a principal with two scopes fails here, not on a request

    def turns_per_key(self) -> int:
        """The turn slots one principal may hold (``max_turns_per_key``, or its default share)."""
        if self.max_turns_per_key is not None:
            return min(self.max_turns_per_key, self.max_concurrent_turns)
        principals = min(len(self.keyring().principals()), 4)
        return max(1, math.ceil(self.max_concurrent_turns / max(principals, 1)))

    def keyring(self) -> KeyRing:
        """Every configured key (``api_keys`` and ``keys``) with its principal."""
        return KeyRing((*(ApiKey.from_env_key(k) for k in self.api_keys), *self.keys), tenant_key=self.tenant_key)
