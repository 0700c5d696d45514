"""Build the sample CRM database that ships with ragloop (``src/ragloop/data/crm.sqlite``).

Customers, orders and a ticket index for *Lumen*, the fictional product of the sample knowledge base. It is
the SQL source of the retrieval-planner examples: a question like "What plan is Harbor Lane Bank on, and how
much does that plan cost per seat?" needs a SQL lookup (the plan) before a document search (its price).

- ``customers``: the 25 customers of the sample ticket database (same names), each with a plan (Free, Team,
  Business, Enterprise — the plans of ``plans-and-pricing.md``), region, seats and status; a few churned.
- ``orders``: ``ORD-1001`` … purchases of plans and seats, paid, refunded or pending.
- ``tickets``: one row per ticket of ``tickets.sqlite`` (same ids) with its customer's id, priority, status,
  opening date, and the first error code its text names (``E2001`` …), so SQL can hand ticket ids to the live
  ticket source and error codes to the document search.
- ``secrets``: API tokens per customer, which the sample allowlist leaves out: the table every SQL-safety test
  tries to reach.

The output is deterministic (fixed seed, rows inserted in id order); the ticket rows are read from
``tickets.sqlite``, so build that first (``scripts/build_sample_tickets.py``). Stdlib only.

Usage::

    python scripts/build_sample_crm.py [--tickets src/ragloop/data/tickets.sqlite] [--out src/ragloop/data/crm.sqlite]
"""

from __future__ import annotations

import argparse
import random
import re
import sqlite3
from datetime import date, timedelta
from pathlib import Path

SEED = 20240202
DATA = Path(__file__).resolve().parents[1] / "src" / "ragloop" / "data"
PLANS = ("Free", "Team", "Business", "Enterprise")
PRICE = {"Free": 0.0, "Team": 9.0, "Business": 19.0, "Enterprise": 35.0}
REGIONS = ("EU", "US", "APAC")

# Pinned so the sample questions, tests and docs can rely on them.
PINNED = {
    "Harbor Lane Bank": ("Enterprise", "EU", 240, "active", None),
    "Nimbus Robotics": ("Business", "US", 85, "active", None),
    "Umber Coffee Roasters": ("Team", "EU", 12, "active", None),
    "Quarry Street Bakery": ("Free", "EU", 4, "churned", "2024-08-30"),
    "Zephyr Telecom": ("Business", "APAC", 130, "active", None),
}
PINNED_ORDERS = {"ORD-1042": ("Nimbus Robotics", "Business", 85, "paid")}

SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    plan TEXT NOT NULL CHECK (plan IN ('Free', 'Team', 'Business', 'Enterprise')),
    region TEXT NOT NULL CHECK (region IN ('EU', 'US', 'APAC')),
    seats INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'churned')),
    signed_up TEXT NOT NULL,
    churned_on TEXT
);
CREATE TABLE orders (
    id TEXT PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    plan TEXT NOT NULL,
    seats INTEGER NOT NULL,
    amount_usd REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('paid', 'refunded', 'pending')),
    ordered TEXT NOT NULL
);
CREATE TABLE tickets (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    priority TEXT NOT NULL,
    status TEXT NOT NULL,
    opened TEXT NOT NULL,
    error_code TEXT
);
CREATE TABLE secrets (
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    api_token TEXT NOT NULL
);
CREATE INDEX orders_customer ON orders (customer_id);
CREATE INDEX tickets_customer ON tickets (customer_id);
"""


def build(tickets_db: Path, out: Path, seed: int = SEED) -> dict[str, int]:
    """Write the database to ``out`` (replacing it) and return the row count per table."""
    rng = random.Random(seed)
    src = sqlite3.connect(f"{tickets_db.resolve().as_uri()}?mode=ro", uri=True)
    tickets = src.execute(
        "SELECT id, customer, priority, status, created, summary || ' ' || body FROM tickets ORDER BY id"
    ).fetchall()
    src.close()
    names = sorted({t[1] for t in tickets})
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp)
    db.executescript(SCHEMA)
    ids: dict[str, int] = {}
    for i, name in enumerate(names, start=1):
        ids[name] = i
        if name in PINNED:
            plan, region, seats, status, churned = PINNED[name]
        else:
            plan = rng.choice(PLANS)
            region = rng.choice(REGIONS)
            seats = {"Free": rng.randint(2, 10), "Team": rng.randint(5, 60)}.get(plan, rng.randint(40, 400))
            status = "churned" if rng.random() < 0.15 else "active"
            churned = (
                (date(2024, 1, 1) + timedelta(days=rng.randint(60, 300))).isoformat() if status == "churned" else None
            )
        signed = (date(2022, 1, 1) + timedelta(days=rng.randint(0, 600))).isoformat()
        db.execute(
            "INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (i, name, plan, region, seats, status, signed, churned),
        )
        db.execute("INSERT INTO secrets VALUES (?, ?)", (i, f"tok_{rng.getrandbits(64):016x}"))
    plans = dict(db.execute("SELECT name, plan FROM customers").fetchall())
    for n in range(1001, 1121):
        oid = f"ORD-{n}"
        if oid in PINNED_ORDERS:
            name, plan, seats, status = PINNED_ORDERS[oid]
        else:
            name = rng.choice(names)
            plan = plans[name]
            seats = rng.randint(1, 50)
            status = rng.choices(("paid", "refunded", "pending"), weights=(85, 8, 7))[0]
        ordered = (date(2024, 1, 1) + timedelta(days=(n - 1001) * 2 + rng.randint(0, 1))).isoformat()
        amount = round(PRICE[plan] * seats * 12, 2)
        db.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)", (oid, ids[name], plan, seats, amount, status, ordered)
        )
    for tid, customer, priority, status, created, text in tickets:
        code = re.search(r"\bE\d{4}\b", text)
        db.execute(
            "INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?)",
            (tid, ids[customer], priority, status, created, code.group(0) if code else None),
        )
    db.commit()
    counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("customers", "orders", "tickets")}
    db.execute("VACUUM")
    db.close()
    tmp.replace(out)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=Path, default=DATA / "tickets.sqlite")
    parser.add_argument("--out", type=Path, default=DATA / "crm.sqlite")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    counts = build(args.tickets, args.out, args.seed)
    print(f"wrote {args.out}: " + ", ".join(f"{n} {t}" for t, n in counts.items()))


if __name__ == "__main__":
    main()
