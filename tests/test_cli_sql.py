"""``flightsrv sql`` as a real subprocess, in process on the warehouse and against a running
server (``--server``), for every output format; the interactive shell through a
prompt_toolkit pipe; scripts on stdin and ``-f``."""

from __future__ import annotations

import datetime as dt
import io
import json
import subprocess

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from test_cli import CMD, failed, run, tree

from flightsrv import Warehouse
from flightsrv.engine.api import Role
from flightsrv.engine.duck import DuckEngine
from flightsrv.server import AuthConfig, Principal, start_in_thread

TOKEN = "cli-test-token"
T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.timezone.utc)
ITEMS = pa.table({
    "id": pa.array([1, 2, 3], pa.int64()),
    "name": ["ann", None, "c;d"],
    "amount": [1.5, 2.25, None],
    "at": pa.array([T0, T0 + dt.timedelta(hours=1), None], pa.timestamp("us", tz="UTC")),
    "ok": [True, False, None],
})
QUERY = "SELECT * FROM items ORDER BY id"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("sql") / "wh")
    Warehouse.open(path).create_table("items", ITEMS.schema).append(ITEMS)
    return path


@pytest.fixture(scope="module")
def server(warehouse):
    engine = DuckEngine(Warehouse.open(warehouse))
    auth = AuthConfig(tokens={TOKEN: Principal("cli", Role.WRITER)})
    srv, port = start_in_thread(engine, auth=auth)
    yield f"grpc://127.0.0.1:{port}"
    srv.shutdown()
    engine.close()


@pytest.fixture(params=["local", "server"])
def target(request, warehouse, tmp_path) -> list[str]:
    """The arguments that point ``flightsrv sql`` at the warehouse, or at the server."""
    if request.param == "local":
        return ["--warehouse", warehouse]
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return ["--server", request.getfixturevalue("server"), "--token-file", str(token)]


def test_format_table(target):
    proc = run("sql", QUERY, *target)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "amount", "at", "ok"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split()[:3] == ["1", "ann", "1.5"]
    assert lines[3].split()[:2] == ["2", "NULL"]
    assert "2026-11-01 12:00:00+00:00" in lines[2]
    assert lines[-1] == "(3 rows)"


