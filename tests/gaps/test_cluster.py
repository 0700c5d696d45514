"""Grouping questions: exact term cosines, average linkage stopped at a threshold, order independence, scale."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.gaps import ATTACH_FLOOR, ATTACH_MARGIN, attach_lone, average_linkage, cluster, combine, lexical_vectors


def _vectors(lists: list[list[str]]) -> np.ndarray:
    df: dict[str, int] = {}
    for ts in lists:
        for t in set(ts):
            df[t] = df.get(t, 0) + 1
    return lexical_vectors(lists, df, len(lists))


class TestLexical:
    def test_unrelated_lists_are_orthogonal(self) -> None:
        """Lists that share no term have cosine 0 (no hashed collisions), like ones share the rare term."""
        v = _vectors([["uptim", "sla", "guarante"], ["move", "team", "asana"], ["asana", "import"], ["sla"]])
        assert v[0] @ v[1] == 0.0
        assert v[1] @ v[2] > 0 and v[0] @ v[3] > 0

    def test_norm_counts_unshared_terms(self) -> None:
        """A term no other list holds has no column but still weighs in the norm (cosines stay exact)."""
        v = _vectors([["zapier", "app"], ["zapier", "connect"]])
        assert 0.0 < float(v[0] @ v[1]) < 1.0
        assert 0.0 < float(np.linalg.norm(v[0])) < 1.0  # only the shared term has a column

    def test_combine_averages_the_cosines(self) -> None:
        """At weight 0.5 joined vectors' dot product is the mean of the term cosine and the embedding cosine."""
        lex = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
        dense = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
        joined = combine(lex, dense, 0.5)
        assert abs(float(joined[0] @ joined[1]) - 0.5) < 1e-6


def _unit_rows(rows: list[list[float]]) -> np.ndarray:
    x = np.array(rows, dtype=np.float64)  # float32 norms of rows near 1e-22 round badly (see TestUnit)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0).astype(np.float32)


class TestUnit:
    def test_tiny_rows_become_unit_rows_and_the_input_is_left_alone(self) -> None:
        """A float32 row whose squared norm is subnormal still comes out at length 1 (hypothesis found one at
        1.0066), a zero row stays zero, and the caller's array is not rescaled in place."""
        from ragloop.gaps._cluster import _unit

        x = np.array([[0.0, 0.0, 2.0225534067024414e-22], [0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], dtype=np.float32)
        before = x.copy()
        out = _unit(x)
        assert out.dtype == np.float32
        assert abs(float(np.linalg.norm(out[0])) - 1.0) < 1e-6
        assert not out[1].any()
        assert np.allclose(out[2], [0.6, 0.8, 0.0])
        assert np.array_equal(x, before)

    @settings(max_examples=60, deadline=None)
    @given(
        rows=st.lists(
            st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=3, max_size=3),
            min_size=1,
            max_size=6,
        )
    )
    def test_any_finite_rows_come_out_unit_or_zero(self, rows: list[list[float]]) -> None:
        """Any finite float32 rows, subnormal or near float32's largest: each comes out at length 1 (or stays
        zero), in the same direction, and the input is left as it was."""
        from ragloop.gaps._cluster import _unit

        x = np.array(rows, dtype=np.float32)
        before = x.copy()
        out = _unit(x)
        lengths = np.linalg.norm(out.astype(np.float64), axis=1)
        for row, length, src in zip(out, lengths, x, strict=True):
            if src.any():
                assert abs(length - 1.0) < 1e-6
                assert np.all(np.sign(row[row != 0]) == np.sign(src[row != 0]))
            else:
                assert not row.any()
        assert np.array_equal(x, before)


_rows = st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=3, max_size=3)


