"""Deleted rows leak no bit (issue 30): a marker row deleted by a deletion vector, then every
statement kind a writer and a reader can send, each with conditions on the marker's value,
through ADBC against a real server (``flightsrv serve`` with two tokens, ``/metrics`` and the
statement log). The whole session runs twice on identical warehouses, once guessing the
marker right and once wrong: every observable output (rows, errors, affected counts, the
history's fields, SHOW output, ``/metrics``, the log's statement lines) must be equal once
the guess itself (which the client sent) is blanked out.

On the old code the splice DELETE evaluated its WHERE over DV-hidden rows (an error or a
``rows_purged`` answered the guess), pruning used statistics whose bound was the deleted
value (``files_pruned``), and a redacted log kept DuckDB's unquoted messages.
"""

from __future__ import annotations

import json
import re
import urllib.request

import adbc_driver_manager
import pyarrow as pa
import pytest
from _server_harness import adbc
from test_serve_cli import Served, free_port

from flightsrv import Warehouse
from flightsrv.runtime import Runtime

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")

MARKER = "alice.secret@example.org"
WRONG = "alice.secret@example.orz"  # same length, sorts after the marker
MARKER_SCORE = 424242
WRONG_SCORE = 424243
SCHEMA = pa.schema([("id", pa.int64()), ("email", pa.string()), ("score", pa.int64())])


def _warehouse(path: str) -> None:
    """Three files; the marker (id 2) holds the first file's largest email and score, and is
    then deleted by a deletion vector (its bytes, and the file's statistics, remain). A row
    of the second file is deleted too, so that with the deletion-mask extension both files
    are read by one ``read_parquet`` whose mask function is given each row's file index."""
    wh = Warehouse.open(path, Runtime.deterministic(7))
    t = wh.create_table("people", SCHEMA)
    for lo in (0, 100, 200):
        ids = list(range(lo, lo + 100))
        t.append(pa.table({"id": ids,
                           "email": [MARKER if i == 2 else f"a{i:04d}@example.org" for i in ids],
                           "score": [MARKER_SCORE if i == 2 else i for i in ids]},
                          schema=SCHEMA))
    assert t.delete("id = 2") == 1
    assert t.delete("id = 150") == 1


def _writer_statements(g: str, s: int) -> list[str]:
    """Statements whose every condition is about the guessed email ``g`` or score ``s``."""
    oracle = (f"CASE WHEN email LIKE '{g}%' THEN CAST(email AS INTEGER) = 0 "
              "ELSE FALSE END")
    dml = [
        f"DELETE FROM people WHERE id NOT IN (SELECT id FROM people) AND {oracle}",
        f"DELETE FROM people WHERE email = '{g}'",
        f"DELETE FROM people WHERE email >= '{g}'",
        f"DELETE FROM people WHERE score = {s}",
        f"DELETE FROM people WHERE CASE WHEN email = '{g}' THEN error('x') ELSE false END",
        f"UPDATE people SET score = score WHERE {oracle}",
        f"UPDATE people SET score = 1 WHERE email >= '{g}'",
        f"UPDATE people SET score = CAST(email AS INT) WHERE email = '{g}'",
        f"MERGE INTO people USING (SELECT '{g}' AS e) s ON people.email = s.e "
        "WHEN MATCHED THEN UPDATE SET score = CAST(people.email AS INT)",
        f"MERGE INTO people USING (SELECT '{g}' AS e) s ON people.email = s.e "
        "WHEN MATCHED AND CAST(people.email AS INT) = 0 THEN DELETE",
        f"MERGE INTO people USING (SELECT {s} AS x) s ON people.score = s.x "
        "WHEN MATCHED THEN DELETE",
    ]
    return [*_reader_statements(g, s), *dml, "SET delete_mode = 'splice'", *dml,
            # a splice of a live row in the marker's row group: the deleted marker goes too,
            # whatever its value (rows_purged counts it either way)
            f"DELETE FROM people WHERE id = 3 AND email <> '{g}'",
            *_metadata_statements()]


def _reader_statements(g: str, s: int) -> list[str]:
    return [
        f"SELECT count(*) AS n FROM people WHERE email = '{g}'",
        f"SELECT count(*) AS n FROM people WHERE email >= '{g}'",
        f"SELECT count(*) AS n FROM people WHERE email <= '{g}'",
        f"SELECT count(*) AS n FROM people WHERE score >= {s}",
        f"SELECT count(*) AS n FROM people WHERE score = {s} OR email = '{g}'",
        f"SELECT id FROM people WHERE CASE WHEN email = '{g}' THEN CAST(email AS INT) = 0 "
        "ELSE false END",
        f"SELECT error(email) FROM people WHERE email LIKE '{g}%'",
        f"SELECT max(email) AS m, max(score) AS s FROM people WHERE email >= '{g[:5]}'",
        f"SELECT count(*) AS n FROM people AT (VERSION => 4) WHERE email = '{g}'",
        f"DELETE FROM people WHERE email = '{g}'",  # a reader: refused either way
    ]


