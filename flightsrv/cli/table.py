"""``flightsrv table ...``: create, load, read, change and maintain tables of a warehouse.

Every command checks its arguments (schema, properties, input files, durations) before it
touches the warehouse, and every command that only reads refuses a location holding no
warehouse instead of creating one. ``append`` of several files is one commit: every file is
written first, then all are committed together; a failure or Ctrl-C before the commit
commits nothing and deletes the files already written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import signal

import pyarrow as pa
from sqlglot import exp

from flightsrv.cli import output
from flightsrv.cli.common import (
    CTRL_C,
    EXIT_FAILED,
    UsageError,
    error_text,
    format_duration,
    input_kind,
    input_schema,
    one_line,
    open_warehouse,
    parse_duration,
    read_input,
    say,
    warn,
)
from flightsrv.errors import ConfigurationError, FlightsrvError, SqlError
from flightsrv.sql.types import MAX_DECIMAL_PRECISION, arrow_type

TABLE_HELP = """\
Create, load, read, change and maintain the tables of the warehouse. Commands that only read
refuse a location holding no warehouse (they never create one). 'append' of several files
is one commit: all files or none."""

# -- argument values -------------------------------------------------------------------

SCHEMA_TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(), "tinyint": pa.int8(), "int16": pa.int16(), "smallint": pa.int16(),
    "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(), "int64": pa.int64(),
    "bigint": pa.int64(), "float": pa.float32(), "float32": pa.float32(), "real": pa.float32(),
    "double": pa.float64(), "float64": pa.float64(), "string": pa.string(),
    "varchar": pa.string(), "text": pa.string(), "bool": pa.bool_(), "boolean": pa.bool_(),
    "date": pa.date32(), "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"), "binary": pa.binary(), "blob": pa.binary(),
}


def parse_schema(text: str) -> pa.Schema:
    """``id:int64,name:string,amount:decimal(12,2)`` -> Arrow schema (UsageError if not)."""
    import re

    from flightsrv.table.schema import check_column_names

    fields = []
    # split on commas outside parentheses (decimal(12,2))
    for part in re.split(r",(?![^(]*\))", text):
        name, sep, typ = part.strip().rpartition(":")
        typ = typ.strip().lower()
        m = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", typ)
        if m:  # checked against DuckDB's limits as CREATE TABLE checks it
            try:
                t = arrow_type(exp.DataType.build(f"DECIMAL({m.group(1)}, {m.group(2)})"))
            except SqlError:
                raise UsageError(f"--schema: {part.strip()!r}: decimal(p,s) needs 1 <= p <= "
                                 f"{MAX_DECIMAL_PRECISION} and s <= p") from None
        else:
            t = SCHEMA_TYPES.get(typ)
        if not sep or not name.strip() or t is None:
            raise UsageError(f"--schema: {part.strip()!r} is not name:type (types: "
                             f"{', '.join(sorted(SCHEMA_TYPES))}, decimal(p,s))")
        fields.append(pa.field(name.strip(), t))
    schema = pa.schema(fields)
    try:
        check_column_names(schema)
    except ConfigurationError as exc:
        raise UsageError(f"--schema: {exc}") from None
    return schema


def parse_properties(items, columns=None, *, table=None, option="--property") -> dict:
    """``KEY=VALUE`` items checked against the property registry (UsageError if not)."""
    from flightsrv.table import properties

    raw = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{option}: {item!r} is not KEY=VALUE")
        raw[key.strip()] = value.strip()
    try:
        return properties.normalize(raw, columns, table=table)
    except ConfigurationError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _size_arg(text: str) -> int:
    from flightsrv.table.properties import parse_size

    try:
        n = parse_size(text)
    except ConfigurationError as exc:
        import argparse

        raise argparse.ArgumentTypeError(exc.message) from None
    if n <= 0:
        import argparse

        raise argparse.ArgumentTypeError("must be positive")
    return n


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- appending (shared by create --from-file) --------------------------------------------


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C while the commit runs, so it is never cut between the conditional write
    and our bookkeeping; yields a list that is non-empty if Ctrl-C came meanwhile."""
    got: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    except ValueError:  # not the main thread
        yield got
        return
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _loading(path: str, table: str):
    """Errors while the rows of input file ``path`` are read and written name the file (and
    the table): pyarrow's become ConfigurationError."""
    try:
        yield
    except pa.ArrowException as exc:
        raise ConfigurationError(f"cannot read {input_kind(path)} file: {one_line(exc)}",
                                 table=table, file=path) from None
    except FlightsrvError as exc:
        raise type(exc)(exc.message, **{**exc.context, "file": path}) from None


