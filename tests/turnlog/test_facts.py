"""The writer's passage checks: question terms no passage mentions, and values cited pages disagree on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.text.terms import key_terms
from ragloop.turnlog import conflicts, facts, unfound_terms


def _stems(question: str) -> set[str]:
    return {t.stem for t in key_terms(question)}


class TestUnfoundTerms:
    def test_terms_no_passage_mentions(self) -> None:
        """Only the question's key terms that appear in no passage (by stem) are unfound."""
        texts = ["Lumen connects to Slack and GitHub.", "Integrations live under Settings."]
        assert unfound_terms("Does Lumen integrate with Zapier?", texts) == ("zapier",)  # integrate ~ integrations
        assert unfound_terms("Which integrations exist?", texts) == ("exist",)

    def test_no_passages_every_term_unfound(self) -> None:
        """Without passages every key term is unfound; stopwords never are."""
        assert unfound_terms("How do I export a Gantt chart?", []) == ("export", "gantt", "chart")


class TestFacts:
    def test_number_and_the_words_it_counts(self) -> None:
        """A number followed by words states a value for its first content word (markup ignored)."""
        found = facts("A workspace can have up to **20 webhook endpoints** and $19 per seat.")
        assert found == {"webhook": {"20"}, "seat|$": {"$19"}}

    def test_thousands_and_units(self) -> None:
        """Thousands separators go, units stay."""
        assert facts("1,000 requests per minute, 10 GB storage")["request"] == {"1000"}
        assert facts("10 GB storage")["storag|gb"] == {"10gb"}

    def test_only_sentences_about_the_question(self) -> None:
        """With question terms, a fact counts only in a sentence holding two of them."""
        text = "Plans start at 20 seats. A workspace can have 20 webhook endpoints."
        stems = _stems("How many webhook endpoints can a workspace have?")
        assert facts(text, stems) == {"webhook": {"20"}}


class TestConflicts:
    def test_disjoint_values_on_a_question_term(self) -> None:
        """Two pages stating different limits for a term of the question conflict, once per statement."""
        question = "How many webhook endpoints can a workspace have?"
        passages = [
            ("webhooks.md", "A workspace can have up to 20 webhook endpoints."),
            ("webhooks-v1.md", "Each workspace may register 50 webhook endpoints."),
        ]
        [c] = conflicts(_stems(question), passages)
        assert c.term == "webhook"
        assert c.values == (("webhooks-v1.md", ("50",)), ("webhooks.md", ("20",)))

    def test_shared_value_is_no_conflict(self) -> None:
        """Pages that share a value for the term (a table listing several plans) do not conflict."""
        passages = [
            ("a.md", "Free: 60 requests per minute; Team: 300 requests per minute."),
            ("b.md", "300 requests per minute"),
        ]
        assert conflicts(_stems("How many requests per minute?"), passages) == ()

    def test_terms_outside_the_question_are_ignored(self) -> None:
        """Values for words the question does not ask about never count."""
        passages = [("a.md", "Keeps 30 days of history."), ("b.md", "Keeps 90 days of history.")]
        assert conflicts(_stems("How many webhook endpoints?"), passages) == ()
        assert len(conflicts(_stems("How many days of history are kept?"), passages)) == 1

    @given(
        st.lists(st.tuples(st.sampled_from(["a.md", "b.md", "c.md"]), st.sampled_from(["5", "20", "50"])), max_size=6)
    )
    def test_order_does_not_matter(self, stated: list[tuple[str, str]]) -> None:
        """The conflicts found do not depend on the order of the passages."""
        passages = [(s, f"up to {v} webhook endpoints") for s, v in stated]
        terms = _stems("webhook endpoints")
        assert conflicts(terms, passages) == conflicts(terms, list(reversed(passages)))
        for c in conflicts(terms, passages):
            assert c.term in terms and len(c.values) >= 2


class TestKinds:
    def test_values_of_different_kinds_never_conflict(self) -> None:
        """20 team members and 100 GB of team storage are not two answers to one question."""
        passages = [("plans.md", "up to 20 team members"), ("import.md", "files up to 100 GB team storage")]
        assert conflicts(_stems("How do I move my team?"), passages) == ()
        prices = [("a.md", "A seat costs $19 per seat"), ("b.md", "Each seat costs $23 per seat")]
        [c] = conflicts(_stems("What does a seat cost?"), prices)
        assert c.term == "seat" and c.values == (("a.md", ("$19",)), ("b.md", ("$23",)))
