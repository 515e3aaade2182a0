"""``flightsrv table ...`` as a real subprocess on real local warehouses: loading CSV/JSON
into the table's own column types, listing with broken tables, delete predicates, dropped
tables' cleanup, erasure certificates and output of binary values."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import re

import pyarrow as pa
import pytest
from test_cli import failed, run, tree

from flightsrv import Warehouse

# -- CSV/JSON appends read the columns as the table's types --------------------------------

UTC = dt.timezone.utc
TYPED = [
    ("id:int64,amount:decimal(12,2)", "id,amount\n1,1.50\n2,2.25\n", "csv",
     [(1, decimal.Decimal("1.50")), (2, decimal.Decimal("2.25"))]),
    ("id:int32,v:float", "id,v\n1,1.5\n", "csv", [(1, 1.5)]),
    ("id:int32,v:float", '{"id": 1, "v": 1.5}\n', "jsonl", [(1, 1.5)]),
    ("id:int64,joined:timestamptz", "id,joined\n1,2024-01-02 03:04:05\n"
     "2,2024-01-02T03:04:05+02:00\n3,\n", "csv",
     [(1, dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
      (2, dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)), (3, None)]),
    ("id:int64,joined:timestamptz", '{"id": 1, "joined": "2024-01-02 03:04:05"}\n', "jsonl",
     [(1, dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC))]),
    ("id:int64,zip:string", "id,zip\n1,02134\n2,90210\n", "csv", [(1, "02134"), (2, "90210")]),
    ("id:int64,price:double", "id,price\n1,10\n2,20\n", "csv", [(1, 10.0), (2, 20.0)]),
]


@pytest.mark.parametrize("schema,text,ext,rows", TYPED,
                         ids=["decimal", "int32-float", "json-int32-float", "timestamptz",
                              "json-timestamptz", "zip-string", "whole-double"])
def test_append_reads_csv_and_json_as_the_table_types(tmp_path, schema, text, ext, rows):
    wh = str(tmp_path / "wh")
    src = tmp_path / f"in.{ext}"
    src.write_text(text)
    assert run("--warehouse", wh, "table", "create", "t", "--schema", schema).returncode == 0
    proc = run("--warehouse", wh, "table", "append", "t", src)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(wh).table("t").scan().read_all().to_pylist()
    assert sorted(tuple(r.values()) for r in got) == rows


@pytest.mark.parametrize("schema,text,ext,needles", [
    ("id:int64,amount:decimal(12,2)", "id,amount\n1,1.50\n2,x\n", "csv",
     ["column=amount", "'x'"]),
    ("id:int32,v:float", "id,v\n" + "1,1.5\n" * 200_000 + "3000000000,2\n", "csv",
     ["column=id", "3000000000"]),
    ("id:int64,joined:timestamptz", "id,joined\n1,2024-01-02 03:04:05\n2,\n3,notatime\n", "csv",
     ["column=joined", "row=3", "value=notatime"]),
], ids=["decimal", "int32-in-a-later-block", "timestamptz"])
def test_a_value_that_does_not_convert_names_file_and_column_and_commits_nothing(
        tmp_path, schema, text, ext, needles):
    wh = str(tmp_path / "wh")
    src = tmp_path / f"in.{ext}"
    src.write_text(text)
    assert run("--warehouse", wh, "table", "create", "t", "--schema", schema).returncode == 0
    before = tree(tmp_path / "wh" / "t")
    proc = run("--warehouse", wh, "table", "append", "t", src)
    assert proc.returncode == 1
    line = proc.stderr.splitlines()[-1]
    assert line.startswith("flightsrv: error: ") and "Traceback" not in proc.stderr
    for needle in [f"file={src}", *needles]:
        assert needle in line, (needle, line)
    assert tree(tmp_path / "wh" / "t").keys() == before.keys()
    assert Warehouse.open(wh).table("t").head().version == 0


def test_create_from_file_and_append_of_the_same_csv_agree(tmp_path):
    wh = str(tmp_path / "wh")
    src = tmp_path / "zips.csv"
    src.write_text("id,zip,at\n1,02134,2024-01-02 03:04:05\n")
    assert run("--warehouse", wh, "table", "create", "t", "--from-file", src).returncode == 0
    proc = run("--warehouse", wh, "table", "append", "t", src)
    assert proc.returncode == 0, proc.stderr
    rows = Warehouse.open(wh).table("t").scan().read_all().to_pylist()
    assert len(rows) == 2 and rows[0] == rows[1]


# -- table list shows the tables it cannot read ---------------------------------------------


def test_list_shows_a_broken_table_warns_and_exits_1(tmp_path):
    wh = tmp_path / "wh"
    w = Warehouse.open(str(wh))
    w.create_table("good", pa.schema([("a", pa.int64())]))
    w.create_table("broken", pa.schema([("a", pa.int64())]))
    (wh / "broken" / "_latest_manifest").write_text("garbage\n")
    proc = run("--warehouse", wh, "table", "list", "--format", "jsonl")
    assert proc.returncode == 1, proc.stderr
    rows = {r["table"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert rows["good"]["status"] == "ok" and rows["good"]["version"] == 0
    assert rows["broken"]["status"].startswith("broken: ")
    assert "broken/_latest_manifest" in rows["broken"]["status"]
    assert "Traceback" not in proc.stderr
    warning = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warning) == 1 and "table broken" in warning[0]
    assert "broken/_latest_manifest" in warning[0]
    # only the broken table left: still listed, still exit 1
    w.drop_table("good")
    proc = run("--warehouse", wh, "table", "list")
    assert proc.returncode == 1 and "broken" in proc.stdout and "(1 row)" in proc.stdout


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_list_shows_a_table_with_a_broken_manifest_chunk_with_the_others(tmp_path, damage):
    """A format-2 table whose manifest chunk does not parse or is gone stopped the whole
    listing (one ``flightsrv: error:`` line, no table listed); it is listed as broken now,
    as a broken pointer or head manifest is."""
    wh = tmp_path / "wh"
    w = Warehouse.open(str(wh))
    for name in ["aaa", "t", "zzz"]:
        w.create_table(name, pa.schema([("id", pa.int64())])).append(
            pa.table({"id": pa.array(range(100), pa.int64())}))
    chunks = sorted(p for p in (wh / "t" / "chunks").rglob("*") if p.is_file())
    assert chunks, "the table has manifest chunks"
    for chunk in chunks:
        if damage == "corrupt":
            chunk.write_text('{"bad":')
        else:
            chunk.unlink()
    proc = run("--warehouse", wh, "table", "list", "--format", "jsonl")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "error:" not in proc.stderr
    rows = {r["table"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert sorted(rows) == ["aaa", "t", "zzz"]
    assert rows["aaa"]["status"] == rows["zzz"]["status"] == "ok"
    assert rows["aaa"]["rows"] == 100
    status = rows["t"]["status"]
    assert status.startswith("broken: ") and "chunks/" in status
    assert ("CorruptObject" if damage == "corrupt" else "ObjectNotFound") in status
    warning = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warning) == 1 and "table t " in warning[0]


def test_list_of_no_tables_shows_the_columns(tmp_path):
    wh = tmp_path / "wh"
    Warehouse.open(str(wh)).create_table("t", pa.schema([("a", pa.int64())]))
    Warehouse.open(str(wh)).drop_table("t")
    proc = run("--warehouse", wh, "table", "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["table", "version"] and "(0 rows)" in proc.stdout


# -- delete --where is one SQL expression ---------------------------------------------------


@pytest.fixture
def wh15(tmp_path) -> str:
    path = str(tmp_path / "wh")
    t = Warehouse.open(path).create_table("t", pa.schema([("id", pa.int64()),
                                                          ("name", pa.string())]))
    t.append(pa.table({"id": [1, 1, 2, 3], "name": ["a", "b", "c", "d"]}))
    return path


@pytest.mark.parametrize("where,needle", [
    ("id > 0 GROUP BY id", "'GROUP BY'"), ("id > 100 LIMIT 0", "'LIMIT'"),
    ("id > 0 UNION ALL SELECT 99", "UNION"), ("", "empty"), ("   ", "empty"),
    ("id = 1; DROP TABLE t", "2 statements"), ("id = ?", "parameter"),
])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "delete"])
def test_delete_where_that_is_not_one_expression_is_a_usage_error(wh15, where, needle, dry):
    version = Warehouse.open(wh15).table("t").head().version
    proc = run("--warehouse", wh15, "table", "delete", "t", "--where", where,
               *(["--dry-run"] if dry else []))
    line = failed(proc, 2, "--where", needle)
    assert "sqlglot" not in line and "IndexError" not in line
    assert Warehouse.open(wh15).table("t").head().version == version


def test_delete_dry_run_and_delete_agree_even_with_a_trailing_comment(wh15):
    where = "id = 1 -- the duplicates"
    dry = run("--warehouse", wh15, "table", "delete", "t", "--where", where, "--dry-run")
    assert dry.returncode == 0 and "would delete 2 rows" in dry.stdout, dry.stderr
    proc = run("--warehouse", wh15, "table", "delete", "t", "--where", where)
    assert proc.returncode == 0 and "deleted 2 rows" in proc.stdout, proc.stderr
    assert Warehouse.open(wh15).table("t").head().live_rows == 2


# -- a dropped table's files are removed by the command the drop names --------------------


def test_table_vacuum_cleans_up_a_dropped_table_as_drop_says(tmp_path):
    wh = tmp_path / "wh"
    t = Warehouse.open(str(wh)).create_table("t", pa.schema([("id", pa.int64())]),
                                             {"vacuum.allow_short_grace": "true"})
    t.append(pa.table({"id": [1, 2, 3]}))
    proc = run("--warehouse", wh, "table", "drop", "t")
    assert proc.returncode == 0
    assert "`flightsrv table vacuum t`" in proc.stdout
    assert list((wh / "t" / "data").rglob("*.parquet"))
    dry = run("--warehouse", wh, "table", "vacuum", "t", "--grace", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert list((wh / "t" / "data").rglob("*.parquet"))
    proc = run("--warehouse", wh, "table", "vacuum", "t", "--grace", "0")
    assert proc.returncode == 0, proc.stderr
    assert not list((wh / "t" / "data").rglob("*.parquet"))
    failed(run("--warehouse", wh, "table", "vacuum", "nosuch"), 1, "no such table",
           "table=nosuch")


# -- erasure certificates say where the erasure came from -----------------------------------


def test_certificates_record_cli_and_sql_as_source_and_show_the_whole_fingerprint(tmp_path):
    wh = tmp_path / "wh"
    t = Warehouse.open(str(wh)).create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": [1, 2, 3]}))
    assert run("--warehouse", wh, "table", "delete", "t", "--where", "id = 1",
               "--mode", "splice").returncode == 0
    assert run("--warehouse", wh, "sql",
               "SET delete_mode = 'splice'; DELETE FROM t WHERE id = 2").returncode == 0
    proc = run("--warehouse", wh, "table", "erasures", "t", "--json")
    certs = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [c["source"] for c in certs] == ["cli", "sql"]
    proc = run("--warehouse", wh, "table", "erasures", "t", "--format", "jsonl")
    rows = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [r["source"] for r in rows] == ["cli", "sql"]
    assert [r["request"] for r in rows] == [c["request_fingerprint"] for c in certs]
    assert all(len(r["request"]) > 40 for r in rows)
    # --json writes to --output like every format, and is a format of its own
    for command in ("erasures", "erasure-status"):
        out = tmp_path / f"{command}.json"
        proc = run("--warehouse", wh, "table", command, "t", "--json", "-o", out)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr
        assert [json.loads(ln) for ln in out.read_text().splitlines()]
        failed(run("--warehouse", wh, "table", command, "t", "--json", "--format", "csv"), 2,
               "--json and --format exclude each other")


# -- flightsrv demo ----------------------------------------------------------------------


def test_demo_runs_again_in_the_same_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTSRV_WAREHOUSE"}
    first = run("demo", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    second = run("demo", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert re.search(r"at version \d+: 150000", second.stdout), second.stdout
    assert Warehouse.open(str(tmp_path / "warehouse")).table("walkthrough").count_rows() == \
        99976


def test_demo_never_replaces_a_users_table(tmp_path):
    """The demo re-creates only its own walkthrough table: one of the user's of that name is
    left whole and the demo refuses, naming it."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTSRV_WAREHOUSE"}
    wh = Warehouse.open(str(tmp_path / "warehouse"))
    wh.sql("CREATE TABLE walkthrough (id INTEGER, owner VARCHAR)")
    wh.sql("INSERT INTO walkthrough VALUES (1, 'me'), (2, 'you')")
    out = run("demo", cwd=tmp_path, env=env)
    assert out.returncode == 1 and "not the demo's" in out.stderr and "walkthrough" in out.stderr
    assert wh.sql("SELECT * FROM walkthrough ORDER BY id").to_pylist() == [
        {"id": 1, "owner": "me"}, {"id": 2, "owner": "you"}]