@contextlib.contextmanager
def _input(path: str, table: str, schema):
    """The rows of input file ``path`` (``read_input``), errors named as ``_loading`` does.
    The reader is closed on the way out, whatever happened: a Parquet scan still reading
    ahead in pyarrow's threads when Ctrl-C ends the process crashed it (SIGSEGV at exit)."""
    try:
        with _loading(path, table):
            reader = read_input(path, schema)
            try:
                yield reader
            finally:
                reader.close()
    except Exception:
        if CTRL_C.is_set():  # DuckDB's "Query interrupted": the Ctrl-C, not a bad file
            raise KeyboardInterrupt from None
        raise


def append_files(t, paths: list[str], label: str):
    """Write every file's rows as data files, then commit them all in one version.
    Returns (manifest or None, rows, files). On any failure or Ctrl-C before the commit,
    nothing is committed and the files written so far are deleted."""
    from flightsrv.progress import Progress

    from flightsrv.table.schema import schema_from_json

    head = t.head()
    schema = schema_from_json(head.schema)  # CSV/JSON columns are read as the table's types
    written, rows, nbytes = [], 0, 0
    keys: list[str] = []  # every object key written, recorded before it is written
    committed = None
    with Progress(label, total=len(paths), unit=" files") as progress:
        try:
            for path in paths:
                with _input(path, t.name, schema) as reader:
                    files, b, n = t.write_files(reader, head=head, keys=keys)
                written += files
                rows += n
                nbytes += b
                progress.advance(1, f"{path}: {n} rows")
            if written:
                with _interrupts_deferred() as interrupted:
                    committed = t.commit_files(written, operation="append",
                                               extra={"bytes_added": nbytes,
                                                      "input_files": len(paths)},
                                               expected_schema=head.schema,
                                               expected_uuid=head.table_uuid)
                if interrupted:
                    say(f"Ctrl-C came during the commit; version {committed.version} was "
                        "committed")
        except BaseException:
            if committed is None:
                t.discard_keys(keys)
            raise
    return committed, rows, len(paths)


# -- commands ------------------------------------------------------------------------


LIST_COLUMNS = ("table", "version", "rows", "files", "bytes", "status")


def cmd_list(args) -> int:
    """The tables; one that cannot be read (corrupt or missing pointer, head manifest or,
    in format 2, a manifest chunk its file list is read from) is listed too, with its error
    as status and a warning on stderr, and the exit code is 1. Transient store errors
    still fail the command."""
    from flightsrv.errors import TransientError

    output.check_output_args(args)
    wh = open_warehouse(args)
    broken: list = []
    rows = []
    for name in wh.list_tables(broken):
        try:
            head = wh.table(name).head()
            files = head.data_files  # format 2: read from the chunks, which can be broken
            row = {"table": name, "version": head.version, "rows": head.live_rows,
                   "files": len(files), "bytes": sum(f.size for f in files), "status": "ok"}
        except TransientError:
            raise
        except FlightsrvError as exc:
            broken.append((name, exc))
            continue
        rows.append(row)
    for name, exc in broken:
        warn(f"table {name} cannot be read: {error_text(exc)}")
        rows.append({"table": name, "version": None, "rows": None, "files": None,
                     "bytes": None, "status": f"broken: {error_text(exc)}"})
    rows.sort(key=lambda r: r["table"])
    output.write_rows(rows, args, columns=LIST_COLUMNS)
    return EXIT_FAILED if broken else 0


def cmd_create(args) -> int:
    from flightsrv.warehouse import check_name

    try:
        check_name(args.table)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    if bool(args.schema) == bool(args.from_file):
        raise UsageError("give exactly one of --schema and --from-file")
    if args.schema_only and not args.from_file:
        raise UsageError("--schema-only goes with --from-file")
    if args.schema:
        schema = parse_schema(args.schema)
    else:
        input_kind(args.from_file)
        schema = input_schema(args.from_file)
        from flightsrv.table.schema import check_column_names

        try:
            check_column_names(schema, args.table)
        except ConfigurationError as exc:
            raise UsageError(f"--from-file {args.from_file}: {exc}") from None
    props = parse_properties(args.property, schema.names, table=args.table)
    partition_by = _partition_fields(args.partition_by)
    _check_partitioning(partition_by, schema, args.table)
    wh = open_warehouse(args, must_exist=False)
    if args.if_not_exists and wh.is_initialized() and args.table.lower() in wh.list_tables():
        print(f"{args.table.lower()}: exists already; nothing done")
        return 0
    if not args.from_file or args.schema_only:
        t = wh.create_table(args.table, schema, props, partition_by=partition_by)
        print(f"created {t.name} at version {t.head().version} in {wh.uri}")
        return 0
    # the table and the file's rows in one commit: a load that fails (or Ctrl-C) leaves no
    # table behind, and no reader ever sees it empty
    from flightsrv.progress import Progress
    from flightsrv.table.schema import normalize_schema

    path = args.from_file
    with Progress(f"load {args.table.lower()}", total=1, unit=" files") as progress:
        with _input(path, args.table.lower(), normalize_schema(schema)) as reader:
            t = wh.create_table(args.table, schema, props, partition_by=partition_by,
                                data=reader)
        head = t.head()
        progress.advance(1, f"{path}: {head.live_rows} rows")
    print(f"created {t.name} at version {head.version} in {wh.uri}")
    print(f"loaded {head.live_rows} rows from {path} -> version {head.version}")
    return 0


