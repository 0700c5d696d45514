"""API keys, principals, the keys file and the server-side scope that client filters may only narrow."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.serve import ANONYMOUS, ApiKey, Principal, ServeSettings, create_app, load_keys
from ragloop.serve._principals import KeyRing, narrow
from ragloop.state import Chunk


class TestApiKey:
    def test_a_key_or_its_sha256_finds_the_principal(self) -> None:
        """A key given in plain text or as its SHA-256 is found by the key itself, with tenant and filters."""
        digest = hashlib.sha256(b"sk-globex-42").hexdigest()
        ring = KeyRing(
            (
                ApiKey("alice", key="sk-acme-1", tenant="acme", filters={"product": ["sso", "billing"]}),
                ApiKey("bob", sha256=digest, tenant="globex"),
            )
        )
        alice = ring.find("sk-acme-1")
        assert alice == Principal("alice", "acme", (("product", ("billing", "sso")),))
        assert alice.scope() == {"product": ("billing", "sso"), "tenant": ("acme",)}
        assert ring.find("sk-globex-42") == Principal("bob", "globex")
        assert ring.find(digest) is None and ring.find("sk-acme-") is None and ring.find("") is None

    def test_env_keys_are_each_their_own_principal(self) -> None:
        """RAGLOOP_API_KEYS keys: principal 'key-' + 12 hex digits of the key's SHA-256, no tenant."""
        key = ApiKey.from_env_key("k-123")
        assert key.principal == "key-" + hashlib.sha256(b"k-123").hexdigest()[:12]
        assert key.as_principal().tenant is None

    @pytest.mark.parametrize(
        ("kwargs", "needle"),
        [
            ({"principal": "a"}, "exactly one of key and sha256"),
            ({"principal": "a", "key": "k", "sha256": "0" * 64}, "exactly one of key and sha256"),
            ({"principal": "a", "key": "has space"}, "printable ASCII without spaces"),
            ({"principal": "a", "key": "ключ"}, "printable ASCII"),
            ({"principal": "a", "sha256": "abc"}, "64 hex digits"),
            ({"principal": "", "key": "k"}, "1–128 characters"),
            ({"principal": "a\nb", "key": "k"}, "printable"),
            ({"principal": "a", "key": "k", "tenant": ""}, "tenant must be a non-empty string"),
            ({"principal": "a", "key": "k", "filters": {"product": []}}, "empty set of values"),
        ],
    )
    def test_a_bad_key_is_one_line_naming_the_rule(self, kwargs: dict[str, object], needle: str) -> None:
        """Each wrong field is a ConfigError that says what to fix."""
        with pytest.raises(ConfigError, match=needle):
            ApiKey(**kwargs)  # type: ignore[arg-type]

    def test_the_tenant_has_one_place(self) -> None:
        """filters.tenant is refused (a key reads one tenant, which is also what live sources see)."""
        with pytest.raises(ConfigError, match=r"not filters\.tenant"):
            ServeSettings(keys=(ApiKey("a", key="k", filters={"tenant": ["acme", "globex"]}),))

    def test_repeated_keys_and_principals_with_two_scopes_are_refused(self) -> None:
        """The same key twice, or one principal with two tenants, fails when the settings are made."""
        with pytest.raises(ConfigError, match="repeats an earlier key"):
            ServeSettings(api_keys=("k",), keys=(ApiKey("a", key="k"),))
        with pytest.raises(ConfigError, match="different tenants or filters"):
            ServeSettings(keys=(ApiKey("a", key="k1", tenant="acme"), ApiKey("a", key="k2", tenant="globex")))
        rotated = ServeSettings(keys=(ApiKey("a", key="old", tenant="acme"), ApiKey("a", key="new", tenant="acme")))
        assert rotated.keyring().find("old") == rotated.keyring().find("new")

    def test_no_keys_means_the_anonymous_principal(self) -> None:
        """Without keys the keyring is empty (the app then calls everyone ANONYMOUS)."""
        assert not ServeSettings().keyring()
        assert ANONYMOUS.scope() == {}


