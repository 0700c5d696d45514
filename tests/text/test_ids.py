"""Tests for ragloop.text.ids: identifier extraction and the exact-id rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.text.ids import extract_ids, id_matches, ids_conflict, normalise_id
from tests.strategies import error_numbers, ticket_numbers, versions


class TestExtractIds:
    def test_tickets(self) -> None:
        """'#1234', 'ticket 1234' and 'issue #77' are tickets in '#n' form."""
        assert extract_ids("ticket 1234, issue #77 and #5")["ticket"] == {"#1234", "#77", "#5"}

    def test_errors(self) -> None:
        """E-codes, ERR_ constants and 'error 404' are error codes."""
        ids = extract_ids("E1234 then ERR_TIMEOUT, later error code 404 and status 503")
        assert ids["error"] == {"E1234", "ERR_TIMEOUT", "E404", "E503"}

    def test_versions(self) -> None:
        """v-prefixed, three-part and 'version x.y' numbers are versions without the v."""
        assert extract_ids("v2.3 and 1.2.3, version 4.1")["version"] == {"2.3", "1.2.3", "4.1"}

    def test_ipv4_addresses_are_not_versions(self) -> None:
        """A dotted quad up to 255, with or without a CIDR prefix, is an address; four parts past 255, or one said
        to be a version, is a version (#33: "is 10.1.2.3 inside 10.0.0.0/8?" refused every ipaddress page that
        shows another address, as a version conflict)."""
        assert extract_ids("Is 10.1.2.3 inside 10.0.0.0/8? Compare 192.168.0.1.") == {}
        assert extract_ids("4.0.30319.42000, v1.2.3.4 and version 10.1.2.3")["version"] == {
            "4.0.30319.42000", "1.2.3.4", "10.1.2.3",
        }  # fmt: skip
        assert not ids_conflict("Is 10.1.2.3 inside 10.0.0.0/8?", ">>> ip_address('192.168.0.1') in network")

    @given(st.lists(st.integers(min_value=0, max_value=255), min_size=4, max_size=4))
    def test_no_ipv4_address_is_a_version(self, octets: list[int]) -> None:
        """Every dotted quad of octets, in prose or with a prefix length, names no identifier."""
        address = ".".join(map(str, octets))
        assert extract_ids(f"Block {address} and {address}/24 at the firewall") == {}

    def test_not_identifiers(self) -> None:
        """Decimals, URL fragments, HTML entities and lower-case identifiers in prose are not ids."""
        assert extract_ids("p < 0.05, page#12, &#1234; error_handler, e1234") == {}

    def test_a_caller_changing_its_answer_changes_no_later_answer(self) -> None:
        """The answers are memoised per text (issue 35's profile): each call gets a dict of its own."""
        text = "ticket #4242 fails with E0042"
        first = extract_ids(text)
        first["ticket"] = frozenset({"#1"})
        del first["error"]
        assert extract_ids(text) == {"ticket": frozenset({"#4242"}), "error": frozenset({"E0042"})}

    @given(st.text())
    def test_memoised_answers_equal_fresh_ones(self, text: str) -> None:
        """The memoised scan answers exactly what a fresh scan of the same text answers."""
        from ragloop.text.ids import _extract

        assert extract_ids(text) == dict(_extract.__wrapped__(text))

    @given(st.text())
    def test_never_crashes(self, text: str) -> None:
        """Any unicode text yields a mapping of known kinds to non-empty sets."""
        ids = extract_ids(text)
        assert set(ids) <= {"ticket", "error", "version"}
        assert all(values for values in ids.values())


class TestIdsConflict:
    def test_other_ticket_conflicts(self) -> None:
        """A chunk about #1233 conflicts with a question about #1234."""
        assert ids_conflict("status of ticket #1234?", "Ticket #1233: login fails")

    def test_naming_both_or_none_is_not_a_conflict(self) -> None:
        """A chunk naming the wanted id (with others), or no id of that kind, does not conflict."""
        assert not ids_conflict("#1234", "duplicates: #1233, #1234")
        assert not ids_conflict("#1234", "how tickets work")
        assert not ids_conflict("how do tickets work", "#1233")

    def test_kinds_are_independent(self) -> None:
        """A version in the chunk does not conflict with a ticket in the question."""
        assert not ids_conflict("ticket #1234", "fixed in v2.3.1")
        assert ids_conflict("E1234 on v2.3.1", "E1234 was fixed in v2.4.0")

    @given(ticket_numbers, ticket_numbers)
    def test_never_accepts_another_ticket(self, wanted: int, other: int) -> None:
        """For any two different ticket numbers the other one always conflicts, the same one never does."""
        conflict = ids_conflict(f"What happened to ticket #{wanted}?", f"Update on #{other}: resolved")
        assert conflict == (wanted != other)

    @given(error_numbers, error_numbers, versions, versions)
    def test_never_accepts_another_error_or_version(self, e1: int, e2: int, v1: str, v2: str) -> None:
        """Different error codes and different versions always conflict; equal ones never do."""
        assert ids_conflict(f"Why E{e1}?", f"About E{e2}.") == (e1 != e2)
        assert ids_conflict(f"Changes in v{v1}", f"Release {v2} notes") == (v1 != v2)


class TestIdMatches:
    def test_spellings_of_the_same_id(self) -> None:
        """'#1234', '1234', 1234 and 'ticket 1234' are the same ticket; 'v2.3.1' and '2.3.1' the same version."""
        assert id_matches("#1234", 1234)
        assert id_matches("ticket 1234", "#1234")
        assert id_matches("v2.3.1", "2.3.1")
        assert id_matches("e1234", "E1234")
        assert normalise_id(" ERR_X ") == "ERR_X"

    def test_different_ids(self) -> None:
        """Different numbers, or a different number of parts, never match."""
        assert not id_matches("#1234", "#1233")
        assert not id_matches("#1234", "#01234")
        assert not id_matches("2.3", "2.3.0")

    @given(ticket_numbers, ticket_numbers)
    def test_exact_equality(self, a: int, b: int) -> None:
        """Two ticket numbers match exactly when they are equal, in any spelling."""
        assert id_matches(f"#{a}", str(b)) == (a == b)
