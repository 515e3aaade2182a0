"""Prometheus metrics and the health endpoints (``--metrics-port``).

Contract:

- ``Metrics`` owns one ``prometheus_client.CollectorRegistry`` per server (two servers in
  one process never share counters) and subscribes to ``flightsrv.telemetry`` for the
  commit events of ``flightsrv.table`` (which are process-wide: a server counts every
  commit its process makes).
- ``MetricsHttpServer(metrics, ready, port, host)`` serves, on its own thread:
  ``/healthz`` 200 while the process runs; ``/readyz`` 200 when ``ready()`` returns
  ``(True, detail)``, else 503 with the reason; ``/metrics`` the registry in the
  Prometheus text format. Anything else is 404. With ``unix_path`` it listens on a unix
  socket (a worker of ``--workers N``); worker 0's ``/metrics`` joins every worker's text
  (``unix_get`` reads it) into one server's (``merge_workers`` sums the samples; with
  ``/metrics?by=worker`` it labels each worker's ``worker`` instead).

Metric names (all prefixed ``flightsrv_``):

=====================================  =========  ============================================
requests_total{rpc,status}             counter    RPCs by method and gRPC status
statements_total{kind,status}          counter    statements by kind (select, delete, ...)
statement_duration_seconds{kind}       histogram  statement latency (a query: until its
                                                  stream ends)
rows_returned_total / bytes_returned   counter    rows and Arrow bytes sent in results
rows_affected_total{kind}              counter    rows deleted/inserted/ingested
commits_total{table,operation}         counter    versions committed (a dropped table's series
                                                  go at its drop; at most 1,000 tables)
commit_conflicts_total{table,op...}    counter    commit attempts that lost a race
files_scanned_total / files_pruned     counter    data files read / skipped by statistics
row_groups_scanned / row_groups_pruned counter    row groups read / skipped
rows_masked_total                      counter    rows hidden by deletion vectors while read
start_time_seconds                     gauge      when the server (a worker) started
auth_failures_total                    counter    failed authentications
early_runs_total{outcome}              counter    prepared queries run from their bind:
                                                  started, claimed (by a DoGet), dropped
queries_run_as_planned_total           counter    queries a DoGet read as of their
                                                  GetFlightInfo (columns changed in between)
sessions / prepared_statements         gauge      open now
queries_in_flight                      gauge      statements running now
maintenance_runs_total{task,status}    counter    automatic maintenance task runs (status ok:
                                                  committed, noop: nothing left, failed)
maintenance_failures_total{task}       counter    runs that failed (logged; the worker goes on)
maintenance_files_compacted_total      counter    data files rewritten by automatic runs
  {task}
maintenance_files_written_total{task}  counter    data files they wrote
maintenance_bytes_read_total{task}     counter    bytes of data files they rewrote
maintenance_bytes_written_total{task}  counter    bytes they wrote
maintenance_seconds_total{task}        counter    time spent in runs
maintenance_ticks_total                counter    ticks of the worker (it looked for work)
=====================================  =========  ============================================
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from flightsrv import telemetry
from flightsrv.engine.api import ExecInfo

log = logging.getLogger("flightsrv.server")

#: tables with commit series at most (the oldest go first); a dropped table's go at its drop
MAX_TABLE_SERIES = 1000

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                    300)


class Metrics:
    def __init__(self, gauges: dict[str, Callable[[], float]] | None = None,
                 started_s: float = 0.0):
        r = self.registry = CollectorRegistry()
        p = "flightsrv_"
        self.requests = Counter(p + "requests", "RPCs by method and gRPC status",
                                ["rpc", "status"], registry=r)
        self.statements = Counter(p + "statements", "statements by kind and gRPC status",
                                  ["kind", "status"], registry=r)
        self.latency = Histogram(p + "statement_duration_seconds", "statement latency",
                                 ["kind"], buckets=_LATENCY_BUCKETS, registry=r)
        self.rows_returned = Counter(p + "rows_returned", "result rows sent", registry=r)
        self.bytes_returned = Counter(p + "bytes_returned", "result Arrow bytes sent",
                                      registry=r)
        self.rows_affected = Counter(p + "rows_affected", "rows changed by DML and ingest",
                                     ["kind"], registry=r)
        self.commits = Counter(p + "commits", "versions committed", ["table", "operation"],
                               registry=r)
        self.conflicts = Counter(p + "commit_conflicts", "commit attempts that lost a race",
                                 ["table", "operation"], registry=r)
        self.files_scanned = Counter(p + "files_scanned", "data files read", registry=r)
        self.files_pruned = Counter(p + "files_pruned", "data files skipped by statistics",
                                    registry=r)
        self.row_groups_scanned = Counter(p + "row_groups_scanned", "row groups read",
                                          registry=r)
        self.row_groups_pruned = Counter(p + "row_groups_pruned",
                                         "row groups skipped by statistics", registry=r)
        self.rows_masked = Counter(p + "rows_masked", "rows hidden by deletion vectors",
                                   registry=r)
        self.early_runs = Counter(p + "early_runs", "prepared queries run from their "
                                  "bind: started, claimed by a DoGet, dropped unfetched",
                                  ["outcome"], registry=r)
        self.as_planned = Counter(p + "queries_run_as_planned", "queries a DoGet ran over "
                                  "their tables as of GetFlightInfo, whose columns had "
                                  "changed since", registry=r)
        self.auth_failures = Counter(p + "auth_failures", "failed authentications",
                                     registry=r)
        self.queue_wait = Histogram(p + "queue_wait_seconds",
                                    "time statements waited for a concurrency slot",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.mnt_runs = Counter(p + "maintenance_runs", "automatic maintenance task runs",
                                ["task", "status"], registry=r)
        self.mnt_failures = Counter(p + "maintenance_failures",
                                    "automatic maintenance runs that failed", ["task"],
                                    registry=r)
        self.mnt_files = Counter(p + "maintenance_files_compacted",
                                 "data files rewritten by automatic maintenance", ["task"],
                                 registry=r)
        self.mnt_files_written = Counter(p + "maintenance_files_written",
                                         "data files written by automatic maintenance",
                                         ["task"], registry=r)
        self.mnt_bytes_read = Counter(p + "maintenance_bytes_read",
                                      "bytes rewritten by automatic maintenance", ["task"],
                                      registry=r)
        self.mnt_bytes_written = Counter(p + "maintenance_bytes_written",
                                         "bytes written by automatic maintenance", ["task"],
                                         registry=r)
        self.mnt_seconds = Counter(p + "maintenance_seconds",
                                   "seconds spent in automatic maintenance runs", ["task"],
                                   registry=r)
        self.mnt_ticks = Counter(p + "maintenance_ticks", "ticks of the maintenance worker",
                                 registry=r)
        for name, fn in (gauges or {}).items():
            Gauge(p + name, name.replace("_", " "), registry=r).set_function(fn)
        # when this server started (``started_s``, unix time from the server's clock): a
        # worker's restart shows as a new value
        Gauge(p + "start_time_seconds", "when this server started (unix time)",
              registry=r).set(started_s)
        self._children: dict = {}  # (id(metric), labels) -> its child (see _child)
        # the tables with commit series: table -> {(metric, operation)}, oldest first (a
        # dict keeps its insertion order)
        self._series: dict[str, set] = {}
        self._series_lock = threading.Lock()
        self._unsubscribe = telemetry.subscribe(self._on_event)

    def _on_event(self, event: str, fields: dict) -> None:
        table, operation = str(fields.get("table")), str(fields.get("operation"))
        if event not in ("commit", "commit_conflict"):
            return
        metric = self.commits if event == "commit" else self.conflicts
        with self._series_lock:
            seen = self._series.setdefault(table, set())
            if len(self._series) > MAX_TABLE_SERIES:  # bounded: the oldest goes
                self._forget(next(iter(self._series)))
            if operation == "drop" and event == "commit":
                # a dropped table's series go (a writer making and dropping uniquely named
                # staging tables grew /metrics without bound)
                self._forget(table)
                return
            seen.add((metric, operation))
            metric.labels(table, operation).inc()

    def _forget(self, table: str) -> None:
        for metric, operation in self._series.pop(table, set()):
            try:
                metric.remove(table, operation)
            except KeyError:
                pass

    def maintenance_run(self, rec) -> None:
        """Count one ``flightsrv.table.maintenance.scheduler.RunRecord``."""
        self.mnt_runs.labels(rec.task, rec.status).inc()
        self.mnt_seconds.labels(rec.task).inc(rec.seconds)
        if rec.status == "failed":
            self.mnt_failures.labels(rec.task).inc()
        o = rec.outcome
        if o is not None:
            self.mnt_files.labels(rec.task).inc(o.files_rewritten)
            self.mnt_files_written.labels(rec.task).inc(o.files_added)
            self.mnt_bytes_read.labels(rec.task).inc(o.bytes_read)
            self.mnt_bytes_written.labels(rec.task).inc(o.bytes_written)

    def maintenance_tick(self, _n: int = 0) -> None:
        self.mnt_ticks.inc()

    def _child(self, metric, *labels):
        """``metric.labels(*labels)``, remembered: the labels of the per-call metrics are
        RPC names, statement kinds and status names, a small fixed set, and prometheus'
        own lookup (a lock and label checks) cost more than the increment."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def rpc(self, rpc: str, status: str) -> None:
        self._child(self.requests, rpc, status).inc()

    def statement(self, kind: str, status: str, seconds: float, info: ExecInfo | None,
                  returned_rows: int = 0, returned_bytes: int = 0,
                  affected: int = 0) -> None:
        self._child(self.statements, kind, status).inc()
        self._child(self.latency, kind).observe(seconds)
        if returned_rows:
            self.rows_returned.inc(returned_rows)
        if returned_bytes:
            self.bytes_returned.inc(returned_bytes)
        if affected:
            self.rows_affected.labels(kind).inc(affected)
        if info is not None:
            for counter, value in ((self.files_scanned, info.files_scanned),
                                   (self.files_pruned, info.files_pruned),
                                   (self.row_groups_scanned, info.row_groups_scanned),
                                   (self.row_groups_pruned, info.row_groups_pruned),
                                   (self.rows_masked, info.rows_masked)):
                if value:
                    counter.inc(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        self._unsubscribe()


def bearer_check(tokens) -> Callable[[str | None], bool]:
    """A check of an HTTP ``Authorization`` header against the server's static bearer
    tokens (compared as SHA-256 digests, in constant time)."""
    import hashlib
    import hmac

    digests = [hashlib.sha256(t.encode()).digest() for t in tokens]

    def check(header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        got = hashlib.sha256(header[len("Bearer "):].strip().encode()).digest()
        return any([hmac.compare_digest(got, d) for d in digests])

    return check


class _UnixHTTPServer(http.server.ThreadingHTTPServer):
    """The same HTTP server on a unix socket (a worker's private metrics endpoint)."""

    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # left by a worker that crashed
            os.unlink(self.server_address)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0


def unix_get(path: str, url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """``GET url`` from the HTTP server on the unix socket ``path``: (status, body)."""
    import http.client

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout_s)
            self.sock.connect(path)

    conn = Conn("localhost", timeout=timeout_s)
    try:
        conn.request("GET", url)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class CounterCarry:
    """Keeps the server's summed counters monotonic while its workers restart (worker 0
    keeps one): a worker that restarted counts from zero again, and one that is restarting
    does not answer a scrape. Remembers each worker's last counter values (counters and
    histograms, not gauges); when a worker's counters went down since its last scrape (it
    restarted), its old totals become a base added to its new ones, and a worker missing
    from a scrape contributes its last totals. Increments between a worker's last scrape
    and its death are lost."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[str, dict[tuple, tuple[str, str, dict, float]]] = {}
        self._base: dict[str, dict[tuple, tuple[str, str, dict, float]]] = {}
        self._started: dict[str, float] = {}

    def adjust(self, scraped: dict[str, list],
               started: dict[str, float] | None = None) -> dict[str, list]:
        """``scraped``: worker index -> [(family name, sample name, labels, value), ...] of
        its counter samples; ``started``: worker index -> its start time (a new one means
        it restarted). Returns the same with the base added, plus the last samples of
        every worker known before and missing now."""
        out: dict[str, list] = {}
        started = started or {}
        with self._lock:
            for index, samples in scraped.items():
                last = self._last.get(index, {})
                now = {(s, tuple(sorted(lab.items()))): (f, s, lab, v) for f, s, lab, v
                       in samples}
                base = self._base.setdefault(index, {})
                was = self._started.get(index)
                if index in started:
                    self._started[index] = started[index]
                if (was is not None and started.get(index, was) != was) or any(
                        key in now and now[key][3] < old[3] for key, old in last.items()):
                    for key, (f, s, lab, v) in last.items():  # it restarted: old totals stay
                        had = base.get(key)
                        base[key] = (f, s, lab, v + (had[3] if had else 0.0))
                self._last[index] = now
                out[index] = [(f, s, lab, v + (base[key][3] if key in base else 0.0))
                              for key, (f, s, lab, v) in now.items()]
                out[index] += [b for key, b in base.items() if key not in now]
            for index, last in self._last.items():
                if index not in scraped:  # restarting: its last totals
                    base = self._base.get(index, {})
                    out[index] = [(f, s, lab, v + (base[key][3] if key in base else 0.0))
                                  for key, (f, s, lab, v) in last.items()]
                    out[index] += [b for key, b in base.items() if key not in last]
        return out


def merge_workers(texts: list[tuple[str, bytes]], by_worker: bool = False,
                  carry: CounterCarry | None = None) -> bytes:
    """One Prometheus exposition of several workers' (``[(worker index, text), ...]``), as
    one server would answer: samples with the same name and labels are summed (counters,
    histogram buckets, counts and sums, and the gauges, which all count things: sessions,
    statements in flight, queued); a ``_created`` time is the earliest. ``by_worker``:
    every worker's samples as they are, each labelled ``worker`` instead. Parsed and written
    by prometheus_client (one HELP and TYPE per metric)."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple, list]] = {}

    def add(fam_name: str, name: str, labels: dict, value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        seen = sums[fam_name].get(key)
        if seen is None:
            sums[fam_name][key] = [name, labels, value]
        elif name.endswith(("_created", "_start_time_seconds")):
            seen[2] = min(seen[2], value)  # the earliest worker's
        else:
            seen[2] += value

    counted: dict[str, list] = {}
    started: dict[str, float] = {}
    for index, text in texts:
        counted[index] = []
        for fam in text_string_to_metric_families(text.decode("utf-8")):
            into = families.get(fam.name)
            if into is None:
                into = families[fam.name] = Metric(fam.name, fam.documentation, fam.type,
                                                   fam.unit)
                sums[fam.name] = {}
            for smp in fam.samples:
                if smp.name == "flightsrv_start_time_seconds":
                    started[index] = smp.value
                if by_worker:
                    into.add_sample(smp.name, {**smp.labels, "worker": index}, smp.value,
                                    smp.timestamp, smp.exemplar)
                elif carry is not None and fam.type in ("counter", "histogram") and \
                        not smp.name.endswith("_created"):
                    counted[index].append((fam.name, smp.name, smp.labels, smp.value))
                else:
                    add(fam.name, smp.name, smp.labels, smp.value)
    if carry is not None and not by_worker:
        for samples in carry.adjust(counted, started).values():
            for fam_name, name, labels, value in samples:
                if fam_name in sums:
                    add(fam_name, name, labels, value)
    if not by_worker:
        for name, fam in families.items():
            for sample_name, labels, value in sums[name].values():
                fam.add_sample(sample_name, labels, value)

    class Merged:
        def collect(self):
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Merged())
    return generate_latest(registry)


class MetricsHttpServer:
    """``/healthz``, ``/readyz`` (no data: always open) and ``/metrics``. ``authorize``:
    when given, ``/metrics`` answers 401 unless it accepts the request's ``Authorization``
    header (``--metrics-auth``: the server's bearer tokens). ``unix_path``: serve on that
    unix socket instead of ``host:port`` (a worker of ``--workers N`` whose metrics worker
    0 gathers); ``render(query)``: what ``/metrics`` answers, given the request's query
    string (default: ``metrics.render()``)."""

    def __init__(self, metrics: Metrics, ready: Callable[[], tuple[bool, str]], port: int,
                 host: str = "127.0.0.1",
                 authorize: Callable[[str | None], bool] | None = None, *,
                 unix_path: str | None = None,
                 render: Callable[[str], bytes] | None = None):
        outer = self
        render = render or (lambda query: metrics.render())

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path, _, query = self.path.partition("?")
                if path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    try:
                        ok, detail = ready()
                    except Exception as exc:  # noqa: BLE001 - not ready, say why
                        ok, detail = False, f"{type(exc).__name__}: {exc}"
                    self._send(200 if ok else 503, (detail + "\n").encode(), "text/plain")
                elif path == "/metrics":
                    if authorize is not None and not authorize(
                            self.headers.get("Authorization")):
                        self._send(401, b"unauthorized: send Authorization: Bearer <token>\n",
                                   "text/plain")
                        return
                    try:
                        body = render(query)
                    except Exception as exc:  # noqa: BLE001 - a worker did not answer
                        self._send(503, f"metrics unavailable: {exc}\n".encode(),
                                   "text/plain")
                        return
                    self._send(200, body, CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args):  # quiet: scrapes are not events
                log.debug("metrics http: " + fmt, *args)

        if unix_path is not None:
            self._httpd = _UnixHTTPServer(unix_path, Handler)
            self.port = None
        else:
            self._httpd = http.server.ThreadingHTTPServer((host, port), Handler)
            self.port = self._httpd.server_address[1]
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="flightsrv-metrics", daemon=True)
        self._thread.start()
        outer.host = host

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
