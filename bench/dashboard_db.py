#!/usr/bin/env python3
"""Fills a hookd SQLite database (already created and migrated by hookd) with N synthetic
events for the dashboard benchmark (bench/dashboard.sh):

    python3 bench/dashboard_db.py DATABASE [EVENTS]

Events come from three sources (github 60 %, stripe 30 %, generic 10 %), of 20 types (one of
them, `rare.type`, 0.1 %), received over the last 30 days, each with a ~300-byte JSON body and
one delivery to `classifier`: 98 % done (one ok attempt), 1 % dead (three failed attempts; the
last one's error kind one of permanent, trap, timeout), 0.5 % retrying, 0.5 % pending. Event
ids are `evt-<n>`. Deterministic (seeded), one transaction.
"""
import json
import random
import sqlite3
import sys
import time

database = sys.argv[1]
events = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
rng = random.Random(7)
now = int(time.time() * 1000)
span = 30 * 24 * 3600 * 1000
types = [f"type.{i}" for i in range(19)] + ["rare.type"]
kinds = ["permanent", "trap", "timeout"]

conn = sqlite3.connect(database)
conn.execute("PRAGMA synchronous = OFF")
conn.execute("BEGIN")
headers = json.dumps([["content-type", "application/json"], ["user-agent", "bench"]])
event_rows, delivery_rows, attempt_rows = [], [], []
delivery_id = attempt_id = 0


def flush():
    conn.executemany(
        "INSERT INTO events (id, source, event_id, event_type, ordering_key, sequence,"
        " received_at, headers, body) VALUES (?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
        event_rows,
    )
    conn.executemany(
        "INSERT INTO deliveries (id, event, source, handler, state, attempts, budget_base,"
        " next_attempt_at, last_error, updated_at) VALUES (?, ?, ?, 'classifier', ?, ?, 0, ?, ?, ?)",
        delivery_rows,
    )
    conn.executemany(
        "INSERT INTO attempts (id, delivery, attempt, started_at, finished_at, outcome,"
        " error_kind, error, plugin_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        attempt_rows,
    )
    event_rows.clear()
    delivery_rows.clear()
    attempt_rows.clear()


for n in range(1, events + 1):
    roll = rng.random()
    source = "github" if roll < 0.6 else "stripe" if roll < 0.9 else "generic"
    event_type = "rare.type" if rng.random() < 0.001 else types[rng.randrange(19)]
    received = now - span + span * n // events
    body = json.dumps({"id": n, "type": event_type, "text": "x" * 240}).encode()
    event_rows.append((n, source, f"evt-{n}", event_type, received, headers, body))
    state_roll = rng.random()
    state = (
        "done" if state_roll < 0.98 else "dead" if state_roll < 0.99
        else "retrying" if state_roll < 0.995 else "pending"
    )
    delivery_id += 1
    tries = {"done": 1, "dead": 3, "retrying": 1, "pending": 0}[state]
    kind = kinds[rng.randrange(3)]
    delivery_rows.append((
        delivery_id, n, source, state, tries, received + 60_000,
        f"{kind}: synthetic failure" if state in ("dead", "retrying") else None,
        received + 1000,
    ))
    for attempt in range(1, tries + 1):
        attempt_id += 1
        ok = state == "done"
        error_kind = None if ok else (kind if state == "dead" else "retry")
        attempt_rows.append((
            attempt_id, delivery_id, attempt, received + attempt * 10, received + attempt * 10 + 5,
            "ok" if ok else ("retry" if state == "retrying" or attempt < tries else "permanent"),
            error_kind, None if ok else "synthetic failure", "ab" * 32,
        ))
    if n % 50_000 == 0:
        flush()
flush()
conn.commit()
conn.close()
print(f"{database}: {events} events")
