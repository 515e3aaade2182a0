"""Errors of a user's statement keep DuckDB's help against the user's own text: its hints
("Did you mean", "Candidate bindings", function candidates) and its ``LINE n:`` with the
caret, compared with what plain DuckDB says for the same statement on the same schema
(the same DDL run on both), through real clients: ADBC to a server, the ``flightsrv``
executable one-shot (in process and ``--server``) and the shell on a pseudo-terminal."""

from __future__ import annotations

import re
import warnings

import adbc_driver_manager
import duckdb
import pytest
from _server_harness import start
from adbc_driver_flightsql import dbapi
from test_cli import run
from test_cli_sql import _Pty

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")

DDL = [
    "CREATE TABLE people (id BIGINT, name VARCHAR, email VARCHAR)",
    "CREATE TABLE orders (id BIGINT, person_id BIGINT, amount DOUBLE, placed DATE)",
    "INSERT INTO people VALUES (1, 'ann', 'ann@example.org'), (2, 'bob', NULL)",
]

#: statements that do not bind, each as plain DuckDB would meet them
BIND_ERRORS = [
    "SELECT nme FROM people",
    "SELECT p.nme FROM people p JOIN orders o ON p.id = o.person_id",
    "SELECT x.name FROM people p",
    "SELECT id FROM people p JOIN orders o ON p.id = o.person_id",
    "SELECT amont FROM people p JOIN orders o ON p.id = o.person_id",
    "MERGE INTO people USING orders o ON people.id = o.idd WHEN MATCHED THEN DELETE",
    "CREATE TABLE big_orders AS SELECT * FROM orders WHERE amont > 10",
    "SELECT *\nFROM people\nWHERE emial = 'ann@example.org'",
    "SELECT 'é' AS e, nme FROM people",
    "SELECT count(*) FROM orders GROUP BY persn_id",
    "SELECT name + 1 FROM people",
    "DELETE FROM people WHERE nme = 'ann'",
    "UPDATE people SET nme = 'x'",
    "SELEC 1",
    "SELECT * FROM people WHERE",
]
#: statements that bind and fail on a value: DuckDB points at the expression
VALUE_ERRORS = [
    "SELECT 'abc'::INT AS n FROM people",
    "SELECT id,\n  CAST(name AS DATE) AS d\nFROM people WHERE id = 2",
]
#: statements that name a table that does not exist
MISSING = [
    "SELECT * FROM peple",
    "SELECT o.id FROM people p JOIN ordrs o ON p.id = o.person_id",
    "DELETE FROM peple WHERE id = 1",
    "INSERT INTO peple VALUES (3, 'cy', NULL)",
]


def duckdb_says(statement: str) -> tuple[str, str]:
    """(first line, the lines after it) of plain DuckDB's error for ``statement``."""
    con = duckdb.connect()
    try:
        for ddl in DDL:
            con.execute(ddl)
        with pytest.raises(duckdb.Error) as exc:
            con.execute(statement)
    finally:
        con.close()
    first, _, rest = str(exc.value).partition("\n")
    return first, rest