def _metadata_statements() -> list[str]:
    return ["SHOW TABLES", "DESCRIBE people", "SHOW STATS people", "SHOW HISTORY people",
            "SHOW ERASURES people",
            "SELECT * FROM flightsrv_table_stats('people')"]


#: fields that differ between any two runs (clocks, random ids, ports, timings)
_VOLATILE = re.compile(r"(^|_)(ts|at|ms|id|ids|peer|path|paths|file|new|key|keys|uuid|fingerprint|"
                       r"duration|seconds|incident|etag|bytes\w*|certificate|object\w*)$|"
                       r"_at_ms$|_ms$|created|verified|started|committed")


def _clean(value, guess: str):
    """``value`` with the guess blanked out and volatile fields dropped (recursively)."""
    if isinstance(value, str):
        text = value.replace(guess, "<G>")
        try:
            inner = json.loads(text)
        except ValueError:
            return text
        return _clean(inner, guess) if isinstance(inner, (dict, list)) else text
    if isinstance(value, dict):
        return {k: _clean(v, guess) for k, v in sorted(value.items())
                if not _VOLATILE.search(str(k))}
    if isinstance(value, (list, tuple)):
        return [_clean(v, guess) for v in value]
    return value


def _run(cur, sql: str, guess: str):
    try:
        cur.execute(sql)
        table = cur.fetch_arrow_table()
        out = ("ok", table.to_pylist(), cur.rowcount)
    except adbc_driver_manager.Error as e:
        # the client's own statement text is quoted in its error: blank the guess there
        out = ("error", re.sub(r"\s+", " ", str(e)))
    return _clean(out, guess)


def _scrape(port: int, token: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    body = urllib.request.urlopen(req, timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        # durations, start times, waits for a slot and the maintenance worker's ticks count
        # time, not data (a slot's wait: a round trip to the parent with ``--workers``)
        if line.startswith("flightsrv_") and "duration" not in line and \
                "_created" not in line and "maintenance_ticks" not in line and \
                "start_time_seconds" not in line and \
                not line.startswith(("flightsrv_queue_wait_seconds_bucket",
                                     "flightsrv_queue_wait_seconds_sum")):
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _session(path: str, env, guess: str, score: int) -> dict:
    _warehouse(path)
    mport = free_port()
    srv = Served(path, "--no-demo", "--auth-token", "W:writer", "--auth-token", "R:reader",
                 "--metrics-port", str(mport), "--metrics-auth",
                 "--log-statements", "redacted", env=env)
    seen: dict = {"writer": [], "reader": []}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as ei:  # no token: no metrics
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10)
        assert ei.value.code == 401
        with adbc(srv.uri(), "R") as conn, conn.cursor() as cur:
            for sql in _reader_statements(guess, score):
                seen["reader"].append((sql.replace(guess, "<G>"), _run(cur, sql, guess)))
        with adbc(srv.uri(), "W") as conn, conn.cursor() as cur:
            for sql in _writer_statements(guess, score):
                seen["writer"].append((sql.replace(guess, "<G>"), _run(cur, sql, guess)))
        seen["metrics"] = _scrape(mport, "R")
    finally:
        assert srv.stop() == 0
    seen["log"] = [_clean({k: v for k, v in e.items() if k not in ("statement", "worker")},
                          guess)
                   for e in srv.events if e.get("event") in ("statement", "rpc")]
    seen["log_text"] = "".join(srv.lines)
    return seen


@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_no_output_depends_on_a_deleted_rows_value(tmp_path, request, backend):
    if backend == "s3":
        env = request.getfixturevalue("subprocess_env")
        make = request.getfixturevalue("s3_uri_factory")
        paths = [make(), make()]
    else:
        env, paths = None, [str(tmp_path / "right"), str(tmp_path / "wrong")]
    right = _session(paths[0], env, MARKER, MARKER_SCORE)
    wrong = _session(paths[1], env, WRONG, WRONG_SCORE)
    # the marker's value appears nowhere when it is not guessed, not even in the log
    for text in (repr(wrong["writer"]), repr(wrong["reader"]), wrong["log_text"]):
        assert MARKER not in text and str(MARKER_SCORE) not in text
    for text in (right["log_text"], wrong["log_text"]):  # redacted: not even the guesses
        assert "alice.secret" not in text
    for part in ("reader", "writer"):
        for (sql, a), (_, b) in zip(right[part], wrong[part]):
            assert a == b, (part, sql, a, b)
    assert right["metrics"] == wrong["metrics"], {
        k: (v, wrong["metrics"].get(k)) for k, v in right["metrics"].items()
        if wrong["metrics"].get(k) != v}
    assert len(right["log"]) == len(wrong["log"])
    for a, b in zip(right["log"], wrong["log"]):
        assert a == b, (a, b)
    # the statements did run: the splice of id 3 purged it and the deleted marker
    history = next(r for s, r in right["writer"] if s == "SHOW HISTORY people")
    assert history[0] == "ok"
    assert history[1][0]["operation"] == "splice_delete"
    assert history[1][0]["summary"]["rows_purged"] == 2