def _check_partitioning(fields: list[str], schema: pa.Schema, table: str) -> None:
    """A usage error (exit 2, before anything is read or written) unless every
    ``--partition-by`` field is a transform of a column of ``schema``."""
    if not fields:
        return
    from flightsrv.table.manifest import schema_with_ids
    from flightsrv.table.partition import make_spec, parse_field
    from flightsrv.table.schema import normalize_schema, schema_to_json

    try:
        schema_json = schema_with_ids(schema_to_json(normalize_schema(schema)))[0]
        make_spec(0, [parse_field(f) for f in fields], schema_json, 999, table=table)
    except ConfigurationError as exc:
        raise UsageError(f"--partition-by: {exc}") from None


def _partition_fields(text: str | None) -> list[str]:
    """``--partition-by`` split at the commas outside parentheses; each field is parsed (and
    checked against the schema) by the table format."""
    if text is None:
        return []
    fields, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            fields.append(cur)
            cur = ""
        else:
            cur += ch
    fields.append(cur)
    fields = [f.strip() for f in fields]
    if depth != 0 or not all(fields):
        raise UsageError(f"--partition-by {text!r}: give fields separated by commas, e.g. "
                         "'day(ts),bucket(16,user_id)'")
    return fields


def cmd_append(args) -> int:
    for path in args.files:
        input_kind(path)  # every file exists and has a known format before anything runs
    t = open_warehouse(args).table(args.table)
    m, rows, nfiles = append_files(t, list(args.files), f"append {t.name}")
    if m is None:
        print(f"{t.name}: the {nfiles} file(s) hold no rows; nothing committed")
    else:
        print(f"{t.name}: appended {rows} rows from {nfiles} file(s) in one commit -> "
              f"version {m.version}, {m.live_rows} rows")
    return 0


def _limited(reader: pa.RecordBatchReader, limit: int | None) -> pa.RecordBatchReader:
    if limit is None:
        return reader

    def gen():
        left = limit
        for batch in reader:
            if left <= 0:
                return
            if batch.num_rows > left:
                batch = batch.slice(0, left)
            left -= batch.num_rows
            yield batch

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def cmd_scan(args) -> int:
    output.check_output_args(args)
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    if args.version is not None and args.as_of is not None:
        raise UsageError("give --version or --as-of, not both")
    if args.as_of is not None:
        from flightsrv.table.timestamps import parse_timestamp_ms

        try:
            parse_timestamp_ms(args.as_of)
        except ConfigurationError as exc:
            raise UsageError(f"--as-of: {exc}") from None
    if args.filter is not None:
        where_predicate(args.filter, "--filter")  # one expression, or a usage error
    t = open_warehouse(args).table(args.table)
    cols = None
    if args.columns:
        have = {n.lower(): n for n in t.schema.names}  # a name in any case, as in SQL
        cols = [have.get(c.strip().lower(), c.strip()) for c in args.columns.split(",")]
    try:
        reader = t.scan(cols, args.filter, version=args.version, as_of=args.as_of)
    except FlightsrvError as exc:
        raise _caret_at_option(exc, "--filter", args.filter) from None
    output.write_result(_limited(reader, args.limit), args)
    return 0


def _engine_session(wh, delete_mode: str | None = None):
    from flightsrv.engine.api import Role, Session
    from flightsrv.engine.duck import DuckEngine

    session = Session(session_id="cli", user="cli", role=Role.WRITER)
    if delete_mode:
        session.settings["delete_mode"] = delete_mode
    return DuckEngine(wh), session


