"""The ``flightsrv`` command line.

    flightsrv serve            run the Flight SQL server (seeds a demo table on first start)
    flightsrv demo             walk through the format: create, append, delete, scan, history
    flightsrv table ...        list | create | append | scan | delete | history | stats |
                               compact | expire | vacuum | purge
    flightsrv user hash        hash a password for a users file
    flightsrv pipeline ...     the Spark example pipeline (needs pyspark)

The warehouse comes from ``--warehouse`` or ``$FLIGHTSRV_WAREHOUSE`` (default ``./warehouse``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

DEFAULT_WAREHOUSE = "./warehouse"


def _warehouse(args):
    from flightsrv import Warehouse

    return Warehouse.open(args.warehouse)


def _parse_schema(text: str):
    """``id:int64,name:string,ts:timestamp`` → Arrow schema (DuckDB type names work too)."""
    import pyarrow as pa

    from flightsrv.errors import ConfigurationError

    simple = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
              "integer": pa.int32(), "bigint": pa.int64(), "float": pa.float32(),
              "double": pa.float64(), "float64": pa.float64(), "float32": pa.float32(),
              "string": pa.string(), "varchar": pa.string(), "text": pa.string(),
              "bool": pa.bool_(), "boolean": pa.bool_(), "date": pa.date32(),
              "timestamp": pa.timestamp("us"), "timestamptz": pa.timestamp("us", tz="UTC"),
              "binary": pa.binary(), "blob": pa.binary()}
    fields = []
    for part in text.split(","):
        name, _, typ = part.strip().partition(":")
        t = simple.get(typ.strip().lower())
        if not name or t is None:
            raise ConfigurationError("schema entry is not name:type", entry=part,
                                     types="|".join(sorted(simple)))
        fields.append(pa.field(name.strip(), t))
    return pa.schema(fields)


def _props(items) -> dict:
    out = {}
    for item in items or []:
        k, _, v = item.partition("=")
        out[k] = v
    return out


def _read_input(path: str):
    import pyarrow.csv as pcsv
    import pyarrow.dataset as ds
    import pyarrow.json as pjson

    if path.endswith((".csv", ".csv.gz")):
        return pcsv.open_csv(path)
    if path.endswith((".json", ".jsonl", ".ndjson")):
        return pjson.read_json(path).to_reader()
    return ds.dataset(path, format="parquet").scanner().to_reader()


def cmd_serve(args) -> int:
    from flightsrv.server.app import run
    from flightsrv.server.config import ServerConfig

    return run(ServerConfig.from_args(args), args.warehouse)


def cmd_demo(args) -> int:
    from flightsrv.demo import walkthrough

    walkthrough(_warehouse(args))
    return 0


def cmd_list(args) -> int:
    from flightsrv.progress import print_table

    wh = _warehouse(args)
    rows = []
    for name in wh.list_tables():
        head = wh.table(name).head()
        rows.append({"table": name, "version": head.version, "rows": head.live_rows,
                     "files": len(head.data_files)})
    print_table(rows)
    return 0


def cmd_create(args) -> int:
    t = _warehouse(args).create_table(args.table, _parse_schema(args.schema), _props(args.property))
    print(f"created {t.name} at version {t.head().version}")
    return 0


def cmd_append(args) -> int:
    from flightsrv.progress import Progress

    t = _warehouse(args).table(args.table)
    with Progress(f"append {t.name}", total=len(args.files), unit=" files") as p:
        for path in args.files:
            m = t.append(_read_input(path))
            p.advance(1, f"{path} -> v{m.version if m else '-'}")
    print(f"{t.name}: version {t.head().version}, {t.count_rows()} rows")
    return 0


def cmd_scan(args) -> int:
    t = _warehouse(args).table(args.table)
    cols = args.columns.split(",") if args.columns else None
    reader = t.scan(cols, args.filter, version=args.version, as_of=args.as_of)
    shown = 0
    out = sys.stdout
    for batch in reader:
        for row in batch.to_pylist():
            if args.limit is not None and shown >= args.limit:
                return 0
            out.write(json.dumps(row, default=str) + "\n")
            shown += 1
    return 0


def cmd_delete(args) -> int:
    t = _warehouse(args).table(args.table)
    n = t.delete(args.where, mode=args.mode)
    print(f"deleted {n} rows from {t.name}; now at version {t.head().version}")
    return 0


def cmd_history(args) -> int:
    from flightsrv.progress import print_table

    t = _warehouse(args).table(args.table)
    keys = ("version", "created_at", "operation", "rows_added", "rows_deleted", "files_added",
            "files_removed", "live_rows")
    print_table([{k: h.get(k, "") for k in keys} for h in t.history(limit=args.limit)])
    return 0


def _print_result(result) -> None:
    from flightsrv.progress import print_table

    if hasattr(result, "rows"):
        print_table(result.rows())
    elif isinstance(result, list):
        print_table(result)
    elif isinstance(result, dict):
        print_table([{"key": k, "value": v} for k, v in result.items()])
    else:
        print(result)


def cmd_maintenance(args) -> int:
    from flightsrv.progress import Progress

    t = _warehouse(args).table(args.table)
    kw = {}
    if args.cmd == "compact":
        if args.sort_by:
            kw["sort_by"] = args.sort_by.split(",")
        if args.target_file_size:
            kw["target_file_size"] = args.target_file_size
        result = t.compact(progress=Progress(f"compact {t.name}"), **kw)
    elif args.cmd == "expire":
        older = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=args.older_than) \
            if args.older_than is not None else None
        result = t.expire_snapshots(older_than=older, retain_last=args.retain_last)
    elif args.cmd == "vacuum":
        result = t.vacuum(grace=dt.timedelta(seconds=args.grace), dry_run=args.dry_run,
                          progress=Progress(f"vacuum {t.name}"))
    elif args.cmd == "purge":
        result = t.purge(expire=args.expire, progress=Progress(f"purge {t.name}"))
    else:
        result = t.stats()
    _print_result(result)
    return 0


def cmd_user_hash(args) -> int:
    import getpass

    from flightsrv.server.auth import hash_password

    pw = args.password or getpass.getpass("password: ")
    print(f"{args.user}:{hash_password(pw)}:{args.role}")
    return 0


def cmd_pipeline(args) -> int:
    from flightsrv.spark.pipeline import main as pipeline_main

    rest = list(args.rest)
    if "--warehouse" not in rest:  # forward the top-level warehouse
        rest += ["--warehouse", args.warehouse]
    return pipeline_main(rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flightsrv", description=__doc__.split("\n\n")[0])
    p.add_argument("--warehouse", default=os.environ.get("FLIGHTSRV_WAREHOUSE", DEFAULT_WAREHOUSE),
                   help="local directory or s3://bucket/prefix (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the Flight SQL server")
    from flightsrv.server.config import add_serve_arguments

    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)

    sub.add_parser("demo", help="walk through create/append/delete/scan/history").set_defaults(
        func=cmd_demo)

    t = sub.add_parser("table", help="table commands").add_subparsers(dest="cmd", required=True)
    t.add_parser("list").set_defaults(func=cmd_list)
    c = t.add_parser("create")
    c.add_argument("table")
    c.add_argument("--schema", required=True, help="name:type,name:type")
    c.add_argument("--property", action="append", metavar="KEY=VALUE")
    c.set_defaults(func=cmd_create)
    a = t.add_parser("append")
    a.add_argument("table")
    a.add_argument("files", nargs="+", help="Parquet, CSV or JSON-lines files")
    a.set_defaults(func=cmd_append)
    for name in ("scan", "head"):
        sc = t.add_parser(name)
        sc.add_argument("table")
        sc.add_argument("--columns")
        sc.add_argument("--filter")
        sc.add_argument("--version", type=int)
        sc.add_argument("--as-of")
        sc.add_argument("--limit", type=int, default=10 if name == "head" else None)
        sc.set_defaults(func=cmd_scan)
    d = t.add_parser("delete")
    d.add_argument("table")
    d.add_argument("--where", required=True)
    d.add_argument("--mode", choices=["dv", "splice"])
    d.set_defaults(func=cmd_delete)
    h = t.add_parser("history")
    h.add_argument("table")
    h.add_argument("--limit", type=int)
    h.set_defaults(func=cmd_history)
    for name in ("stats", "compact", "expire", "vacuum", "purge"):
        m = t.add_parser(name)
        m.add_argument("table")
        if name == "compact":
            m.add_argument("--sort-by")
            m.add_argument("--target-file-size", type=int)
        if name == "expire":
            m.add_argument("--older-than", type=int, metavar="SECONDS")
            m.add_argument("--retain-last", type=int, default=1)
        if name == "vacuum":
            m.add_argument("--grace", type=int, default=7 * 24 * 3600, metavar="SECONDS")
            m.add_argument("--dry-run", action="store_true")
        if name == "purge":
            m.add_argument("--expire", action="store_true",
                           help="also expire versions and delete objects holding erased bytes")
        m.set_defaults(func=cmd_maintenance)

    u = sub.add_parser("user", help="users file helpers").add_subparsers(dest="cmd", required=True)
    uh = u.add_parser("hash")
    uh.add_argument("user")
    uh.add_argument("--role", choices=["reader", "writer"], default="reader")
    uh.add_argument("--password")
    uh.set_defaults(func=cmd_user_hash)

    pl = sub.add_parser("pipeline", help="the Spark example pipeline "
                        "(`flightsrv pipeline --help` for its options)", add_help=False)
    pl.set_defaults(func=cmd_pipeline, rest=[])
    return p


def main(argv: list[str] | None = None) -> int:
    from flightsrv.errors import FlightsrvError

    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "pipeline" in argv:  # everything after it belongs to the pipeline's own parser
        i = argv.index("pipeline")
        argv, rest = argv[:i + 1], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if args.command == "pipeline":
        args.rest = rest
    try:
        return args.func(args)
    except FlightsrvError as exc:
        sys.stderr.write(f"flightsrv: error: {type(exc).__name__}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
