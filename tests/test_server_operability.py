"""Operability (issue 12 item 5): /healthz /readyz /metrics moving with a small mixed
workload, one structured log line per statement with redacted text, SIGTERM drain, and
SqlInfo values checked against behaviour."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

import adbc_driver_manager
import pyarrow as pa
import pytest
from _server_harness import (
    READER,
    WRITER,
    action,
    adbc,
    fetch,
    make_table,
    opts,
    query,
    start,
    update,
)
from prometheus_client.parser import text_string_to_metric_families
from pyarrow import flight
from test_serve_cli import Served, free_port

from flightsrv.server import proto
from flightsrv.server.logs import StatementText
from flightsrv.server.metrics import Metrics, MetricsHttpServer, bearer_check

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


def _scrape(port: int) -> dict[tuple, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _delta(after, before, name, **labels) -> float:
    return _get(after, name, **labels) - _get(before, name, **labels)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def statements(self):
        return [r.fields for r in self.records
                if isinstance(getattr(r, "fields", None), dict)
                and r.fields.get("event") == "statement"]


def test_metrics_follow_a_mixed_workload_and_statements_are_logged(tmp_path):
    server, engine, wh, uri = start(tmp_path)
    ready = {"ok": True}
    http = MetricsHttpServer(server.metrics, lambda: (ready["ok"], "state"), 0)
    capture = _Capture()
    server_log = logging.getLogger("flightsrv.server")
    level = server_log.level
    server_log.setLevel(logging.INFO)
    server_log.addHandler(capture)
    try:
        make_table(wh, "t", batches=4, rows=1000)
        port = http.port
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").status == 200
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200
        ready["ok"] = False
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz")
        assert ei.value.code == 503
        before = _scrape(port)
        client = flight.connect(uri)
        rows = 0
        for k in range(5):  # five selects of known sizes
            _, table = fetch(client, query(f"SELECT id FROM t WHERE id < {100 * (k + 1)}"),
                             WRITER)
            rows += table.num_rows
        with adbc(uri, WRITER) as conn, conn.cursor() as cur:
            cur.execute("DELETE FROM t WHERE id < 10")
            assert cur.rowcount == 10
            cur.execute("INSERT INTO t VALUES (-1, 'secret-literal')")
            with pytest.raises(adbc_driver_manager.Error):
                cur.execute("SELECT * FROM missing_table")
        with adbc(uri, READER) as conn, conn.cursor() as cur, \
                pytest.raises(adbc_driver_manager.Error):
            cur.execute("DELETE FROM t")
        after = _scrape(port)
        client.close()

        assert _delta(after, before, "flightsrv_statements_total", kind="select",
                      status="OK") == 5
        assert _delta(after, before, "flightsrv_rows_returned_total") == rows == 1500
        assert _delta(after, before, "flightsrv_bytes_returned_total") >= rows * 8
        assert _delta(after, before, "flightsrv_statements_total", kind="delete",
                      status="OK") == 1
        assert _delta(after, before, "flightsrv_statements_total", kind="delete",
                      status="PERMISSION_DENIED") == 1
        assert _delta(after, before, "flightsrv_rows_affected_total", kind="delete") == 10
        assert _delta(after, before, "flightsrv_rows_affected_total", kind="insert") == 1
        assert _delta(after, before, "flightsrv_commits_total", table="t",
                      operation="delete") == 1
        assert _delta(after, before, "flightsrv_commits_total", table="t",
                      operation="append") == 1
        assert _delta(after, before, "flightsrv_requests_total", rpc="DoGet",
                      status="OK") >= 5
        assert _delta(after, before, "flightsrv_requests_total", rpc="DoAction",
                      status="NOT_FOUND") >= 1  # the missing table, at prepare
        assert _delta(after, before, "flightsrv_statement_duration_seconds_count",
                      kind="select") == 5
        assert _get(after, "flightsrv_queries_in_flight") == 0
        assert _get(after, "flightsrv_prepared_statements") == 0  # ADBC closed them

        lines = capture.statements()
        selects = [f for f in lines if f["kind"] == "select" and f["status"] == "OK"]
        assert len(selects) == 5 and sum(f["rows"] for f in selects) == 1500
        assert all(f["principal"] == "writer" and f["duration_ms"] >= 0 for f in selects)
        assert selects[0]["statement"] == "SELECT id FROM t WHERE id < ?"  # redacted
        insert = next(f for f in lines if f["kind"] == "insert")
        assert "secret-literal" not in json.dumps(insert) and insert["rows"] == 1
        denied = next(f for f in lines if f["status"] == "PERMISSION_DENIED")
        assert denied["principal"] == "reader" and denied["error_class"] == "PermissionDenied"
        delete = next(f for f in lines if f["kind"] == "delete" and f["status"] == "OK")
        assert delete["rows"] == 10
    finally:
        server_log.removeHandler(capture)
        server_log.setLevel(level)
        http.close()
        server.shutdown()
        engine.close()


def test_sigterm_drains_running_calls_then_exits_zero(tmp_path):
    metrics_port = free_port()
    srv = Served(str(tmp_path / "wh"), "--metrics-port", str(metrics_port),
                 "--drain-timeout", "20")
    try:
        uri = srv.uri()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz") as r:
            assert r.status == 200
        client = flight.connect(uri)
        info = client.get_flight_info(query(
            "SELECT range AS i FROM range(3000000)"), opts(None))
        reader = client.do_get(info.endpoints[0].ticket)
        got = reader.read_chunk().data.num_rows  # a stream in progress
        srv.proc.send_signal(15)
        deadline = time.monotonic() + 10
        refused = None
        while time.monotonic() < deadline:  # new calls are refused while draining
            try:
                fetch(flight.connect(uri), query("SELECT 1"))
            except flight.FlightUnavailableError as exc:
                refused = exc
                break
            except flight.FlightCancelledError:
                pass  # with --workers: raced an idle worker's exit (it had nothing to drain)
            time.sleep(0.05)
        assert refused is not None and "shutting down" in str(refused)
        while True:  # the running stream finishes
            try:
                got += reader.read_chunk().data.num_rows
            except StopIteration:
                break
        assert got == 3_000_000
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.kill()
    stop = [e for e in srv.events if e.get("event") == "stopped"]
    assert stop and stop[0]["drained"] is True


def test_sql_info_matches_behaviour(tmp_path):
    server, engine, wh, uri = start(tmp_path, max_statement_bytes=4096,
                                    max_prepared_statements=3, prepared_ttl_s=120)
    try:
        make_table(wh, "t", batches=1, rows=10)
        client = flight.connect(uri)

        def info(token):
            _, table = fetch(client, flight.FlightDescriptor.for_command(
                proto.pack(proto.CommandGetSqlInfo())), token)
            return {r["info_name"]: r["value"] for r in table.to_pylist()}

        writer, reader = info(WRITER), info(READER)
        # read-only per principal: the reader's DELETE fails, the writer's works
        assert reader[3] is True and writer[3] is False
        with pytest.raises(flight.FlightUnauthorizedError):
            fetch(client, query("DELETE FROM t WHERE id = 1"), READER)
        fetch(client, query("DELETE FROM t WHERE id = 1"), WRITER)
        # transactions unsupported
        assert writer[8] == 0 and writer[563] is False
        with pytest.raises(pa.ArrowNotImplementedError, match="transactions"):
            action(client, "BeginTransaction", b"", WRITER)
        # cancel supported (tested end to end in test_server_security)
        assert writer[9] is True
        info_q = client.get_flight_info(query("SELECT 1 AS x"), opts(WRITER))
        req = proto.CancelFlightInfoRequest(info=info_q.serialize())
        (raw,) = action(client, "CancelFlightInfo", req.SerializeToString(), WRITER)
        assert proto.parse(proto.CancelFlightInfoResult, raw).status == \
            proto.CancelStatus.CANCELLED
        # bulk ingest supported, without transactions
        assert writer[10] is True and writer[11] is False
        with adbc(uri, WRITER) as conn, conn.cursor() as cur:
            assert cur.adbc_ingest("ing", pa.table({"a": [1, 2]}), mode="create") == 2
        # statement timeout: the prepared-handle idle timeout, in ms
        assert writer[100] == 120_000
        # statement length and open statements
        assert writer[557] == 4096 and writer[558] == 3
        with pytest.raises(pa.ArrowInvalid, match="max_statement_bytes"):
            client.get_flight_info(query("SELECT 1 -- " + "x" * 4096), opts(WRITER))
        assert isinstance(writer[556], bool)
        client.close()
    finally:
        server.shutdown()
        engine.close()


def test_readme_adbc_example_runs(tmp_path):
    """The README's ADBC example, bulk ingest of 1M rows in moderate batches included."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"Connect with ADBC:\n\n```python\n(.*?)```", readme, re.S).group(1)
    srv = Served(str(tmp_path / "wh"))
    try:
        code = block.replace("grpc://127.0.0.1:31337", srv.uri()).replace("print(", "str(")
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the documented example
        with adbc(srv.uri()) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT id) FROM events_copy")
            assert cur.fetchone() == (1_000_000, 1_000_000)
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_spill_directory_is_private_and_outside_the_warehouse(tmp_path):
    import os

    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine
    from flightsrv.errors import ConfigurationError
    from flightsrv.server.config import ServerConfig, resolve_temp_dir

    root = tmp_path / "wh"
    root.mkdir()
    for inside in (root, root / "spill"):
        with pytest.raises(ConfigurationError, match="outside the warehouse"):
            resolve_temp_dir(ServerConfig(temp_dir=str(inside)), str(root))
    path, owned = resolve_temp_dir(ServerConfig(), str(root))
    assert owned and not path.startswith(str(root)) and os.stat(path).st_mode & 0o077 == 0
    engine = DuckEngine(Warehouse.open(str(root)), temp_directory=path, memory_limit="1GiB",
                        threads=1)
    con = engine._cursors.cursor()  # the engine's own connection (users cannot read settings)
    got = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                           "('temp_directory', 'threads', 'memory_limit')").fetchall())
    assert got["temp_directory"] == path and got["threads"] == "1"
    assert got["memory_limit"].startswith("1.0 GiB") or got["memory_limit"] == "1.0 GiB"
    engine.close()
    os.rmdir(path)