def where_predicate(text: str, option: str = "--where") -> str:
    """``text`` checked to be one SQL expression (sqlglot, DuckDB dialect, as the SQL front
    end parses), returned ready to follow ``WHERE``: in parentheses on lines of its own, so
    nothing in it (a trailing ``--`` comment) reaches the rest of the statement. What it
    means, and whether it is boolean, DuckDB decides. UsageError if it is not one
    expression (empty, a query, a clause such as GROUP BY or LIMIT, several statements)."""
    import sqlglot
    from sqlglot import exp

    from flightsrv.sql.statements import DIALECT

    try:
        trees = sqlglot.parse(text, read=DIALECT)
    except sqlglot.errors.ParseError as exc:
        e = exc.errors[0] if exc.errors else {}
        where = f" at {e['highlight']!r} (column {e['col']})" if e.get("highlight") else ""
        raise UsageError(f"{option} {text!r} is not one SQL expression: unexpected "
                         f"input{where}") from None
    except sqlglot.errors.SqlglotError:
        raise UsageError(f"{option} {text!r} is not one SQL expression") from None
    trees = [t for t in trees if t is not None]
    if not trees:
        raise UsageError(f"{option} is empty: give a SQL predicate, e.g. \"id = 1\"")
    if len(trees) > 1:
        raise UsageError(f"{option} {text!r} holds {len(trees)} statements; give one SQL "
                         "predicate")
    tree = trees[0]
    if isinstance(tree, exp.Query) or not isinstance(tree, exp.Condition):
        raise UsageError(f"{option} {text!r} is not a condition but {tree.key.upper()}; give "
                         "a SQL condition, e.g. \"id = 1\"")
    if tree.find(exp.Placeholder, exp.Parameter):
        raise UsageError(f"{option} {text!r} holds a parameter ($1, ?); write the value")
    return f"(\n{text}\n)"


def _caret_at_option(exc: FlightsrvError, option: str,
                     text: str | None = None) -> FlightsrvError:
    """DuckDB's error for a statement built around an option's predicate points at a line
    of that statement (``LINE 2``: the predicate's own line, as ``where_predicate`` sets
    it; or the line holding ``text``, the predicate as given): point at the option
    instead, the caret under the same characters."""
    lines = exc.detail.split("\n")
    for i, line in enumerate(lines[:-1]):
        m = re.match(r"LINE \d+: ", line)
        if m is None or not lines[i + 1].startswith(" " * m.end()):
            continue
        rest, caret = line[m.end():], lines[i + 1][m.end():]
        at, end = 0, None
        if not line.startswith("LINE 2: "):
            at = rest.find(text.strip()) if text and text.strip() else -1
            end = at + len(text.strip())
        if at < 0 or len(caret) - len(caret.lstrip()) < at:
            continue
        lines[i] = f"{option}: {rest[at:end]}"
        lines[i + 1] = " " * (len(option) + 2) + caret[at:]
        return exc.with_detail("\n".join(lines))
    return exc


def cmd_delete(args) -> int:
    predicate = where_predicate(args.where)
    wh = open_warehouse(args)
    t = wh.table(args.table)
    engine, session = _engine_session(wh, args.mode)
    try:
        return _delete(args, t, engine, session, predicate)
    except FlightsrvError as exc:
        raise _caret_at_option(exc, "--where") from None
    finally:
        engine.close()


def _delete(args, t, engine, session, predicate: str) -> int:
    if args.dry_run:
        # DuckDB decides which rows match, exactly as the DELETE would
        res = engine.execute_query(f"SELECT count(*) FROM {_quote(t.name)} "
                                   f"WHERE {predicate}", session)
        n = res.reader.read_all().column(0)[0].as_py()
        print(f"dry run: would delete {n} rows from {t.name} (version "
              f"{t.head().version}); nothing changed")
        return 0
    # the DELETE as SQL would run it; a splice's certificate records source cli
    n = engine.delete_statement(f"DELETE FROM {_quote(t.name)} WHERE {predicate}",
                                session, mode=args.mode, source="cli")
    if n:
        print(f"deleted {n} rows from {t.name}; now at version {t.head().version}")
    else:
        print(f"no rows of {t.name} match; nothing committed")
    return 0


def cmd_history(args) -> int:
    output.check_output_args(args)
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    t = open_warehouse(args).table(args.table)
    keys = ("version", "created_at", "operation", "rows_added", "rows_deleted", "files_added",
            "files_removed", "live_rows")
    output.write_rows([{k: h.get(k) for k in keys} for h in t.history(limit=args.limit)], args,
                      columns=keys)
    return 0