def _split(text: str) -> tuple[str, str]:
    """(first line without flightsrv's context, the lines after it) of an error text."""
    first, _, rest = text.partition("\n")
    first = re.sub(r" \((?:table=\S+ )?statement=.*\)$", "", first)
    return first, rest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv, engine, wh, uri = start(tmp_path_factory.mktemp("hints"), with_auth=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = dbapi.connect(uri, autocommit=True)
    with conn.cursor() as cur:
        for ddl in DDL:
            cur.execute(ddl)
        # a table that existed: never offered as a candidate
        cur.execute("CREATE TABLE secret_plans (id BIGINT)")
        cur.execute("DROP TABLE secret_plans")
    yield uri, conn, wh
    conn.close()
    srv.shutdown()
    engine.engine.close()


def adbc_error(conn, statement: str) -> str:
    """The message ADBC shows for ``statement``, from flightsrv's first line on, without
    what pyarrow appends after it (``. Detail: Python exception: ...``)."""
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
        cur.execute(statement)
        cur.fetchall()  # an error of a value may come with the rows
    text = str(exc.value).split("[FlightSQL] ", 1)[1]
    text = text.split("\n. Detail:")[0]
    return re.sub(r"^(SqlError|TableNotFound): ", "", text)


@pytest.mark.parametrize("statement", BIND_ERRORS)
def test_adbc_error_is_what_duckdb_says_for_the_users_text(server, statement):
    uri, conn, _ = server
    got = _split(adbc_error(conn, statement))
    assert got == duckdb_says(statement)
    assert "__fsrv" not in got[0] + got[1]


@pytest.mark.parametrize("statement", VALUE_ERRORS)
def test_a_value_errors_caret_is_moved_onto_the_users_text(server, statement):
    """DuckDB's caret for the text flightsrv ran, placed on the same text in the user's
    statement: what plain DuckDB shows for the same statement over the same rows."""
    uri, conn, _ = server
    assert _split(adbc_error(conn, statement)) == duckdb_says(statement)


@pytest.mark.parametrize("statement", MISSING)
def test_an_unknown_table_gets_duckdbs_did_you_mean_and_caret(server, statement):
    uri, conn, _ = server
    text = adbc_error(conn, statement)
    first, rest = _split(text)
    assert first == "no such table"  # flightsrv's own line (NOT_FOUND), then DuckDB's help
    assert rest == duckdb_says(statement)[1]
    assert "Did you mean" in rest  # DuckDB shows no LINE for a DELETE's target


def test_only_tables_the_caller_may_see_are_offered(server):
    """A dropped table is no candidate: the hint is plain DuckDB's over the tables that
    GetTables lists (every principal may list every table), less what DuckDB offers from
    its own catalog (here "pg_description")."""
    uri, conn, wh = server
    assert sorted(wh.list_tables()) == ["orders", "people"]
    statement = "SELECT * FROM secret_plan"
    first, rest = _split(adbc_error(conn, statement))
    plain = duckdb_says(statement)[1]
    assert rest == re.sub(r'Did you mean "pg_\w+"\?\n', "", plain)
    assert "secret_plans" not in rest


@pytest.mark.parametrize("statement", ["SELECT * FROM nosuch", "SELECT * FROM secret_plan",
                                       "DESCRIBE nosuch"])
def test_duckdbs_own_catalogs_are_never_offered(server, statement):
    """Plain DuckDB offers its system catalog's names ("pg_sequences", "pg_am"), which the
    server refuses: those suggestions are left out, DuckDB's caret stays; an
    information_schema view, which the server serves, may be offered."""
    uri, conn, _ = server
    assert "Did you mean" in duckdb_says(statement.replace("DESCRIBE", "SELECT * FROM"))[1]
    first, rest = _split(adbc_error(conn, statement))
    assert first == "no such table" and "Did you mean" not in rest
    assert "pg_" not in rest.split("LINE")[0]
    _, rest = _split(adbc_error(conn, "SELECT * FROM tables"))
    assert 'Did you mean "information_schema.tables"' in rest


def test_hints_come_from_the_schema_only(server):
    """The same statement gives the same help whatever the rows, deleted ones included."""
    uri, conn, _ = server
    before = adbc_error(conn, "SELECT nme FROM people WHERE name = 'ann'")
    with conn.cursor() as cur:
        cur.execute("DELETE FROM people WHERE name = 'ann'")
        cur.fetchall()
    after = adbc_error(conn, "SELECT nme FROM people WHERE name = 'ann'")
    assert before == after and "ann@" not in after


def test_time_travel_hints_name_the_columns_of_the_version_read(server):
    uri, conn, wh = server
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE pets (id BIGINT, nick VARCHAR)")
        cur.execute("ALTER TABLE pets ADD COLUMN nickname VARCHAR")
    old = adbc_error(conn, "SELECT p.nic FROM pets AT (VERSION => 0) p")
    new = adbc_error(conn, "SELECT p.nic FROM pets p")
    assert '"nick"' in old and "nickname" not in old and "nickname" in new
    # the caret is under the user's own text, AT clause included
    line, caret = old.splitlines()[-2:]
    assert line == "LINE 1: SELECT p.nic FROM pets AT (VERSION => 0) p"
    assert caret.index("^") == line.index("p.nic") and caret.count("^") == len("p.nic")


def test_metadata_functions_offer_their_own_columns(server):
    uri, conn, _ = server
    text = adbc_error(conn, "SELECT versoin FROM flightsrv_history('people')")
    assert text.startswith('Binder Error: Referenced column "versoin" not found')
    hint, _, line, caret = text.splitlines()[1:]
    assert hint.startswith('Candidate bindings: "version"')
    assert line == "LINE 1: SELECT versoin FROM flightsrv_history('people')"
    assert caret.index("^") == line.index("versoin")


def test_own_errors_point_at_the_users_text(server):
    uri, conn, _ = server
    text = adbc_error(conn, "SELECT *\n  FROM read_csv('/etc/passwd')")
    assert text.startswith("table function read_csv() is not allowed")
    line, caret = text.splitlines()[-2:]
    assert line == "LINE 2:   FROM read_csv('/etc/passwd')"
    assert caret.index("^") == line.index("read_csv") and caret.count("^") == len("read_csv")


def test_one_shot_cli_shows_the_hint_and_caret(server, tmp_path):
    uri, _, wh = server
    statement = "SELECT nme FROM people"
    first, rest = duckdb_says(statement)
    local = run("sql", statement, "--warehouse", wh.uri)
    assert local.returncode == 1 and "Traceback" not in local.stderr
    assert local.stderr == (f"flightsrv: error: {first} (statement='{statement}')\n"
                            f"{rest}\n")
    remote = run("sql", "SELECT * FROM peple", "--server", uri)
    lines = remote.stderr.splitlines()
    assert remote.returncode == 1 and lines[0].startswith("flightsrv: error: NOT_FOUND: ")
    assert "\n".join(lines[1:]) == duckdb_says("SELECT * FROM peple")[1]


def test_the_shell_shows_the_hint_and_caret_and_goes_on(server):
    uri, _, wh = server
    term = _Pty(["sql", "--warehouse", wh.uri])
    try:
        term.expect("flightsrv> ")
        term.send("SELECT id,\r  nme FROM people;\r")
        shown = term.expect("flightsrv> ", timeout=60).replace("\r\n", "\n")
        assert 'Candidate bindings: "name"' in shown
        assert "LINE 2:   nme FROM people\n          ^^^\n" in shown
        term.send("SELECT 6 * 7 AS answer;\r")
        assert "42" in term.expect("flightsrv> ", timeout=60)
        term.send(".quit\r")
        assert term.proc.wait(timeout=30) == 0
        assert "Traceback" not in term.seen
    finally:
        term.close()


def test_the_log_never_keeps_the_hint_lines():
    from flightsrv.errors import SqlError
    from flightsrv.server.logs import StatementText

    err = SqlError.from_engine("Binder Error: Referenced column \"nme\" not found",
                               statement="'SELECT nme FROM people WHERE name = ''ann'''")
    err.with_detail("Candidate bindings: \"name\"\n\nLINE 1: SELECT nme FROM people WHERE "
                    "name = 'ann'\n               ^^^")
    for mode in ("redacted", "off", "full"):
        logged = StatementText(mode).error_text(err, str(err), "SELECT nme FROM people "
                                                "WHERE name = 'ann'")
        assert "\n" not in logged and "LINE" not in logged and "Candidate" not in logged


def test_diagnoses_at_once_each_see_their_own_catalog_and_no_file():
    """Each diagnosis binds against its own cursor's temporary tables; the scratch
    database opens no file and reads no Python variable."""
    import threading

    import pyarrow as pa

    from flightsrv.engine.diagnose import Scratch

    scratch = Scratch(concurrent=8)
    got: dict[int, str] = {}

    def diagnose(i: int) -> None:
        schema = pa.schema([(f"name_{i}", pa.string()), ("id", pa.int64())])
        found = scratch.explain("SELECT nme FROM t", {"t": schema})
        got[i] = found.detail if found else ""

    try:
        threads = [threading.Thread(target=diagnose, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, detail in got.items():
            assert f'"name_{i}"' in detail and detail.count("name_") == 1, (i, detail)
        secret_rows = pa.table({"x": ["root:x:0:0"]})  # noqa: F841 - a replacement scan's bait
        for text in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM secret_rows"):
            found = scratch.explain(text, {})
            assert found is not None and "root:" not in found.first + found.detail
    finally:
        scratch.close()
    assert Scratch(concurrent=0).explain("SELECT nme FROM t", {}) is None  # busy: no help


@pytest.mark.parametrize("statement", ["INSERT INTO zzqx_nothing VALUES (1)",
                                       "DESCRIBE zzqx_nothing", "OPTIMIZE zzqx_nothing"])
def test_a_table_nothing_resembles_names_the_statement_and_no_other(server, statement):
    """No table to offer: the error still names the statement, and shows no caret into a
    statement the user did not write (the suggestion is asked of DuckDB with a stand-in
    SELECT, whose LINE once leaked when DuckDB had nothing to suggest)."""
    uri, conn, _ = server
    text = adbc_error(conn, statement)
    first, rest = _split(text)
    assert first == "no such table"
    assert "statement=" in text and statement.split()[0] in text
    assert "LINE" not in rest and "SELECT" not in text



@pytest.mark.parametrize("statement", ["CREATE TABLE people (x INT)",
                                       "SELECT * FROM people AT (VERSION => 99999)",
                                       "ALTER TABLE people ALTER COLUMN id TYPE INT"])
def test_every_bad_input_error_names_its_statement(server, statement):
    """Bad input of any kind (a name taken, a version that does not exist, a narrowing type
    change) names the statement beside its table, as a binding error does: through the
    server, and from the engine itself (the one-shot CLI on the warehouse)."""
    uri, conn, wh = server
    text = adbc_error(conn, statement)
    assert f"statement={statement!r}" in text.split("\n")[0] and "table=people" in text
    local = run("sql", statement, "--warehouse", wh.uri)  # the engine's own error
    assert local.returncode != 0 and "Traceback" not in local.stderr
    assert f"statement={statement!r}" in local.stderr and "table=people" in local.stderr
