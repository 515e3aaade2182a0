"""The demo table seeded into a fresh embedded warehouse, and the format walk-through."""

from __future__ import annotations

import datetime as dt
import sys

import numpy as np
import pyarrow as pa

DEMO_TABLE = "demo_events"
DEMO_SCHEMA = pa.schema([
    ("event_id", pa.int64()),
    ("user_id", pa.int64()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_type", pa.string()),
    ("amount", pa.float64()),
])
_TYPES = ["view", "click", "cart", "purchase", "refund"]


def demo_batch(start: int, n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed + start)
    base = int(dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp() * 1_000_000)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "event_id": ids,
        "user_id": rng.integers(1, 5000, n),
        "event_time": pa.array(base + ids * 1_000_000, pa.timestamp("us", tz="UTC")),
        "event_type": pa.array([_TYPES[i] for i in rng.integers(0, len(_TYPES), n)]),
        "amount": np.round(rng.random(n) * 100, 2),
    }, schema=DEMO_SCHEMA)


def seed_demo(warehouse, rows: int = 100_000, batches: int = 4) -> str | None:
    """Create and fill ``demo_events`` if the warehouse has no tables, healthy or broken.
    None if seeded, else why not (for the server to say)."""
    broken: list = []
    names = warehouse.list_tables(broken)
    if names or broken:
        shown = ", ".join(sorted([*names, *(b[0] for b in broken)])[:3])
        more = "" if len(names) + len(broken) <= 3 else ", ..."
        return f"the warehouse already holds tables ({shown}{more}); seeding needs an empty one"
    t = warehouse.create_table(DEMO_TABLE, DEMO_SCHEMA, {"sort_key": "event_time"}, exist_ok=True)
    if t.count_rows():
        return f"{DEMO_TABLE} already holds rows"
    per = rows // batches
    for i in range(batches):
        t.append(demo_batch(i * per, per))
    t.delete("user_id = 42")  # an erasure request, as a deletion vector
    return None


#: the table property marking the walkthrough's own table (a ``user.`` property: stored
#: as given, never interpreted)
_MARK = "user.flightsrv_demo"


def walkthrough(warehouse, out=sys.stdout) -> None:
    """Create a table, append, delete, scan and print history (the format in one minute)."""
    from flightsrv.progress import print_table

    name = "walkthrough"
    if warehouse.exists(name):
        # only a table this walkthrough made (its mark; before the mark, its very schema)
        # is replaced: never a user's table
        old = warehouse.table(name)
        if old.properties.get(_MARK) != "walkthrough" and not old.schema.equals(DEMO_SCHEMA):
            from flightsrv.errors import TableExists

            raise TableExists("the demo writes a table named walkthrough, and this one is not "
                              "the demo's; run the demo in another warehouse (--warehouse)",
                              table=name, warehouse=warehouse.uri)
        warehouse.drop_table(name)
    t = warehouse.create_table(name, DEMO_SCHEMA, {_MARK: "walkthrough"})
    out.write(f"created table {name} in {warehouse.uri}\n")
    for i in range(3):
        m = t.append(demo_batch(i * 50_000, 50_000, seed=1))
        out.write(f"appended 50000 rows -> version {m.version}\n")
    n = t.delete("user_id = 7")
    out.write(f"deleted {n} rows of user 7 (deletion vector) -> version {t.head().version}\n")
    n = t.delete("event_id < 50000")
    out.write(f"deleted {n} rows by event_id < 50000 (metadata only) -> version "
              f"{t.head().version}\n")
    # the version after the appends (version numbers go on after a drop and re-create)
    appended = m.version
    out.write(f"live rows now: {t.count_rows()}; at version {appended}: "
              f"{t.count_rows(version=appended)}\n")
    sample = t.to_table(columns=["event_id", "user_id", "event_type", "amount"],
                        filter="event_id BETWEEN 120000 AND 120004")
    print_table(sample.to_pylist(), out)
    out.write("\nhistory:\n")
    print_table([{k: h[k] for k in ("version", "operation", "rows_added", "rows_deleted",
                                    "live_rows")} for h in t.history()], out)
