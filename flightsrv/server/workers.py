"""``flightsrv serve --workers N`` (N > 1): a parent process supervising N worker/front pairs.

Each worker is a complete ``flightsrv serve`` (its own DuckDB, manifest cache, sessions,
tickets and prepared handles) listening on a private unix socket in a 0700 directory;
each front shares the public port with the others (SO_REUSEPORT) and passes the connections
the kernel gives it to a worker: without TLS a relay (``server/relay.py``, bytes both ways,
to the worker with the fewest connections), with it a gRPC front (``server/front.py``, which
ends TLS and forwards each call to its own worker). See docs/ARCHITECTURE.md, "Using every
core".

Contract:

- The parent validates the options as a single server does (the CLI), then starts front 0
  (which resolves ``--port 0``), the other fronts on the same port, then the workers, and
  prints the "serving" line once every worker serves (its socket, and worker 0's metrics
  port: each worker writes ``w<index>.sock.ready`` when it is up).
- The parent keeps every principal's statement and DoPut slots, and its counts of prepared
  statements and sessions, for the whole server (``server/broker.py``: a ``SlotBroker`` on
  ``slots.sock`` in the same directory, given to each worker as ``--slots-socket``).
- The parent logs the server's ``start`` line once every worker serves, and ``stop`` and
  ``stopped`` (``drained``: every worker exited 0, not ``WORKER_NOT_DRAINED``).
- Workers get the parent's command line with ``--workers 1`` and their socket; worker 0
  alone serves ``--metrics-port`` (``/metrics`` holds every worker's samples, each labelled
  ``worker``, read from the others' private ``m<index>.sock``; ``/readyz`` is ready when
  every worker is) and seeds the demo table. Each worker's DuckDB runs ``--threads``
  threads (default: the CPU count), so one statement alone on the server uses every core as
  one process would (idle DuckDB threads cost nothing); a ``--memory-limit`` in percent is
  divided by N, so N workers ask for the memory one did.
- Bearer tokens issued by one worker verify on every worker: the parent makes one random
  HMAC key and hands it to each worker on its stdin (never argv or the environment).
- A worker or front that exits while the server runs is started again (its clients'
  prepared handles, tickets and sessions are gone with it; new calls and connections
  work); one that keeps dying within 5 s of its start 5 times in a row stops the server.
- SIGTERM/SIGINT: every child gets SIGTERM and drains as a single server does; one still
  running ``--drain-timeout`` + 15 s later is killed. Exit status 0 (1 when a process kept
  dying). A parent that dies without doing so (SIGKILL) takes its children with it: each
  child asks the kernel for SIGTERM when its parent dies (``signals.follow_parent``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from flightsrv.server.broker import LOGINS_QUEUED, SlotBroker
from flightsrv.server.relay import Loads
from flightsrv.server.signals import PARENT_ENV, StopFlag, StopOnSignals

log = logging.getLogger("flightsrv.server")

_DIR_PREFIX = "flightsrv-w"
_FAST_EXIT_S = 5.0
_MAX_FAST_EXITS = 5


@dataclass
class _Child:
    role: str  # "worker" | "front"
    index: int
    argv: list[str]
    stdin: bytes | None = None
    proc: subprocess.Popen | None = None
    started: float = 0.0
    fast_exits: int = 0
    restarts: int = field(default=0)

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            self.argv, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if self.role == "front" else None, start_new_session=True)
        if self.stdin is not None:
            self.proc.stdin.write(self.stdin)
        self.proc.stdin.close()
        self.started = time.monotonic()
        log.info(f"{self.role} started", extra={"fields": {
            "event": f"{self.role}_started", "index": self.index, "pid": self.proc.pid,
            "restarts": self.restarts}})


def worker_argv(argv: list[str], n: int, index: int, socket_path: str, public_port: int,
                memory_limit: str, slots_socket: str | None = None) -> list[str]:
    """The command line of worker ``index``: the parent's, with the worker's options last
    (argparse takes the last value of an option)."""
    out = [sys.executable, "-m", "flightsrv.cli", *argv, "--workers", "1",
           "--worker-socket", socket_path, "--public-port", str(public_port),
           "--worker-index", str(index)]
    if slots_socket:
        out += ["--slots-socket", slots_socket]
    if memory_limit.strip().endswith("%"):
        pct = float(memory_limit.strip()[:-1]) / n
        out += ["--memory-limit", f"{pct:g}%"]
    if index > 0:  # worker 0 alone seeds the demo and maintains tables (and serves the
        # metrics port, answering for every worker: the others serve a private socket)
        out += ["--no-demo", "--no-auto-maintenance"]
    return out


def supervise(argv: list[str], cfg, on_start, auth: bool = False) -> int:
    """Run ``cfg.workers`` pairs until SIGTERM/SIGINT (see the module docstring). ``argv``:
    the parent's command line after the program name; ``on_start(port)`` prints the line;
    ``auth``: whether the server asks for credentials (its start line says so)."""
    n = cfg.workers
    key = os.urandom(32).hex().encode() + b"\n"
    _remove_stale_dirs()
    sockdir = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # 0700
    with open(os.path.join(sockdir, "parent.pid"), "w") as f:
        f.write(str(os.getpid()))
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())  # children end with this process (follow_parent)
    signals = StopOnSignals()
    stop, received = signals.stop, signals.received
    tls = ["--tls-cert", cfg.tls_cert, "--tls-key", cfg.tls_key] if cfg.tls_cert else []
    children: list[_Child] = []
    status = 0
    # the per-principal statement and DoPut slots of the whole server (server/broker.py)
    slots = SlotBroker(os.path.join(sockdir, "slots.sock"), {
        "queries": (cfg.max_concurrent_queries, cfg.max_queued_queries),
        "puts": (cfg.max_open_puts, cfg.max_queued_queries),
        "logins": (cfg.max_concurrent_logins, LOGINS_QUEUED)}, holds={
        "prepared": cfg.max_prepared_statements, "sessions": cfg.max_sessions})
    slots.start()
    try:
        port = cfg.port
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        tag = os.urandom(6).hex()  # names this server's relayed connections
        socks = [os.path.join(sockdir, f"w{i}.sock") for i in range(n)]
        loads = os.path.join(sockdir, "loads")  # connections per relay and worker
        Loads.create(loads, n)
        for i in range(n):
            sock = socks[i]
            if tls:  # TLS ends in a gRPC front; plain connections are relayed as bytes
                argv_i = [sys.executable, "-m", "flightsrv.server.front",
                          "--listen", f"{host}:{port}", "--worker", f"unix:{sock}",
                          "--drain-timeout", str(cfg.drain_timeout_s), *tls]
            else:
                # every relay reaches every worker: each new connection goes to the
                # worker with the fewest (the kernel's choice of relay is a hash)
                argv_i = [sys.executable, "-m", "flightsrv.server.relay",
                          "--listen", f"{host}:{port}", "--tag", f"{tag}.{i}",
                          "--index", str(i), "--loads", loads,
                          "--drain-timeout", str(cfg.drain_timeout_s)]
                for s in socks:
                    argv_i += ["--worker", s]
            front = _Child("front", i, argv_i)
            front.start(env)
            port = _read_port(front)
            front.argv[front.argv.index("--listen") + 1] = f"{host}:{port}"  # for a restart
            children.append(front)
        for i in range(n):
            sock = socks[i]
            worker = _Child("worker", i, worker_argv(argv, n, i, sock, port,
                                                      cfg.memory_limit, slots.path), stdin=key)
            worker.start(env)
            children.append(worker)
        ready = _wait_sockets(sockdir, n, children, stop)
        if not stop.is_set():
            # the server's start line, as one process logs it (the workers' are
            # worker_start): once every worker serves
            log.info("serving", extra={"fields": {
                "event": "start", "host": cfg.host, "port": port,
                "tls": bool(cfg.tls_cert), "auth": auth, "pid": os.getpid(),
                "metrics_port": ready.get("metrics_port"), "workers": n}})
            on_start(port)
        while not stop.wait(0.5):
            for child in children:
                if child.proc.poll() is None:
                    continue
                try:
                    _restart(child, env)
                except OSError as exc:
                    log.error("server stopping: a process keeps failing", extra={"fields": {
                        "event": "restart_failed", "error": str(exc)}})
                    status = 1
                    stop.set()
                    break
    finally:
        log.info("shutting down", extra={"fields": {
            "event": "stop", "signal": ",".join(received), "workers": n}})
        for child in children:
            if child.proc and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + cfg.drain_timeout_s + 15
        drained = True
        for child in children:
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
            # a worker exits WORKER_NOT_DRAINED when it cancelled calls at its deadline
            drained = drained and (child.role != "worker" or child.proc.returncode == 0)
        slots.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
        signals.restore()
        log.info("stopped", extra={"fields": {"event": "stopped", "drained": drained}})
    return status


def _remove_stale_dirs() -> None:
    """Remove the private directories of servers whose parent died without cleaning up
    (SIGKILL, the OOM killer: its children exit by PR_SET_PDEATHSIG, its sockets stay).
    Only this user's, and only those whose ``parent.pid`` names no live process."""
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(_DIR_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            with open(os.path.join(path, "parent.pid")) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue  # not one of ours, or one being created: left alone
        if pid <= 0 or _alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed a dead server's directory", extra={"fields": {
            "event": "stale_dir_removed", "path": path, "pid": pid}})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_port(front: _Child) -> int:
    line = front.proc.stdout.readline().decode().strip()
    if not line.startswith("port "):
        front.proc.wait()
        raise OSError(f"front {front.index} did not start (exit status {front.proc.returncode})")
    return int(line.split()[1])


