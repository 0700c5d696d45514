#!/usr/bin/env bash
# Build the wheel and run the offline `ragloop ask` from it in a fresh virtual environment (not `pip install -e`),
# from a folder outside the checkout, so a data file missing from the package (the sample pages, the ticket or CRM
# database, the tokenizer) fails here instead of on a user's machine. Called by .ci/run; usage: scripts/check_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[[ "$python" = /* ]] || python="$PWD/$python"  # absolute (not resolved: a venv's python is a symlink)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m pip wheel -q --no-deps -w "$work/dist" .  # the project venv has pip (Debian's python3 may not)
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/ragloop-*.whl
mkdir -p "$work/home" "$work/run"
cd "$work/run"
out="$(HOME="$work/home" "$work/venv/bin/ragloop" ask "What plan is Harbor Lane Bank on, and how much does that plan cost per seat?" --org "Harbor Lane Bank" --json)"
printf '%s' "$out" | "$work/venv/bin/python" -c '
import json, sys
reply = json.load(sys.stdin)
assert reply["text"].strip() and reply["outcome"] in ("context", "partial"), reply
assert reply["citations"] and reply["record"]["plan"] is not None, "the installed wheel answered without its data"
outcome, cited = reply["outcome"], len(reply["citations"])
print(f"wheel: ragloop ask answered from the installed wheel ({outcome}, {cited} citations)")
'
"$work/venv/bin/ragloop" --version
# Typed for its users: a user's file that imports ragloop.extend passes mypy --strict against the installed wheel
# (py.typed shipped: no import-untyped), checked with the project's mypy pointed at the wheel's interpreter.
cat > "$work/run/user_ranker.py" <<'PY'
from ragloop.extend import Candidates, FusionRanker, Hit, JoinedRetriever, Retriever
from ragloop.turn import Turn


class Reversed:
    async def rank(self, candidates: Candidates) -> list[Hit]:
        return list(reversed(await FusionRanker().rank(candidates)))


def wire(turn: Turn, other: Retriever) -> Turn:
    joined = JoinedRetriever({"docs": turn.retriever, "other": other})
    assert joined.mode == "rrf"
    return turn.add_retriever("other", other, weight=0.5).ranker(Reversed())
PY
"$python" -m mypy --strict --no-incremental --python-executable "$work/venv/bin/python" "$work/run/user_ranker.py"
echo "wheel: mypy --strict passes on a user file importing ragloop.extend (py.typed shipped)"
