"""Scopes (retrievers/scope.py): what one index run owns, as stored with its documents."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.retrievers.scope import Corpus, Scope
from ragloop.state import Chunk

pairs = st.dictionaries(st.text(min_size=1, max_size=8).filter(str.strip), st.text(max_size=8), max_size=4)


class TestScope:
    @given(pairs)
    def test_the_label_is_canonical_and_reads_back(self, value: dict[str, str]) -> None:
        """The label does not depend on the pairs' order and from_label gives the same scope back."""
        scope = Scope(value)
        assert Scope(dict(reversed(list(value.items())))).label == scope.label
        assert Scope.from_label(scope.label) == scope
        assert (scope.label == "") == (not value)

    @given(pairs, st.text(min_size=1, max_size=20))
    def test_apply_is_idempotent_and_keeps_the_empty_scope_as_it_is(self, value: dict[str, str], text: str) -> None:
        """Applying a scope twice is applying it once; the empty scope changes nothing; ids of two scopes differ."""
        chunk = Chunk(id="c1", text=text, doc_id="guide.md", metadata={"path": "guide.md", "tenant": "other"})
        scope = Scope(value)
        once = scope.apply([chunk])
        assert scope.apply(once) == once
        if not value:
            assert once == [chunk]
        else:
            assert once[0].id != chunk.id and once[0].meta().items() >= value.items()
            assert Scope({**value, "_x": "1"}).apply([chunk])[0].id != once[0].id

    def test_a_scope_with_two_values_for_a_key_is_refused(self) -> None:
        """One value per key; an empty key is refused too."""
        with pytest.raises(ConfigError, match="one value per key"):
            Scope((("tenant", "acme"), ("tenant", "globex")))
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            Scope({" ": "x"})

    def test_describe_and_filters(self) -> None:
        """How messages name a scope, and the filters that find its chunks."""
        scope = Scope.of({"version": "2", "tenant": "acme"})
        assert scope.describe() == "tenant=acme, version=2"
        assert scope.filters() == {"tenant": ("acme",), "version": ("2",)}
        assert Scope.of(None).describe() == "(no scope)" and Scope.of(scope) is scope


class TestCorpus:
    def test_visible_is_what_a_filtered_search_can_find(self) -> None:
        """Positions of the chunks whose metadata passes the filters (a chunk without the key never does)."""
        corpus = Corpus.of(
            [
                Chunk("a", "one", metadata={"tenant": "acme"}),
                Chunk("b", "two", metadata={"tenant": "globex"}),
                Chunk("c", "three"),
            ]
        )
        assert corpus.has_metadata and len(corpus) == 3
        assert corpus.visible({"tenant": ("acme",)}) == (0,)
        assert corpus.visible({"tenant": ("acme", "globex")}) == (0, 1)
        assert corpus.visible(None) == corpus.visible({}) == (0, 1, 2)
        assert corpus.texts_at((2, 0)) == ["three", "one"]

    def test_texts_without_metadata(self) -> None:
        """Plain texts are a corpus without metadata: no filter shows any of it."""
        corpus = Corpus.from_texts(["x", "y"])
        assert not corpus.has_metadata and corpus.visible({"tenant": ("acme",)}) == ()

    def test_one_metadata_per_text(self) -> None:
        """Texts and metadata of different lengths are refused with both counts."""
        with pytest.raises(ConfigError, match="2 and 1"):
            Corpus(("x", "y"), ({},))