class TestKeysFile:
    def test_a_keys_file_loads(self, tmp_path: Path) -> None:
        """[[key]] tables with key or sha256, principal, tenant and filters."""
        path = tmp_path / "keys.toml"
        path.write_text(
            '[[key]]\nkey = "sk-a"\nprincipal = "alice"\ntenant = "acme"\nfilters = { product = ["sso"] }\n\n'
            f'[[key]]\nsha256 = "{hashlib.sha256(b"sk-b").hexdigest()}"\nprincipal = "bob"\n'
        )
        keys = load_keys(path)
        ring = ServeSettings(keys=keys).keyring()
        assert ring.find("sk-a") == Principal("alice", "acme", (("product", ("sso",)),))
        assert ring.find("sk-b") == Principal("bob")

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("", r"holds no \[\[key\]\] tables"),
            ("keys = 1", "unknown top-level names"),
            ('[[key]]\nkey = "k"\n', "needs principal"),
            ('[[key]]\nkey = "k"\nprincipal = "a"\nrole = "admin"\n', r"unknown fields \['role'\]; known: key"),
            ('[[key]]\nkey = 5\nprincipal = "a"\n', "key must be a string"),
            ('[[key]]\nkey = "k"\nprincipal = "a"\nfilters = "x"\n', "filters must be a table"),
            ('[[key]]\nkey = "k\nprincipal', "not valid TOML"),
            ('[[key]]\nkey = "a b"\nprincipal = "a"\n', r"\[\[key\]\] 1: .*without spaces"),
        ],
    )
    def test_a_wrong_keys_file_is_one_line(self, tmp_path: Path, text: str, needle: str) -> None:
        """Every mistake names the file, the entry and the rule."""
        path = tmp_path / "keys.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=needle) as caught:
            load_keys(path)
        assert "\n" not in str(caught.value).strip() or "TOML" in str(caught.value)

    def test_a_missing_keys_file(self, tmp_path: Path) -> None:
        """A path that is not there: one line, no traceback."""
        with pytest.raises(ConfigError, match="cannot read the keys file"):
            load_keys(tmp_path / "nope.toml")


_values = st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4).map(lambda v: tuple(sorted(set(v))))
_filters = st.dictionaries(st.sampled_from(["tenant", "product", "version"]), _values, max_size=3)


class TestNarrow:
    @given(_filters, _filters)
    def test_client_filters_never_widen_the_scope(
        self, scope: dict[str, tuple[str, ...]], asked: dict[str, tuple[str, ...]]
    ) -> None:
        """Whatever a client asks, the turn's filters are inside the scope on every scope key, and inside what it
        asked on every key it asked; asking outside the scope is refused, never answered from the scope."""
        out, refused = narrow(scope, asked)
        outside = any(not set(v) <= set(scope[k]) for k, v in asked.items() if k in scope)
        assert (refused is not None) == outside
        if refused is None:
            for key, allowed in scope.items():
                assert set(out[key]) <= set(allowed)
            for key, values in asked.items():
                assert out[key] == values
        else:
            assert out == {} and "outside what this API key may read" in refused


class TestScopesCheckedAtStart:
    def _rag(self, *, tenants: bool) -> ChatRAG:
        chunks = [
            Chunk(f"d{n}", text, metadata=(("tenant", "acme"),) if tenants else ())
            for n, text in enumerate(("SAML single sign-on needs the Enterprise plan.", "Invoices are monthly."))
        ]
        return ChatRAG.from_index(KnowledgeIndex.build(chunks, HashEmbedder(64)))

    def test_a_tenant_the_documents_do_not_carry_is_refused_before_serving(self) -> None:
        """A key scoped to tenant=acme over documents without a tenant key: one line at start, not a 400 per
        request (every one of its turns would have been refused as an unknown filter key)."""
        settings = ServeSettings(keys=(ApiKey("alice", key="sk-1", tenant="acme"),))
        with pytest.raises(ConfigError, match=r"principal 'alice' is scoped to tenant=acme.*--meta tenant="):
            create_app(self._rag(tenants=False), settings=settings)

    def test_a_tenant_the_documents_carry_serves(self) -> None:
        """The same key over documents indexed with --meta tenant=…: the app is built."""
        settings = ServeSettings(keys=(ApiKey("alice", key="sk-1", tenant="acme"),))
        assert create_app(self._rag(tenants=True), settings=settings) is not None

    def test_principals_are_listed_once_each(self) -> None:
        """Two keys of one principal (a rotation) are one principal in the ring's list."""
        keys = (
            ApiKey("alice", key="k1", tenant="acme"),
            ApiKey("bob", key="k2"),
            ApiKey("alice", key="k3", tenant="acme"),
        )
        ring = KeyRing(keys)
        assert [p.name for p in ring.principals()] == ["alice", "bob"]
