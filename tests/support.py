"""Helpers shared by several test modules (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os


class Hook:
    """A progress object that runs ``action`` once, on the first ``advance`` — for
    compaction: after it pinned its read version and before it commits."""

    def __init__(self, action):
        self.action, self.fired = action, False
        self.total, self.unit = None, ""

    def advance(self, n=1, note=""):
        if not self.fired:
            self.fired = True
            self.action()

    def finish(self):
        pass


# Modules a test's worker process needs; the fork server imports them once.
# (tests._s3_warm: botocore's models parsed once there, not in each worker that opens an S3
# store; importable when pytest runs from the repository root, as README command 2 does)
_PRELOAD = ["pyarrow", "pyarrow.parquet", "pyarrow.compute", "duckdb", "sqlglot",
            "flightsrv.store.s3", "flightsrv.store.local", "flightsrv.warehouse",
            "flightsrv.table.maintenance", "flightsrv.table.erase", "tests._s3_warm"]


def worker_processes():
    """The ``multiprocessing`` context for the separate writer/crasher processes tests start.

    A fork server that imported flightsrv, pyarrow and DuckDB once forks each process, so it
    starts at once instead of importing them again (about a second of CPU per process on the
    2-core CI machine, a minute over the suite). Each is still its own fresh process: the
    fork server holds no table, connection, thread or store, only the imported modules, and
    the test's function, arguments and ``sys.path`` reach it as with ``spawn``."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # no effect once this worker's server runs
    return ctx


# -- the CLI, started many times -----------------------------------------------------------
#
# Most CLI tests start `flightsrv ...` dozens of times; each start imports pyarrow, DuckDB,
# sqlglot and flightsrv again (about a second of CPU on the 2-core CI machine, minutes over
# the suite). ``run_cli`` instead forks each command from a launcher process that imported
# the CLI once. The command is still its own process, started with its own argv, environment,
# working directory, stdin, stdout and stderr; it runs ``flightsrv.cli.main`` exactly as the
# installed executable does, and leaves through the interpreter's normal exit (atexit
# handlers, flushes). Tests about signals, terminals and pipes start the real executable,
# and FLIGHTSRV_TEST_CLI=exec makes every CLI test start it. (A command that aborted at exit,
# `terminate called without an active exception`, was a bug of `flightsrv sql`, seen with
# the real executable too and fixed: it exited while a thread still freed a DuckDB reader.)

_LAUNCHER = r"""
import json, os, sys
sys.argv = ["flightsrv"]
from flightsrv.cli import main
# what commands import on first use: once here, not in every forked command (imports start
# no threads; nothing here opens a database or a connection)
import importlib
for name in ("flightsrv.cli.render", "flightsrv.cli.sql", "flightsrv.cli.table",
             "flightsrv.cli.warehouse", "flightsrv.cli.tools", "flightsrv.cli.store",
             "flightsrv.warehouse", "flightsrv.engine.duck", "flightsrv.table.maintenance",
             "pyarrow.compute", "pyarrow.parquet", "pyarrow.dataset"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
ctl = int(os.environ.pop("_FSRV_LAUNCHER_FD"))
rfile = os.fdopen(ctl, "r", buffering=1)
for line in rfile:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        rfile.close()
        os.chdir(req["cwd"])
        os.environ.clear(); os.environ.update(req["env"])
        for fd, path, mode in ((0, req["stdin"], os.O_RDONLY),
                               (1, req["stdout"], os.O_WRONLY),
                               (2, req["stderr"], os.O_WRONLY)):
            f = os.open(path, mode)
            os.dup2(f, fd); os.close(f)
        sys.argv = ["flightsrv", *req["argv"]]
        sys.exit(main())  # unwinds out of this loop: the interpreter's normal exit
    _, status = os.waitpid(pid, 0)
    os.write(ctl, (json.dumps({"pid": pid, "status": os.waitstatus_to_exitcode(status)})
                   + "\n").encode())
"""