def test_commit_conflicts_are_counted_by_table_and_operation(tmp_path):
    """A competing commit lands between a writer's read of the head and its write: the
    table layer reports the lost race through flightsrv.telemetry, the server counts it."""
    import dataclasses

    from flightsrv import Warehouse
    from flightsrv.server.metrics import Metrics

    metrics = Metrics()
    try:
        wh = Warehouse.open(str(tmp_path / "wh"))
        make_table(wh, "c", batches=1, rows=10)
        other = Warehouse.open(str(tmp_path / "wh"))  # a second writer with its own cache
        sneaked = []

        def competing_commit():
            if not sneaked:
                sneaked.append(other.table("c").delete("id = 0"))

        def touch(head):
            return dataclasses.replace(head, operation="set_properties")

        wh.table("c").commit(touch, before_write=competing_commit)
        sample = metrics.registry.get_sample_value
        assert sample("flightsrv_commit_conflicts_total",
                      {"table": "c", "operation": "set_properties"}) == 1
        assert sample("flightsrv_commits_total",
                      {"table": "c", "operation": "set_properties"}) == 1
        assert sample("flightsrv_commits_total", {"table": "c", "operation": "delete"}) == 1
    finally:
        metrics.close()


# every statement below fails with a message that quotes a value the statement holds (as a
# literal or a bound parameter) or read from a table; each value holds a marker "secretN"
_FAILING = [
    ("DELETE FROM t WHERE id = 'a.secret1@x.org'", None),
    ("SELECT CAST(email AS INT) FROM t WHERE email <> 'x'", None),  # the table's secret0
    ("SELECT CAST('a.secret2@x.org' AS INT)", None),
    ("SELECT error('a.secret3@x.org')", None),
    ("UPDATE t SET id = CAST('a.secret4@x.org' AS INT) WHERE id = 2", None),
    ("INSERT INTO t VALUES ('a.secret5@x.org', 'a')", None),
    ("SELECT 'it''s secret6' :: INT", None),
    ("SELECT CAST(98765432106 AS INT)", None),  # "with value 98765432106"
    ("SELECT * FROM t WHERE id = ?", ["a.secret7@x.org"]),
    ("SELECT error(?)", ["bound secret8"]),
    ("SELECT CAST(? AS INT)", [98765432108]),
    # values read from the table that DuckDB shows double-quoted or unquoted
    ("SELECT CAST(email AS DATE) FROM t WHERE id = 1", None),  # format: "O'Brien.secret0"
    ("SELECT CAST(email AS JSON) FROM t WHERE id = 1", None),  # Input: "O'Brien.secret0"
    ("SELECT id * 98765432109876 FROM t WHERE id > 2", None),  # (87654329 * 9876...)
    ("SELECT make_date(id, 1, 1) FROM t WHERE id > 2", None),  # out of range: 87654329-1-1
]
_MARKERS = ["secret0", *(f"secret{n}" for n in range(1, 9)), "98765432106", "98765432108",
            "87654329"]


