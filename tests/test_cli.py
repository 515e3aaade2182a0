"""The ``flightsrv`` executable, run as a real subprocess, for every case of issue 17: each
failing case asserts its exit code, a one-line stderr without a traceback, and that nothing
was written where nothing should be.

Exit codes: 0 ok, 1 the command failed, 2 the command line is wrong, 130 interrupted.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightsrv import Warehouse
from support import run_cli

BIN = Path(sys.executable).with_name("flightsrv")
CMD = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "flightsrv.cli"]
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def run(*args, cwd=None, env=None, timeout=120, stdin=None) -> subprocess.CompletedProcess:
    """``flightsrv ARGS`` in its own process: a fork of a launcher that imported the CLI
    once (``support.run_cli``), or with FLIGHTSRV_TEST_CLI=exec the real executable."""
    proc = run_cli(args, cwd=None if cwd is None else str(cwd), env=env, timeout=timeout,
                   input=stdin)
    if proc is None:
        proc = subprocess.run([*CMD, *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, env=env, timeout=timeout, input=stdin)
    return proc


def failed(proc, code: int, *needles: str) -> str:
    """Assert the one-line failure and return the line."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("flightsrv: error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def tree(path) -> dict[str, int]:
    """Every file under ``path`` (relative name -> size): the 'nothing written' check."""
    root = Path(path)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() or p.is_dir()}


@pytest.fixture
def wh(tmp_path) -> str:
    """A warehouse with table ``people`` (3 rows over 2 versions)."""
    path = str(tmp_path / "wh")
    t = Warehouse.open(path).create_table("people", SCHEMA)
    t.append(pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"]}))
    return path


def people(path):
    return Warehouse.open(path).table("people")


# -- read-only commands never create a warehouse ------------------------------------------

READ_ONLY = [["table", "list"], ["table", "scan", "people"], ["table", "head", "people"],
             ["table", "history", "people"], ["table", "describe", "people"],
             ["table", "stats", "people"], ["sql", "SELECT 1"]]


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: "-".join(c[:2]))
def test_read_only_commands_on_a_mistyped_path_create_nothing(tmp_path, command):
    proc = run("--warehouse", "./whh", *command, cwd=tmp_path)
    failed(proc, 1, "no warehouse at ./whh", "flightsrv table create")
    assert tree(tmp_path) == {}


def test_missing_parent_dot_and_a_tables_own_directory_are_not_warehouses(tmp_path, wh):
    failed(run("table", "list", "--warehouse", tmp_path / "no" / "such" / "dir"), 1,
           "no warehouse at")
    assert not (tmp_path / "no").exists()
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello")
    before = tree(project)
    failed(run("--warehouse", ".", "table", "list", cwd=project), 1, "no warehouse at .")
    assert tree(project) == before
    before = tree(wh)
    failed(run("--warehouse", Path(wh) / "people", "table", "list"), 1,
           "directory of a table", "parent")
    assert tree(wh) == before


def test_a_file_as_warehouse_is_one_line(tmp_path):
    f = tmp_path / "wh"
    f.write_text("not a directory")
    failed(run("--warehouse", f, "table", "list"), 1, "is a file")
    failed(run("--warehouse", f, "table", "create", "t", "--schema", "id:int64"), 1,
           "not a directory")
    assert f.read_text() == "not a directory"


# -- validation before writing ------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["--schema", "id:int64,id:string"], "duplicate column name"),
    (["--schema", "id:int64,ID:string"], "case-insensitive"),
    (["--schema", "id:int65"], "is not name:type"),
    (["--schema", "id:decimal(50,2)"], "decimal(p,s) needs 1 <= p <= 38 and s <= p"),
    (["--schema", "id:decimal(0,0)"], "decimal(p,s) needs 1 <= p <= 38"),
    (["--schema", "id:int64,d:decimal(5,7)"], "'d:decimal(5,7)'"),
    (["--schema", "id:int64", "--property", "target_file_size=64XB"], "64MB or 1GiB"),
    (["--schema", "id:int64", "--property", "target_filesize=64MB"], "known="),
    (["--schema", "id:int64", "--property", "sort_key=ts"], "missing=ts"),
    (["--schema", "id:int64", "--property", "novalue"], "KEY=VALUE"),
    ([], "exactly one of --schema and --from-file"),
])
def test_create_refuses_bad_definitions_before_writing(tmp_path, args, needle):
    failed(run("--warehouse", tmp_path / "wh", "table", "create", "t", *args), 2, needle)
    assert tree(tmp_path) == {}