def cmd_describe(args) -> int:
    import json

    from flightsrv.table import properties as P
    from flightsrv.table.partition import describe as partition_describe

    t = open_warehouse(args).table(args.table)
    head = t.head()
    schema = t.snapshot().schema
    props = dict(head.properties)
    created = dt.datetime.fromtimestamp(head.created_at_ms / 1000, tz=dt.timezone.utc)
    info = {
        "table": t.name, "warehouse": t.warehouse_uri, "version": head.version,
        "committed_at": created.isoformat(), "operation": head.operation,
        "live_rows": head.live_rows, "files": len(head.data_files),
        "format_version": head.stored_format,
        "partitioning": partition_describe(head.partition_spec, head.schema)
        if head.partition_spec.get("fields") else "none",
        "bytes": sum(f.size for f in head.data_files),
        "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                    for f in schema],
        "properties": [
            *({"name": p.name, "value": props.get(p.name), "default": p.describe_default(),
               "meaning": p.help} for p in P.PROPERTIES.values()),
            *({"name": k, "value": v, "default": "", "meaning": "user property"}
              for k, v in sorted(props.items()) if k not in P.PROPERTIES)],
    }
    if args.format == "json":
        print(json.dumps(info, indent=2))
        return 0
    for k in ("table", "warehouse", "version", "committed_at", "operation", "live_rows",
              "files", "bytes", "format_version", "partitioning"):
        print(f"{k:<15} {info[k]}")
    print("\ncolumns:")
    w = max(len(c["name"]) for c in info["columns"])
    for c in info["columns"]:
        print(f"  {c['name']:<{w}}  {c['type']}{'' if c['nullable'] else ' NOT NULL'}")
    print("\nproperties (set; defaults of the others in parentheses):")
    pw = max([29] + [len(p["name"]) for p in info["properties"]])
    for p in info["properties"]:
        prop = P.PROPERTIES.get(p["name"])
        if p["value"] is None:
            shown = f"({p['default']})"
        elif prop is not None and prop.kind == "size" and str(p["value"]).isdigit():
            shown = f"{p['value']} ({P.format_size(int(p['value']))})"
        else:
            shown = p["value"]
        print(f"  {p['name']:<{pw}} {shown}")
    return 0


def cmd_set_property(args) -> int:
    from flightsrv.table import properties as P

    if not args.assignments and not args.unset:
        raise UsageError("give KEY=VALUE assignments and/or --unset KEY")
    for name in args.unset or []:
        try:
            P.check_name(name)
        except ConfigurationError as exc:
            raise UsageError(f"--unset: {exc}") from None
    t = open_warehouse(args).table(args.table)
    given = parse_properties(args.assignments, t.schema.names, table=t.name, option="set-property")
    both = set(given) & set(args.unset or [])
    if both:
        raise UsageError(f"set and unset the same property: {', '.join(sorted(both))}")
    m = t.set_properties(**given, **{k: None for k in args.unset or []})
    for k, v in given.items():
        shown = v
        prop = P.PROPERTIES.get(k)
        if prop is not None and prop.kind == "size":
            shown = f"{v} ({P.format_size(int(v))})"
        print(f"{t.name}: {k} = {shown}")
    for k in args.unset or []:
        print(f"{t.name}: {k} unset")
    if m is None:
        print(f"{t.name}: nothing changed; still at version {t.head().version}")
    else:
        print(f"{t.name}: now at version {m.version}")
    return 0


def cmd_drop(args) -> int:
    wh = open_warehouse(args)
    from flightsrv.errors import TableNotFound

    try:
        wh.drop_table(args.table)
    except TableNotFound:
        if args.if_exists:
            print(f"{args.table}: no such table; nothing done")
            return 0
        raise
    print(f"dropped {args.table.lower()} (its files stay until `flightsrv table vacuum "
          f"{args.table.lower()}` deletes them after its grace)")
    return 0


def _print_result(result, args) -> None:
    render = _render()
    output.write_rows(render.result_rows(result), args, columns=render.result_columns(result))


def cmd_stats(args) -> int:
    output.check_output_args(args)
    t = open_warehouse(args).table(args.table)
    _print_result(t.stats(), args)
    return 0