def test_format_csv(target):
    proc = run("sql", QUERY, *target, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == '"id","name","amount","at","ok"'
    back = pcsv.read_csv(io.BytesIO(proc.stdout.encode()), convert_options=pcsv.ConvertOptions(
        strings_can_be_null=True, quoted_strings_can_be_null=False))  # NULL: an empty field
    assert back.column("id").to_pylist() == [1, 2, 3]
    assert back.column("name").to_pylist() == ["ann", None, "c;d"]
    assert back.column("amount").to_pylist() == [1.5, 2.25, None]
    assert back.column("ok").to_pylist() == [True, False, None]
    assert back.column("at").cast(pa.timestamp("us", tz="UTC")).equals(ITEMS.column("at"))


def test_format_jsonl(target):
    proc = run("sql", QUERY, *target, "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert rows == [
        {"id": 1, "name": "ann", "amount": 1.5, "at": "2026-11-01T12:00:00+00:00", "ok": True},
        {"id": 2, "name": None, "amount": 2.25, "at": "2026-11-01T13:00:00+00:00", "ok": False},
        {"id": 3, "name": "c;d", "amount": None, "at": None, "ok": None},
    ]


def test_format_json_is_one_array_as_duckdbs_cli(target):
    """``--format json`` (DuckDB's CLI ``-json``, what users type first) was refused."""
    proc = run("sql", QUERY, *target, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    lines = run("sql", QUERY, *target, "--format", "jsonl").stdout.splitlines()
    assert json.loads(proc.stdout) == [json.loads(ln) for ln in lines]
    assert proc.stdout.startswith("[{") and proc.stdout.endswith("}]\n")
    empty = run("sql", "SELECT * FROM items WHERE false", *target, "--format", "json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []


def test_format_parquet_to_a_file_and_to_stdout(target, tmp_path):
    out = tmp_path / "items.parquet"
    proc = run("sql", QUERY, *target, "--format", "parquet", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert pq.read_table(out).cast(ITEMS.schema).equals(ITEMS)  # DuckDB names UTC Etc/UTC
    piped = pq.read_table(pa.BufferReader(subprocess.run(
        [*CMD, "sql", QUERY, *target, "--format", "parquet"], capture_output=True,
        check=True).stdout))
    assert piped.cast(ITEMS.schema).equals(ITEMS)


def _statement_failed(proc, *needles: str) -> list[str]:
    """A statement's error: one line naming it, then DuckDB's caret block under it."""
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("flightsrv: error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert lines[-2].startswith("LINE 1: ") and set(lines[-1].strip()) == {"^"}, lines
    return lines


def test_errors_name_the_statement_and_leave_no_output_file(target, tmp_path):
    out = tmp_path / "never.csv"
    lines = _statement_failed(run("sql", "SELEC 1", *target, "--format", "csv", "--output",
                                  out), "syntax error", "SELEC 1")
    assert lines[-2:] == ["LINE 1: SELEC 1", "        ^^^^^"]  # as DuckDB's CLI shows it
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name != "token"]
    _statement_failed(run("sql", "SELECT * FROM nope", *target), "nope")


def test_statements_that_write_answer_rows_affected(target, warehouse):
    name = "w_" + ("local" if "--warehouse" in target else "remote")
    proc = run("sql", f"CREATE TABLE {name} AS SELECT range AS id FROM range(10)", *target)
    assert proc.returncode == 0, proc.stderr
    proc = run("sql", f"DELETE FROM {name} WHERE id < 4", *target, "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"rows_affected": 4}
    assert Warehouse.open(warehouse).table(name).count_rows() == 6
    proc = run("sql", f"DROP TABLE {name}", *target)
    assert proc.returncode == 0, proc.stderr


def test_script_on_stdin_and_from_a_file(target, tmp_path):
    script = "SELECT 1 AS a;\n-- a comment; with a semicolon\nSELECT 'x;y' AS b;\n"
    proc = run("sql", *target, "--format", "jsonl", stdin=script)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(ln) for ln in proc.stdout.splitlines()] == [{"a": 1}, {"b": "x;y"}]
    f = tmp_path / "q.sql"
    f.write_text("SELECT 2 AS a; SELEC; SELECT 3 AS a;")
    proc = run("sql", *target, "-f", f, "--format", "jsonl")
    assert proc.returncode == 1 and proc.stdout.strip() == '{"a": 2}'  # stops at the error
    assert proc.stderr.splitlines()[-2:] == ["LINE 1: SELEC", "        ^^^^^"], proc.stderr
    assert "Traceback" not in proc.stderr


def test_server_auth_errors_are_one_line(server, tmp_path):
    failed(run("sql", "SELECT 1", "--server", server), 1, "UNAUTHENTICATED")
    failed(run("sql", "SELECT 1", "--server", server, "--token", "wrong"), 1, "UNAUTHENTICATED")
    failed(run("sql", "SELECT 1", "--server", "grpc://127.0.0.1:1", "--token", "x"), 1,
           "grpc://127.0.0.1:1")
    failed(run("sql", "SELECT 1", "--server", "http://x"), 2, "grpc://HOST:PORT")
    failed(run("sql", "SELECT 1", "--token", "x", "--warehouse", tmp_path), 2, "need --server")
    failed(run("sql", "SELECT 1", "--server", server, "--token-file", tmp_path / "none"), 2,
           "--token-file: no such file")


def test_local_sql_needs_a_warehouse_unless_it_writes(tmp_path):
    failed(run("sql", "SELECT 1", "--warehouse", tmp_path / "nowh"), 1, "no warehouse at")
    assert tree(tmp_path) == {}
    proc = run("sql", "CREATE TABLE t (a INTEGER)", "--warehouse", tmp_path / "new")
    assert proc.returncode == 0, proc.stderr
    assert Warehouse.open(str(tmp_path / "new")).list_tables() == ["t"]


def test_parquet_to_a_terminal_is_refused(warehouse):
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*CMD, "sql", QUERY, "--warehouse", warehouse, "--format",
                               "parquet"], stdout=slave, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode == 2 and "parquet is binary" in proc.stderr


def test_the_shell_runs_multi_line_statements_and_keeps_history(warehouse, tmp_path,
                                                               monkeypatch, capsys):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from flightsrv.cli import sql
    from flightsrv.cli.main import parse_args

    history = tmp_path / "history"
    monkeypatch.setenv("FLIGHTSRV_HISTORY", str(history))
    args = parse_args(["sql", "--warehouse", warehouse, "--format", "csv"])
    with create_pipe_input() as inp:
        inp.send_text("SELECT id,\n  name\nFROM items\nWHERE id < 3\nORDER BY id;\n"
                      "SELEC 1;\n.tables\n.format jsonl\nSELECT 'a;b' AS s;\n.quit\n")
        assert sql.shell(args, input=inp, output_stream=DummyOutput()) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ['"id","name"', "1,\"ann\"", "2,", "items", '{"s": "a;b"}']
    assert [ln for ln in err.splitlines() if ln.startswith("flightsrv: error:")] == [
        ("flightsrv: error: Parser Error: syntax error at or near \"SELEC\" "
         "(statement='SELEC 1')")]
    assert "LINE 1: SELEC 1\n        ^^^^^\n" in err  # DuckDB's parser, on the user's text
    saved = history.read_text()
    assert "+SELECT id,\n+  name\n+FROM items" in saved and "+.tables" in saved


def test_statement_splitting_and_completeness():
    from flightsrv.cli.sql import is_complete, split_statements

    assert split_statements("SELECT 1; SELECT ';' ; -- x;\n") == ["SELECT 1", "SELECT ';'"]
    assert split_statements('SELECT "a;b" FROM t') == ['SELECT "a;b" FROM t']
    assert split_statements("SELECT 'open") == ["SELECT 'open"]
    assert split_statements("  ;; ") == []
    assert is_complete("SELECT 1;") and is_complete(".tables") and is_complete("")
    assert not is_complete("SELECT 1") and not is_complete("SELECT ';")
    assert is_complete("SELECT 1; -- a trailing comment")
    assert split_statements("SELECT $1,$2; SELECT 3") == ["SELECT $1,$2", "SELECT 3"]
    assert is_complete("SELECT $1,$2;")


# -- Ctrl-C -------------------------------------------------------------------------------

#: a query that runs for minutes: 10^10 pairs, no index, no shortcut
LONG = ("SELECT a.range % 7 AS k, count(*) FROM range(100000) a, range(100000) b "
        "WHERE a.range + b.range = 7 GROUP BY ALL")


def _interrupt_when_running(args: list[str], wait_running) -> tuple[int, str, float]:
    """Start ``flightsrv sql`` with ``args``, let ``wait_running(proc)`` return once the query
    runs (it returns the stderr lines it read), send SIGINT; return the exit code, stderr and
    seconds from the signal to the exit."""
    import signal
    import time

    proc = subprocess.Popen([*CMD, "--log-level", "debug", "sql", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = wait_running(proc)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return proc.returncode, seen + err, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _logged_running(proc) -> str:
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "running statement" in line:
            return "".join(lines)
    raise AssertionError(("the statement never started", proc.wait(), lines))


def test_ctrl_c_stops_an_in_process_query_at_once(warehouse):
    code, err, took = _interrupt_when_running(["--warehouse", warehouse, LONG],
                                              _logged_running)
    assert code == 130, err
    assert "Traceback" not in err and "error" not in err, err
    assert err.splitlines()[-1] == "flightsrv: interrupted"
    assert took < 20, took  # the query alone runs for minutes


def test_ctrl_c_with_server_cancels_the_call_and_the_server_interrupts_duckdb(warehouse,
                                                                              tmp_path):
    import time

    engine = DuckEngine(Warehouse.open(warehouse))
    auth = AuthConfig(tokens={TOKEN: Principal("cli", Role.WRITER)})
    srv, port = start_in_thread(engine, auth=auth)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    try:
        def running(proc) -> str:  # the server is executing the statement
            while srv._calls.in_flight() == 0:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            return ""

        code, err, took = _interrupt_when_running(
            ["--server", f"grpc://127.0.0.1:{port}", "--token-file", str(token), LONG],
            running)
        assert code == 130, err
        assert "Traceback" not in err and "error" not in err, err
        assert err.splitlines()[-1] == "flightsrv: interrupted"
        assert took < 20, took
        deadline = time.monotonic() + 20
        while srv._calls.in_flight():  # the server stopped DuckDB, it did not run to the end
            assert time.monotonic() < deadline, "the server still runs the cancelled query"
            time.sleep(0.05)
    finally:
        srv.shutdown()
        engine.close()


class _Pty:
    """``flightsrv sql`` on a pseudo-terminal (a shell, as a person sees it)."""

    def __init__(self, args: list[str]):
        import os
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([*CMD, *args], stdin=slave, stdout=slave, stderr=slave,
                                     env={**os.environ, "TERM": "dumb"},
                                     start_new_session=True)
        os.close(slave)
        self.seen = ""

    def expect(self, needle: str, timeout: float = 120) -> str:
        import os
        import select
        import time

        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, (needle, self.seen[-2000:])
            ready, _, _ = select.select([self.master], [], [], min(left, 1))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    assert needle in self.seen, (needle, self.seen[-2000:])
        at = self.seen.index(needle) + len(needle)
        got, self.seen = self.seen[:at], self.seen[at:]
        return got

    def send(self, text: str) -> None:
        import os

        os.write(self.master, text.encode())

    def close(self) -> None:
        import os

        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_ctrl_c_in_the_shell_stops_the_query_and_the_shell_stays(warehouse, tmp_path):
    import signal

    term = _Pty(["sql", "--warehouse", warehouse, "--log-level", "debug"])
    try:
        term.expect("flightsrv> ")
        term.send(LONG + ";\r")
        term.expect("running statement")
        term.proc.send_signal(signal.SIGINT)  # what the terminal sends for Ctrl-C
        shown = term.expect("flightsrv> ", timeout=20)
        assert "query interrupted" in shown and "Traceback" not in shown, shown
        term.send("SELECT 6 * 7 AS answer;\r")
        assert "42" in term.expect("flightsrv> ")
        term.send(".quit\r")
        assert term.proc.wait(timeout=30) == 0
        assert "Traceback" not in term.seen
    finally:
        term.close()


def test_the_shell_speaks_psql_and_duckdb(warehouse, tmp_path, monkeypatch, capsys):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from flightsrv.cli import sql
    from flightsrv.cli.main import parse_args

    monkeypatch.setenv("FLIGHTSRV_HISTORY", str(tmp_path / "history"))
    args = parse_args(["sql", "--warehouse", warehouse])
    with create_pipe_input() as inp:
        inp.send_text("\\x\nSELECT id, name FROM items WHERE id = 1;\n\\x\n"
                      ".maxrows 2\nSELECT * FROM range(5);\n.maxrows 0\n.help\n"
                      ".mode csv\nSELECT 1 AS one;\n.mode table\n"
                      "\\timing\nSELECT 2 AS two;\n.timer off\nSELECT 3 AS three;\n"
                      "\\q\nSELECT 'never' AS after_quit;\n")
        assert sql.shell(args, input=inp, output_stream=DummyOutput()) == 0
    out, err = capsys.readouterr()
    assert "-[ RECORD 1 ]-\nid   | 1\nname | ann\n(1 row)\n" in out
    assert '"one"\n1\n' in out and "two\n---\n  2\n(1 row)" in out and "three" in out
    # a cut table names the shell's commands, not the command line's flags (session 28)
    assert "(2 rows shown; more rows were not read: use .maxrows 0 for all, or .mode csv)" \
        in out
    assert "table | line | csv | json | jsonl" in err
    assert "never" not in out
    assert err.count("Run Time: ") == 1 and "Timing is on." in err
    assert "Expanded display is on." in err and "Expanded display is off." in err

    for word in ("exit", "quit;", ".exit"):
        with create_pipe_input() as inp:
            inp.send_text(f"{word}\nSELECT 'never' AS after_quit;\n")
            assert sql.shell(args, input=inp, output_stream=DummyOutput()) == 0
        assert "never" not in capsys.readouterr().out


def test_wide_results_turn_vertical_and_line_is_a_format(warehouse):
    from flightsrv.cli import output

    wide = pa.table({f"column_{i}": [f"value number {i}"] for i in range(12)})
    buf = io.BytesIO()

    class Args:
        format, max_rows, max_width, output = "table", 10, 80, None

    import contextlib

    @contextlib.contextmanager
    def to_buf(_):
        yield buf

    orig = output._binary_target
    output._binary_target = to_buf
    try:
        output.write_result(wide.to_reader(), Args)
        assert buf.getvalue().decode().startswith("-[ RECORD 1 ]-\ncolumn_0  | value number 0")
        buf.seek(0)
        buf.truncate()
        Args.max_width = None
        output.write_result(wide.to_reader(), Args)
        assert buf.getvalue().decode().startswith("column_0")
    finally:
        output._binary_target = orig
    proc = run("sql", "SELECT id, name FROM items ORDER BY id LIMIT 1", "--warehouse",
               warehouse, "--format", "line")
    assert proc.returncode == 0 and proc.stdout == "-[ RECORD 1 ]-\nid   | 1\nname | ann\n" \
        "(1 row)\n", proc


def test_tab_completes_keywords_tables_and_columns(warehouse):
    from flightsrv.cli.main import parse_args
    from flightsrv.cli.sql import LocalRunner, SqlCompleter

    runner = LocalRunner(parse_args(["sql", "--warehouse", warehouse]))
    try:
        c = SqlCompleter(runner)
        assert c.candidates("SEL", "SEL") == ["SELECT"]
        assert c.candidates("sel", "sel") == ["select"]
        assert "items" in c.candidates("SELECT * FROM it", "it")
        assert c.candidates("SELECT am", "am") == []  # no table named yet
        assert c.candidates("SELECT * FROM items WHERE am", "am") == ["amount"]
    finally:
        runner.close()
