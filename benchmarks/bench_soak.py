"""A mixed soak of one principal at default settings: readers, writers and OPTIMIZE at once
(issue 32, "A 32-client mixed soak ... 0 errors, 0 lost rows, 0 resurrected rows").

The server is ``flightsrv serve`` in its own process at its defaults: only ``--no-demo``, a
port and a fresh local warehouse, so auth is off and every client is the one principal
``anonymous``, ``--max-concurrent-queries`` is 16 and the background maintenance worker
runs. The warehouse holds one table ``soak(id BIGINT, writer BIGINT, val BIGINT, pad
VARCHAR)`` seeded with ``SEED`` rows (``writer = -1``, ``val = 3 * id``) that nobody changes.

``FLIGHTSRV_BENCH_WORKERS`` sets ``serve --workers`` (default 1).
``FLIGHTSRV_BENCH_CLIENTS`` (default 32) client processes, each with its own ADBC
connection, run for ``FLIGHTSRV_BENCH_SECONDS`` (default 30); they start together once all
have connected:

- **optimizers** (2, or 1 under 8 clients): ``OPTIMIZE soak`` every ``OPTIMIZE_EVERY`` s
  (3, or ``FLIGHTSRV_BENCH_OPTIMIZE_EVERY``);
- **writers** (about half the rest, or ``FLIGHTSRV_BENCH_WRITERS``): writer ``w`` owns the
  keys ``(w + 1) * 10**7 + n`` and runs a random mix of ``INSERT INTO soak VALUES`` (3
  rows), ``adbc_ingest`` append (5 rows), ``DELETE FROM soak WHERE id = ?`` and ``UPDATE
  soak SET val = ? WHERE id = ?`` on one of its live keys. It records which statements were
  acknowledged and checks its own writes: a DELETE or UPDATE must report 1 row, a key
  re-read after an acknowledged delete is gone, after an update shows the new value, after
  an insert is there once; and every ``OWN_SCAN_EVERY`` statements ``SELECT id, val FROM
  soak WHERE writer = ?`` must equal its model exactly (read-your-writes, during OPTIMIZE
  and automatic compaction). Every writer also increments ``HOT`` shared rows (``UPDATE soak
  SET val = val + 1 WHERE id = ?``, ids -1..-4, ``writer = -2``): concurrent updates of one
  row, whose conflicts the server must re-run, not lose or surface (a share ``HOT_SHARE``
  of its statements, 0.1, or ``FLIGHTSRV_BENCH_HOT_SHARE``);
- **readers** (the rest): the hot rows (each between the increments acknowledged before the
  query and those started before it ended, and never lower than this reader saw before), a
  point query ``WHERE id = ?`` on a seed row (exactly that row),
  a range scan of 200 seed ids (exactly those rows), and ``SELECT count(*), sum(val)
  FILTER (WHERE writer = -1), count(*) FILTER (WHERE writer = -1) FROM soak``: the seed part
  exact, and the total count between the floor and the ceiling the writers' shared
  counters allow (``seed + inserted rows acknowledged before the query - deletes started
  before it ended`` <= count <= ``seed + inserts started - deletes acknowledged``).

A failed statement is an error (counted, first messages kept); its effect is unknown, so the
keys it touched are left out of the lost/resurrected counts (they must still be there at
most once).

At the end (after the clients stop): one pass over ``SELECT id, writer, val FROM soak``
through the server and once more through ``Warehouse.open(...).table("soak")`` after the
server stopped, against the writers' models: every acknowledged insert present exactly once
with its last acknowledged value (lost, duplicated, wrong value), every acknowledged delete
absent (resurrected), no row nobody wrote (phantom), the seed intact, each hot row equal to
its acknowledged increments (a shortfall counts as lost updates); and time travel to a
few versions of ``flightsrv_history('soak')``: ``count(*) AT (VERSION => v)`` equals that
version's ``live_rows`` and the seed is whole there. Figures: statements by kind, q/s and
p50/p99 per kind, errors, invariant violations, OPTIMIZE runs, the server's own maintenance
runs (its ``maintenance_run`` log lines: the metrics port is off by default) and server CPU.

Run alone: ``python -m benchmarks --only soak --no-write``.
"""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
import traceback
import warnings