def cmd_compact(args) -> int:
    from flightsrv.progress import Progress

    t = open_warehouse(args).table(args.table)
    kw = {"dry_run": args.dry_run}
    if args.sort_by:
        wanted = [c.strip() for c in args.sort_by.split(",")]
        have = {n.lower(): n for n in t.schema.names}  # a name in any case, as in SQL
        unknown = [c for c in wanted if c.lower() not in have]
        if unknown:
            raise UsageError(f"--sort-by: the table has no column {', '.join(unknown)} "
                             f"(columns: {', '.join(t.schema.names)})")
        kw["sort_by"] = [have[c.lower()] for c in wanted]
    if args.target_file_size:
        kw["target_file_size"] = args.target_file_size
    if not args.dry_run:
        kw["progress"] = Progress(f"compact {t.name}")
    result = t.compact(**kw)
    _print_result(result, args)
    return 0


def cmd_flush(args) -> int:
    t = open_warehouse(args).table(args.table)
    _print_result(t.flush_inlined(), args)
    return 0


def cmd_expire(args) -> int:
    if args.retain_last < 1:
        raise UsageError("--retain-last must be at least 1 (the head version is always kept)")
    t = open_warehouse(args).table(args.table)
    older = None
    if args.older_than is not None:
        older = _duration(args.older_than)
    result = t.expire_snapshots(older_than=older, retain_last=args.retain_last,
                                dry_run=args.dry_run)
    _print_result(result, args)
    return 0


def cmd_vacuum(args) -> int:
    from flightsrv.engine.maintenance import ALLOW_SHORT_GRACE, MIN_GRACE_HOURS
    from flightsrv.progress import Progress
    from flightsrv.table import properties as P

    # as SQL VACUUM: a dropped table's files are cleaned up here too
    t = open_warehouse(args).table(args.table, dropped_ok=True)
    props = t.log.head().properties  # a dropped table keeps its last properties
    if args.grace < MIN_GRACE_HOURS * 3600 and not P.value(props, ALLOW_SHORT_GRACE):
        raise ConfigurationError(
            f"vacuum --grace {format_duration(args.grace)} is below the minimum grace of "
            f"{MIN_GRACE_HOURS} hour: it can delete the files of a write that has not committed "
            f"yet; set the table property {ALLOW_SHORT_GRACE}=true to allow it",
            table=t.name, minimum_hours=MIN_GRACE_HOURS)
    kw = {"grace": _duration(args.grace), "dry_run": args.dry_run}
    if not args.dry_run:
        kw["progress"] = Progress(f"vacuum {t.name}")
    _print_result(t.vacuum(**kw), args)
    return 0


def cmd_purge(args) -> int:
    from flightsrv.progress import Progress

    if args.grace is not None and not args.expire:
        raise UsageError("--grace applies with --expire only (the objects it lets purge "
                         "delete are those expiry leaves unreferenced)")
    t = open_warehouse(args).table(args.table)
    kw = {} if args.grace is None else {"grace": _duration(args.grace)}
    _print_result(t.purge(expire=args.expire, progress=Progress(f"purge {t.name}"),
                          source="cli", **kw), args)
    return 0


def cmd_publish(args) -> int:
    from flightsrv.progress import Progress

    import argparse

    t = open_warehouse(args).table(args.table)
    result = t.publish(args.format, progress=Progress(f"publish {t.name}"))
    # --format names the mirror here, so the report is always an aligned table
    shown = argparse.Namespace(**{**vars(args), "format": "table", "output": None,
                                  "max_rows": 0})
    output.write_rows(_render().result_rows(result), shown)
    return 0


def cmd_upgrade(args) -> int:
    t = open_warehouse(args).table(args.table)
    head = t.head()
    if head.format_version >= 2:
        print(f"{t.name}: already table format {head.stored_format}; nothing done")
        return 0
    say(f"upgrading {t.name} to table format 2 ({len(head.data_files)} data files, "
        "metadata only)")
    m = t.upgrade()
    if m is None:  # a concurrent upgrade won
        print(f"{t.name}: already table format 2; nothing done")
        return 0
    print(f"{t.name}: upgraded from table format {head.format_version} to "
          f"{m.format_version} at version {m.version}; no data file was rewritten")
    return 0


def cmd_erasures(args) -> int:
    import sys

    from flightsrv.table.certificate import UNREADABLE

    t = open_warehouse(args).table(args.table)
    certs = t.erasures()
    for c in certs:  # listed with the others; the reason goes to stderr
        if c["status"] == UNREADABLE:
            print(f"warning: {c['error']}", file=sys.stderr)
    if args.json:
        output.write_json_documents(certs, args)
        return 0
    output.write_rows([{
        "id": c["id"], "operation": c["operation"], "source": c.get("source", ""),
        # the whole fingerprint, except in the table for people
        "request": (c.get("request_fingerprint") or "-")[:40 if args.format == "table" else None],
        "versions": f"{c['versions']['before']}->{c['versions']['after']}"
        if "versions" in c else "",
        "rows_removed": c.get("rows_removed", ""),
        "rewritten": len(c["objects_rewritten"]) if "objects_rewritten" in c else "",
        "deleted": len(c["objects_deleted"]) if "objects_deleted" in c else "",
        "scanned": (c.get("verification") or {}).get("objects_scanned", ""),
        "matches": (c.get("verification") or {}).get("matches", ""),
        "status": c["status"], "verified_at": c.get("verified_at") or ""} for c in certs], args)
    return 0


