"""Tiny corpora and strategies shared by the retrieval tests (kept beside them: only they use them)."""

from __future__ import annotations

from hypothesis import strategies as st

from ragloop.state import Chunk, Hit

#: Eight short documents on distinct topics; ids c0..c7.
TEXTS = (
    "How to reset your password: open settings, choose security and click reset password.",
    "Invoices are emailed monthly; download past invoices from the billing page.",
    "The cat sat on the warm mat near the kitchen window.",
    "Redis ZADD adds members with scores to a sorted set.",
    "FastAPI path parameters are declared with Python type hints.",
    "Vitamin D deficiency is associated with lower bone density in adults.",
    "Two-factor authentication adds a one-time code to every login.",
    "Shipping to Europe takes five to seven business days.",
)

CHUNKS = tuple(
    Chunk(id=f"c{i}", text=t, source=f"doc{i}.md", title=f"Doc {i}", doc_id=f"d{i}") for i, t in enumerate(TEXTS)
)


def headed_chunks(tenant: str, n: int) -> list[Chunk]:
    """``n`` one-chunk pages of ``tenant`` (metadata ``tenant``), each with its own title and a section heading:
    the headings a meaning scale asks as pseudo-questions."""
    return [
        Chunk(
            f"{tenant}{i}",
            f"{tenant} text {i} about topic {i}",
            title=f"{tenant} page {i}",
            title_path=(f"{tenant} page {i}", f"{tenant} section {i}"),
            doc_id=f"{tenant}/{i}.md",
            metadata={"tenant": tenant},
        )
        for i in range(n)
    ]


_WORDS = st.text(alphabet="abcdefgh", min_size=1, max_size=4)


@st.composite
def hit_lists(draw: st.DrawFn) -> dict[str, list[Hit]]:
    """A mapping retriever name → ranked hits over a small shared id pool (duplicates allowed)."""
    names = draw(st.lists(st.sampled_from(["bm25", "dense", "live", "x"]), min_size=1, max_size=4, unique=True))
    pool = [f"c{i}" for i in range(draw(st.integers(1, 12)))]
    out: dict[str, list[Hit]] = {}
    for name in names:
        ids = draw(st.lists(st.sampled_from(pool), max_size=10))
        out[name] = [
            Hit(
                chunk=Chunk(id=cid, text=f"text {cid}"),
                score=draw(st.floats(-5, 5, allow_nan=False)),
                confidence=draw(st.floats(0, 1)),
            )
            for cid in ids
        ]
    return out


#: Small documents made of a few short words.
doc_texts = st.lists(st.lists(_WORDS, min_size=1, max_size=8).map(" ".join), min_size=1, max_size=12)
#: Short queries over the same alphabet.
queries = st.lists(_WORDS, min_size=1, max_size=4).map(" ".join)
