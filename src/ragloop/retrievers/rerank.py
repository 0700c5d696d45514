"""A feature-based reranker over the turn's fused ranking: the top of the context is what the answer reads.

No cross-encoder ships inside a PyPI wheel with its weights, so the head of the fused list (its first ``depth``
hits) is reordered by three cheap features of each passage against the question, each a multiplier on the
passage's reciprocal-rank score ``1 / (k + rank)``:

- **title match**: the share of the question's key terms in the passage's title (a question that names an
  entity is answered by that entity's page);
- **term proximity**: the share of the question's key terms the passage holds, times how tightly they sit (the
  shortest token window holding all of them, against twice their number);
- **bridge-entity overlap**: the passage's title names an entity the first passage mentions and the question
  does not (the second hop of a multi-hop question: the film names the actress; her page answers);
- **head-term match**: the question's *head term* — its key term the fewest passages of the head hold, the one
  that tells its topic apart from the generic words around it ("logo" in "How big can the workspace logo file
  be?", where "file" and "big" are in every import page) — in the passage's title or section headings (in
  full) or only in its text (at half): the page about the thing asked wins over one sharing only generic
  terms (:func:`head_term`); for short questions only (``head_max_terms``), and off unless ``head_weight`` is set
  (measured neutral, see :class:`RerankSettings`).

Pure and deterministic (ties keep the fused order). ``title_weight``, ``proximity_weight`` and
``bridge_weight`` (0.5 each) and ``depth=20`` were chosen on the tuning half of HotpotQA dev200
(``benchmarks/bench_quality.py --half tuning``: recall@2 0.630 → 0.670, recall@5 0.795 → 0.835 over the same
searches); the protected passages of the question's own search stay within the first ``protect_depth`` places.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

from attrs import field, frozen, validators

from ragloop.state import Hit
from ragloop.text.terms import key_terms, stem, tokenize

__all__ = ["RerankSettings", "bridge_names", "head_term", "proximity", "rerank"]

_ENTITY = re.compile(r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|and|de|von|van|la|du)\s+)?[A-Z][\w'’.-]*){0,4}")


@frozen
class RerankSettings:
    """The reranker's knobs (see the module docstring).

    Attributes:
        depth: How many of the fused list's first hits are reordered.
        k: The reciprocal-rank constant of the base score.
        title_weight: Weight of the title match.
        proximity_weight: Weight of term proximity.
        bridge_weight: Weight of a title naming the first passage's bridge entity.
        protect_depth: Protected hits (the question's own best) stay within this many first places.
        head_weight: Weight of the head-term match; 0 (the default) turns it off. At 0.5 it left every tuning
            half of ``bench_answers.py`` unchanged (sample, sample2, FastAPI, HotpotQA gated to short questions),
            so it is opt-in until a set shows it earns its keep.
        head_max_terms: The head-term match applies to short questions only, of at most this many key terms
            (a short factual question has one topic; a long multi-hop one has several, and on the HotpotQA
            tuning half the feature cost a point of answer recall when applied to every question).
    """

    depth: int = field(default=20, validator=validators.ge(0))
    k: float = field(default=10.0, validator=validators.ge(0))
    title_weight: float = field(default=0.5, validator=validators.ge(0))
    proximity_weight: float = field(default=0.5, validator=validators.ge(0))
    bridge_weight: float = field(default=0.5, validator=validators.ge(0))
    protect_depth: int = field(default=10, validator=validators.ge(0))
    head_weight: float = field(default=0.0, validator=validators.ge(0))
    head_max_terms: int = field(default=5, validator=validators.ge(0))


def proximity(text: str, terms: Collection[str]) -> float:
    """The share of ``terms`` (stems) in ``text``, times how tightly they sit: ``2 n / window`` capped at 1,
    where ``window`` is the shortest run of tokens holding every one of the ``n`` present terms (0 with fewer
    than two present)."""
    if not terms:
        return 0.0
    tokens = [stem(t) for t in tokenize(text)]
    at = [(i, t) for i, t in enumerate(tokens) if t in terms]
    present = {t for _, t in at}
    if len(present) < 2:
        return 0.0  # one term has no window; its coverage is the title's and the fused score's to judge
    best = len(tokens)
    counts: Counter[str] = Counter()
    have = left = 0
    for right in range(len(at)):
        counts[at[right][1]] += 1
        have += counts[at[right][1]] == 1
        while have == len(present):
            best = min(best, at[right][0] - at[left][0] + 1)
            counts[at[left][1]] -= 1
            have -= counts[at[left][1]] == 0
            left += 1
    return len(present) / len(terms) * min(1.0, 2 * len(present) / best)


def bridge_names(question: str, text: str) -> set[str]:
    """Names ``text`` mentions that are not made only of the question's words (lower-cased)."""
    asked = {w.lower() for w in re.findall(r"\w+", question)}
    out = set()
    for m in _ENTITY.finditer(text):
        name = m.group(0).strip(" .")
        words = re.findall(r"\w+", name)
        if len(name) > 3 and words and not all(w.lower() in asked for w in words):
            out.add(name.lower())
    return out


def head_term(terms: Sequence[str], hits: Sequence[Hit]) -> str:
    """The key term (stem) of ``terms`` that the fewest of ``hits`` hold in their title, headings or text, when
    it is held by some but fewer than all of them (the term that tells the question's topic apart); ``""``
    when every term is as common as the others (no term is the head). Ties go to the later term (English puts
    the head of a compound last among the specific words: "workspace logo")."""
    if len(terms) < 2 or len(hits) < 2:
        return ""
    held = [{stem(t) for t in tokenize(" ".join([h.chunk.title, *h.chunk.title_path, h.chunk.text]))} for h in hits]
    counts = {t: n for t in dict.fromkeys(terms) if (n := sum(t in h for h in held))}  # a term no hit holds: no help
    if len(counts) < 2:
        return ""
    rare = min(counts.values())
    if rare == len(hits) or sum(c == rare for c in counts.values()) == len(counts):
        return ""
    return [t for t in counts if counts[t] == rare][-1]


def rerank(
    question: str, ranked: Sequence[Hit], *, protected: Collection[str] = (), settings: RerankSettings | None = None
) -> list[Hit]:
    """``ranked`` with its first ``settings.depth`` hits reordered by the features (the rest as they were);
    the ids in ``protected`` stay within the first ``settings.protect_depth`` places."""
    s = settings or RerankSettings()
    head, tail = list(ranked[: s.depth]), list(ranked[s.depth :])
    if len(head) < 2:
        return [*head, *tail]
    terms = [t.stem for t in key_terms(question)]
    wanted = frozenset(terms)
    bridges = bridge_names(question, head[0].chunk.text)
    focus = head_term(terms, head) if s.head_weight > 0 and len(set(terms)) <= s.head_max_terms else ""
    score = {}
    for i, hit in enumerate(head):
        title = {stem(t) for t in tokenize(hit.chunk.title)}
        title_match = len(wanted & title) / len(wanted) if wanted else 0.0
        bridge = 1.0 if i > 0 and any(b in hit.chunk.title.lower() for b in bridges) else 0.0
        boost = s.title_weight * title_match + s.proximity_weight * proximity(hit.chunk.text, wanted)
        if focus:
            sections = {stem(t) for t in tokenize(" ".join(hit.chunk.title_path))} | title
            text = focus in {stem(t) for t in tokenize(hit.chunk.text)}
            boost += s.head_weight * (1.0 if focus in sections else 0.5 if text else 0.0)
        score[hit.id] = (1.0 + boost + s.bridge_weight * bridge) / (s.k + i + 1)
    order = {hit.id: i for i, hit in enumerate(head)}
    head.sort(key=lambda h: (-score[h.id], order[h.id]))
    out = [*head, *tail]
    late = [h for h in out[s.protect_depth :] if h.id in protected]
    if not late:
        return out
    first = [h for h in out[: s.protect_depth] if h.id in protected] + late
    kept = [h for h in out[: s.protect_depth] if h.id not in protected][: max(s.protect_depth - len(first), 0)]
    position = {h.id: i for i, h in enumerate(out)}
    front = sorted([*kept, *first], key=lambda h: position[h.id])
    taken = {h.id for h in front}
    return front + [h for h in out if h.id not in taken]
