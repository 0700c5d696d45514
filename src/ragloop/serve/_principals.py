"""Who calls the API: API keys, the principal each one stands for, and the scope that principal may read.

A :class:`Principal` is the identity behind one or more API keys: its ``name`` owns sessions, its ``tenant``
becomes the turn's :class:`~ragloop.state.Caller` and, with its ``filters``, the **server-side filter** of every
search of its turns. A client's own ``filters`` can only narrow that scope (:func:`narrow`), never widen it.

Keys come from ``RAGLOOP_API_KEYS`` (each key its own principal, named ``key-`` + 12 hex digits of its SHA-256)
or from a keys file (:func:`load_keys`)::

    # keys.toml
    [[key]]
    sha256 = "5e884898da28047151d0e56f8dc62927..."   # hex SHA-256 of the key (or: key = "sk-...")
    principal = "alice"
    tenant = "acme"
    filters = { product = ["billing", "sso"] }

Presented keys are hashed and compared with :func:`hmac.compare_digest` against every configured digest, with
no early exit, so neither the time taken nor anything else tells which key (or whether a prefix) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from attrs import field, frozen

from ragloop.errors import ConfigError
from ragloop.retrievers.filters import FilterKey, Filters, filter_key, normalize_filters

__all__ = ["ANONYMOUS", "ApiKey", "KeyRing", "Principal", "load_keys", "narrow"]

_FIELDS = ("key", "sha256", "principal", "tenant", "filters")


def _printable(text: str, *, spaces: bool = True) -> bool:
    return text.isprintable() and (spaces or " " not in text)


@frozen
class Principal:
    """The identity behind an API key.

    Attributes:
        name: Owns the sessions its turns start (another principal's session id is an unknown id to it).
        tenant: Its organisation: the turn's ``Caller.tenant`` and a server-side ``tenant`` filter.
        filters: Further server-side filters every search of its turns applies (canonical, sorted).
    """

    name: str
    tenant: str | None = None
    filters: FilterKey = ()

    def scope(self, tenant_key: str = "tenant") -> dict[str, tuple[str, ...]]:
        """The server-side filters of this principal's turns: its ``filters`` plus ``tenant_key = tenant``."""
        out = dict(self.filters)
        if self.tenant is not None:
            out[tenant_key] = (self.tenant,)
        return out


#: The one principal of a server without API keys (it binds to loopback only; see ``ragloop serve``).
ANONYMOUS = Principal("anonymous")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _check_key(key: str, where: str) -> None:
    if not key:
        raise ConfigError(f"{where}: the key is empty")
    if not (key.isascii() and _printable(key, spaces=False)):
        raise ConfigError(f"{where}: a key must be printable ASCII without spaces (an HTTP header carries it)")


def _sha256(value: str, where: str) -> bytes:
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ConfigError(
            f"{where}: sha256 must be 64 hex digits (the SHA-256 of the key: "
            'python -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" KEY)'
        )
    return digest


@frozen
class ApiKey:
    """One API key and the principal it stands for.

    Give the key itself (``key``) or only its SHA-256 (``sha256``, 64 hex digits), so that a leaked keys file
    does not leak the keys.

    Attributes:
        principal: The principal's name (1–128 printable characters).
        key: The key as clients send it (``Authorization: Bearer <key>``).
        sha256: Hex SHA-256 of the key, instead of ``key``.
        tenant: The principal's tenant (``None``: not bound to one).
        filters: Server-side filters of the principal's turns (``{"product": ["billing", "sso"]}``).
    """

    principal: str
    key: str | None = field(default=None, repr=False)
    sha256: str | None = field(default=None, repr=False)
    tenant: str | None = None
    filters: Mapping[str, str | list[str] | tuple[str, ...]] = field(factory=dict)

    def __attrs_post_init__(self) -> None:
        where = f"API key of principal {self.principal!r:.80}"
        if not isinstance(self.principal, str) or not 1 <= len(self.principal) <= 128:
            raise ConfigError(f"{where}: principal must be a name of 1–128 characters")
        if not _printable(self.principal):
            raise ConfigError(f"{where}: principal must be printable (no control characters)")
        if (self.key is None) == (self.sha256 is None):
            raise ConfigError(f"{where}: give exactly one of key and sha256")
        if self.key is not None:
            _check_key(self.key, where)
        if self.sha256 is not None:
            _sha256(self.sha256, where)
        if self.tenant is not None and (not isinstance(self.tenant, str) or not self.tenant or len(self.tenant) > 256):
            raise ConfigError(f"{where}: tenant must be a non-empty string of at most 256 characters, or absent")
        try:
            normalize_filters(self.filters)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def digest(self) -> bytes:
        """SHA-256 of the key."""
        if self.key is not None:
            return _digest(self.key)
        assert self.sha256 is not None
        return bytes.fromhex(self.sha256)

    def as_principal(self, tenant_key: str = "tenant") -> Principal:
        """The principal this key stands for."""
        filters = normalize_filters(self.filters)
        if tenant_key in filters:  # the tenant is also what live sources see: it has one place, one value
            raise ConfigError(
                f'API key of principal {self.principal!r}: set the tenant with tenant = "…", not filters.{tenant_key}'
            )
        return Principal(self.principal, self.tenant, filter_key(filters))

    @classmethod
    def from_env_key(cls, key: str) -> ApiKey:
        """A key of ``RAGLOOP_API_KEYS``: its own principal, ``key-`` + the first 12 hex digits of its SHA-256."""
        _check_key(key, "RAGLOOP_API_KEYS")
        return cls(f"key-{hashlib.sha256(key.encode()).hexdigest()[:12]}", key=key)


class KeyRing:
    """The configured keys, looked up in constant time.

    Args:
        keys: The keys; two keys may share a principal (key rotation), but then with the same tenant and filters.
        tenant_key: The metadata key a principal's tenant filters on.
    """

    def __init__(self, keys: tuple[ApiKey, ...], *, tenant_key: str = "tenant") -> None:
        entries: list[tuple[bytes, Principal]] = []
        by_name: dict[str, Principal] = {}
        for n, api_key in enumerate(keys, 1):
            principal = api_key.as_principal(tenant_key)
            digest = api_key.digest()
            if any(hmac.compare_digest(digest, d) for d, _ in entries):
                raise ConfigError(f"API key {n} (principal {principal.name!r}) repeats an earlier key; drop one")
            known = by_name.setdefault(principal.name, principal)
            if known != principal:
                raise ConfigError(
                    f"principal {principal.name!r} has keys with different tenants or filters; "
                    "give every key of one principal the same tenant and filters"
                )
            entries.append((digest, principal))
        self._entries = tuple(entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def principals(self) -> tuple[Principal, ...]:
        """Every configured principal once, in the order its first key was given."""
        first: dict[str, Principal] = {}
        for _, principal in self._entries:
            first.setdefault(principal.name, principal)
        return tuple(first.values())

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, presented: str) -> Principal | None:
        """The principal of the key ``presented`` (``None``: no such key).

        Every configured digest is compared, whatever matched before, so the time does not depend on which key
        matched; digests have one length, so neither does it depend on the lengths of the keys.
        """
        digest = _digest(presented)
        found: Principal | None = None
        for known, principal in self._entries:
            if hmac.compare_digest(digest, known):
                found = principal
        return found


def load_keys(path: str | os.PathLike[str]) -> tuple[ApiKey, ...]:
    """The keys of a TOML keys file: one ``[[key]]`` table per key (see the module docstring).

    Raises:
        ConfigError: The file is missing or not TOML, or an entry is wrong (the message names it and the fix).
    """
    where = Path(path)
    try:
        data = tomllib.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the keys file {where}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the keys file {where} is not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"key"})
    if extra:
        raise ConfigError(f"the keys file {where} has unknown top-level names {extra}; use [[key]] tables only")
    entries = data.get("key", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"the keys file {where} holds no [[key]] tables; add one per API key")
    out = []
    for n, entry in enumerate(entries, 1):
        at = f"{where} [[key]] {n}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be a table")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"{at} has unknown fields {unknown}; known: {', '.join(_FIELDS)}")
        if "principal" not in entry:
            raise ConfigError(f'{at} needs principal = "name" (who the key stands for)')
        for name in ("key", "sha256", "principal", "tenant"):
            if name in entry and not isinstance(entry[name], str):
                raise ConfigError(f"{at}: {name} must be a string")
        filters = entry.get("filters", {})
        if not isinstance(filters, dict):
            raise ConfigError(f'{at}: filters must be a table, e.g. filters = {{ product = ["billing"] }}')
        try:
            out.append(
                ApiKey(
                    entry["principal"],
                    key=entry.get("key"),
                    sha256=entry.get("sha256"),
                    tenant=entry.get("tenant"),
                    filters=filters,
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"{at}: {exc}") from None
    return tuple(out)


def narrow(scope: Filters, asked: Filters) -> tuple[dict[str, tuple[str, ...]], str | None]:
    """The filters of a turn: the server-side ``scope`` narrowed by the client's ``asked`` filters.

    A key of ``asked`` outside ``scope`` adds a condition; a key inside it may keep only some of the scope's
    values. Returns the filters and ``None``, or ``({}, why)`` when ``asked`` reaches outside ``scope`` (a value
    the scope does not allow): the request is then refused, never answered from a wider scope.
    """
    out = dict(asked)
    for key, allowed in scope.items():
        if key not in asked:
            out[key] = allowed
            continue
        outside = sorted(set(asked[key]) - set(allowed))
        if outside:
            return {}, (
                f"filter {key}={outside[0]!r:.80} is outside what this API key may read "
                f"({key}: {', '.join(allowed)}); drop it or ask with a key that may"
            )
    return out, None