class TestCombinedSimilarity:
    """The question-embedding cosine joined to the term cosine (#34): a weighted sum, symmetric, in range."""

    def test_default_weight_is_the_embeddings_share(self) -> None:
        """Same terms, orthogonal embeddings: the similarity is the term share, 1 - DENSE_WEIGHT."""
        from ragloop.gaps._cluster import DENSE_WEIGHT

        lex = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
        dense = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
        joined = combine(lex, dense)
        assert abs(float(joined[0] @ joined[1]) - (1 - DENSE_WEIGHT)) < 1e-6
        assert combine(lex, None) is lex

    def test_weight_out_of_range_is_refused(self) -> None:
        """A weight outside [0, 1] is a ValueError naming the range, not a silent NaN."""
        import pytest

        lex = np.eye(2, dtype=np.float32)
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            combine(lex, lex, 1.5)

    @settings(max_examples=60, deadline=None)
    @given(
        lex=st.lists(_rows, min_size=2, max_size=5),
        dense=st.lists(_rows, min_size=2, max_size=5),
        weight=st.floats(0, 1, allow_nan=False),
    )
    def test_weighted_sum_symmetric_and_bounded(
        self, lex: list[list[float]], dense: list[list[float]], weight: float
    ) -> None:
        """For any unit term rows and any embeddings, the joined dot product is (1-w) term cosine + w embedding
        cosine: symmetric, at most 1, and 1 on the diagonal of a row with both halves non-zero."""
        n = min(len(lex), len(dense))
        a, b = _unit_rows(lex[:n]), _unit_rows(dense[:n])
        joined = combine(a, b, weight)
        sim = joined @ joined.T
        expected = (1 - weight) * (a @ a.T) + weight * (b @ b.T)
        assert np.allclose(sim, expected, atol=1e-5)
        assert np.allclose(sim, sim.T, atol=1e-6)
        assert float(sim.max()) <= 1 + 1e-5

    @settings(max_examples=40, deadline=None)
    @given(
        dense=st.lists(_rows, min_size=2, max_size=7),
        seed=st.integers(0, 2**16),
        threshold=st.floats(0.1, 0.9),
    )
    def test_grouping_does_not_depend_on_question_order(
        self, dense: list[list[float]], seed: int, threshold: float
    ) -> None:
        """Shuffling the questions permutes the rows but not the partition average linkage finds on them."""
        terms = [["a", "b"] if i % 2 else ["b", "c"] for i in range(len(dense))]
        x = combine(_vectors(terms), _unit_rows(dense) + np.float32(1e-3) * np.arange(len(dense))[:, None])
        perm = np.random.default_rng(seed).permutation(len(dense))
        first = cluster(x, [1.0] * len(x), threshold)
        second = cluster(x[perm], [1.0] * len(x), threshold)
        groups = {frozenset(i for i in range(len(x)) if first[i] == g) for g in set(first)}
        moved = {frozenset(int(perm[i]) for i in range(len(x)) if second[i] == g) for g in set(second)}
        assert groups == moved


