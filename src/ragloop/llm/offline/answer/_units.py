"""What an extractive answer can quote from a block: sentences and list items, table rows with their header,
and fenced code blocks with their indentation — each with the heading it sits under.

A definition's term (an API reference's ``<dt>``, which ingest writes as a one-line paragraph of its own:
``secrets.token_urlsafe([nbytes=None])``, ``class csv.DictReader(f, …)``, ``d | other``) is never quoted alone:
it opens the first sentence of the description under it ("`secrets.token_urlsafe([nbytes=None])`: Return a
random URL-safe text string …"), so a reply that quotes the description names the API it describes."""

from __future__ import annotations

import re
from typing import Literal

from attrs import frozen

__all__ = [
    "MAX_TERM_CHARS",
    "Unit",
    "answers_how",
    "block_units",
    "defines",
    "definition_term",
    "is_block_unit",
    "split_sentences",
]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n|\n(?=\s*(?:[-*+]\s|\d+\.\s|#))")
#: Where a paragraph, a list item or a heading ends (inside one, sentences end at terminal punctuation).
_PART_END = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*+]\s|\d{1,3}[.)]\s|#))")
_STOP = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[*`]?[A-Z0-9])")
_HEADING_LINE = re.compile(r"(?m)^(#{1,6}\s[^\n]*)\n(?!\n)")
#: A fenced code block, or two or more table rows (``| a | b |``), each kept whole.
_ATOMIC = re.compile(r"(?ms)^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$|(?:^[ \t]*\|[^\n]*\|[ \t]*(?:\n|\Z)){2,}")
_HEADING = re.compile(r"^\s*#{1,6}\s+(.*?)\s*(?:\{\s*#[\w-]*\s*\})?\s*$")
_LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_SEPARATOR = re.compile(r"[\s|:-]+")
_QUOTE_MARK = re.compile(r"^(?:>\s*)+")
_KINDS = "class|exception|async|await|abstractmethod|classmethod|staticmethod|coroutine|method|function|attribute"
_KEYWORDS = rf"(?:(?:{_KINDS}|property|data)\s+)*"
#: A signature: a (dotted) name and its parameters ("random.sample(population, k, *, counts=None)"), maybe
#: after a kind word and before a return annotation; or a dotted name alone, after a kind word or not (an
#: attribute's term: "PurePath.stem", "csv.QUOTE_ALL").
_SIGNATURE = re.compile(
    rf"^{_KEYWORDS}(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:\[[^\]]*\])?\(.*\)(?:\s*->\s*\S.*)?$"
    rf"|^(?:class|exception|attribute|data)\s+[A-Za-z_][\w.]*$|^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$"
)
#: What ends a dotted word that names a file or a host, not an attribute ("setup.py", "example.com").
_NOT_ATTRIBUTES = frozenset((
    "com", "org", "net", "io", "dev", "edu", "gov", "html", "htm", "md", "rst", "txt", "py", "pyc", "json", "csv",
    "toml", "yaml", "yml", "ini", "cfg", "xml", "pdf", "zip", "gz", "tar", "js", "ts", "css", "png", "jpg", "svg",
    "exe", "sh",
))  # fmt: skip
#: An operator form of a definition list ("d | other", "key in d", "del d[key]", "s * n"): short, code only.
_OPERAND = r"[A-Za-z_]\w{0,11}(?:\[\w+\])?"
_OPERATOR = re.compile(
    rf"^(?:del\s+)?{_OPERAND}(?:\s+(?:not\s+in|in|is|[|&^+*/%<>=!~-]{{1,3}})\s+{_OPERAND})*(?:\s*=\s*\w{{1,12}})?$"
)
#: The longest definition term joined to its description (a longer line is prose, not a signature).
MAX_TERM_CHARS = 300

Kind = Literal["sentence", "item", "row", "code"]


@frozen
class Unit:
    """One quotable piece of a block.

    Attributes:
        block: The block's number.
        position: Its order in the block.
        kind: ``sentence``, ``item`` (a list item), ``row`` (a table row) or ``code`` (a fenced block).
        text: The text as it is quoted (a row's line, a code block's lines as written).
        heading: The heading it sits under in the block (``""`` before any heading).
        header: A row's table header line.
        table: A row's table, counted within the block (rows of one table are quoted under one header).
        term: The definition term whose description the unit belongs to (its first sentence opens with the term
            itself; a later one, "This method is useful for monetary applications", is quoted after it).
    """

    block: int
    position: int
    kind: Kind
    text: str
    heading: str = ""
    header: str = ""
    table: int = -1
    term: str = ""


def is_block_unit(sentence: str) -> bool:
    """True for a unit :func:`split_sentences` kept whole (a code block or a table)."""
    return "\n" in sentence


def split_sentences(text: str, *, headings: bool = True) -> list[str]:
    """Sentences (and list items, headings unless ``headings=False``) of ``text``, whitespace-collapsed,
    empty ones dropped. A fenced code block or a markdown table is one unit, kept line by line as written
    (flattened, a table or code loses its meaning)."""
    out = []
    start = 0
    for m in _ATOMIC.finditer(text):
        out += _prose_sentences(text[start : m.start()], headings)
        unit = "\n".join(line.rstrip() for line in m.group(0).strip("\n").splitlines())
        if unit.strip():
            out.append(unit)
        start = m.end()
    return out + _prose_sentences(text[start:], headings)


def _prose_sentences(text: str, headings: bool) -> list[str]:
    out = []
    text = _HEADING_LINE.sub(r"\1\n\n", text)  # a heading line is its own part even without a blank line
    for part in _SENTENCE_END.split(text):
        if not headings and part.lstrip().startswith("#"):
            continue
        sentence = " ".join(part.split()).lstrip("#*->+ ").strip()
        if sentence:
            out.append(sentence)
    return out


def definition_term(part: str) -> str:
    """The definition term a paragraph is (a signature or an operator form on one line, see the module
    docstring), backticks removed; ``""`` for any other paragraph."""
    line = part.strip().replace("`", "").strip()
    if not line or "\n" in line or len(line) > MAX_TERM_CHARS or line[-1] in ".:;,!?":
        return ""
    if _SIGNATURE.match(line) and line.rsplit(".", 1)[-1].lower() not in _NOT_ATTRIBUTES:
        return line
    # an operator form needs an operator and a one-letter lower-case operand: "d | other", "key in d"
    words = [w for w in re.split(r"[\s\[\]]+", line) if w.isalnum()]
    if _OPERATOR.match(line) and len(line.split()) > 1 and any(len(w) == 1 and w.islower() for w in words):
        return line
    return ""


def _prose_units(units: list[Unit], block: int, piece: str, heading: str, under: str = "") -> tuple[str, str]:
    """Append the sentences and list items of a prose piece to ``units``; the heading in force after it, and the
    definition term whose description goes on (``under``: a description may go on past a code block)."""
    piece = _HEADING_LINE.sub(r"\1\n\n", piece)
    terms: list[str] = []  # definition terms waiting for the description under them

    def flush() -> None:  # a term with no description under it is quoted as it stands
        units.extend(Unit(block, len(units), "sentence", term, heading) for term in terms)
        terms.clear()

    for part in _PART_END.split(piece):
        if not part.strip():
            continue
        head = _HEADING.match(part)
        if head is not None and part.lstrip().startswith("#"):
            flush()
            heading, under = " ".join(head.group(1).split()), ""
            continue
        item = _LIST_MARK.match(part) is not None
        term = "" if item else definition_term(part)
        if term:
            terms.append(term)
            continue
        body = " ".join(_LIST_MARK.sub("", _QUOTE_MARK.sub("", part.strip())).split())
        for sentence in filter(None, (s.strip() for s in _STOP.split(body))):
            if terms:
                under = ", ".join(terms)
                sentence = f"{', '.join(f'`{t}`' for t in terms)}: {sentence}"
                terms.clear()
            units.append(Unit(block, len(units), "item" if item else "sentence", sentence, heading, term=under))
    flush()
    return heading, under


#: A question asking for the means to do something ("How do I …", "how to …", "Which function …"): on an API
#: reference the answer is an API, so a definition's opening sentence answers it.
_HOW = re.compile(
    r"^\W*(?:how\s+(?:do|can|could|should|would|shall)\s+(?:i|you|we|one)\b|how\s+to\b"
    r"|(?:which|what)\s+(?:\w+\s+)?(?:function|method|class|module|call|api|option|parameter|argument)s?\b)",
    re.IGNORECASE,
)


def defines(unit: Unit) -> bool:
    """Whether ``unit`` opens a definition: a term joined to its first description sentence."""
    return unit.kind in ("sentence", "item") and unit.text.startswith("`") and "`: " in unit.text


def answers_how(question: str, unit: Unit) -> bool:
    """Whether ``unit`` opens a definition and ``question`` asks for the means to do something (see ``_HOW``):
    the answerer then adds its near bonus, as for a value beside the question's terms (the row a question's head
    term labels gets the asked bonus); the abstention takes it off again, since it picks the API but is no
    evidence that the pages cover the question."""
    return defines(unit) and _HOW.match(question) is not None


def block_units(block: int, text: str) -> list[Unit]:
    """Every quotable unit of a block's text, in reading order (headings are context, never units); a
    definition's term opens the first sentence of its description (see the module docstring)."""
    units: list[Unit] = []
    heading, under = "", ""
    tables = 0
    start = 0
    for m in _ATOMIC.finditer(text):
        heading, under = _prose_units(units, block, text[start : m.start()], heading, under)
        start = m.end()
        lines = [line.rstrip() for line in m.group(0).strip("\n").splitlines()]
        if lines[0].lstrip().startswith("```"):
            units.append(Unit(block, len(units), "code", "\n".join(lines), heading))
            continue
        rows = [line.strip() for line in lines]
        header = ""
        if len(rows) >= 2 and _SEPARATOR.fullmatch(rows[1]):
            header, rows = rows[0], rows[2:]
        for row in rows:
            if not _SEPARATOR.fullmatch(row):
                units.append(Unit(block, len(units), "row", row, heading, header, tables))
        tables += 1
    _prose_units(units, block, text[start:], heading, under)
    return units