def test_sizes_as_64MB_are_accepted_and_appends_work(tmp_path):
    wh = tmp_path / "wh"
    proc = run("--warehouse", wh, "table", "create", "t", "--schema", "id:int64,name:string",
               "--property", "target_file_size=64MB", "--property", "row_group_bytes=1KiB",
               "--property", "user.owner=data team")
    assert proc.returncode == 0, proc.stderr
    csv = tmp_path / "rows.csv"
    csv.write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(2000)))
    proc = run("--warehouse", wh, "table", "append", "t", csv)
    assert proc.returncode == 0, proc.stderr
    t = Warehouse.open(str(wh)).table("t")
    assert t.count_rows() == 2000
    assert t.properties == {"target_file_size": "64000000", "row_group_bytes": "1024",
                            "user.owner": "data team"}
    assert t.head().data_files[0].row_group_offsets[1] > 0  # 1KiB row groups took effect


def test_set_property_checks_types_and_commits_once(wh):
    v = people(wh).head().version
    failed(run("--warehouse", wh, "table", "set-property", "people", "target_file_size=big"), 2,
           "property=target_file_size")
    failed(run("--warehouse", wh, "table", "set-property", "people", "colour=red"), 2,
           "user.", "known=")
    failed(run("--warehouse", wh, "table", "set-property", "people", "sort_key=age"), 2,
           "missing=age")
    failed(run("--warehouse", wh, "table", "set-property", "people"), 2, "KEY=VALUE")
    assert people(wh).head().version == v
    proc = run("--warehouse", wh, "table", "set-property", "people", "target_file_size=1GiB",
               "delete_mode=splice", "sort_key=id")
    assert proc.returncode == 0, proc.stderr
    assert "1073741824 (1GiB)" in proc.stdout
    t = people(wh)
    assert t.head().version == v + 1
    assert t.properties == {"target_file_size": str(1 << 30), "delete_mode": "splice",
                            "sort_key": "id"}
    proc = run("--warehouse", wh, "table", "set-property", "people", "--unset", "delete_mode")
    assert proc.returncode == 0 and "delete_mode" not in people(wh).properties
    v = people(wh).head().version
    proc = run("--warehouse", wh, "table", "set-property", "people", "sort_key=id")
    assert proc.returncode == 0 and "nothing changed; still at version" in proc.stdout
    assert people(wh).head().version == v  # setting what is set commits nothing


# -- appends: file checks, atomicity, progress ----------------------------------------------