def cmd_erasure_status(args) -> int:

    t = open_warehouse(args).table(args.table)
    st = t.erasure_status()
    if args.json:
        output.write_json_documents([st.to_dict()], args)
        return 0
    output.write_rows(_render().result_rows(st), args)
    footer = (f"deadline {format_duration(st.deadline_ms / 1000)} (table property "
              f"erasure.deadline); {len(st.items)} item(s), {len(st.overdue)} overdue")
    # stdout of a machine format holds its rows only
    print(footer) if getattr(args, "format", "table") == "table" else say(footer)
    return 0


# -- the parser ------------------------------------------------------------------------


def add_parser(sub, command) -> None:
    """Register ``table`` and its subcommands; ``command(sub, name, help, func)`` makes a leaf
    parser that carries the global options."""
    from flightsrv.table import properties as P

    t = sub.add_parser("table", help="create, load, read, change and maintain tables",
                       description=TABLE_HELP)
    ts = t.add_subparsers(dest="table_command", required=True, metavar="COMMAND")

    def name_arg(p):
        p.add_argument("table", help="table name")

    p = command(ts, "list", "list the tables with version, rows, files and bytes", cmd_list)
    output.add_output_options(p)

    p = command(ts, "create", "create a table from a schema or from a data file", cmd_create)
    name_arg(p)
    p.add_argument("--schema", metavar="NAME:TYPE,...",
                   help="columns, e.g. id:int64,name:string,amount:decimal(12,2),ts:timestamptz")
    p.add_argument("--from-file", metavar="FILE",
                   help="take the columns from a Parquet, CSV, TSV or JSON-lines file and load "
                   "its rows")
    p.add_argument("--schema-only", action="store_true",
                   help="with --from-file: take the columns only, load no rows")
    p.add_argument("--property", action="append", metavar="KEY=VALUE",
                   help=f"table property (repeatable); known: {', '.join(P.PROPERTIES)}; "
                        f"your own under {P.USER_PREFIX}*; sizes as 64MB or 1GiB")
    p.add_argument("--partition-by", metavar="FIELDS",
                   help="hidden partitioning, as in SQL's PARTITIONED BY, e.g. "
                        "'day(ts),bucket(16,user_id)' (col, identity(col), year/month/day/"
                        "hour(col), bucket(N,col), truncate(W,col))")
    p.add_argument("--if-not-exists", action="store_true",
                   help="succeed without changes if the table exists")

    p = command(ts, "append", "append Parquet, CSV, TSV or JSON-lines files in one commit",
                cmd_append)
    name_arg(p)
    p.add_argument("files", nargs="+", metavar="FILE",
                   help=".parquet/.pq (or a directory of them), .csv/.csv.gz, .tsv, "
                        ".json/.jsonl/.ndjson (extension case does not matter)")

    for name, helptext, limit, fmt in (
            ("scan", "print rows (all, or --limit)", None, "jsonl"),
            ("head", "print the first rows", 10, "table")):
        p = command(ts, name, helptext, cmd_scan)
        name_arg(p)
        p.add_argument("--columns", metavar="COL,...", help="only these columns")
        p.add_argument("--filter", metavar="SQL", help="a SQL predicate, e.g. \"id > 10\"")
        p.add_argument("--version", type=int, help="time travel to this version")
        p.add_argument("--as-of", metavar="TIMESTAMP",
                       help="time travel to the last version at or before this ISO time")
        p.add_argument("--limit", type=int, default=limit, metavar="N",
                       help="at most N rows" + ("" if limit else " (default: all)"))
        output.add_output_options(p, default=fmt)

    p = command(ts, "delete", "delete the rows matching a SQL predicate", cmd_delete)
    name_arg(p)
    p.add_argument("--where", required=True, metavar="SQL",
                   help="which rows, as a SQL predicate decided by DuckDB (required)")
    p.add_argument("--mode", choices=["dv", "splice"],
                   help="dv: deletion vectors; splice: physical erasure "
                        "(default: the table's delete_mode property, else dv)")
    p.add_argument("--dry-run", action="store_true",
                   help="count the rows that would be deleted; change nothing")

    p = command(ts, "history", "the table's versions, newest first", cmd_history)
    name_arg(p)
    p.add_argument("--limit", type=int, metavar="N", help="at most N versions (default: all)")
    output.add_output_options(p)

    p = command(ts, "describe", "version, columns, rows and properties", cmd_describe)
    name_arg(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")

    p = command(ts, "set-property", "set or remove table properties (one commit)",
                cmd_set_property)
    name_arg(p)
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help=f"properties to set; known: {', '.join(P.PROPERTIES)}; "
                        f"your own under {P.USER_PREFIX}*")
    p.add_argument("--unset", action="append", metavar="KEY", help="remove KEY (repeatable)")

    p = command(ts, "drop", "drop a table (its files stay until vacuum)", cmd_drop)
    name_arg(p)
    p.add_argument("--if-exists", action="store_true", help="succeed if there is no such table")

    p = command(ts, "stats", "table health and a maintenance recommendation", cmd_stats)
    name_arg(p)
    output.add_output_options(p)

    p = command(ts, "compact", "rewrite small and delete-heavy files (OPTIMIZE)", cmd_compact)
    name_arg(p)
    p.add_argument("--sort-by", metavar="COL,...", help="rewrite every file sorted by these")
    p.add_argument("--target-file-size", type=_size_arg, metavar="SIZE",
                   help="output file size, e.g. 128MiB (default: the table's target_file_size "
                        "property, else 256MiB)")
    p.add_argument("--dry-run", action="store_true", help="report the plan; write nothing")
    output.add_output_options(p)

    p = command(ts, "flush", "write the inlined rows of small appends as Parquet (one commit)",
                cmd_flush)
    name_arg(p)
    output.add_output_options(p)

    p = command(ts, "expire", "delete old versions' manifests (time travel stops there)",
                cmd_expire)
    name_arg(p)
    p.add_argument("--older-than", type=parse_duration, metavar="DURATION",
                   help="only versions older than this, e.g. 7d, 12h, 3600 (seconds) "
                        "(default: no age limit)")
    p.add_argument("--retain-last", type=int, default=1, metavar="N",
                   help="always keep the newest N versions")
    p.add_argument("--dry-run", action="store_true", help="report what would expire; change "
                   "nothing")
    output.add_output_options(p)

    p = command(ts, "vacuum", "delete files no retained version references", cmd_vacuum)
    name_arg(p)
    p.add_argument("--grace", type=parse_duration, default=7 * 86400, metavar="DURATION",
                   help="keep unreferenced files younger than this, e.g. 7d, 2h (at least 1h "
                        "unless the table property vacuum.allow_short_grace=true) "
                        "(default: 7d)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    output.add_output_options(p)

    p = command(ts, "purge", "physically remove rows already marked deleted (erasure)",
                cmd_purge)
    name_arg(p)
    p.add_argument("--expire", action="store_true",
                   help="also expire versions and delete objects holding erased bytes")
    p.add_argument("--grace", type=parse_duration, metavar="DURATION",
                   help="with --expire, also delete unreferenced objects older than this, "
                        "e.g. 1h, 0 (default: table property erasure.orphan_grace, else 1h)")
    output.add_output_options(p)

    p = command(ts, "publish", "make every retained version readable as Delta Lake and/or "
                "Iceberg v3 (metadata only, under the table prefix)", cmd_publish)
    name_arg(p)
    p.add_argument("--format", choices=("delta", "iceberg", "all"), default="all",
                   help="which mirror to bring up to date (default: all)")

    p = command(ts, "upgrade", "move a format-1 table to table format 2 in one commit "
                "(field ids, manifest chunks; no data file is rewritten)", cmd_upgrade)
    name_arg(p)

    for name, func, text in (("erasures", cmd_erasures, "list the erasure certificates"),
                             ("erasure-status", cmd_erasure_status,
                              "deletions whose bytes are still stored, with age and deadline")):
        p = command(ts, name, text, func)
        name_arg(p)
        p.add_argument("--json", action="store_true",
                       help="one JSON document per line, as stored" if name == "erasures"
                       else "the status as one JSON document")
        output.add_output_options(p)


def _render():
    """The result renderers, imported when a result is shown: they import every
    maintenance and erasure module, which most commands never need."""
    from flightsrv.cli import render

    return render


def _duration(seconds: float):
    # imported here: the maintenance package loads compaction and the whole table format
    from flightsrv.table.maintenance.common import duration

    return duration(seconds)
