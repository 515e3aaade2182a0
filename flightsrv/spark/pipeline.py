"""The example pipeline: ``flightsrv pipeline [options]``.

``flightsrv pipeline [run] [options]`` (``run`` is optional; the top-level CLI forwards
everything after ``pipeline`` here, with its global ``--warehouse``).

1. (``--generate N``) write N sample events as raw JSON-lines or CSV files, plus an erasure
   list of user ids, so the pipeline runs out of the box;
2. ingest the raw files into the table, ``--batch-files`` files per append (one commit each);
3. apply the erasure list: ``delete_matching(on=["user_id"])`` (one commit);
4. compact on Spark (one commit);
5. print the table's history.

Runs on Spark ``--master`` (default ``local[2]``) against the warehouse given by
``--warehouse`` (default ``$FLIGHTSRV_WAREHOUSE`` or ``./warehouse``): a local directory or
``s3://bucket/prefix`` (credentials and endpoint from the usual AWS_* variables).

Example::

    flightsrv pipeline --generate 100000 --input ./raw --warehouse ./warehouse
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time

EVENT_SCHEMA = ("event_id LONG, user_id LONG, ts TIMESTAMP, kind STRING, "
                "amount DECIMAL(12,2), country STRING")
KINDS = ("view", "click", "purchase", "refund", "signup")
COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NL")


def generate(input_dir: str, n: int, *, files: int = 8, fmt: str = "json", users: int = 0,
             erase_fraction: float = 0.01, seed: int = 7) -> str:
    """Write ``n`` events over ``files`` raw files and an erasure list; returns its path."""
    os.makedirs(input_dir, exist_ok=True)
    rng = random.Random(seed)
    users = users or max(10, n // 20)
    base = 1_767_225_600  # 2026-01-01T00:00:00Z
    per = max(1, -(-n // files))
    eid = 0
    for i in range(files):
        path = os.path.join(input_dir, f"events-{i:04d}.{fmt}")
        with open(path, "w") as out:
            if fmt == "csv":
                out.write("event_id,user_id,ts,kind,amount,country\n")
            for _ in range(min(per, n - eid)):
                ev = {"event_id": eid, "user_id": rng.randrange(users),
                      "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                          time.gmtime(base + eid * 7 + rng.randrange(7))),
                      "kind": rng.choice(KINDS), "amount": f"{rng.randrange(1, 100000) / 100:.2f}",
                      "country": rng.choice(COUNTRIES)}
                out.write(",".join(str(v) for v in ev.values()) + "\n" if fmt == "csv"
                          else json.dumps(ev) + "\n")
                eid += 1
    erase = os.path.join(input_dir, "erasure_list.csv")
    with open(erase, "w") as out:
        out.write("user_id\n")
        chosen = rng.sample(range(users), max(1, int(users * erase_fraction)))
        out.writelines(f"{u}\n" for u in sorted(chosen))
    return erase


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless it has none (None, a flag's False) or its help
    already says it."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flightsrv pipeline", formatter_class=_Help,
        description="The example Spark pipeline: generate sample events (--generate), ingest "
        "them, apply an erasure list, compact, and print the table's history.")
    p.add_argument("action", nargs="?", choices=["run"], default="run",
                   help="the only action (optional)")
    p.add_argument("--warehouse", default=os.environ.get("FLIGHTSRV_WAREHOUSE", "./warehouse"),
                   help="where the tables live (default: $FLIGHTSRV_WAREHOUSE, else "
                   "./warehouse)")
    p.add_argument("--table", default="events", help="the table the events go into")
    p.add_argument("--input", default="./raw", help="directory of raw event files")
    p.add_argument("--format", choices=("json", "csv"), default="json",
                   help="format of the raw event files")
    p.add_argument("--batch-files", type=int, default=4, help="raw files per append commit")
    p.add_argument("--erase-list", help="CSV with a user_id column (default: "
                   "<input>/erasure_list.csv if present)")
    p.add_argument("--generate", type=int, metavar="N", help="first write N sample events")
    p.add_argument("--files", type=int, default=8, help="raw files to generate")
    p.add_argument("--master", default="local[2]", help="the Spark master URL")
    p.add_argument("--no-compact", action="store_true",
                   help="skip the compaction step at the end")
    return p


def _say(msg: str) -> None:
    print(msg, flush=True)


def run(spark, argv: list[str] | None = None) -> int:
    """The pipeline on an existing session (registered with ``flightsrv.spark.register``)."""
    from flightsrv.spark import compact, delete_matching, register
    from flightsrv.spark.location import split_uri
    from flightsrv.warehouse import Warehouse

    args = build_parser().parse_args(argv)
    register(spark)
    uri = f"{args.warehouse.rstrip('/')}/{args.table}"
    wh_uri, name = split_uri(uri)
    if args.generate:
        erase = generate(args.input, args.generate, files=args.files, fmt=args.format)
        _say(f"generated {args.generate} events in {args.files} {args.format} files under "
             f"{args.input}; erasure list {erase}")
    erase_list = args.erase_list or os.path.join(args.input, "erasure_list.csv")
    files = sorted(f for f in glob.glob(os.path.join(args.input, f"*.{args.format}"))
                   if os.path.abspath(f) != os.path.abspath(erase_list))
    if not files:
        _say(f"no *.{args.format} files under {args.input} (use --generate N)")
        return 2
    for i in range(0, len(files), max(1, args.batch_files)):
        batch = files[i:i + max(1, args.batch_files)]
        reader = spark.read.schema(EVENT_SCHEMA)
        df = reader.option("header", "true").csv(batch) if args.format == "csv" \
            else reader.json(batch)
        t0 = time.perf_counter()
        df.write.format("flightsrv").mode("append").save(uri)
        _say(f"ingested {len(batch)} file(s) in {time.perf_counter() - t0:.1f}s")
    if os.path.exists(erase_list):
        keys = spark.read.schema("user_id LONG").option("header", "true").csv(erase_list)
        t0 = time.perf_counter()
        n = delete_matching(spark, uri, keys, on=["user_id"])
        _say(f"erased {n} rows of {keys.count()} listed users in "
             f"{time.perf_counter() - t0:.1f}s")
    if not args.no_compact:
        t0 = time.perf_counter()
        r = compact(spark, uri)
        _say(f"compacted {r.files_rewritten} files into {r.files_added} "
             f"(purged {r.deleted_rows_purged} deleted rows) in {time.perf_counter() - t0:.1f}s")
    table = Warehouse.open(wh_uri).table(name)
    _say(f"\nhistory of {uri} ({table.count_rows()} live rows):")
    _say(f"{'version':>7}  {'operation':<15} {'rows+':>9} {'rows-':>9} {'files':>6}  created_at")
    for h in reversed(table.history()):
        _say(f"{h['version']:>7}  {h['operation']:<15} {h['rows_added']:>9} "
             f"{h['rows_deleted']:>9} {h['files']:>6}  {h['created_at']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from flightsrv.spark import session

    args = build_parser().parse_args(argv)
    spark = session(args.master, "flightsrv-pipeline")
    try:
        return run(spark, argv)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