def test_append_checks_every_file_before_writing(wh, tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("id,name\n4,dee\n")
    before = tree(wh)
    failed(run("--warehouse", wh, "table", "append", "people", good, tmp_path / "missing.csv"),
           2, "no such file", "missing.csv")
    (tmp_path / "notes.txt").write_text("x")
    failed(run("--warehouse", wh, "table", "append", "people", good, tmp_path / "notes.txt"),
           2, "cannot tell the format")
    assert tree(wh) == before


def test_append_upper_case_extensions(wh, tmp_path):
    (tmp_path / "good.CSV").write_text("id,name\n4,dee\n")
    (tmp_path / "more.JSONL").write_text('{"id": 5, "name": "eve"}\n')
    pq.write_table(pa.table({"id": [6], "name": ["fay"]}), tmp_path / "x.PARQUET")
    proc = run("--warehouse", wh, "table", "append", "people", tmp_path / "good.CSV",
               tmp_path / "more.JSONL", tmp_path / "x.PARQUET")
    assert proc.returncode == 0, proc.stderr
    t = people(wh)
    assert sorted(t.to_table().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert t.history(limit=1)[0]["files_added"] == 3  # one commit for the three files


def test_a_bad_file_mid_append_commits_nothing_and_leaves_no_files(wh, tmp_path):
    files = []
    for i in range(3):
        f = tmp_path / f"ok{i}.csv"
        f.write_text("id,name\n" + "".join(f"{i * 100 + j},x\n" for j in range(100)))
        files.append(f)
    bad = tmp_path / "bad.csv"
    bad.write_text("id,name\n7,ok\nnot-a-number,x\n")
    v = people(wh).head().version
    before = tree(wh)
    proc = run("--warehouse", wh, "table", "append", "people", *files, bad)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith("flightsrv: error: ") and "file=" in lines[-1]
    assert "bad.csv" in lines[-1]
    progress = [ln for ln in lines[:-1] if ln.startswith("append people")]
    assert progress and "failed" in progress[-1] and "done" not in progress[-1]
    assert people(wh).head().version == v
    after = tree(wh)
    assert not [k for k in after if k.startswith(".flightsrv/tmp/")]
    # no new object anywhere: the data files of ok0..ok2 were deleted again (lock files of
    # the store's per-key locks are its own bookkeeping, never listed as objects)
    assert {k for k in set(after) - set(before) if not k.startswith(".flightsrv/locks/")} \
        <= {k for k in after if (Path(wh) / k).is_dir()}


def test_ctrl_c_while_duckdb_reads_a_json_input_exits_130_and_commits_nothing(wh, tmp_path):
    """JSON lines are read by DuckDB, which turns a SIGINT arriving during its query into
    its own error ("RuntimeError: Query interrupted"): that is still an interrupt (exit 130,
    "interrupted"), not an unexpected error (exit 1). The input is a FIFO: DuckDB blocks
    reading it, so the signal lands inside the query every time."""
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    v = people(wh).head().version
    proc = subprocess.Popen([*CMD, "--warehouse", wh, "table", "append", "people", str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # opening for writing succeeds once the reader has the FIFO open
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the append never opened its input"
                time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the signal is pending in the blocked query; now let the read go on
        os.set_blocking(fd, True)
        try:
            with os.fdopen(fd, "w") as f:
                f.write('{"id": 1, "name": "x"}\n' * 1000)
        except BrokenPipeError:
            pass
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    lines = err.splitlines()
    assert lines[-1] == "flightsrv: interrupted" and "unexpected" not in err, err
    assert lines[-2].startswith("append people") and "interrupted after" in lines[-2], err
    assert people(wh).head().version == v


def test_a_csv_conversion_error_names_the_row(wh, tmp_path):
    bad = tmp_path / "bad.csv"  # row 2 spans two lines: the row, not the line, is counted
    bad.write_text('id,name\n7,ok\n8,"two\nlines"\nnot-a-number,x\n9,y\n')
    proc = run("--warehouse", wh, "table", "append", "people", bad)
    line = proc.stderr.splitlines()[-1]
    assert proc.returncode == 1 and line.startswith("flightsrv: error: "), proc.stderr
    assert "invalid value 'not-a-number'" in line and "column=id" in line and "row=3" in line
    late = tmp_path / "late.csv"  # in a later block than the first
    late.write_text("id,name\n" + "".join(f"{i},x\n" for i in range(100_000)) + "oops,y\n")
    proc = run("--warehouse", wh, "table", "append", "people", late)
    line = proc.stderr.splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "invalid value 'oops'" in line and "column=id" in line and "row=100001" in line


def test_ctrl_c_during_a_many_file_append_commits_nothing(wh, tmp_path):
    # the last input is a FIFO written only after the signal: the append blocks on it after
    # writing the other files' data, so the signal always lands mid-append (no race with a
    # fast machine)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        (src / f"f{i:03d}.csv").write_text(f"id,name\n{i},x\n")
    fifo = src / "f999.csv"
    os.mkfifo(fifo)
    v = people(wh).head().version
    data = Path(wh) / "people" / "data"
    before = set(data.rglob("*.parquet"))
    proc = subprocess.Popen([*CMD, "--warehouse", wh, "table", "append", "people",
                             *sorted(map(str, src.iterdir()))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(set(data.rglob("*.parquet")) - before) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the append wrote no files"
            time.sleep(0.02)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)  # lands mid-append, whether or not it reached the FIFO
        # now let it go on if it waits for the FIFO (Python raises KeyboardInterrupt). Never
        # block here: if the signal came before the append opened the FIFO, it exits without
        # ever opening it, and a blocking open for writing would wait forever
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:  # ENXIO: no reader yet
                assert exc.errno == errno.ENXIO, exc
                time.sleep(0.02)
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    f.write("id,name\n999,x\n")
            except BrokenPipeError:
                pass  # it was interrupted and closed the FIFO before reading it
            break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[-1] == "flightsrv: interrupted"
    assert "interrupted" in lines[-2] and lines[-2].startswith("append people")
    assert people(wh).head().version == v
    assert set(data.rglob("*.parquet")) == before  # the files written so far were deleted
    assert not list((Path(wh) / ".flightsrv" / "tmp").iterdir())


def test_create_from_file(tmp_path):
    src = tmp_path / "Events.Parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "kind": ["a", "b"]}), src)
    wh = tmp_path / "wh"
    proc = run("--warehouse", wh, "table", "create", "events", "--from-file", src)
    assert proc.returncode == 0, proc.stderr
    t = Warehouse.open(str(wh)).table("events")
    assert t.schema == pa.schema([("id", pa.int32()), ("kind", pa.string())])
    assert t.to_table().to_pylist() == [{"id": 1, "kind": "a"}, {"id": 2, "kind": "b"}]
    proc = run("--warehouse", wh, "table", "create", "empty", "--from-file", src,
               "--schema-only")
    assert proc.returncode == 0 and Warehouse.open(str(wh)).table("empty").count_rows() == 0
    dup = tmp_path / "dup.csv"
    dup.write_text("id,ID\n1,2\n")
    failed(run("--warehouse", wh, "table", "create", "d", "--from-file", dup), 2,
           "case-insensitive")
    assert "d" not in Warehouse.open(str(wh)).list_tables()


# -- broken pipes -------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["table", "scan", "big"], ["table", "history", "big"],
                                     ["table", "scan", "big", "--format", "csv"]],
                         ids=["scan", "history", "scan-csv"])
def test_a_closed_pipe_ends_quietly(tmp_path, command):
    path = str(tmp_path / "wh")
    t = Warehouse.open(path).create_table("big", SCHEMA)
    t.append(pa.table({"id": list(range(50_000)), "name": ["n" * 20] * 50_000}))
    t.delete("id < 10")
    proc = subprocess.Popen([*CMD, "--warehouse", path, *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()  # like `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0
    assert first and err == ""


# -- serve ----------------------------------------------------------------------------------


def _taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_serve_on_a_taken_port_says_so(tmp_path):
    with _taken_port() as s:
        port = s.getsockname()[1]
        proc = run("--warehouse", tmp_path / "wh", "serve", "--port", port, timeout=60)
    line = failed(proc, 1, f"port {port}", "already in use")
    assert "serving" not in proc.stderr and "nanobind" not in line
    assert tree(tmp_path) == {}


@pytest.mark.parametrize("args,needle", [
    (["--users-file", "users.txt"], "--users-file: no such file: users.txt"),
    (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "--tls-cert: no such file: c.pem"),
    (["--tls-cert", "c.pem"], "--tls-key"),
    (["--auth-token-file", "tokens"], "--auth-token-file: no such file"),
    (["--auth-token", "tok:admin"], "TOKEN[:reader|writer]"),
    (["--port", "70000"], "not a port number"),
    (["--nope"], "unrecognized arguments: --nope"),
])
def test_serve_refuses_bad_options_before_touching_anything(tmp_path, args, needle):
    proc = run("serve", "--warehouse", "wh", *args, cwd=tmp_path, timeout=60)
    failed(proc, 2, needle)
    assert tree(tmp_path) == {}


class Serving:
    """``flightsrv serve`` in a subprocess, stopped by SIGTERM; its stderr lines."""

    def __init__(self, *args, env=None):
        self.proc = subprocess.Popen([*CMD, *map(str, args)], stderr=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith("flightsrv: serving"):
                # the warning, if any, follows at once
                return
        self.stop()
        raise AssertionError("did not start:\n" + "\n".join(self.lines))

    @property
    def port(self) -> int:
        return next(json.loads(ln)["port"] for ln in self.lines if ln.startswith("{")
                    and json.loads(ln).get("event") == "start")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, rest = self.proc.communicate(timeout=60)
        self.lines += rest.splitlines()
        return self.proc.returncode


def test_serve_port_0_prints_the_bound_port_and_takes_options_after_the_command(tmp_path):
    srv = Serving("serve", "--warehouse", tmp_path / "wh", "--port", "0", "--no-demo",
                  "--log-level", "warning")
    try:
        serving = next(ln for ln in srv.lines if ln.startswith("flightsrv: serving"))
        port = int(serving.split("127.0.0.1:")[1].split()[0])
        assert port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert str(tmp_path / "wh") in serving
    finally:
        assert srv.stop() == 0
    assert not [ln for ln in srv.lines if ln.startswith("{") and '"info"' in ln]  # warning level
    assert not any("warning" in ln for ln in srv.lines)  # loopback: no warning


def test_serve_on_all_interfaces_without_auth_warns(tmp_path):
    srv = Serving("--warehouse", tmp_path / "wh", "serve", "--host", "0.0.0.0", "--port", "0",
                  "--no-demo")
    try:
        line = srv.proc.stderr.readline()
    finally:
        srv.stop()
    assert line.startswith("flightsrv: warning: serving on 0.0.0.0 without --auth-token")
    token = tmp_path / "token"
    token.write_text("s3cret:reader\n")
    srv = Serving("--warehouse", tmp_path / "wh", "serve", "--host", "0.0.0.0", "--port", "0",
                  "--no-demo", "--auth-token-file", token)
    try:
        pass
    finally:
        srv.stop()
    assert not any("warning" in ln for ln in srv.lines)


def test_serve_help_shows_the_global_options():
    proc = run("serve", "--help")
    assert proc.returncode == 0
    for option in ("--warehouse", "--log-level", "--debug", "--auth-token-file"):
        assert option in proc.stdout


# -- S3 ------------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_missing_bucket_and_missing_credentials_are_one_line(subprocess_env, s3_server):
    failed(run("--warehouse", "s3://no-such-bucket-x/wh", "table", "list", env=subprocess_env),
           1, "no such bucket", "bucket=no-such-bucket-x")
    failed(run("--warehouse", "s3://no-such-bucket-x/wh", "table", "create", "t", "--schema",
               "id:int64", env=subprocess_env), 1, "no such bucket")
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3_server.endpoint, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    failed(run("--warehouse", "s3://flightsrv-test/creds", "table", "list", env=env), 1,
           "no AWS credentials found")


@pytest.mark.s3
def test_s3_read_only_commands_create_nothing(s3_uri, subprocess_env):
    import boto3

    failed(run("--warehouse", s3_uri, "table", "list", env=subprocess_env), 1, "no warehouse at")
    bucket, prefix = s3_uri[5:].split("/", 1)
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    assert listed.get("KeyCount", 0) == 0


# -- other commands ---------------------------------------------------------------------


def test_global_options_before_or_after_the_command(wh, tmp_path):
    for args in (["--warehouse", wh, "table", "list"], ["table", "list", "--warehouse", wh],
                 ["table", "--warehouse", wh, "list"],
                 ["--warehouse", "elsewhere", "table", "list", "--warehouse", wh]):
        proc = run(*args, "--format", "csv", cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        assert proc.stdout.splitlines()[1].startswith('"people",1,3,1,')
    env = {**os.environ, "FLIGHTSRV_WAREHOUSE": wh}
    assert run("table", "list", env=env, cwd=tmp_path).returncode == 0


def test_version_and_usage_errors():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("flightsrv 0.")
    # python -m flightsrv is the same command (a scripts directory off PATH)
    import subprocess
    import sys
    mod = subprocess.run([sys.executable, "-m", "flightsrv", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert mod.returncode == 0 and mod.stdout == proc.stdout, mod.stderr
    mod = subprocess.run([sys.executable, "-m", "flightsrv", "tabel"], capture_output=True,
                         text=True, timeout=60)
    assert mod.returncode == 2 and "invalid choice" in mod.stderr
    failed(run("tabel", "list"), 2, "invalid choice")
    failed(run("table", "scan"), 2, "the following arguments are required: table",
           "flightsrv table scan --help")
    failed(run("table", "vacuum", "t", "--grace", "soon"), 2, "is not a duration")


def test_runtime_errors_exit_1_and_debug_shows_the_traceback(wh):
    failed(run("--warehouse", wh, "table", "scan", "zzzzzzzz"), 1, "no such table",
           "table=zzzzzzzz")  # nothing resembles it: no hint line
    failed(run("--warehouse", wh, "table", "scan", "people", "--version", "99"), 1,
           "version=99")
    proc = run("--warehouse", wh, "table", "scan", "zzzzzzzz", "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("flightsrv: error: no such table")


def test_an_unknown_table_gets_the_hint_sql_gives(wh):
    """A table command naming a table that does not exist says which one resembles it,
    as the same name in a SQL statement does (DuckDB's suggestion over the warehouse's
    tables); a name nothing resembles gets the one-line error alone."""
    for cmd in (["describe", "peple"], ["scan", "peopl"], ["delete", "peeople", "--where",
                                                            "id = 1"]):
        proc = run("--warehouse", wh, "table", *cmd)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.splitlines() == [
            f"flightsrv: error: no such table (table={cmd[1]})", 'Did you mean "people"?'], \
            proc.stderr
        sql = run("--warehouse", wh, "sql", f"SELECT * FROM {cmd[1]}")
        assert 'Did you mean "people"?' in sql.stderr, sql.stderr
    failed(run("--warehouse", wh, "table", "describe", "zzzzzzzz"), 1, "no such table")
    assert people(wh).head().version == 1  # the delete changed nothing


def test_describe_drop_and_history(wh):
    proc = run("--warehouse", wh, "table", "describe", "people", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["version"] == 1 and info["live_rows"] == 3
    assert info["columns"] == [{"name": "id", "type": "int64", "nullable": True},
                               {"name": "name", "type": "string", "nullable": True}]
    assert {p["name"] for p in info["properties"]} >= {"target_file_size", "delete_mode"}
    proc = run("--warehouse", wh, "table", "describe", "people")
    assert "target_file_size" in proc.stdout and "(256MiB)" in proc.stdout
    proc = run("--warehouse", wh, "table", "history", "people", "--format", "jsonl")
    ops = [json.loads(ln)["operation"] for ln in proc.stdout.splitlines()]
    assert ops == ["append", "create"]
    for limit, want in (("1", 1), ("0", 0)):
        proc = run("--warehouse", wh, "table", "history", "people", "--limit", limit,
                   "--format", "jsonl")
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) == want, proc.stdout
    failed(run("--warehouse", wh, "table", "history", "people", "--limit", "-5"), 2,
           "--limit must be 0 or more")
    assert run("--warehouse", wh, "table", "drop", "people").returncode == 0
    assert Warehouse.open(wh).list_tables() == []
    failed(run("--warehouse", wh, "table", "drop", "people"), 1, "no such table")
    assert run("--warehouse", wh, "table", "drop", "people", "--if-exists").returncode == 0


def test_delete_dry_run_counts_with_the_engine_and_changes_nothing(wh):
    v = people(wh).head().version
    proc = run("--warehouse", wh, "table", "delete", "people", "--where",
               "name LIKE '%b%' OR id IS NULL", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would delete 1 rows" in proc.stdout
    assert people(wh).head().version == v
    proc = run("--warehouse", wh, "table", "delete", "people", "--where",
               "name LIKE '%b%' OR id IS NULL")
    assert proc.returncode == 0 and "deleted 1 rows" in proc.stdout
    assert sorted(people(wh).to_table().column("id").to_pylist()) == [1, 3]
    proc = run("--warehouse", wh, "table", "delete", "people", "--where", "nope = 1",
               "--dry-run")
    # one error line, then DuckDB's own hint and caret (docs/CLI.md, errors)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    first, *hint = proc.stderr.splitlines()
    assert first.startswith("flightsrv: error: ") and "nope" in first, first
    assert 'Candidate bindings: "name"' in hint and any(ln.lstrip().startswith("^") for ln in hint)
    # the caret points into --where as typed, not at a line of the statement built around it
    for extra in ([], ["--dry-run"]):
        proc = run("--warehouse", wh, "table", "delete", "people", "--where",
                   "id = 1 AND nope = 1", *extra)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 1 and "--where: id = 1 AND nope = 1" in lines, proc.stderr
        caret = lines[lines.index("--where: id = 1 AND nope = 1") + 1]
        assert caret == " " * len("--where: id = 1 AND ") + "^^^^", proc.stderr
        assert not [ln for ln in lines if ln.startswith("LINE ")], proc.stderr
    # --filter is checked the same way: the caret points into it, DuckDB's hint kept
    proc = run("--warehouse", wh, "table", "scan", "people", "--filter", "id = 1 AND nope = 1")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "--filter: id = 1 AND nope = 1" in lines, proc.stderr
    caret = lines[lines.index("--filter: id = 1 AND nope = 1") + 1]
    assert caret == " " * len("--filter: id = 1 AND ") + "^^^^", proc.stderr
    assert 'Candidate bindings: "name"' in lines, proc.stderr
    assert not [ln for ln in lines if ln.startswith("LINE ")], proc.stderr


def test_compact_and_expire_dry_runs_change_nothing(wh, tmp_path):
    t = people(wh)
    for i in range(3):
        t.append(pa.table({"id": [10 + i], "name": ["x"]}))
    t.delete("id = 10")
    head = t.head()
    before = tree(wh)
    proc = run("--warehouse", wh, "table", "compact", "people", "--dry-run", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert '"dry_run","true"' in proc.stdout, proc.stdout
    proc = run("--warehouse", wh, "table", "expire", "people", "--retain-last", "1",
               "--dry-run", "--format", "jsonl")
    rows = {r["metric"]: r["value"] for r in map(json.loads, proc.stdout.splitlines())}
    assert rows["versions_expired"] == head.version  # numbers stay numbers in jsonl
    assert tree(wh) == before and people(wh).head().version == head.version
    proc = run("--warehouse", wh, "table", "compact", "people", "--target-file-size", "64MB")
    assert proc.returncode == 0, proc.stderr
    assert "compact people" in proc.stderr and "done" in proc.stderr
    assert people(wh).head().operation == "compact"


def test_vacuum_enforces_the_minimum_grace_like_sql(wh):
    t = people(wh)
    files, _, _ = t.write_files(pa.table({"id": [9], "name": ["orphan"]}))  # never committed
    orphan = Path(wh) / "people" / files[0].path
    failed(run("--warehouse", wh, "table", "vacuum", "people", "--grace", "0"), 1,
           "minimum grace of 1 hour", "vacuum.allow_short_grace=true", "table=people")
    assert orphan.exists()
    assert run("--warehouse", wh, "table", "vacuum", "people", "--grace", "0",
               "--dry-run").returncode == 1
    run("--warehouse", wh, "table", "set-property", "people", "vacuum.allow_short_grace=true")
    proc = run("--warehouse", wh, "table", "vacuum", "people", "--grace", "0s")
    assert proc.returncode == 0, proc.stderr
    assert not orphan.exists()


def test_log_level_info_shows_commits(wh, tmp_path):
    (tmp_path / "a.csv").write_text("id,name\n9,z\n")
    proc = run("--warehouse", wh, "--log-level", "info", "table", "append", "people",
               tmp_path / "a.csv")
    assert proc.returncode == 0
    assert any(ln.startswith("flightsrv: info flightsrv.commit: commit") and "table=people" in ln
               for ln in proc.stderr.splitlines())
    proc = run("--warehouse", wh, "table", "append", "people", tmp_path / "a.csv")
    assert "flightsrv.commit" not in proc.stderr  # default: warnings only


def test_user_hash_reads_the_password_from_the_environment():
    from flightsrv.server.auth import AuthConfig

    env = {**os.environ, "FLIGHTSRV_PASSWORD": "pw"}
    proc = run("user", "hash", "ann", "--role", "writer", env=env)
    assert proc.returncode == 0, proc.stderr
    name, pw_hash, role = proc.stdout.strip().split(":")
    assert (name, role) == ("ann", "writer") and pw_hash.startswith("pbkdf2_sha256$")
    failed(run("user", "hash", "ann", stdin=""), 2, "no password")
    assert AuthConfig  # the users-file format is covered by test_serve_cli


@pytest.mark.parametrize("name", ["bob\nmallory", "ops#1", " ann", "ann ", "a:b", "", "a\tb"])
def test_user_hash_refuses_a_name_a_users_file_line_cannot_hold(name):
    """A newline would print a second line, a credential of another user; '#' starts a
    comment, ':' separates fields and the loader strips spaces: each is a usage error."""
    env = {**os.environ, "FLIGHTSRV_PASSWORD": "pw"}
    proc = run("user", "hash", name, "--role", "writer", env=env)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert "user name must be" in proc.stderr


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from flightsrv.cli.main import _all_parsers, build_parser
    from flightsrv.spark.pipeline import build_parser as pipeline_parser

    for parser in [*_all_parsers(build_parser()), pipeline_parser()]:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, (parser.prog, action.dest)
            d = action.default
            if d is not None and d is not False and d is not argparse.SUPPRESS and d != []:
                text = parser.formatter_class(parser.prog)._get_help_string(action)
                assert "default" in text, (parser.prog, action.dest)
        shown = " ".join(parser.format_help().split())
        # a default is shown once, and only a real one
        assert "(default: None)" not in shown and "(default: False)" not in shown, parser.prog


def test_an_unknown_option_points_at_the_help_of_its_command(wh):
    for argv, prog in ((["table", "list", "--bogus"], "flightsrv table list"),
                       (["table", "scan", "people", "--bogus"], "flightsrv table scan"),
                       (["sql", "--bogus", "SELECT 1"], "flightsrv sql"),
                       (["store", "check", "--bogus"], "flightsrv store check")):
        proc = run("--warehouse", wh, *argv)
        failed(proc, 2, "unrecognized arguments: --bogus", f"(see `{prog} --help`)")


def test_scan_filter_is_one_expression_like_delete_where(wh):
    proc = run("--warehouse", wh, "table", "scan", "people", "--filter",
               "id = 1; DROP TABLE people")
    failed(proc, 2, "--filter", "holds 2 statements")
    proc = run("--warehouse", wh, "table", "scan", "people", "--filter", "id = 1 -- one",
               "--format", "csv")
    assert proc.returncode == 0 and proc.stdout.splitlines()[1:] == ['1,"ann"'], proc
    proc = run("--warehouse", wh, "table", "scan", "people", "--filter", "nope = 1 -- one")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "--filter: nope = 1 -- one" in lines, proc.stderr
    assert lines[lines.index("--filter: nope = 1 -- one") + 1] == " " * 10 + "^^^^"


def test_pipeline_without_pyspark_gives_the_install_hint(monkeypatch, capsys):
    from flightsrv.cli.main import main

    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark: ModuleNotFoundError
    assert main(["pipeline", "--generate", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flightsrv: error: flightsrv pipeline needs PySpark") and \
        "pip install 'flightsrv[spark]'" in err, err


def test_pipeline_both_spellings_parse_the_same():
    from flightsrv.cli.main import parse_args
    from flightsrv.spark.pipeline import build_parser

    a = parse_args(["pipeline", "--generate", "100", "--warehouse", "w1"])
    b = parse_args(["--warehouse", "w1", "pipeline", "run", "--generate", "100"])
    assert a.rest == ["--generate", "100"] and b.rest == ["run", "--generate", "100"]
    assert a.warehouse == b.warehouse == "w1"
    pa_, pb = build_parser().parse_args(a.rest), build_parser().parse_args(b.rest)
    assert vars(pa_) == vars(pb)
    # a table called "pipeline" is not the pipeline command
    c = parse_args(["table", "create", "pipeline", "--schema", "id:int64"])
    assert c.table == "pipeline"


def test_secrets_from_environment_variables_and_files(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# tokens for the test\nfile-writer:writer\nfile-reader:reader\n")
    env = {**os.environ, "FLIGHTSRV_AUTH_TOKEN_FILE": str(tokens),
           "FLIGHTSRV_AUTH_TOKEN": "env-token:reader"}
    path = str(tmp_path / "wh")
    Warehouse.open(path).create_table("people", SCHEMA).append(
        pa.table({"id": [1, 2], "name": ["a", "b"]}))
    srv = Serving("serve", "--warehouse", path, "--port", "0", env=env)
    try:
        uri = f"grpc://127.0.0.1:{srv.port}"
        for token in ("file-writer", "file-reader", "env-token"):
            proc = run("sql", "--server", uri, "SELECT count(*) AS n FROM people",
                       "--format", "csv", env={**os.environ, "FLIGHTSRV_TOKEN": token})
            assert proc.returncode == 0, (token, proc.stderr)
            assert proc.stdout.splitlines() == ['"n"', "2"]
        failed(run("sql", "--server", uri, "SELECT 1",
                   env={**os.environ, "FLIGHTSRV_TOKEN": "guess"}), 1, "UNAUTHENTICATED")
        failed(run("sql", "--server", uri, "DELETE FROM people",
                   env={**os.environ, "FLIGHTSRV_TOKEN": "env-token"}), 1, "UNAUTHORIZED")
        proc = run("sql", "--server", uri, "DELETE FROM people WHERE id = 1",
                   env={**os.environ, "FLIGHTSRV_TOKEN": "file-writer"})
        assert proc.returncode == 0 and people(path).count_rows() == 1
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("error,word", [(None, "done in"), (ValueError("bad row 7"), "failed"),
                                        (KeyboardInterrupt(), "interrupted")])
def test_progress_ends_with_how_the_work_ended(error, word):
    import io

    from flightsrv.progress import Progress

    buf = io.StringIO()
    p = Progress("job", total=3, stream=buf)

    def work():  # like the maintenance code: finish() in a finally, no arguments
        try:
            p.advance(1)
            if error is not None:
                raise error
        finally:
            p.finish()

    if error is None:
        work()
    else:
        with pytest.raises(type(error)):
            work()
    p.finish()  # a second call (the CLI's own) changes nothing
    last = buf.getvalue().splitlines()[-1]
    assert word in last and len(buf.getvalue().splitlines()) == 2
    assert p.outcome == word.split()[0]
    if error is not None:
        assert "done" not in last
    if isinstance(error, ValueError):
        assert "bad row 7" in last



def test_progress_without_a_count_shows_none():
    """Work that counted nothing and has no unit ends without a bare 0 ("purge t 0 done")."""
    import io

    from flightsrv.progress import Progress

    buf = io.StringIO()
    with Progress("purge t", stream=buf):
        pass
    assert buf.getvalue().splitlines()[-1].startswith("purge t done in ")
    buf = io.StringIO()
    with Progress("compact t", stream=buf, unit=" files"):
        pass
    assert buf.getvalue().splitlines()[-1].startswith("compact t 0 files done in ")

def test_create_partitioned_and_describe_shows_format_and_partitioning(tmp_path):
    """`table create --partition-by` is SQL's PARTITIONED BY: rows of two days land in two
    files; describe names the format version and the partitioning; a bad field is one line
    (exit 2 for the syntax, exit 1 for an unknown column) and creates nothing."""
    wh = str(tmp_path / "wh")
    proc = run("--warehouse", wh, "table", "create", "ev", "--schema",
               "id:int64,ts:timestamptz,u:int32", "--partition-by", "day(ts), bucket(16,u)")
    assert proc.returncode == 0, proc.stderr
    proc = run("--warehouse", wh, "sql", "INSERT INTO ev VALUES "
               "(1, TIMESTAMPTZ '2026-01-01 10:00:00+00', 3), "
               "(2, TIMESTAMPTZ '2026-01-02 10:00:00+00', 3)")
    assert proc.returncode == 0, proc.stderr
    assert len(Warehouse.open(wh).table("ev").head().data_files) == 2
    info = json.loads(run("--warehouse", wh, "table", "describe", "ev", "--format",
                          "json").stdout)
    assert info["format_version"] == 2
    assert info["partitioning"] == "day(ts), bucket(16, u)"
    failed(run("--warehouse", wh, "table", "create", "bad", "--schema", "id:int64",
               "--partition-by", "day(id"), 2, "--partition-by")
    failed(run("--warehouse", wh, "table", "create", "bad", "--schema", "id:int64",
               "--partition-by", "day(nope)"), 2, "nope")
    assert Warehouse.open(wh).list_tables() == ["ev"]


def test_booleans_are_spelled_as_sql_spells_them_in_every_text_format(tmp_path):
    """``true``/``false`` as DuckDB and ``--format csv`` write them, not Python's
    ``True``; in a listing of mixed values too (a maintenance command's metric/value)."""
    wh = tmp_path / "wh"
    assert run("--warehouse", wh, "sql", "CREATE TABLE b (x BOOLEAN, l BOOLEAN[]); "
               "INSERT INTO b VALUES (true, [true, false])").returncode == 0
    for fmt in ("table", "line", "csv"):
        query = "SELECT x FROM b" if fmt == "csv" else "SELECT * FROM b"  # (csv: flat)
        proc = run("--warehouse", wh, "sql", query, "--format", fmt)
        assert proc.returncode == 0 and "true" in proc.stdout, proc.stderr
        assert "True" not in proc.stdout and "False" not in proc.stdout, proc.stdout
    proc = run("--warehouse", wh, "table", "compact", "b", "--dry-run", "--format", "csv")
    assert '"dry_run","true"' in proc.stdout, proc.stdout
