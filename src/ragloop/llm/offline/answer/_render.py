"""How the chosen units read as a reply: prose with ``[n]`` after each sentence, a table's rows under their
header, code on its own lines, and a sentence that opens without a subject after the subject its block names."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ragloop.llm.offline.answer._choose import Asked, Scored, has_asked_for, stems_of
from ragloop.llm.offline.answer._units import Unit, block_units
from ragloop.state import ContextBlock

__all__ = ["MAX_INTRODUCED_LINES", "introduces", "lead_in", "render", "row_sentence", "with_introduced"]

#: An opening word that refers back to a subject the sentence does not name ("It returns …", "They are …").
_SUBJECTLESS = re.compile(r"^(?:It|Its|It's|This|That|These|Those|They|Their|Them|He|She|His|Her)\b|^[a-z]")
_ANCHOR = re.compile(r"\s*\{\s*#[\w-]*\s*\}\s*$")
#: What a definition term holds besides its name: kind words before it, its parameters and annotation after it.
_NAME = re.compile(
    r"^(?:(?:class|exception|async|classmethod|staticmethod|abstractmethod|method|function|attribute)\s+)*"
    r"|[(\[].*$"
)


#: An API named in a sentence: inline code ("The `quantize()` method rounds a number …").
_CODE_SPAN = re.compile(r"`[^`\n]{1,80}`")


def _named_before(unit: Unit, block: ContextBlock) -> str:
    """The API the sentence before ``unit`` names (its first inline code), when that sentence is prose of the
    same block: "This method is useful for monetary applications" is about the `quantize()` named before it."""
    if unit.position == 0:
        return ""
    before = block_units(block.n, block.text)
    prev = before[unit.position - 1] if unit.position - 1 < len(before) else None
    if prev is None or prev.kind not in ("sentence", "item") or prev.heading != unit.heading:
        return ""
    found = _CODE_SPAN.search(prev.text)
    return found.group(0) if found else ""


def _subject(block: ContextBlock, unit: Unit) -> str:
    """What a unit's block is about: the heading it sits under, else the page title (anchors removed)."""
    return _ANCHOR.sub("", unit.heading or block.title).strip()


def render(picked: Sequence[Scored], by_n: Mapping[int, ContextBlock]) -> str:
    """The quoted units as reply text: prose with ``[n]`` after each sentence, a table's rows under their
    header (one table once, its citation on the line after it), code blocks on their own lines."""
    pieces: list[str | list[Unit]] = []  # text, or the rows of one table
    tables: dict[tuple[int, int], list[Unit]] = {}
    previous: Unit | None = None
    fact = _fact_first(picked)
    if fact:
        pieces.append(fact)
    for i, s in enumerate(picked):
        u = s.unit
        if u.kind == "row":
            if (u.block, u.table) not in tables:
                tables[(u.block, u.table)] = []
                pieces.append(tables[(u.block, u.table)])
            tables[(u.block, u.table)].append(u)
        elif u.kind == "code":
            pieces.append(f"\n\n{u.text}\n\n[{u.block}]\n\n")
        else:
            continues = previous is not None and previous.block == u.block and u.position == previous.position + 1
            text = u.text if continues else _with_subject(u, by_n[u.block], s.lead_in)
            introduces = i + 1 < len(picked) and _introduced(u, picked[i + 1].unit)
            pieces.append(f"{text}" if introduces else f"{text} [{u.block}] ")
        previous = u
    text = "".join(piece if isinstance(piece, str) else _table(piece) for piece in pieces)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


#: Header cells that name no column of their own ("Value", "What it does"): the row reads "Logo: PNG or SVG, …".
_GENERIC_HEADER = frozenset(
    ("value", "values", "what it does", "meaning", "description", "notes", "note", "details", "detail", "")
)
_EMPTY_CELL = frozenset(("", "—", "-", "–", "n/a"))
#: Most of a leading table's rows stated as one fact sentence (a comparison's sides); more is a table question.
MAX_FACT_ROWS = 3
#: Most cells of one row a fact sentence states when the header does not say which column was asked about.
MAX_FACT_CELLS = 3


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _lower_first(text: str) -> str:
    """A header as it reads mid-sentence: "Billed monthly" → "billed monthly"; a one-word header ("Team", a
    name) and an acronym ("SLA") keep their case."""
    first = text.split(" ", 1)[0]
    if " " in text and first[:1].isupper() and not first.isupper() and not any(c.isdigit() for c in first):
        return first.lower() + text[len(first) :]
    return text


def row_sentence(unit: Unit, wanted: frozenset[str]) -> str:
    """One plain sentence stating what a table row says, its label first ("Team, billed monthly: $11 per seat /
    month"): the columns whose header holds a term of ``wanted`` (the question's terms the row covers), else the
    row's first few filled cells; a column whose header names nothing ("Value", "What it does") is stated
    without it. ``""`` when the row has no header or no filled cell besides its label."""
    cells = _cells(unit.text)
    heads = _cells(unit.header) if unit.header else []
    if len(cells) < 2 or len(heads) != len(cells) or not cells[0] or cells[0] in _EMPTY_CELL:
        return ""
    filled = [j for j in range(1, len(cells)) if cells[j].casefold() not in _EMPTY_CELL]
    overlap = {j: len(stems_of(heads[j]) & wanted) for j in filled}
    best = max(overlap.values(), default=0)  # "billed monthly" names one column, not every "billed" one
    columns = [j for j in filled if best and overlap[j] == best] or filled[:MAX_FACT_CELLS]
    if not columns:
        return ""
    parts = []
    for j in columns:
        value = cells[j].rstrip(".")
        head = heads[j]
        parts.append(value if head.casefold() in _GENERIC_HEADER else f"{_lower_first(head)}: {value}")
    sep = ": " if heads[columns[0]].casefold() in _GENERIC_HEADER else ", "
    return f"{cells[0]}{sep}{'; '.join(parts)}"