from benchmarks.bench_concurrency import _cpu_seconds, _free_port, _stop
from benchmarks.bench_concurrency import _serve as _serve_with
from benchmarks.harness import Context, Row

NAME = "soak"
SEED = 20_000
HOT = 4  # rows every writer increments: ids -1..-HOT, writer = -2, val = increments so far
HOT_SHARE = float(os.environ.get("FLIGHTSRV_BENCH_HOT_SHARE", "0.1"))  # of writer statements
OPTIMIZE_EVERY = float(os.environ.get("FLIGHTSRV_BENCH_OPTIMIZE_EVERY", "3"))
OWN_SCAN_EVERY = 5
RANGE = 200
KEY_SPAN = 10_000_000
MAX_MESSAGES = 5


def _connect(target: str):
    from adbc_driver_flightsql import dbapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(target, autocommit=True)


class _Client:
    """What one client process measures and reports."""

    def __init__(self, target: str):
        self.target = target
        self.conn = _connect(target)
        self.cur = self.conn.cursor()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: dict[str, int] = collections.Counter()
        self.messages: list[str] = []
        self.violations: list[str] = []
        self.spans: list[tuple[float, float]] = []  # wall-clock (start, end) of each statement

    def run(self, kind: str, sql: str, params=None, fetch: bool = True):
        """Run one statement, time it under ``kind``; returns (ok, rows or rowcount)."""
        t0 = time.perf_counter()
        try:
            if params is None:
                self.cur.execute(sql)
            else:
                self.cur.execute(sql, params)
            out = self.cur.fetchall() if fetch else self.cur.rowcount
        except Exception as exc:  # counted: an error at default settings is a finding
            self.error(kind, exc)
            return False, None
        self.took(kind, t0)
        return True, out

    def took(self, kind: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.lat[kind].append(dt)
        now = time.time()
        self.spans.append((now - dt, now))

    def ingest(self, kind: str, table) -> bool:
        t0 = time.perf_counter()
        try:
            n = self.cur.adbc_ingest("soak", table, mode="append")
        except Exception as exc:
            self.error(kind, exc)
            return False
        self.took(kind, t0)
        if n not in (-1, table.num_rows):  # -1: the driver does not know
            self.violate(f"ingest of {table.num_rows} rows reported {n}")
        return True

    def error(self, kind: str, exc: Exception) -> None:
        self.errors[kind] += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(f"{kind}: {type(exc).__name__}: {str(exc)[:300]}")
        try:  # a failed call can leave the cursor unusable (ADBC after a failed ingest)
            self.cur.close()
        except Exception:
            pass
        self.cur = self.conn.cursor()

    def violate(self, what: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(what)

    def report(self, **extra) -> dict:
        try:
            self.cur.close()
            self.conn.close()
        except Exception:
            pass
        return {"lat": dict(self.lat), "errors": dict(self.errors), "messages": self.messages,
                "violations": self.violations, "spans": self.spans, **extra}


def _wait_start(ready, go, start_at) -> float:
    ready.put(os.getpid())
    go.wait()
    while time.time() < start_at.value:
        time.sleep(0.005)
    return start_at.value


def _optimizer(target, seconds, ready, go, start_at, out, idx) -> None:
    c = _Client(target)
    _wait_start(ready, go, start_at)
    deadline = time.time() + seconds
    runs = collections.Counter()
    time.sleep(random.Random(idx).uniform(0, OPTIMIZE_EVERY))  # two optimizers out of step
    while time.time() < deadline:
        ok, rows = c.run("optimize", "OPTIMIZE soak")
        if ok:  # report rows: (table, operation, metric, value)
            got = {r[2]: r[3] for r in rows}
            runs["runs"] += 1
            runs["committed"] += got.get("version") not in (None, "", "None", "null")
            for k in ("files_rewritten", "groups_aborted"):
                runs[k] += int(got.get(k) or 0)
        time.sleep(min(OPTIMIZE_EVERY, max(0.0, deadline - time.time())))
    out.put(c.report(role="optimizer", optimize=dict(runs)))


def _reader(target, seconds, ready, go, start_at, out, idx, counters) -> None:
    c = _Client(target)
    rng = random.Random(1000 + idx)
    seed_sum = 3 * SEED * (SEED - 1) // 2
    _wait_start(ready, go, start_at)
    deadline = time.time() + seconds
    ins_acked, ins_started, del_acked, del_started, hot_started, hot_acked, _ = counters
    seen = [0] * HOT  # hot values this reader saw last: they never go down
    while time.time() < deadline:
        r = rng.random()
        if r < 0.1:
            floor = list(hot_acked)
            ok, rows = c.run("hot read", "SELECT id, val FROM soak WHERE writer = -2 ORDER BY id "
                             "DESC")
            ceil = list(hot_started)
            if ok:
                got = [v for _, v in rows]
                if [k for k, _ in rows] != [-h - 1 for h in range(HOT)]:
                    c.violate(f"hot rows: ids {[k for k, _ in rows]}")
                elif any(not max(floor[h], seen[h]) <= got[h] <= ceil[h] for h in range(HOT)):
                    c.violate(f"hot rows: {got} outside [{floor} (or last seen {seen}), {ceil}]")
                else:
                    seen = got
        elif r < 0.5:
            k = rng.randrange(SEED)
            ok, rows = c.run("point", "SELECT id, writer, val FROM soak WHERE id = ?", (k,))
            if ok and rows != [(k, -1, 3 * k)]:
                c.violate(f"point id={k}: got {rows}")
        elif r < 0.75:
            lo = rng.randrange(SEED - RANGE)
            ok, rows = c.run("range", "SELECT id, val FROM soak WHERE id BETWEEN ? AND ? "
                             "ORDER BY id", (lo, lo + RANGE - 1))
            if ok and rows != [(k, 3 * k) for k in range(lo, lo + RANGE)]:
                c.violate(f"range {lo}..{lo + RANGE - 1}: {len(rows)} rows, not the seed's")
        else:
            floor0 = SEED + HOT + sum(ins_acked)
            ceil_del = sum(del_acked)
            ok, rows = c.run("aggregate", "SELECT count(*), sum(val) FILTER (WHERE writer = -1),"
                             " count(*) FILTER (WHERE writer = -1) FROM soak")
            floor = floor0 - sum(del_started)
            ceil = SEED + HOT + sum(ins_started) - ceil_del
            if ok:
                total, s, n = rows[0]
                if (n, s) != (SEED, seed_sum):
                    c.violate(f"aggregate: seed count/sum {n}/{s}, expected {SEED}/{seed_sum}")
                if not floor <= total <= ceil:
                    c.violate(f"aggregate: count {total} outside [{floor}, {ceil}]")
    out.put(c.report(role="reader"))


def _writer(target, seconds, ready, go, start_at, out, idx, w, counters) -> None:
    import pyarrow as pa

    c = _Client(target)
    rng = random.Random(2000 + w)
    base = (w + 1) * KEY_SPAN
    nxt = 0
    live: dict[int, int] = {}  # acknowledged state of this writer's keys
    deleted: set[int] = set()
    unsure: dict[int, set] = {}  # key -> values it may hold (None: absent) after a failed stmt
    ins_acked, ins_started, del_acked, del_started, hot_started, hot_acked, hot_failed = counters
    stmts = 0
    _wait_start(ready, go, start_at)
    deadline = time.time() + seconds

    def fresh(n):
        nonlocal nxt
        ks = list(range(base + nxt, base + nxt + n))
        nxt += n
        return ks

    def bump(arr, n, at=None):
        with arr.get_lock():
            arr[w if at is None else at] += n

    def check_key(k, want):  # want: a value, or None for "absent"
        ok, rows = c.run("read-own", "SELECT val FROM soak WHERE id = ?", (k,))
        if ok and rows != ([] if want is None else [(want,)]):
            c.violate(f"writer {w} key {k}: expected {want}, read {rows}")

    while time.time() < deadline:
        stmts += 1
        r = rng.random()
        if r < HOT_SHARE:  # a row every writer updates: conflicts, re-runs, lost updates
            h = rng.randrange(HOT)
            bump(hot_started, 1, h)
            ok, n = c.run("hot update", "UPDATE soak SET val = val + 1 WHERE id = ?", (-h - 1,),
                          fetch=False)
            if ok:
                bump(hot_acked, 1, h)
                if n != 1:
                    c.violate(f"writer {w} hot UPDATE id={-h - 1} reported {n} rows")
            else:
                bump(hot_failed, 1, h)
            continue
        r = rng.random()
        if not live or r < 0.3:
            ks = fresh(3)
            vals = [rng.randrange(10**6) for _ in ks]
            sql = "INSERT INTO soak VALUES " + ", ".join(
                f"({k}, {w}, {v}, 'w{w}-{k}')" for k, v in zip(ks, vals))
            bump(ins_started, 3)
            ok, n = c.run("insert", sql, fetch=False)
            if ok:
                bump(ins_acked, 3)
                if n != 3:
                    c.violate(f"writer {w} INSERT of 3 rows reported {n}")
                live.update(zip(ks, vals))
                check_key(ks[-1], vals[-1])
            else:
                for k, v in zip(ks, vals):
                    unsure[k] = {None, v}
        elif r < 0.5:
            ks = fresh(5)
            vals = [rng.randrange(10**6) for _ in ks]
            tbl = pa.table({"id": pa.array(ks, pa.int64()), "writer": pa.array([w] * 5, pa.int64()),
                            "val": pa.array(vals, pa.int64()),
                            "pad": pa.array([f"w{w}-{k}" for k in ks], pa.string())})
            bump(ins_started, 5)
            if c.ingest("ingest", tbl):
                bump(ins_acked, 5)
                live.update(zip(ks, vals))
                check_key(ks[0], vals[0])
            else:
                for k, v in zip(ks, vals):
                    unsure[k] = {None, v}
        elif r < 0.75:
            k = rng.choice(list(live))
            bump(del_started, 1)
            ok, n = c.run("delete", "DELETE FROM soak WHERE id = ?", (k,), fetch=False)
            old = live.pop(k)
            if ok:
                bump(del_acked, 1)
                deleted.add(k)
                if n != 1:
                    c.violate(f"writer {w} DELETE id={k} reported {n} rows, expected 1")
                check_key(k, None)
            else:
                unsure[k] = {None, old}
        else:
            k = rng.choice(list(live))
            v = rng.randrange(10**6)
            ok, n = c.run("update", "UPDATE soak SET val = ? WHERE id = ?", (v, k), fetch=False)
            if ok:
                live[k] = v
                if n != 1:
                    c.violate(f"writer {w} UPDATE id={k} reported {n} rows, expected 1")
                check_key(k, v)
            else:
                unsure[k] = {live.pop(k), v}
        if stmts % OWN_SCAN_EVERY == 0 and not unsure:
            ok, rows = c.run("scan-own", "SELECT id, val FROM soak WHERE writer = ?", (w,))
            if ok:
                got = collections.Counter(r[0] for r in rows)
                dup = [k for k, n in got.items() if n > 1]
                if dup or dict(rows) != live:
                    missing = set(live) - set(got)
                    extra = set(got) - set(live)
                    wrong = [k for k, v in rows if k in live and live[k] != v]
                    c.violate(f"writer {w} own scan: {len(missing)} missing, {len(extra)} extra, "
                              f"{len(dup)} duplicated, {len(wrong)} wrong values")
    out.put(c.report(role="writer", writer=w, live=live, deleted=sorted(deleted),
                     unsure={k: sorted(v, key=lambda x: (x is not None, x or 0))
                             for k, v in unsure.items()}))


def _client_main(role, args) -> None:
    out = args[5]
    try:
        {"optimizer": _optimizer, "reader": _reader, "writer": _writer}[role](*args)
    except Exception:  # a crashed client is a result, never a silent zero
        out.put({"role": role, "crashed": traceback.format_exc()[-2000:], "lat": {},
                 "errors": {}, "messages": [], "violations": []})


def _serve(uri: str, port: int, log_path: str) -> subprocess.Popen:
    """``flightsrv serve`` at its default settings (the default statement log; one worker,
    or ``FLIGHTSRV_BENCH_WORKERS``)."""
    workers = int(os.environ.get("FLIGHTSRV_BENCH_WORKERS", "1"))
    return _serve_with(uri, port, log_path, workers, log_statements=None)


def _seed(uri: str) -> None:
    import pyarrow as pa

    from flightsrv import Warehouse

    ids = list(range(SEED)) + [-h - 1 for h in range(HOT)]
    data = pa.table({"id": pa.array(ids, pa.int64()),
                     "writer": pa.array([-1] * SEED + [-2] * HOT, pa.int64()),
                     "val": pa.array([3 * i for i in range(SEED)] + [0] * HOT, pa.int64()),
                     "pad": pa.array([f"seed-{i}" for i in ids], pa.string())})
    Warehouse.open(uri).create_table("soak", data.schema).append(data)


def _verify(rows: list[tuple], writers: list[dict], hot_acked: list[int],
            hot_failed: list[int]) -> dict:
    """Compare ``(id, writer, val)`` rows with the writers' models and the hot rows with
    the increments acknowledged (and failed: each may or may not have landed)."""
    count = collections.Counter(r[0] for r in rows)
    val = {r[0]: r[2] for r in rows}
    res = dict.fromkeys(("lost", "resurrected", "wrong_value", "unsure_bad", "acked_live",
                         "acked_deleted", "unsure"), 0)
    res["duplicated"] = sum(1 for n in count.values() if n > 1)
    seed_ok = sum(1 for k in range(SEED) if count.get(k) == 1 and val[k] == 3 * k)
    res["seed_damaged"] = SEED - seed_ok
    known = set(range(SEED)) | {-h - 1 for h in range(HOT)}
    res["hot_increments_acked"] = sum(hot_acked)
    res["hot_lost_updates"] = res["hot_extra_updates"] = res["hot_rows_bad"] = 0
    for h in range(HOT):
        k = -h - 1
        if count.get(k) != 1:
            res["hot_rows_bad"] += 1
            continue
        res["hot_lost_updates"] += max(0, hot_acked[h] - val[k])
        res["hot_extra_updates"] += max(0, val[k] - hot_acked[h] - hot_failed[h])
    for w in writers:
        known |= set(w["live"]) | set(w["deleted"]) | set(w["unsure"])
        for k, v in w["live"].items():
            if k not in count:
                res["lost"] += 1
            elif val[k] != v:
                res["wrong_value"] += 1
        res["resurrected"] += sum(1 for k in w["deleted"] if k in count)
        for k, vs in w["unsure"].items():
            if (val.get(k) if k in count else None) not in vs:
                res["unsure_bad"] += 1
        res["acked_live"] += len(w["live"])
        res["acked_deleted"] += len(w["deleted"])
        res["unsure"] += len(w["unsure"])
    res["phantom"] = sum(1 for k in count if k not in known)
    res["rows"] = len(rows)
    return res


def _time_travel(target: str) -> tuple[int, int, list[str]]:
    c = _Client(target)
    ok, hist = c.run("history", "SELECT version, live_rows FROM flightsrv_history('soak') "
                     "ORDER BY version")
    checked, bad = 0, []
    if ok and hist:
        hist = [h for h in hist if h[1]]  # the create (version 0) holds no rows yet
        pick = sorted({hist[int(i * (len(hist) - 1) / 5)] for i in range(6)})
        for v, live_rows in pick:
            ok, rows = c.run("time travel", f"SELECT count(*), count(*) FILTER (WHERE writer = "
                             f"-1 AND val = 3 * id) FROM soak AT (VERSION => {v})")
            if ok:
                checked += 1
                if rows[0] != (live_rows, SEED):
                    bad.append(f"version {v}: count/seed {rows[0]}, history says {live_rows}")
    bad += c.messages
    c.report()
    return checked, len(hist or []), bad


def _in_flight(spans: list[tuple[float, float]], limit: int) -> tuple[int, float]:
    """The most statements in flight at once (as the clients saw them, from the call to the
    last batch) and the seconds during which more than ``limit`` were."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = n = 0
    over, since = 0.0, None
    for t, d in events:
        n += d
        most = max(most, n)
        if n > limit and since is None:
            since = t
        elif n <= limit and since is not None:
            over += t - since
            since = None
    return most, over


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else float("nan")


def run(ctx: Context) -> list[Row]:
    clients = int(os.environ.get("FLIGHTSRV_BENCH_CLIENTS", "32").split(",")[-1])
    seconds = float(os.environ.get("FLIGHTSRV_BENCH_SECONDS", "30"))
    n_opt = 2 if clients >= 8 else 1
    n_writers = min(clients - n_opt, int(os.environ.get("FLIGHTSRV_BENCH_WRITERS", 0))
                    or max(1, (clients - n_opt) // 2))
    n_readers = max(0, clients - n_opt - n_writers)
    uri = ctx.tempdir("soak")
    _seed(uri)
    port = _free_port()
    log_path = os.path.join(ctx.workdir, "soak-server.log")
    server = _serve(uri, port, log_path)
    target = f"grpc://127.0.0.1:{port}"
    mpc = mp.get_context("spawn")
    counters = tuple(mpc.Array("q", n_writers) for _ in range(4)) + tuple(
        mpc.Array("q", HOT) for _ in range(3))  # hot rows: started, acknowledged, failed
    ready, out, go = mpc.Queue(), mpc.Queue(), mpc.Event()
    start_at = mpc.Value("d", 0.0)
    procs = []
    try:
        common = (target, seconds, ready, go, start_at, out)
        specs = [("optimizer", common + (i,)) for i in range(n_opt)]
        specs += [("writer", common + (n_opt + i, i, counters)) for i in range(n_writers)]
        specs += [("reader", common + (n_opt + n_writers + i, counters))
                  for i in range(n_readers)]
        for role, args in specs:
            p = mpc.Process(target=_client_main, args=(role, args))
            p.start()
            procs.append(p)
        for _ in procs:  # every client connected before the clock starts
            ready.get(timeout=300)
        start_at.value = time.time() + 0.5
        go.set()
        while time.time() < start_at.value:
            time.sleep(0.01)
        cpu0, t0 = _cpu_seconds(server.pid), time.time()
        results = [out.get(timeout=seconds + 600) for _ in procs]
        elapsed = time.time() - t0  # until every client reported (server CPU's window)
        cpu = _cpu_seconds(server.pid) - cpu0
        # q/s over the run: until the last statement (started before the deadline) ended
        window = max((b for r in results for _, b in r.get("spans", [])),
                     default=t0 + seconds) - t0
        for p in procs:
            p.join(timeout=30)
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}) during the soak; its "
                               f"log ends:\n{open(log_path).read()[-8000:]}")
        writers = [r for r in results if r.get("role") == "writer" and "live" in r]
        verify_srv = {}
        c = _Client(target)
        ok, rows = c.run("final", "SELECT id, writer, val FROM soak")
        if ok:
            verify_srv = _verify(rows, writers, list(counters[5]), list(counters[6]))
        final_err = c.messages
        c.report()
        tt_checked, versions, tt_bad = _time_travel(target)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        _stop(server)
    from flightsrv import Warehouse

    direct = Warehouse.open(uri).table("soak").to_table(columns=["id", "writer", "val"])
    verify_dir = _verify(list(zip(*(direct.column(n).to_pylist()
                                     for n in ("id", "writer", "val")))), writers,
                         list(counters[5]), list(counters[6]))

    # -- the report ------------------------------------------------------------------------
    lat: dict[str, list[float]] = collections.defaultdict(list)
    errors: collections.Counter = collections.Counter()
    messages, violations, crashed, spans = [], [], [], []
    for r in results:
        spans += r.get("spans", [])
        for k, xs in r["lat"].items():
            lat[k].extend(xs)
        errors.update(r["errors"])
        messages += r["messages"]
        violations += r["violations"]
        if "crashed" in r:
            crashed.append(r["crashed"])
    opt = collections.Counter()
    for r in results:
        opt.update(r.get("optimize", {}))
    maint = collections.Counter()
    srv_errors = collections.Counter()
    warned: list[str] = []  # warning/error lines and anything not JSON (a traceback)
    for line in open(log_path):
        try:
            ev = json.loads(line) if line.startswith("{") else None
        except ValueError:
            ev = None
        if ev is None:
            if line.strip() and not line.startswith("flightsrv: serving"):
                warned.append(line.strip()[:200])
            continue
        if ev.get("level") in ("warning", "error", "critical"):
            warned.append(f"{ev.get('event')}: {ev.get('msg')}")
        if ev.get("event") == "maintenance_run":
            maint[f"{ev.get('task')} {ev.get('status')}"] += 1
        elif ev.get("event") == "maintenance_failed":
            maint[f"{ev.get('task')} failed"] += 1
            messages.append(f"server maintenance failed: {ev.get('error_class')}: "
                            f"{str(ev.get('error'))[:200]}")
        elif ev.get("event") == "statement" and str(ev.get("status")).lower() != "ok":
            srv_errors[ev.get("status")] += 1
    n_err = sum(errors.values()) + len(crashed)
    lost = verify_srv.get("lost", -1) + verify_dir.get("lost", 0) \
        + verify_srv.get("hot_lost_updates", 0) + verify_dir.get("hot_lost_updates", 0)
    res = verify_srv.get("resurrected", -1) + verify_dir.get("resurrected", 0)
    bad_other = sum(v.get(k, 0) for v in (verify_srv, verify_dir)
                    for k in ("duplicated", "wrong_value", "phantom", "seed_damaged",
                              "unsure_bad", "hot_extra_updates", "hot_rows_bad"))
    total = sum(len(xs) for xs in lat.values())
    most, over = _in_flight(spans, 16)
    workload = (f"{clients} clients ({n_readers} readers, {n_writers} writers, {n_opt} OPTIMIZE) "
                f"of one principal, {seconds:.0f} s, server at default settings")
    rows_out: list[Row] = []
    for kind in sorted(lat):
        xs = sorted(lat[kind])
        rows_out.append(Row(f"soak: {kind}", workload,
                            f"{len(xs)} ok, {len(xs) / window:.1f} q/s, p50 {_pct(xs, .5):.0f} ms,"
                            f" p99 {_pct(xs, .99):.0f} ms", "-", None,
                            note=f"{errors.get(kind, 0)} errors"))
    met = n_err == 0 and lost == 0 and res == 0 and bad_other == 0 and not violations \
        and not tt_bad and not final_err
    rows_out.append(Row(
        "soak: errors, lost, resurrected", workload,
        f"{n_err} errors, {lost} lost, {res} resurrected, {bad_other} other bad rows, "
        f"{len(violations)} invariant violations", "0 / 0 / 0", None,
        "0 errors, 0 lost, 0 resurrected", met,
        f"{total} statements in {window:.0f} s ({total / window:.1f}/s); by kind: "
        + ", ".join(f"{k} {len(v)}" for k, v in sorted(lat.items()))
        + f"; errors by kind {dict(errors)}; final check via server {verify_srv}, "
        f"direct {verify_dir}; time travel {tt_checked} of {versions} versions checked"
        + (f"; first messages: {' | '.join(messages[:3] + final_err + tt_bad[:3])}"
           if messages or final_err or tt_bad else "")
        + (f"; violations: {' | '.join(violations[:3])}" if violations else "")
        + (f"; crashed clients: {crashed[0][-300:]}" if crashed else "")))
    rows_out.append(Row(
        "soak: maintenance and server CPU", workload,
        f"OPTIMIZE {dict(opt) or 0}, server maintenance runs {dict(maint) or 0}", "-", None,
        note=f"server CPU {cpu:.1f} s over {elapsed:.0f} s ({cpu / elapsed:.2f} cores), "
             f"{cpu / max(1, total) * 1000:.1f} ms/statement; server-logged failed statements "
             f"{dict(srv_errors) or 0}; server log warnings {len(warned)}"
             + (f" (first: {' | '.join(warned[:3])})" if warned else "")
             + f"; statements in flight (client side) at most {most}, more than the default "
             f"--max-concurrent-queries 16 for {over:.0f} s"))
    sys.stderr.write(json.dumps({"errors": dict(errors), "messages": messages[:10],
                                 "violations": violations[:10], "verify_server": verify_srv,
                                 "verify_direct": verify_dir, "time_travel_bad": tt_bad,
                                 "crashed": crashed[:2], "server_warnings": warned[:10]},
                                default=str) + "\n")
    return rows_out
