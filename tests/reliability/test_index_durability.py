"""Item 7: killing ``ragloop index`` (SIGKILL) at any point leaves the previous index or the new one, never a
broken one: the index directory always loads, with its manifest and every checksum verified.

Two kinds of kill: at chosen filesystem steps of a run (every ``mkdir``/``fsync``/``rename``/``rmtree``, in a
forked child that kills itself, so the kill lands exactly there), and from outside at seeded random times.
By default a seeded handful of steps (always including the swap of the old and new directories); with
``RAGLOOP_SOAK=1`` every step and more random kills.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from tests.reliability._support import SOAK, count, scale

SEED = 7
ROOT = Path(__file__).resolve().parents[2]


def write_docs(folder: Path, version: str, n: int) -> Path:
    """``n`` markdown pages whose text names ``version`` (so old and new chunks differ)."""
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"page-{i:03d}.md").write_text(
            f"# Page {i} ({version})\n\n"
            f"Release {version} page {i}: webhooks retry {i} times; exports take {i} minutes.\n"
        )
    return folder


def chunk_ids(docs: Path) -> frozenset[str]:
    """The chunk ids ``ragloop index`` makes of ``docs``."""
    return frozenset(c.id for c in ingest_path(docs).chunks)


def classify(kb: Path, old: frozenset[str], new: frozenset[str]) -> str:
    """``old`` or ``new`` when ``kb`` loads (checksums verified) as exactly that index; raises otherwise."""
    index = KnowledgeIndex.load(kb, verify=True)
    ids = frozenset(c.id for c in index.chunks)
    assert ids in (old, new), f"{kb} loaded with {len(ids)} chunks that are neither the old nor the new index"
    assert len(index.dense) == len(ids) == len(index.bm25)
    return "old" if ids == old else "new"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, frozenset[str], frozenset[str]]:
    """Old docs (already indexed into a pristine index), new docs, and both chunk-id sets."""
    root = tmp_path_factory.mktemp("durability")
    old_docs, new_docs = write_docs(root / "old", "v1", 6), write_docs(root / "new", "v2", 12)
    pristine = KnowledgeIndex.build(ingest_path(old_docs).chunks, HashEmbedder()).save(root / "pristine")
    return pristine, old_docs, new_docs, chunk_ids(old_docs), chunk_ids(new_docs)


def fresh_trial(root: Path, name: str, pristine: Path) -> Path:
    """A trial folder holding a copy of the previous index at ``kb``."""
    kb = root / name / "kb"
    shutil.copytree(pristine, kb)
    return kb


def run_driver(new_docs: Path, trials: Path, points: list[int]) -> list[dict[str, object]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability._kill_driver",
            str(new_docs),
            str(trials),
            ",".join(map(str, points)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_kill_at_filesystem_steps(
    corpora: tuple[Path, Path, Path, frozenset[str], frozenset[str]], tmp_path: Path
) -> None:
    """SIGKILL at (seeded) filesystem steps of a run: the index loads as the old one or the new one, every time."""
    pristine, _, new_docs, old, new = corpora
    fresh_trial(tmp_path, "trial-0", pristine)
    (dry,) = run_driver(new_docs, tmp_path, [0])
    assert dry["exit"] == 0 and not dry["killed"]
    steps = int(str(dry["steps"]))
    assert classify(tmp_path / "trial-0" / "kb", old, new) == "new"
    renames = _rename_steps(steps)
    rng = random.Random(SEED)
    points = (
        list(range(1, steps + 1)) if SOAK else sorted({*renames, *rng.sample(range(1, steps + 1), k=min(4, steps))})
    )
    for k in points:
        fresh_trial(tmp_path, f"trial-{k}", pristine)
    results = run_driver(new_docs, tmp_path, points)
    assert [r["k"] for r in results] == points and all(r["killed"] for r in results)
    seen = {classify(tmp_path / f"trial-{r['k']}" / "kb", old, new) for r in results}
    count("index_kills_at_steps", len(points))
    count("index_run_steps", steps)
    assert seen, "no kill was checked"


def _rename_steps(steps: int) -> list[int]:
    # A run ends: ... rename(s) of the swap, fsync of the parent, rmtree of the old copy, fsync. The last four
    # steps always cover the swap and the cleanup after it.
    return [s for s in range(max(1, steps - 4), steps + 1)]


def test_kill_at_random_times(corpora: tuple[Path, Path, Path, frozenset[str], frozenset[str]], tmp_path: Path) -> None:
    """SIGKILL from outside at seeded random times during `ragloop index`: old or new index, never broken."""
    pristine, _, new_docs, old, new = corpora
    rng = random.Random(SEED)
    kills = scale(2, 20)
    outcomes = []
    for i in range(kills):
        kb = fresh_trial(tmp_path, f"random-{i}", pristine)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragloop.cli", "index", str(new_docs), "--out", str(kb), "--embedder", "hash"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        outcomes.append(classify(kb, old, new))
    count("index_kills_random", kills)
    assert len(outcomes) == kills
