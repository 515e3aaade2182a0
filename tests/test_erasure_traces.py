"""Issue 16: an erasure through SQL leaves its literal values nowhere — not in the server's
logs (statement text is redacted by default, error text too), not in manifests, summaries or
certificates, and, after ``PURGE t EXPIRE``, not in any stored object."""

from __future__ import annotations

import io
import logging
import warnings

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine.duck import DuckEngine
from flightsrv.server.app import start_in_thread
from flightsrv.server.logs import JsonFormatter

SECRET = "mallory.secret@example.com"


@pytest.fixture
def captured_logs():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("flightsrv")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_sql_erasure_leaves_no_literal_in_logs_or_storage(warehouse_uri, captured_logs):
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("people", pa.schema([("id", pa.int64()), ("email", pa.string())]))
    emails = [f"user{i}@example.com" for i in range(300)]
    emails[123] = SECRET
    t.append(pa.table({"id": list(range(300)), "email": emails}))
    engine = DuckEngine(wh)
    server, port = start_in_thread(engine)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = flightsql.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
        with conn:
            cur = conn.cursor()
            cur.execute(f"SELECT count(*) FROM people WHERE email = '{SECRET}'")
            assert cur.fetchall() == [(1,)]
            cur.execute(f"DELETE FROM people WHERE email = '{SECRET}'")
            assert cur.rowcount == 1
            with pytest.raises(Exception):  # an error that echoes the statement
                cur.execute(f"DELETE FROM people WHERE email = '{SECRET}' AND nosuch = 1")
            cur.close()
            cur = conn.cursor()
            cur.execute("PURGE people EXPIRE")
            rows = {(r[2], r[3]) for r in cur.fetchall()}
            assert ("status", "erased") in rows, rows
            cur.close()
    finally:
        server.shutdown()
        engine.close()
    logs = captured_logs.getvalue()
    assert "DELETE FROM people WHERE email = ?" in logs  # the statement was logged, redacted
    assert SECRET not in logs and "mallory" not in logs
    for meta in wh.store.list("people/"):
        body, _ = wh.store.get(meta.key)
        assert SECRET.encode() not in body, meta.key
    for m in wh.table("people").log.versions():
        summary = wh.table("people").log.load(m).summary
        assert SECRET not in repr(summary)
    certs = wh.table("people").erasures()
    assert certs and SECRET not in repr(certs)
    assert wh.table("people").count_rows() == 299


# every way DuckDB spells a constant, each holding the secret; and a comment holding it
_SPELLINGS = [
    "'{s}'", "E'{s}'", "$${s}$$", "$q${s}$q$", "N'{s}'", "'{s}'::VARCHAR", "DATE '{s}'",
    "{{'k': '{s}'}}", "['{s}', 'x']", "'it''s {s}'",
]


@pytest.mark.parametrize("spelling", _SPELLINGS)
def test_redacted_statement_text_keeps_no_constant(spelling):
    from flightsrv.server.logs import StatementText

    text = StatementText("redacted")
    literal = spelling.format(s=SECRET)
    sql = (f"SELECT \"user col\", count(*) FROM people /* {SECRET} */ WHERE email = {literal}"
           f" AND id IN (9876543210, 0x7F3A, 1_234_567, -3.25e7) AND z = $1 -- {SECRET}\n"
           "GROUP BY 1")
    shown = text(sql)
    for leak in ("mallory", "9876543210", "7F3A", "1_234_567", "3.25e7", "234"):
        assert leak not in shown, (leak, shown)
    # the statement's shape survives: keywords, identifiers, operators and parameters
    assert shown.startswith('SELECT "user col", count(*) FROM people WHERE email = ')
    assert "id IN (?, ?, ?, -?) AND z = $1 GROUP BY ?" in shown
    assert "\n" not in shown


def test_redacted_statement_text_past_non_ascii_keeps_no_constant():
    """DuckDB's tokenizer counts UTF-8 bytes: a character beyond ASCII before a constant
    must not shift the reading (the constant showed, cut, where a keyword was)."""
    from flightsrv.server.logs import StatementText

    sql = ("SELECT 'café 日本', 1234567 FROM people WHERE email = 'mallory@example.org' "
           "AND note = 'ü' AND id = 9876543210")
    shown = StatementText("redacted")(sql)
    assert shown == "SELECT ?, ? FROM people WHERE email = ? AND note = ? AND id = ?"