def _wait_sockets(sockdir: str, n: int, children: list[_Child], stop: StopFlag,
                  timeout_s: float = 120.0) -> dict:
    """Wait until every worker serves; worker 0's ready note (its metrics port)."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        # a worker marks itself ready once it serves everything (``w<i>.sock.ready``)
        if all(os.path.exists(os.path.join(sockdir, f"w{i}.sock.ready")) for i in range(n)):
            try:
                with open(os.path.join(sockdir, "w0.sock.ready")) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {}
        for child in children:
            if child.proc.poll() is not None:
                raise OSError(f"{child.role} {child.index} exited while starting "
                              f"(exit status {child.proc.returncode})")
        if time.monotonic() > deadline:
            raise OSError(f"workers did not start within {timeout_s:g} s")
        time.sleep(0.1)
    return {}


def _restart(child: _Child, env: dict[str, str]) -> None:
    code = child.proc.returncode
    lived = time.monotonic() - child.started
    child.fast_exits = child.fast_exits + 1 if lived < _FAST_EXIT_S else 0
    log.warning(f"{child.role} exited; starting it again", extra={"fields": {
        "event": f"{child.role}_exited", "index": child.index, "pid": child.proc.pid,
        "exit_status": code, "lived_s": round(lived, 1)}})
    if child.fast_exits >= _MAX_FAST_EXITS:
        raise OSError(f"{child.role} {child.index} exited {child.fast_exits} times within "
                      f"{_FAST_EXIT_S:g} s of its start (last exit status {code})")
    if child.role == "front":
        child.proc.stdout.close()
    child.restarts += 1
    child.start(env)
    if child.role == "front":
        _read_port(child)