class TestAverageLinkage:
    def test_threshold_stops_merging(self) -> None:
        """Close points merge, far ones stay apart; a threshold above every cosine leaves singletons."""
        x = np.array([[1, 0, 0], [0.95, 0.312, 0], [0, 0, 1]], dtype=np.float32)
        assert average_linkage(x, np.ones(3), 0.5).tolist() == [0, 0, 1]
        assert average_linkage(x, np.ones(3), 0.999).tolist() == [0, 1, 2]

    def test_average_not_single_linkage(self) -> None:
        """A chain a~b~c with a and c unlike is not one group under average linkage at a high threshold."""
        a, c = np.array([1.0, 0.0]), np.array([0.0, 1.0])
        b = (a + c) / np.linalg.norm(a + c)
        x = np.array([a, b, c], dtype=np.float32)
        labels = average_linkage(x, np.ones(3), 0.6).tolist()
        assert len(set(labels)) == 2  # b joins one side (cos 0.707); the pair's average to the other is 0.35

    def test_weights_count(self) -> None:
        """A heavy item pulls its group's average: the weighted Lance-Williams update."""
        x = np.array([[1, 0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
        light = average_linkage(x, np.array([1.0, 1.0, 1.0]), 0.5).tolist()
        heavy = average_linkage(x, np.array([1.0, 9.0, 1.0]), 0.5).tolist()
        assert light == [0, 0, 1] and heavy == [0, 0, 0]  # {0, 1} to 2: (0 + 0.6) / 2 against (0 + 9 * 0.6) / 10

    @settings(max_examples=30)
    @given(st.lists(st.integers(0, 5), min_size=2, max_size=25), st.randoms(use_true_random=False))
    def test_order_does_not_matter(self, topics: list[int], rng: object) -> None:
        """Shuffling the items gives the same partition (as sets of items)."""
        base = np.eye(6, dtype=np.float32)
        noise = np.random.default_rng(len(topics)).normal(0, 0.05, size=(len(topics), 6)).astype(np.float32)
        x = base[topics] + noise
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        order = list(range(len(topics)))
        rng.shuffle(order)  # type: ignore[attr-defined]

        def partition(labels: list[int], ids: list[int]) -> set[frozenset[int]]:
            groups: dict[int, set[int]] = {}
            for label, i in zip(labels, ids, strict=True):
                groups.setdefault(label, set()).add(i)
            return {frozenset(g) for g in groups.values()}

        first = partition(cluster(x, [1.0] * len(x), 0.5), list(range(len(x))))
        second = partition(cluster(x[order], [1.0] * len(x), 0.5), order)
        assert first == second
        assert first == partition(topics, list(range(len(x))))  # and it finds the planted topics


def _units(rows: list[list[float]]) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _partition(labels: list[int], ids: list[int] | None = None) -> set[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for label, i in zip(labels, ids if ids is not None else range(len(labels)), strict=True):
        groups.setdefault(label, set()).add(i)
    return {frozenset(g) for g in groups.values()}


def _with_cosine(c: float, axis: int, spare: int) -> list[float]:
    """A unit row whose cosine to the unit vector ``axis`` is ``c`` (the rest on the ``spare`` axis)."""
    row = [0.0] * 6
    row[axis], row[spare] = c, (1 - c * c) ** 0.5
    return row


class TestAttachLone:
    """A question that merged with nothing joins the topic it is clearly nearest to (#34: on main such a paraphrase,
    "a paper copy of the board" beside "print my task list", stayed a topic of its own below the threshold)."""

    def test_a_lone_paraphrase_joins_its_clearly_nearest_topic(self) -> None:
        """Two near-identical rows make a topic at 0.4; a third, 0.3 from both and 0.05 from the other topic, joins
        it with attach and stays alone without (the old behaviour)."""
        x = _units([[1, 0.05, 0, 0, 0, 0], [1, -0.05, 0, 0, 0, 0], _with_cosine(0.3, 0, 4), [0.05, 0, 1, 0, 0, 0]])
        plain = cluster(x, [1.0] * 4, 0.4)
        assert _partition(plain) == {frozenset({0, 1}), frozenset({2}), frozenset({3})}
        attached = cluster(x, [1.0] * 4, 0.4, attach=(ATTACH_FLOOR, ATTACH_MARGIN))
        assert _partition(attached) == {frozenset({0, 1, 2}), frozenset({3})}

    def test_below_the_floor_or_between_two_topics_it_stays_alone(self) -> None:
        """0.15 from its nearest topic (under the 0.2 floor), or 0.3 from one topic and 0.25 from another (under
        the 0.1 margin): it stays a topic of its own."""
        far = _units([[1, 0.05, 0, 0, 0, 0], [1, -0.05, 0, 0, 0, 0], _with_cosine(0.15, 0, 4)])
        assert _partition(cluster(far, [1.0] * 3, 0.4, attach=(0.2, 0.1))) == {frozenset({0, 1}), frozenset({2})}
        between = np.zeros((5, 6), dtype=np.float32)
        between[0], between[1] = _units([[1, 0.02, 0, 0, 0, 0], [1, -0.02, 0, 0, 0, 0]])
        between[2], between[3] = _units([[0, 0, 1, 0.02, 0, 0], [0, 0, 1, -0.02, 0, 0]])
        v = np.array([0.3, 0.0, 0.25, 0.0, 0.0, 0.0])
        v[5] = (1 - v @ v) ** 0.5
        between[4] = v
        labels = cluster(between, [1.0] * 5, 0.4, attach=(0.2, 0.1))
        assert frozenset({4}) in _partition(labels)

    def test_two_lone_questions_that_choose_each_other_become_one_topic(self) -> None:
        """Two lone rows 0.3 alike, far from everything else, are one topic (each chose the other)."""
        x = _units([_with_cosine(0.3, 0, 1), [1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]])
        assert _partition(attach_lone(x, np.ones(3), np.array([0, 1, 2]))) == {frozenset({0, 1}), frozenset({2})}

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.integers(0, 4), min_size=2, max_size=20),
        st.floats(0.0, 0.3),
        st.integers(0, 2**16),
        st.randoms(use_true_random=False),
    )
    def test_only_lone_items_move_and_order_does_not_matter(
        self, topics: list[int], spread: float, seed: int, rng: object
    ) -> None:
        """Whatever the vectors: every group average linkage made stays whole (attaching only adds lone items
        to groups or pairs lone items), each lone item that joined a group was at least the floor near it and the
        margin nearer than to any other, and shuffling the items gives the same partition."""
        noise = np.random.default_rng(seed).normal(0, spread, size=(len(topics), 6))
        x = _units((np.eye(6)[topics] + noise).tolist())
        w = np.ones(len(x))
        plain = average_linkage(x, w, 0.5)
        attached = attach_lone(x, w, plain, 0.2, 0.1)
        before, after = _partition(plain.tolist()), _partition(attached.tolist())
        for group in before:
            if len(group) > 1:
                assert any(group <= g for g in after)
        for group in after:
            assert sum(len(g) > 1 for g in before if g <= group) <= 1  # never two old topics joined
        lone = [i for g in before if len(g) == 1 for i in g]
        for group in after - before:  # grown: some lone item in it chose a group of the old partition inside it
            chose = False
            for i in (i for i in lone if i in group):
                near = {g: float(np.mean([x[i] @ x[j] for j in g])) for g in before if i not in g}
                ranked = [*sorted(near.values(), reverse=True), -9.0]
                target = max(near, key=lambda g: (near[g], -min(g)))
                ok = ranked[0] >= 0.2 - 1e-5 and ranked[0] - ranked[1] >= 0.1 - 1e-5
                chose = chose or (ok and target <= group)
            assert chose
        order = list(range(len(x)))
        rng.shuffle(order)  # type: ignore[attr-defined]
        shuffled = cluster(x[order], [1.0] * len(x), 0.5, attach=(0.2, 0.1))
        assert _partition(shuffled, order) == _partition(cluster(x, [1.0] * len(x), 0.5, attach=(0.2, 0.1)))


class TestScale:
    def test_leader_pass_finds_the_same_topics(self) -> None:
        """Past max_items, the first pass plus average linkage on its groups finds the planted topics."""
        rng = np.random.default_rng(0)
        centres = np.eye(40, dtype=np.float32)
        topics = rng.integers(0, 40, size=2_000)
        x = centres[topics] + rng.normal(0, 0.03, size=(2_000, 40)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        labels = cluster(x, [1.0] * len(x), 0.5, max_items=200)
        pairs = {(int(t), int(lab)) for t, lab in zip(topics, labels, strict=True)}
        assert len(pairs) == len(set(topics.tolist())) == len(set(labels))


class TestNeighbourhood:
    def test_shared_specific_chunks_add_their_cosine(self) -> None:
        """Joined vectors' dot product is the term cosine plus the weight times the neighbourhood cosine."""
        from ragloop.gaps import neighbourhood_vectors, with_neighbourhood

        hits = [{"c1": 0.9, "c2": 0.5}, {"c1": 0.9, "c2": 0.5}, {"c3": 0.9}]
        df = {"c1": 2, "c2": 2, "c3": 1}
        nb = neighbourhood_vectors(hits, df, 50)
        assert float(nb[0] @ nb[2]) == 0.0  # nothing shared, nothing added
        lex = np.zeros((3, 1), dtype=np.float32)
        joined = with_neighbourhood(lex, nb, 0.25)
        assert abs(float(joined[0] @ joined[1]) - 0.25 * float(nb[0] @ nb[1])) < 1e-6
        assert float(nb[0] @ nb[1]) > 0.5

    def test_chunks_every_search_hits_add_almost_nothing(self) -> None:
        """Two neighbourhoods made only of chunks every turn hits are nearly orthogonal after scaling."""
        from ragloop.gaps import neighbourhood_vectors

        hits = [{"generic": 0.8, "start": 0.6}, {"generic": 0.8, "start": 0.6}]
        nb = neighbourhood_vectors(hits, {"generic": 100, "start": 100}, 100)
        assert float(nb[0] @ nb[1]) < 0.05

    @settings(max_examples=50, deadline=None)
    @given(
        st.lists(st.dictionaries(st.sampled_from("abcdefg"), st.floats(0.0, 1.0), max_size=4), min_size=1, max_size=8),
        st.integers(1, 200),
    )
    def test_rows_are_at_most_unit(self, hits: list[dict[str, float]], total: int) -> None:
        """Every row has norm <= 1 (specificity <= 1), so the added cosine never exceeds the weight."""
        from ragloop.gaps import neighbourhood_vectors

        df = {c: 1 for c in "abcdefg"}
        nb = neighbourhood_vectors(hits, df, total)
        assert (np.linalg.norm(nb, axis=1) <= 1.0 + 1e-5).all()