@pytest.mark.parametrize("mode", ["redacted", "off", "full"])
def test_logged_errors_follow_log_statements(tmp_path, mode):
    srv = Served(str(tmp_path / "wh"), "--no-demo", "--log-statements", mode)
    client_errors = []
    try:
        with adbc(srv.uri(), None) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id INTEGER, email VARCHAR)")
            cur.execute("INSERT INTO t VALUES (1, 'O''Brien.secret0'), (2, '12'), "
                        "(87654329, NULL)")
            for sql, params in _FAILING:
                with pytest.raises(adbc_driver_manager.Error) as ei:
                    cur.execute(sql, params)
                    cur.fetchall()
                client_errors.append(str(ei.value))
    finally:
        assert srv.stop() == 0
    # the client is told the value it sent
    assert "a.secret1@x.org" in client_errors[0] and "98765432108" in client_errors[10]
    failed = [e for e in srv.events if e.get("msg") in ("statement failed", "rpc failed")]
    assert len([e for e in failed if e["msg"] == "statement failed"]) >= len(_FAILING)
    log = "".join(srv.lines)
    if mode == "full":
        for marker in _MARKERS:
            assert marker in log, marker
        assert any("'a.secret1@x.org'" in e["error"] and "'a.secret1@x.org'" in e["statement"]
                   for e in failed)
        return
    leaked = [m for m in _MARKERS if m in log]
    assert not leaked, [ln for ln in srv.lines if any(m in ln for m in leaked)]
    assert "O'Brien" not in log and "Brien" not in log
    first = next(e for e in failed if e["msg"] == "statement failed")
    if mode == "off":
        assert "statement" not in first and "statement='<statement>'" in first["error"]
    else:
        assert first["statement"] == "DELETE FROM t WHERE id = ?"
        # DuckDB's message is never logged: its class, its kind, the redacted statement
        assert first["error"] == ("SqlError: Conversion Error: <message not logged> "
                                  "(statement='DELETE FROM t WHERE id = ?')")
    assert not any("Could not convert" in e["error"] for e in failed)


