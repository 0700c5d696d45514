"""The feature-based reranker of the final ranking: title match, term proximity, bridge entities, protection."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from ragloop.retrievers.rerank import RerankSettings, bridge_names, head_term, proximity, rerank
from ragloop.testing import make_hit

OFF = RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0, head_weight=0)


class TestFeatures:
    def test_proximity_prefers_terms_side_by_side(self) -> None:
        """All terms in a short window score higher than the same terms far apart; fewer than two score 0."""
        terms = {"webhook", "retri"}
        near = proximity("Webhooks are retried eight times.", terms)
        far = proximity("Webhooks " + "and more words " * 20 + "are retried.", terms)
        assert near > far > 0 and proximity("Only webhooks here.", terms) == 0.0

    def test_bridge_names_are_the_ones_the_question_does_not_name(self) -> None:
        """Names in the first passage the question does not contain are bridges."""
        names = bridge_names("Who played Corliss Archer?", "Kiss and Tell starred Shirley Temple as Corliss Archer.")
        assert "shirley temple" in names and "corliss archer" not in names


class TestHeadTerm:
    def test_the_head_term_is_the_one_fewest_passages_hold(self) -> None:
        """ "workspace logo file": "file" is on every import page, "logo" on one: "logo" is the head term; a term
        no passage holds, or terms all equally common, make none."""
        hits = [
            make_hit("Files of at most 50 MB per file can be imported.", title="Import from CSV", chunk_id="a"),
            make_hit("Exported files are zipped.", title="Exporting your data", chunk_id="b"),
            make_hit("Logo: PNG or SVG, at most 1 MB, in the file picker.", title="Workspace settings", chunk_id="c"),
        ]
        assert head_term(["big", "workspac", "logo", "file"], hits) == "logo"
        assert head_term(["file"], hits) == "" and head_term(["file", "export"], hits[:1]) == ""
        same = [make_hit("webhooks retried", chunk_id=str(i)) for i in range(3)]
        assert head_term(["webhook", "retri"], same) == ""

    def test_the_page_about_the_head_term_moves_up(self) -> None:
        """A short factual question is answered from the page holding its head term in its headings, above
        pages that share only its generic words ("file", "big")."""
        csv = make_hit("A file can be at most 50 MB; big files are split.", title="Import from CSV", chunk_id="csv")
        export = make_hit("Each export file is a zip.", title="Exporting your data", chunk_id="exp")
        settings = make_hit("| Logo | PNG or SVG, at most 1 MB |", title="Workspace settings", chunk_id="ws")
        settings = attrs.evolve(settings, chunk=attrs.evolve(settings.chunk, title_path=("Branding", "Logo")))
        on = RerankSettings(head_weight=0.5)
        ranked = rerank("How big can the workspace logo file be?", [csv, export, settings], settings=on)
        assert ranked[0].id == "ws"
        assert rerank("How big can the workspace logo file be?", [csv, export, settings])[0].id == "csv"  # off
        off = rerank("How big can the workspace logo file be?", [csv, export, settings], settings=OFF)
        assert off[0].id == "csv"
        short = RerankSettings(head_weight=0.5, head_max_terms=3)  # four key terms: too long for the feature
        assert rerank("How big can the workspace logo file be?", [csv, export, settings], settings=short)[0].id == "csv"


class TestRerank:
    def test_the_entitys_own_page_moves_up(self) -> None:
        """A passage titled with the question's entity rises above a fused neighbour that is not."""
        other = make_hit("Portland is a city with bridges and a river.", title="Portland", chunk_id="a")
        page = make_hit("She was born in Portland in 1950.", title="Annie Morton", chunk_id="b")
        assert [h.id for h in rerank("When was Annie Morton born?", [other, page])] == ["b", "a"]

    def test_the_bridge_entitys_page_moves_up(self) -> None:
        """The page of the entity the first passage names (the second hop) moves up the list."""
        film = make_hit("Kiss and Tell starred Shirley Temple as Corliss Archer.", title="Kiss and Tell", chunk_id="f")
        noise = [make_hit(f"Another comedy film number {i}.", title=f"Film {i}", chunk_id=f"n{i}") for i in range(4)]
        temple = make_hit("She served as Chief of Protocol.", title="Shirley Temple", chunk_id="t")
        ranked = rerank("What position did the actress who played Corliss Archer hold?", [film, *noise, temple])
        assert [h.id for h in ranked].index("t") < 5

    def test_zero_weights_keep_the_fused_order(self) -> None:
        """With every weight 0 the reranker changes nothing."""
        hits = [make_hit(f"text {i} webhooks retried", title=f"T{i}", chunk_id=str(i)) for i in range(8)]
        assert rerank("webhooks retried", hits, settings=OFF) == hits

    def test_protected_hits_stay_in_front(self) -> None:
        """A protected hit (the question's own best) never falls past protect_depth, however low it scores."""
        hits = [make_hit(f"retried webhooks {i}", title="webhooks retried", chunk_id=str(i)) for i in range(12)]
        weak = make_hit("unrelated words", title="x", chunk_id="p")
        ranked = rerank("webhooks retried", [weak, *hits], protected={"p"}, settings=RerankSettings(protect_depth=3))
        assert "p" in [h.id for h in ranked[:3]]

    @given(
        st.lists(st.sampled_from(["webhooks", "retried", "Shirley", "Temple", "film", "x"]), min_size=1, max_size=6),
        st.integers(0, 12),
        st.sets(st.integers(0, 11), max_size=3),
    )
    def test_a_permutation_that_keeps_protection(self, words: list[str], n: int, protected: set[int]) -> None:
        """Whatever the hits: the reranked list is a permutation of the input, and every protected hit sits in
        the first protect_depth places when the input had room for it."""
        hits = [make_hit(f"{' '.join(words)} {i}", title=words[i % len(words)], chunk_id=str(i)) for i in range(n)]
        ids = {str(i) for i in protected if i < n}
        ranked = rerank(" ".join(words), hits, protected=ids, settings=RerankSettings(protect_depth=5))
        assert sorted(h.id for h in ranked) == sorted(h.id for h in hits)
        if len(ids) <= 5:
            assert ids <= {h.id for h in ranked[:5]}