def _fact_first(picked: Sequence[Scored]) -> str:
    """The sentence a reply that would open with a table opens with instead: what its leading rows say, cited
    ("Team, billed monthly: $11 per seat / month. [1]"); ``""`` when the reply opens with prose or code, or with
    more rows of one table than a sentence can state (a question asked across the rows reads the table)."""
    if not picked or picked[0].unit.kind != "row":
        return ""
    first = picked[0].unit
    rows = [s for s in picked if s.unit.kind == "row" and (s.unit.block, s.unit.table) == (first.block, first.table)]
    if len(rows) > MAX_FACT_ROWS:
        return ""
    said = [row_sentence(s.unit, s.covered) for s in rows]
    if not all(said):
        return ""
    return f"{'; '.join(said)}. [{first.block}]"


def _table(rows: Sequence[Unit]) -> str:
    """Rows of one table under its header line, the citation on the line after it."""
    header = rows[0].header
    head = [header, "|" + "---|" * (header.count("|") - 1)] if header else []
    return "\n\n" + "\n".join([*head, *(r.text for r in rows)]) + f"\n\n[{rows[0].block}]\n\n"


def _with_subject(unit: Unit, block: ContextBlock, lead_in: str) -> str:
    """A sentence after the subject it leaves to its context: the heading that holds the value asked for
    ("v3.2.0 — 23 July 2024: **Passkeys** can be registered …"), or, for one that opens without a subject of
    its own ("It is …"), the heading or page title its block names."""
    text = unit.text
    if lead_in:
        return f"{lead_in}: {text}"
    if unit.term and _NAME.sub("", unit.term).split(".")[-1].casefold() not in text.casefold():
        return f"`{unit.term}`: {text}"  # a later sentence of a definition, after the API it describes
    if not _SUBJECTLESS.match(text):
        return text
    subject = _named_before(unit, block) or _subject(block, unit)
    if not subject:
        return text
    # A title "<source>: <what>" (a database row: "sql: orders id ORD-1042") over a text that opens with <what>
    # names its subject already; the source's name is the turn's own word, never the reader's.
    if text.casefold().startswith(subject.rsplit(": ", 1)[-1].casefold()):
        return text
    first = text.split(" ", 1)[0]
    lowered = first.lower() if first[:1].isupper() and not first.isupper() else first
    return f"{subject}: {lowered}{text[len(first) :]}"


def lead_in(unit: Unit, asked: Asked | None, question_words: set[str]) -> str:
    """The heading a prose unit is quoted after when only the heading holds the value asked for."""
    if asked is None or unit.kind not in ("sentence", "item") or not unit.heading:
        return ""
    if has_asked_for(asked, unit.text, question_words) or not has_asked_for(asked, unit.heading, question_words):
        return ""
    return _ANCHOR.sub("", unit.heading).strip()


#: A code block a sentence ending in a colon introduces is quoted with it when it has at most this many lines.
MAX_INTRODUCED_LINES = 20


def _introduced(unit: Unit, nxt: Unit) -> bool:
    """``nxt`` is the code block that ``unit`` (a sentence ending in a colon) introduces."""
    return (
        unit.kind in ("sentence", "item")
        and unit.text.rstrip().endswith(":")
        and nxt.kind == "code"
        and nxt.block == unit.block
        and nxt.position == unit.position + 1
    )


def introduces(unit: Unit, block: Sequence[Unit]) -> Unit | None:
    """The short code block right after ``unit`` in its block when ``unit`` introduces it (ends in a colon)."""
    nxt = block[unit.position + 1] if unit.position + 1 < len(block) else None
    if nxt is None or not _introduced(unit, nxt) or nxt.text.count("\n") >= MAX_INTRODUCED_LINES:
        return None
    return nxt


def with_introduced(chosen: list[Scored], units: Mapping[int, Sequence[Unit]]) -> list[Scored]:
    """``chosen`` with the short code block right after each chosen sentence that ends in a colon
    ("… specify the version with:" and the block that shows it); a block chosen on its own further down moves
    up beside the sentence that introduces it."""
    out: list[Scored] = []
    by_key = {(s.unit.block, s.unit.position): s for s in chosen}
    placed: set[tuple[int, int]] = set()
    for s in chosen:
        key = (s.unit.block, s.unit.position)
        if key in placed:
            continue
        out.append(s)
        placed.add(key)
        nxt = introduces(s.unit, units.get(s.unit.block, ()))
        if nxt is not None and (nxt.block, nxt.position) not in placed:
            out.append(
                by_key.get((nxt.block, nxt.position))
                or Scored(nxt, stems_of(nxt.text), frozenset(), 0.0, frozenset(), "")
            )
            placed.add((nxt.block, nxt.position))
    return out