def test_a_redacted_log_holds_no_value_duckdb_printed(tmp_path):
    """DuckDB prints values it read unquoted (``error(email)`` is ``Invalid Input Error:
    <the value>``): under ``--log-statements redacted`` no DuckDB message is logged at all,
    so a marker stored in a row never reaches the log, whatever statement fails over it."""
    marker = "zq.marker.qxvw@example.org"  # no digits: a timestamp could hold them
    srv = Served(str(tmp_path / "wh"), "--no-demo", "--log-statements", "redacted")
    failing = ["SELECT error(email) FROM t WHERE id = 2",
               "SELECT error(upper(email)) FROM t",
               "SELECT CAST(email AS INT) FROM t WHERE id = 2",
               "SELECT CAST(email AS DATE) FROM t WHERE id = 2",
               "SELECT CAST(email AS JSON) FROM t WHERE id = 2",
               "SELECT CAST(replace(email, '.', ' ') AS INT) FROM t WHERE id = 2",
               "SELECT CAST(email AS STRUCT(a INT)) FROM t WHERE id = 2",
               "SELECT error(email) FROM (SELECT email FROM t) WHERE id IS NULL OR true",
               "UPDATE t SET id = CAST(email AS INT) WHERE id = 2",
               "UPDATE t SET email = error(email) WHERE id = 2",
               "DELETE FROM t WHERE CAST(email AS INT) = 1"]
    try:
        with adbc(srv.uri(), None) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id INTEGER, email VARCHAR)")
            cur.execute(f"INSERT INTO t VALUES (1, 'x'), (2, '{marker}')")
            for sql in failing:
                with pytest.raises(adbc_driver_manager.Error) as ei:
                    cur.execute(sql)
                    cur.fetchall()
                assert "INVALID_ARGUMENT" in str(ei.value), (sql, str(ei.value))
            cur.execute("DELETE FROM t WHERE id = 2")
            cur.execute("PURGE t EXPIRE")
    finally:
        assert srv.stop() == 0
    failed = [e for e in srv.events if e.get("msg") in ("statement failed", "rpc failed")]
    assert len(failed) >= len(failing)
    log = "".join(srv.lines)
    for piece in (marker, "zq.marker", "qxvw", "ZQ.MARKER"):
        assert piece not in log, [ln for ln in srv.lines if piece in ln]
    assert any("Invalid Input Error: <message not logged>" in e["error"] for e in failed)