# -- binary values in csv output --------------------------------------------------------------


@pytest.mark.parametrize("command", [["table", "scan", "b"], ["sql", "SELECT * FROM b"]],
                         ids=["scan", "sql"])
def test_csv_writes_binary_as_hex(tmp_path, command):
    wh = tmp_path / "wh"
    t = Warehouse.open(str(wh)).create_table("b", pa.schema([("id", pa.int64()),
                                                             ("payload", pa.binary())]))
    t.append(pa.table({"id": [1, 2], "payload": pa.array([b"\xff\x00", None], pa.binary())}))
    proc = run("--warehouse", wh, *command, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ['"id","payload"', '1,"\\xff00"', "2,"]



def _append_file(tmp_path, schema: str, text: str, ext: str = "jsonl"):
    """Create table t with ``schema`` and append an input file (``in.<ext>``) holding
    ``text``: (warehouse, input file, the append's process)."""
    wh = tmp_path / "wh"
    src = tmp_path / f"in.{ext}"
    src.write_text(text)
    assert run("--warehouse", wh, "table", "create", "t", "--schema", schema).returncode == 0
    return wh, src, run("--warehouse", wh, "table", "append", "t", src)


@pytest.mark.parametrize("ext,text", [
    ("csv", 'id,b\n1,\\x00ff\n2,"\\x"\n3,\n4,plain\n5,\\xABcd\n'),
    ("jsonl", '{"id": 1, "b": "AP8="}\n{"id": 2, "b": ""}\n{"id": 3, "b": null}\n'
              '{"id": 4, "b": "cGxhaW4="}\n{"id": 5, "b": "q80="}\n'),
], ids=["csv-hex", "jsonl-base64"])
def test_append_decodes_binary_as_scan_writes_it(tmp_path, ext, text):
    """CSV: \\x + hex is bytes, text without \\x its UTF-8 bytes; JSON lines: base64."""
    wh, _, proc = _append_file(tmp_path, "id:int32,b:binary", text, ext)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("t").to_table().sort_by("id").to_pylist()
    assert [r["b"] for r in got] == [b"\x00\xff", b"", None, b"plain", b"\xab\xcd"]


@pytest.mark.parametrize("ext,text,value", [
    ("csv", "id,b\n1,\\x00\n2,\\x0g\n", "value=\\x0g"),
    ("csv", "id,b\n1,\\x00\n2,\\x000\n", "value=\\x000"),
    ("jsonl", '{"id": 1, "b": "AA=="}\n{"id": 2, "b": "AP8"}\n', "value=AP8"),
], ids=["csv-not-hex", "csv-odd", "jsonl-not-base64"])
def test_a_binary_value_that_does_not_decode_names_file_column_row_and_value(
        tmp_path, ext, text, value):
    wh, src, proc = _append_file(tmp_path, "id:int32,b:binary", text, ext)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.splitlines()[-1]
    assert line.startswith("flightsrv: error: "), line
    for needle in [f"file={src}", "column=b", "row=2", value]:
        assert needle in line, (needle, line)
    assert Warehouse.open(str(wh)).table("t").head().version == 0


@pytest.mark.parametrize("schema,line,row", [
    ("id:int64,dt:date", '{"id": 1, "dt": "2024-02-29"}', (1, dt.date(2024, 2, 29))),
    ("id:int64,ts:timestamp", '{"id": 1, "ts": "2024-01-01T01:02:03.456789"}',
     (1, dt.datetime(2024, 1, 1, 1, 2, 3, 456789))),
    ("id:int64,tz:timestamptz", '{"id": 1, "tz": "2024-01-01T02:00:00+02:00"}',
     (1, dt.datetime(2024, 1, 1, tzinfo=UTC))),
    ("id:int64,dec:decimal(20,5)", '{"id": 1, "dec": "-999999999999999.99999"}',
     (1, decimal.Decimal("-999999999999999.99999"))),
    ("id:int64,d:double", '{"id": 1, "d": "Infinity"}', (1, math.inf)),
    ("id:int64,d:double", '{"id": 1, "d": "-Infinity"}', (1, -math.inf)),
    ("id:int64,s:string", '{"id": 1, "s": 12.5}', (1, "12.5")),
], ids=["date", "timestamp", "timestamptz", "decimal", "inf", "-inf", "number-to-string"])
def test_jsonl_append_reads_what_scan_writes(tmp_path, schema, line, row):
    wh, _, proc = _append_file(tmp_path, schema, line + '\n{"id": 2}\n')
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("t").to_table().sort_by("id").to_pylist()
    assert [tuple(r.values()) for r in got] == [row, (2, None)]


def test_jsonl_nan_string_loads_into_a_double(tmp_path):
    wh, _, proc = _append_file(tmp_path, "id:int64,d:double", '{"id": 1, "d": "NaN"}\n')
    assert proc.returncode == 0, proc.stderr
    assert math.isnan(Warehouse.open(str(wh)).table("t").to_table().column("d")[0].as_py())


def test_a_jsonl_value_that_does_not_convert_names_file_column_row_and_value(tmp_path):
    wh, src, proc = _append_file(tmp_path, "id:int64,dt:date",
                                 '{"id": 1, "dt": "2024-01-01"}\n\n{"id": 2, "dt": "nope"}\n')
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.splitlines()[-1]
    for needle in [f"file={src}", "column=dt", "row=2", 'value="nope"']:
        assert needle in line, (needle, line)
    assert Warehouse.open(str(wh)).table("t").head().version == 0


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_scan_then_append_into_the_same_schema_gives_the_same_rows(tmp_path, fmt):
    """CLI.md: what ``table scan --format csv|jsonl`` writes appends back unchanged, text
    that spells NULL, NaN and infinities, empty and NULL binary included."""
    wh = tmp_path / "wh"
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("d", pa.float64()),
                        ("b", pa.binary()), ("day", pa.date32()),
                        ("amount", pa.decimal128(12, 2)),
                        ("at", pa.timestamp("us", tz="UTC"))])
    rows = pa.table({
        "id": [1, 2, 3, 4],
        "s": ["NA", "NULL", "", None],
        "d": [math.nan, math.inf, -math.inf, None],
        "b": [b"\x00\xff", b"", None, b"NA"],
        "day": [dt.date(2024, 2, 29), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)],
        "amount": [decimal.Decimal("-9999999999.99"), decimal.Decimal("0.01"), None,
                   decimal.Decimal("0.00")],
        "at": [dt.datetime(2024, 1, 1, 1, 2, 3, 456789, tzinfo=UTC), None,
               dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(2038, 1, 19, tzinfo=UTC)],
    }, schema=schema)
    w = Warehouse.open(str(wh))
    w.create_table("src", schema).append(rows)
    w.create_table("dst", schema)
    out = tmp_path / f"out.{fmt}"
    proc = run("--warehouse", wh, "table", "scan", "src", "--format", fmt, "--output", out)
    assert proc.returncode == 0, proc.stderr
    proc = run("--warehouse", wh, "table", "append", "dst", out)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("dst").to_table().sort_by("id")
    assert got.schema == schema
    # NaN != NaN: compare the doubles by their text
    def norm(t):
        return [{**r, "d": repr(r["d"])} for r in t.to_pylist()]
    assert norm(got) == norm(rows)