class _Launcher:
    def __init__(self):
        import socket
        import subprocess
        import sys

        self.sock, theirs = socket.socketpair()
        # one BLAS thread: the launcher forks, and should hold as few threads as it can
        env = dict(os.environ, _FSRV_LAUNCHER_FD=str(theirs.fileno()), OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER], env=env,
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.pythonpath = os.environ.get("PYTHONPATH")
        self.buf = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv, cwd, env, stdin_path, out_path, err_path, timeout):
        import json
        import select
        import signal
        import subprocess
        import time

        req = {"argv": argv, "cwd": cwd, "env": env, "stdin": stdin_path,
               "stdout": out_path, "stderr": err_path}
        self.sock.sendall((json.dumps(req) + "\n").encode())
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                # the child's pid is not known here: kill every child of the launcher
                for pid in _children(self.proc.pid):
                    os.kill(pid, signal.SIGKILL)
                self._drain(10)
                raise subprocess.TimeoutExpired(["flightsrv", *argv], timeout)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the CLI launcher died")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)["status"]

    def _drain(self, timeout):
        import select

        while b"\n" not in self.buf and select.select([self.sock], [], [], timeout)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return
            self.buf += chunk
        if b"\n" in self.buf:
            self.buf = self.buf.split(b"\n", 1)[1]


def _children(ppid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


_launcher: _Launcher | None = None


def run_cli(argv, *, cwd=None, env=None, timeout=120, input=None):
    """``subprocess.run(["flightsrv", *argv], capture_output=True, text=True, ...)``, forked
    from the launcher above (see there); the same ``CompletedProcess``."""
    import subprocess
    import tempfile

    global _launcher
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    if os.environ.get("FLIGHTSRV_TEST_CLI", "fork") != "fork" or \
            env.get("PYTHONPATH") != os.environ.get("PYTHONPATH"):
        return None  # the caller starts the real executable
    if _launcher is None or not _launcher.alive():
        _launcher = _Launcher()
    with tempfile.TemporaryDirectory(prefix="fsrv-cli-") as d:
        paths = [os.path.join(d, n) for n in ("in", "out", "err")]
        with open(paths[0], "w") as f:
            f.write(input or "")
        for p in paths[1:]:
            open(p, "w").close()
        code = _launcher.run(argv, cwd or os.getcwd(), env, *paths, timeout)
        with open(paths[1], encoding="utf-8", errors="replace") as f:
            out = f.read()
        with open(paths[2], encoding="utf-8", errors="replace") as f:
            err = f.read()
    return subprocess.CompletedProcess(["flightsrv", *argv], code, out, err)


# -- an HTTP forwarder in front of an S3 server --------------------------------------------


class HttpForwarder:
    """A threaded HTTP server on 127.0.0.1 that forwards every request to ``upstream``; it
    also serves as an HTTP proxy (an absolute-URI request keeps its Host header). Subclasses
    change what passes: ``answer`` may reply instead of the upstream (a (status, headers,
    body) tuple), ``headers`` may drop or change request headers, ``returned`` may replace
    the upstream's reply. A context manager."""

    def __init__(self, upstream: str):
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
        fwd = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                u = urlsplit(self.path)
                path = u.path + (f"?{u.query}" if u.query else "")
                reply = fwd.answer(self.command, self.headers.get("Host", ""), path)
                if reply is None:
                    conn = http.client.HTTPConnection(host, port, timeout=30)
                    try:
                        conn.request(self.command, path, body=body,
                                     headers=fwd.headers(dict(self.headers.items())))
                        r = conn.getresponse()
                        reply = (r.status, r.getheaders(), r.read())
                    finally:
                        conn.close()
                    reply = fwd.returned(self.command, path, reply)
                status, headers, data = reply
                self.send_response(status)
                length = str(len(data))
                for k, v in headers:
                    if k.lower() == "content-length" and self.command == "HEAD":
                        length = v  # a HEAD reply's length is the object's
                    elif k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, host: str, path: str):
        """A reply in place of the upstream's, or None to forward the request."""
        return None

    def headers(self, headers: dict) -> dict:
        """The request headers sent upstream."""
        return headers

    def returned(self, method: str, path: str, reply: tuple) -> tuple:
        """The reply sent back for a forwarded request (the upstream's, or another one
        after the upstream acted on the request: a lost reply)."""
        return reply

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