def test_redact_message_keeps_identifiers_and_prose():
    text = StatementText("redacted")
    sql = "SELECT \"Name\" FROM t WHERE a = 'x''y' AND b = 12 AND c = E'l1\\nl2'"
    message = ("Binder Error: Referenced column \"Name\" can't be cast: x'y, 12, l1 and "
               "'O'Brien' ('' 123 INT32 1.5) (statement=" + repr(sql) + ")")
    out = text.redact_message(message, sql)
    assert out == ("Binder Error: Referenced column \"Name\" can't be cast: ?, ?, ? and "
                   "? (? ? INT32 ?) (statement="
                   + repr("SELECT \"Name\" FROM t WHERE a = ? AND b = ? AND c = ?") + ")")
    assert StatementText("full").redact_message(message, sql) == message


def test_redact_message_hides_unquoted_and_double_quoted_values():
    """DuckDB shows values read from a table unquoted (overflow operands, dates out of
    range) or double-quoted (unparsable dates, JSON); names the statement spells stay, as do
    a parser error's line, a decimal type's width and flightsrv's own version numbers."""
    text = StatementText("redacted")
    cases = [
        ("Out of Range Error: Overflow in multiplication of INT64 (987654321 * 100)!",
         "SELECT i * 100 FROM t",
         "Out of Range Error: Overflow in multiplication of INT64 (? * ?)!"),
        ('Conversion Error: invalid date field format: "a@b.org", expected format is '
         "(YYYY-MM-DD) when casting from source column s", 'SELECT CAST(s AS DATE) FROM t',
         "Conversion Error: invalid date field format: ?, expected format is (YYYY-MM-DD) "
         "when casting from source column s"),
        ('Binder Error: Referenced column "Name" not found! Candidate bindings: "name", '
         '"secret"', 'SELECT "Name" FROM t',
         'Binder Error: Referenced column "Name" not found! Candidate bindings: "name", ?'),
        ("Conversion Error: Date out of range: 10002019-2-3", "SELECT d + x FROM t",
         "Conversion Error: Date out of range: ?-?-?"),
        ("Could not cast value 1234.500000 to DECIMAL(38,0)", "SELECT x FROM t",
         "Could not cast value ? to DECIMAL(38,0)"),
        ("Parser Error: syntax error at or near \"FROMM\"\n\nLINE 1: SELECT x FROMM t",
         "SELECT x FROMM t",
         "Parser Error: syntax error at or near \"FROMM\"\n\nLINE 1: SELECT x FROMM t"),
        ("manifest missing (table=t version=12 size=40)", None,
         "manifest missing (table=t version=12 size=40)"),
    ]
    for message, sql, expected in cases:
        assert text.redact_message(message, sql) == expected, message
        assert StatementText("full").redact_message(message, sql) == message