TEMPORAL = ("id INT, d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, s TIMESTAMP_S, ms TIMESTAMP_MS, "
            "ns TIMESTAMP_NS, t TIME")
TEMPORAL_ROWS = (
    "(1, 'infinity', '-infinity', 'infinity', 'infinity', '-infinity', 'infinity', "
    "'24:00:00'), "
    "(2, '0044-03-15 (BC)', '0044-03-15 (BC) 10:00:00', '0001-01-01 (BC) 23:59:59.5+00', "
    "'10000-01-01', '0044-03-15 (BC) 10:00:00.123', '-infinity', '00:00:00'), "
    "(3, '2024-02-29', '2024-02-29 01:02:03.456789', '2024-02-29 01:02:03.456789+00', "
    "'2024-02-29 01:02:03', '2024-02-29 01:02:03.456', '2024-02-29 01:02:03.456789123', "
    "'23:59:59.999999'), "
    "(4, '10000-01-01', '294246-12-31', '-infinity', '-infinity', 'infinity', '1970-01-01', "
    "NULL), "
    "(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")


def _temporal_warehouse(tmp_path):
    wh = tmp_path / "wh"
    for sql in [f"CREATE TABLE src ({TEMPORAL})", f"INSERT INTO src VALUES {TEMPORAL_ROWS}",
                f"CREATE TABLE dst ({TEMPORAL})"]:
        proc = run("--warehouse", wh, "sql", sql)
        assert proc.returncode == 0, proc.stderr
    return wh


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_dates_python_cannot_hold_are_written_by_scan_and_append_back(tmp_path, fmt):
    """BC dates, years past 9999, ±infinity and TIME 24:00:00 (which DuckDB and the table
    format hold, Python's datetime not) made ``--format jsonl`` fail (OverflowError) and
    ``--format csv`` write ``<value out of range: ...>``, a wrong -infinity TIMESTAMPTZ or a
    ``-0043`` year that the append refused. DuckDB spells them now, and the append reads
    every value back unchanged, next to ordinary values in the same column."""
    wh = _temporal_warehouse(tmp_path)
    out = tmp_path / f"out.{fmt}"
    proc = run("--warehouse", wh, "table", "scan", "src", "--format", fmt, "--output", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    for spelled in ["infinity", "0044-03-15 (BC)", "10000-01-01", "24:00:00",
                    "0001-01-01 (BC) 23:59:59.5+00"]:
        assert spelled in text, (spelled, text)
    proc = run("--warehouse", wh, "table", "append", "dst", out)
    assert proc.returncode == 0, proc.stderr
    proc = run("--warehouse", wh, "sql",
               "SELECT count(*) AS n FROM ((SELECT * FROM src EXCEPT ALL SELECT * FROM dst) "
               "UNION ALL (SELECT * FROM dst EXCEPT ALL SELECT * FROM src))", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["0"]


@pytest.mark.parametrize("fmt", ["table", "line", "json"])
def test_dates_python_cannot_hold_print_in_every_format(tmp_path, fmt):
    wh = _temporal_warehouse(tmp_path)
    for args in [("table", "scan", "src"), ("sql", "SELECT * FROM src ORDER BY id")]:
        proc = run("--warehouse", wh, *args, "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        for spelled in ["infinity", "-infinity", "0044-03-15 (BC)", "10000-01-01", "24:00:00",
                        "294246-12-31 00:00:00", "2024-02-29"]:
            assert spelled in proc.stdout, (spelled, proc.stdout)
    if fmt == "json":
        rows = json.loads(proc.stdout)
        assert rows[0]["d"] == "infinity" and rows[1]["d"] == "0044-03-15 (BC)"
        assert rows[3]["tz"] == "-infinity" and rows[2]["d"] == "2024-02-29"


def test_a_nanosecond_timestamptz_column_prints_and_takes_sql_writes(tmp_path):
    """A CSV whose timestamps carry a zone and a fraction is guessed ``timestamp[ns, UTC]``
    (DuckDB's TIMESTAMPTZ_NS): every output format prints it (DuckDB has no
    ``isfinite(TIMESTAMPTZ_NS)``: each failed with an internal BinderException), and a SQL
    INSERT of a TIMESTAMPTZ casts to it as in DuckDB (refused before: session 29)."""
    src = tmp_path / "in.csv"
    src.write_text("id,ts\n1,2026-01-01 10:00:00.123456789Z\n")
    wh = tmp_path / "wh"
    proc = run("--warehouse", wh, "table", "create", "t", "--from-file", src)
    assert proc.returncode == 0, proc.stderr
    proc = run("--warehouse", wh, "sql",
               "INSERT INTO t VALUES (2, TIMESTAMPTZ '2026-01-02 00:00:00+00'), (3, NULL)")
    assert proc.returncode == 0, proc.stderr
    for fmt in ("table", "csv", "jsonl", "line", "json"):
        for args in [("table", "scan", "t"), ("sql", "SELECT * FROM t ORDER BY id")]:
            proc = run("--warehouse", wh, *args, "--format", fmt)
            assert proc.returncode == 0, (fmt, args, proc.stderr)
            assert "2026-01-01" in proc.stdout and "2026-01-02" in proc.stdout, proc.stdout
    proc = run("--warehouse", wh, "sql", "SELECT id, epoch_ns(ts) AS ns FROM t ORDER BY id",
               "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["1,1767261600123456789", "2,1767312000000000000",
                                            "3,"]


def test_jsonl_numbers_load_only_when_exact(tmp_path):
    """JSON lines into integer and decimal columns: a value DuckDB's cast would round
    (``9.999`` into decimal(12,2), ``1.7`` into int8) or reinterpret (``true``) fails naming
    the file, column, row and value, as the CSV reader refuses it, and nothing commits;
    exact spellings load (found in session 28: JSONL stored 10.00 and 2 silently)."""
    wh = str(tmp_path / "wh")
    run("--warehouse", wh, "table", "create", "d", "--schema",
        "id:int64,amt:decimal(12,2),i8:int8")
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"id": 1, "amt": "9.99", "i8": 1}\n{"id": 2, "amt": 1.5, "i8": 2.0}\n'
                  '{"id": 3, "amt": "1e1", "i8": null}\n{"id": 4, "amt": null, "i8": -7}\n')
    proc = run("--warehouse", wh, "table", "append", "d", ok)
    assert proc.returncode == 0, proc.stderr
    for n, (amt, i8, column, value) in enumerate([
            ('"9.999"', "1", "amt", '"9.999"'), ("9.999", "1", "amt", "9.999"),
            ("1", "1.7", "i8", "1.7"), ("1", "true", "i8", "true")]):
        bad = tmp_path / f"bad{n}.jsonl"
        bad.write_text(f'{{"id": 5, "amt": 1, "i8": 1}}\n{{"id": 6, "amt": {amt}, "i8": {i8}}}\n')
        proc = run("--warehouse", wh, "table", "append", "d", bad)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        line = proc.stderr.splitlines()[-1]  # after the progress line
        for needle in ("flightsrv: error: ", "does not convert exactly", f"column={column}",
                       "row=2", f"value={value})", f"file={bad}"):  # as written (JSON)
            assert needle in line, (needle, line)
    proc = run("--warehouse", wh, "sql", "SELECT id, amt, i8 FROM d ORDER BY id",
               "--format", "csv")
    assert proc.stdout.splitlines()[1:] == ["1,9.99,1", "2,1.50,2", "3,10.00,", "4,,-7"]


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_dates_python_cannot_hold_inside_nested_values_print(tmp_path, fmt):
    """A list or struct holding such a date (``[DATE 'infinity']``) failed every format with
    an internal ``OverflowError`` naming nothing (found in session 28); DuckDB's ``to_json``
    spells the whole value now, and the JSON lines append back into a DATE[] column."""
    wh = str(tmp_path / "wh")
    run("--warehouse", wh, "table", "create", "t", "--schema", "id:int64")
    sql = ("SELECT 1 AS id, [DATE 'infinity', DATE '2020-01-02'] AS l, "
           "{'a': TIMESTAMP '-infinity', 'b': DATE '0044-03-15 (BC)'} AS s")
    proc = run("--warehouse", wh, "sql", sql, "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    for spelled in ('"infinity"', '"2020-01-02"', '"-infinity"', '"0044-03-15 (BC)"'):
        assert spelled in proc.stdout, (spelled, proc.stdout)
    if fmt == "jsonl":
        row = json.loads(proc.stdout)
        assert row["l"] == ["infinity", "2020-01-02"]
        (tmp_path / "rows.jsonl").write_text(json.dumps({"id": 1, "l": row["l"]}) + "\n")
        run("--warehouse", wh, "sql", "CREATE TABLE d (id BIGINT, l DATE[])")
        proc = run("--warehouse", wh, "table", "append", "d", tmp_path / "rows.jsonl")
        assert proc.returncode == 0, proc.stderr
        proc = run("--warehouse", wh, "sql", "SELECT l = [DATE 'infinity', DATE '2020-01-02'] "
                   "AS same FROM d", "--format", "csv")
        assert proc.stdout.splitlines()[1:] == ["true"], proc.stdout


def test_jsonl_scan_then_append_keeps_nested_columns(tmp_path):
    """Maps are written as JSON objects (keys as text, as DuckDB's ``to_json`` writes them)
    and append back into MAP columns, whatever the key type; structs and lists too. A map
    was written as a list of [key, value] pairs, which the append refused, and ``sql``'s
    table output failed on a map with date keys."""
    wh = tmp_path / "wh"
    schema = pa.schema([("id", pa.int64()),
                        ("m", pa.map_(pa.string(), pa.int64())),
                        ("md", pa.map_(pa.date32(), pa.list_(pa.float64()))),
                        ("mi", pa.map_(pa.int32(), pa.string())),
                        ("st", pa.struct([("a", pa.int64()), ("b", pa.string())])),
                        ("l", pa.list_(pa.string()))])
    rows = pa.table({
        "id": [1, 2, 3],
        "m": [[("a", 1), ("b", 2)], [], None],
        "md": [[(dt.date(2024, 1, 1), [1.5, math.inf])], None, [(dt.date(1, 1, 1), [])]],
        "mi": [[(-1, "x"), (7, None)], None, [(0, "")]],
        "st": [{"a": 1, "b": "x"}, None, {"a": None, "b": None}],
        "l": [["a", None], [], None],
    }, schema=schema)
    w = Warehouse.open(str(wh))
    w.create_table("src", schema).append(rows)
    w.create_table("dst", schema)
    out = tmp_path / "out.jsonl"
    proc = run("--warehouse", wh, "table", "scan", "src", "--format", "jsonl", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert '"m": {"a": 1, "b": 2}' in out.read_text()
    proc = run("--warehouse", wh, "table", "append", "dst", out)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("dst").to_table().sort_by("id")
    assert got.schema == schema
    assert got.to_pylist() == rows.to_pylist()
    proc = run("--warehouse", wh, "sql", "SELECT md FROM dst WHERE id = 1")
    assert proc.returncode == 0 and '{"2024-01-01": [1.5, "Infinity"]}' in proc.stdout, \
        proc.stderr


# -- small output fixes ---------------------------------------------------------------------


def test_jsonl_metrics_keep_their_types_and_the_deadline_is_a_duration(tmp_path):
    wh = tmp_path / "wh"
    Warehouse.open(str(wh)).create_table("u", pa.schema([("id", pa.int64())]),
                                         {"erasure.deadline": "1h"})
    proc = run("--warehouse", wh, "table", "compact", "u", "--dry-run", "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    values = {r["metric"]: r["value"] for r in map(json.loads, proc.stdout.splitlines())}
    assert values["dry_run"] is True and values["read_version"] == 0
    proc = run("--warehouse", wh, "table", "erasure-status", "u")
    assert proc.returncode == 0, proc.stderr
    assert "deadline 1h (table property erasure.deadline)" in proc.stdout
    proc = run("--warehouse", wh, "table", "erasure-status", "u", "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():  # only rows on stdout: each line is JSON
        json.loads(line)
    assert "deadline 1h" in proc.stderr


def test_bad_values_on_the_command_line_exit_2_and_change_nothing(tmp_path):
    wh = tmp_path / "wh"
    assert run("--warehouse", wh, "table", "create", "t", "--schema",
               "id:int64,ts:timestamp").returncode == 0
    before = tree(wh)
    for args, needle in [
        (("table", "scan", "t", "--version", "0", "--as-of", "2030-01-01"), "not both"),
        (("table", "scan", "t", "--as-of", "notatime"), "--as-of"),
        (("table", "compact", "t", "--sort-by", "nosuch"), "nosuch"),
        (("table", "create", "p", "--schema", "id:int64", "--partition-by", "day(nosuch)"),
         "nosuch"),
        (("table", "create", "p", "--schema", "id:int64", "--partition-by", "bogus(id)"),
         "--partition-by"),
    ]:
        failed(run("--warehouse", wh, *args), 2, needle)
    assert tree(wh) == before


def test_csv_written_by_scan_appends_back_with_nulls_and_empty_strings(tmp_path):
    """``--format csv`` writes NULL as an empty field and '' as ""; appending that file
    must give back the same rows (empty fields were loaded as '')."""
    wh = tmp_path / "wh"
    w = Warehouse.open(str(wh))
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("n", pa.int32())])
    rows = pa.table({"id": [1, 2, 3, 4], "s": [None, "", "x", "a,b"], "n": [None, 1, 2, None]},
                    schema=schema)
    w.create_table("src", schema).append(rows)
    w.create_table("dst", schema)
    proc = run("--warehouse", wh, "table", "scan", "src", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    csv = tmp_path / "out.csv"
    csv.write_text(proc.stdout)
    proc = run("--warehouse", wh, "table", "append", "dst", csv)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("dst").to_table().sort_by("id")
    assert got.to_pylist() == rows.to_pylist()



@pytest.mark.parametrize("how", ["append", "create"])
def test_csv_with_a_quote_that_never_closes_is_refused_and_loads_nothing(tmp_path, how):
    """pyarrow reads a quoted value that never closes as the rest of the file, rows and
    all, without a word: the load fails naming the file and the row, and commits nothing.
    A quoted value over two lines and a quote inside an unquoted value still load."""
    wh = tmp_path / "wh"
    bad = tmp_path / "bad.csv"
    bad.write_text('id,name\n1,"ann\n2,bob\n3,cy\n')
    good = tmp_path / "good.csv"
    # (a value longer than Python's CSV field limit, a space after a closing quote: both
    # read by pyarrow and DuckDB, so no reason to refuse the file)
    good.write_text(f'id,name\n0,{"x" * 200_000}\n3,"ab" \n1,"a\nb"\n2,27" tv\n')
    if how == "append":
        Warehouse.open(str(wh)).sql("CREATE TABLE q (id BIGINT, name VARCHAR)")
        before = tree(wh)
        out = run("--warehouse", wh, "table", "append", "q", bad)
        assert out.returncode == 1 and "quoted value never closes" in out.stderr
        assert "row=1" in out.stderr and "Traceback" not in out.stderr
        assert tree(wh) == before
        proc = run("--warehouse", wh, "table", "append", "q", good)
    else:
        out = run("--warehouse", wh, "table", "create", "q", "--from-file", bad)
        assert out.returncode == 1 and "quoted value never closes" in out.stderr
        proc = run("--warehouse", wh, "table", "create", "q", "--from-file", good)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).sql("SELECT * FROM q ORDER BY id").to_pylist()
    assert got == [{"id": 0, "name": "x" * 200_000}, {"id": 1, "name": "a\nb"},
                   {"id": 2, "name": '27" tv'}, {"id": 3, "name": "ab "}]


@pytest.mark.parametrize("how", ["append", "create"])
def test_csv_null_is_only_an_empty_field_not_na_null_or_nan(tmp_path, how):
    """pyarrow's default NULL spellings are values in our CSV: 'NA', 'NULL', 'null', 'N/A'
    stay text and NaN/nan/inf are floats; only an unquoted empty field is NULL."""
    wh = tmp_path / "wh"
    src = tmp_path / "in.csv"
    src.write_text('id,s,d,f\n1,NA,NaN,nan\n2,NULL,inf,-Infinity\n3,null,nan,1.5\n'
                   '4,N/A,,\n5,"",1,2\n6,,1,2\n')
    if how == "append":
        assert run("--warehouse", wh, "table", "create", "t", "--schema",
                   "id:int32,s:string,d:double,f:float").returncode == 0
        proc = run("--warehouse", wh, "table", "append", "t", src)
    else:
        proc = run("--warehouse", wh, "table", "create", "t", "--from-file", src)
    assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("t").to_table().sort_by("id").to_pylist()
    text = [(r["id"], r["s"]) for r in got]
    assert text == [(1, "NA"), (2, "NULL"), (3, "null"), (4, "N/A"), (5, ""), (6, None)]
    floats = [(r["d"], r["f"]) for r in got]
    assert all(math.isnan(x) for x in (floats[0][0], floats[0][1], floats[2][0]))
    assert floats[1] == (math.inf, -math.inf) and floats[2][1] == 1.5
    assert floats[3] == (None, None) and floats[4] == (1.0, 2.0)


def test_a_vacuum_dry_run_with_nothing_to_delete_shows_its_columns(tmp_path):
    wh = tmp_path / "wh"
    Warehouse.open(str(wh)).create_table("v", pa.schema([("id", pa.int64())]))
    proc = run("--warehouse", wh, "table", "vacuum", "v", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would_delete" in proc.stdout and "(no columns)" not in proc.stdout


def test_create_from_file_that_fails_to_load_leaves_no_table_and_no_files(tmp_path):
    """The table and the file's rows are one commit: a bad value past the first block
    (types are guessed from the first block) fails the command and nothing remains."""
    src = tmp_path / "late_bad.csv"
    lines = ["id,name"] + [f"{i},name{i}" for i in range(120_000)] + ["oops,late"]
    src.write_text("\n".join(lines) + "\n")
    wh = tmp_path / "wh"
    proc = run("--warehouse", wh, "table", "create", "t", "--from-file", src)
    assert proc.returncode == 1 and "late_bad.csv" in proc.stderr, proc.stderr
    w = Warehouse.open(str(wh))
    assert "t" not in w.list_tables()
    assert not list((wh / "t").rglob("*.parquet"))  # what it wrote was removed
    ok = tmp_path / "ok.csv"
    ok.write_text("id,name\n1,a\n2,b\n")
    proc = run("--warehouse", wh, "table", "create", "t", "--from-file", ok)
    assert proc.returncode == 0, proc.stderr
    assert "loaded 2 rows" in proc.stdout
    assert Warehouse.open(str(wh)).table("t").head().version == 0  # one commit


@pytest.mark.parametrize("command", [["table", "vacuum", "t", "--grace", "99999999999d"],
                                     ["table", "purge", "t", "--expire", "--grace",
                                      "99999999999w"],
                                     ["table", "expire", "t", "--older-than", "99999999999w"],
                                     ["warehouse", "vacuum", "--grace", "99999999999d"],
                                     ["sql", "VACUUM t RETAIN 1000000000000 HOURS"]],
                         ids=["vacuum", "purge", "expire", "warehouse-vacuum", "sql-vacuum"])
def test_a_duration_longer_than_python_holds_means_keep_everything(tmp_path, command):
    """A huge duration (a way to say "keep everything") failed with an unexpected
    OverflowError; it is the longest duration, so nothing is old enough to go."""
    wh = tmp_path / "wh"
    t = Warehouse.open(str(wh)).create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": [1, 2, 3]}))
    t.delete("id = 2")
    proc = run("--warehouse", wh, *command)
    assert proc.returncode == 0 and "Error" not in proc.stderr, proc.stderr
    t = Warehouse.open(str(wh)).table("t")
    if "purge" not in command:  # PURGE ... EXPIRE expires what reaches the erased bytes
        assert [h["version"] for h in t.history()][-1] == 0  # nothing expired
    assert sorted(t.to_table().column("id").to_pylist()) == [1, 3]


def test_purge_with_nothing_to_rewrite_says_so(tmp_path):
    """The total row names the committed version, or says none was (was "version None")."""
    wh = tmp_path / "wh"
    t = Warehouse.open(str(wh)).create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": [1, 2, 3]}))
    proc = run("--warehouse", wh, "table", "purge", "t", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    total = [ln for ln in proc.stdout.splitlines() if ln.startswith('"total"')]
    assert len(total) == 1 and '"no new version (read v1)"' in total[0], proc.stdout
    assert "None" not in proc.stdout
    # --grace means something with --expire only: alone it is a usage error, nothing runs
    # (it was accepted and ignored: session 29)
    before = Warehouse.open(str(wh)).table("t").head().version
    proc = run("--warehouse", wh, "table", "purge", "t", "--grace", "0")
    assert proc.returncode == 2 and "--grace applies with --expire only" in proc.stderr
    assert Warehouse.open(str(wh)).table("t").head().version == before


def test_column_names_in_options_match_in_any_case(tmp_path):
    """--sort-by and --columns take a column's name in any case, as SQL does (the check
    passed ID, then compaction failed on it; scan refused it)."""
    wh = tmp_path / "wh"
    w = Warehouse.open(str(wh))
    w.sql("CREATE TABLE s (id INTEGER, Name VARCHAR)")
    w.sql("INSERT INTO s VALUES (2, 'b'), (1, 'a')")
    proc = run("--warehouse", wh, "table", "compact", "s", "--sort-by", "ID")
    assert proc.returncode == 0, proc.stderr
    proc = run("--warehouse", wh, "table", "scan", "s", "--columns", "NAME,ID",
               "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(ln) for ln in proc.stdout.splitlines()] == [
        {"Name": "a", "id": 1}, {"Name": "b", "id": 2}]


def test_durations_and_intervals_print_as_duckdb_spells_them_and_read_back(tmp_path):
    """A duration column (and a SQL INTERVAL) is DuckDB's INTERVAL text in every text
    format (it was seconds, microseconds, a timedelta or a Python repr by format, and CSV
    of an INTERVAL failed), and what scan writes appends back exactly."""
    wh = tmp_path / "wh"
    schema = pa.schema([("id", pa.int64()), ("d", pa.duration("us"))])
    t = Warehouse.open(str(wh)).create_table("dur", schema)
    t.append(pa.table({"id": [1, 2], "d": pa.array([dt.timedelta(seconds=90),
                                                     dt.timedelta(days=2, microseconds=5)],
                                                    pa.duration("us"))}))
    for command in (["table", "scan", "dur"], ["sql", "SELECT * FROM dur ORDER BY id"]):
        for fmt in ("table", "line", "csv", "jsonl"):
            proc = run("--warehouse", wh, *command, "--format", fmt)
            assert proc.returncode == 0, proc.stderr
            # (DuckDB's INTERVAL of a duration holds microseconds only: 48:00:00.000005)
            assert "00:01:30" in proc.stdout and ("48:00:00.000005" in proc.stdout or
                                                  "2 days 00:00:00.000005" in proc.stdout), \
                (command, fmt, proc.stdout)
    for fmt in ("jsonl", "csv"):
        out = tmp_path / f"dur.{fmt}"
        assert run("--warehouse", wh, "table", "scan", "dur", "--format", fmt, "-o", out
                   ).returncode == 0
        proc = run("--warehouse", wh, "table", "append", "dur", out)
        assert proc.returncode == 0, proc.stderr
    got = Warehouse.open(str(wh)).table("dur").to_table().column("d").to_pylist()
    assert sorted(got) == sorted([dt.timedelta(seconds=90),
                                  dt.timedelta(days=2, microseconds=5)] * 4)  # (2, +2, +4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 9, "d": "1 month"}\n')
    proc = run("--warehouse", wh, "table", "append", "dur", bad)
    assert proc.returncode == 1 and "months have no fixed length" in proc.stderr
