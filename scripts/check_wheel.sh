#!/usr/bin/env bash
# Build the wheel and run the offline `ragloop ask` from it in a fresh virtual environment (not `pip install -e`),
# from a folder outside the checkout, so a data file missing from the package (the sample pages, the ticket or CRM
# database, the tokenizer) fails here instead of on a user's machine. Called by .ci/run; usage: scripts/check_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps -w "$work/dist" .  # the project venv has pip (Debian's python3 may not)
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
