"""Shared pieces of the benchmark runner: context, result rows, timing, the results table."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Row:
    benchmark: str  # e.g. "append throughput"
    workload: str  # e.g. "10M rows, 348 MB"
    figure: str  # e.g. "512 MB/s"
    baseline: str  # e.g. "pyarrow write_table 600 MB/s"
    ratio: float | None  # ours / baseline in the direction of "higher is better" unless noted
    goal: str = ""  # e.g. ">= 0.8x"
    met: bool | None = None
    note: str = ""


@dataclass
class Context:
    scale: str  # "small" | "full"
    workdir: str
    _moto: object = None
    extras: dict = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.scale == "full"

    def rows(self, small: int, full: int) -> int:
        return full if self.full else small

    def tempdir(self, name: str) -> str:
        d = os.path.join(self.workdir, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    def s3_uri(self, name: str) -> str:
        """A warehouse on a moto S3 server started once per run (127.0.0.1)."""
        if self._moto is None:
            from flightsrv.testing.moto_server import MotoProcess

            self._moto = MotoProcess().start()
            self._moto.apply_env()
            self._moto.create_bucket("bench")
        return f"s3://bench/{name}-{int(time.time() * 1000)}"

    def close(self) -> None:
        if self._moto is not None:
            self._moto.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def new_context(scale: str) -> Context:
    return Context(scale=scale, workdir=tempfile.mkdtemp(prefix="flightsrv-bench-"))


def timed(fn: Callable, repeat: int = 3, setup: Callable | None = None) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs (``setup()`` untimed before each)."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_pair(fns: dict[str, Callable], repeat: int = 3,
               setup: Callable | None = None) -> dict[str, float]:
    """Median wall time of each ``fns[name]()``, runs interleaved (a, b, a, b, ...) so that
    background load on a shared machine hits every contender alike. ``setup()`` runs untimed
    before each call."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def machine() -> str:
    load = ""
    if hasattr(os, "getloadavg"):  # a shared box: say how busy it was (1/5/15-min averages)
        load = ", load average " + "/".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python " \
           f"{platform.python_version()}{load}"


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def render(rows: list[Row], scale: str, date: str, elapsed: float) -> str:
    head = ("| benchmark | workload | figure | baseline (same run) | ratio | goal | met | note |\n"
            "|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.benchmark} | {r.workload} | {r.figure} | {r.baseline} | "
        f"{'' if r.ratio is None else f'{r.ratio:.2f}x'} | {r.goal} | "
        f"{'' if r.met is None else ('yes' if r.met else 'NO')} | {r.note} |\n" for r in rows)
    return (f"# Benchmark results\n\nDate: {date}. Scale: `{scale}`. Machine: {machine()}. "
            f"Wall time: {elapsed:.0f} s.\n\nRatios compare flightsrv with a baseline measured "
            f"in the same run on the same data (see each benchmark module for details).\n\n"
            + head + body)