def test_redaction_reads_parameter_values_python_cannot_hold():
    """The logged error's redaction reads the bound values; a date past 9999 (refused as a
    parameter) made it raise OverflowError, which reached the client as a Python exception
    instead of the statement's own INVALID_ARGUMENT."""
    import pyarrow as pa

    from flightsrv.server.logs import parameter_values

    batch = pa.record_batch([pa.array([2**31 - 1], pa.date32()),
                             pa.array([10**14], pa.timestamp("s")),
                             pa.array(["secret"])], names=["a", "b", "c"])
    assert parameter_values(batch) == ["2147483647", "100000000000000", "secret"]


def test_metrics_auth_takes_the_servers_bearer_tokens():
    """``--metrics-auth``: /metrics answers 401 without one of the server's tokens; the
    probes stay open (they hold nothing about data)."""
    metrics = Metrics()
    http = MetricsHttpServer(metrics, lambda: (True, "ready"), 0,
                             authorize=bearer_check(["W", "R"]))
    base = f"http://127.0.0.1:{http.port}"
    try:
        assert http.host == "127.0.0.1"
        for header in (None, "Bearer nope", "Basic Vzo=", "Bearer "):
            req = urllib.request.Request(base + "/metrics",
                                         headers={"Authorization": header} if header else {})
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(req, timeout=10)
            assert ei.value.code == 401, header
        for token in ("W", "R"):
            req = urllib.request.Request(base + "/metrics",
                                         headers={"Authorization": f"Bearer {token}"})
            body = urllib.request.urlopen(req, timeout=10).read().decode()
            assert "flightsrv_requests_total" in body
        assert urllib.request.urlopen(base + "/healthz", timeout=10).status == 200
    finally:
        http.close()
        metrics.close()


def test_metrics_auth_without_tokens_is_refused(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse",
                          str(tmp_path / "wh"), "serve", "--port", "0", "--no-demo",
                          "--metrics-port", "0", "--metrics-auth"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--metrics-auth needs" in out.stderr, out.stderr[-500:]


def test_commit_series_of_dropped_tables_go_and_their_number_is_bounded(tmp_path):
    """A writer that creates and drops uniquely named staging tables grew /metrics by a
    commits series per table forever (session 29): a DROP removes the table's commit and
    conflict series, and at most MAX_TABLE_SERIES tables keep series. Through the real
    server and its metrics endpoint: SQL CREATE, INSERT, DROP."""
    from flightsrv.server import metrics as M

    server, engine, wh, uri = start(tmp_path)
    http = MetricsHttpServer(server.metrics, lambda: (True, "ok"), 0)
    try:
        client = flight.connect(uri)
        for k in range(3):
            update(client, f"CREATE TABLE stage_{k} (x INTEGER)", WRITER)
            update(client, f"INSERT INTO stage_{k} VALUES (1)", WRITER)
        update(client, "DROP TABLE stage_0", WRITER)
        update(client, "DROP TABLE stage_1", WRITER)
        tables = {dict(labels).get("table") for (name, labels) in _scrape(http.port)
                  if name == "flightsrv_commits_total"}
        assert "stage_2" in tables and not {"stage_0", "stage_1"} & tables, tables
        client.close()
    finally:
        http.close()
        server.shutdown()
        engine.close()
    from flightsrv import telemetry

    m = M.Metrics()
    try:
        for k in range(M.MAX_TABLE_SERIES + 5):
            telemetry.emit("commit", table=f"t{k}", operation="append")
        telemetry.emit("commit_conflict", table="last", operation="append")
        tables = set()
        for family in text_string_to_metric_families(m.render().decode()):
            for sample in family.samples:
                if family.name in ("flightsrv_commits", "flightsrv_commit_conflicts"):
                    tables.add(sample.labels["table"])
        assert len(tables) <= M.MAX_TABLE_SERIES and "t0" not in tables
        assert {"last", f"t{M.MAX_TABLE_SERIES + 4}"} <= tables
    finally:
        m.close()
