"""Shared fixtures: real stores only.

S3 tests run against two independent S3 implementations, each a real server on 127.0.0.1
over HTTP (docs/DEVELOPMENT.md, "S3 servers"):

- ``moto_s3``: one moto server per test session (subprocess), with requests serialized so
  conditional writes are atomic as on real S3 (``flightsrv.testing.moto_server``).
- ``versity_s3``: one Versity Gateway (posix backend over a per-worker temp directory) per
  test session (``flightsrv.testing.versity_server``); skips, saying why, when versitygw is
  not built (``python -m flightsrv.testing.versity_server build``; ``.ci/run`` does it).
- ``s3_server``: the server this test runs on, by ``s3_backend``; it points the ``AWS_*``
  environment at it for the test. ``FLIGHTSRV_S3`` picks the servers: unset, every S3 test
  on moto and ``VERSITY_BY_DEFAULT`` also on Versity; ``moto``, ``versity`` or ``both``: every
  S3 test on that server / on each. A test on two servers gets ``[moto]`` / ``[versity]``
  in its id (``-k versity``) and the marker of its server (``-m versity``).
- ``local_uri`` / ``s3_uri``: a fresh warehouse location per test.
- ``warehouse_uri``: parametrized over both store backends (local and S3).
- ``spark``: one real local[2] SparkSession for the whole run, shared by every Spark test
  file (start-up costs 12-17 s). It depends on the session's S3 server so the AWS_* variables
  are in the environment before the JVM starts and every Spark Python worker inherits them:
  Spark tests therefore run on one server, moto (Versity with ``FLIGHTSRV_S3=versity``).

A test that reaches S3 through ``request.getfixturevalue`` names ``s3_backend`` with
``@pytest.mark.usefixtures("s3_backend")`` so it is parametrized too; its local variants run
once (on ``[local-moto]``; ``[local-versity]`` is deselected).
"""

from __future__ import annotations

import os
import uuid

import pytest

from _s3_models import share_loader

from flightsrv.testing.moto_server import MotoProcess


# one botocore loader for every S3 client of this process (tests/_s3_models.py: a new
# client parsed botocore's S3 model again, ~0.1-0.3 s of CPU per Warehouse.open of an S3 URI)
share_loader()

BUCKET = "flightsrv-test"
S3_MODES = ("default", "moto", "versity", "both")

# What the default run (README command 2, CI) also runs on Versity Gateway, beside moto: the
# proof that flightsrv's commits hold on a second, independent implementation, at a small
# cost in time (docs/DEVELOPMENT.md gives the split and the figures).
VERSITY_BY_DEFAULT = (
    "tests/test_store.py",  # the ObjectStore contract of S3Store, faults wrapper included
    "tests/test_store_check.py",  # `flightsrv store check`: SAFE on it
    "tests/test_s3_config.py",  # addressing, retries, timeouts, errors against the server
    "tests/test_model.py::test_model_s3",  # the S3 model tests
    "tests/test_format2_model.py::test_format2_model_s3",
    "tests/test_maintenance_model.py::test_model_s3",
    "tests/test_erasure_model.py::test_erasure_model_s3",
    "tests/test_dml.py::test_concurrent_writers_model_s3",  # a model of racing writers
    "tests/test_concurrency.py::test_eight_writer_processes_append",  # racing commits
    "tests/test_maintenance_race.py",
)


def s3_mode() -> str:
    mode = os.environ.get("FLIGHTSRV_S3", "") or "default"
    if mode not in S3_MODES:
        raise pytest.UsageError(f"FLIGHTSRV_S3={mode!r}: use one of moto, versity, both "
                                "(unset: moto, and the VERSITY_BY_DEFAULT tests on both)")
    return mode


def pytest_configure(config):
    s3_mode()  # a bad FLIGHTSRV_S3 is a usage error before anything runs
    if not hasattr(config, "workerinput"):
        # the deletion-mask extensions, built once before the workers start (the C++ kind
        # fetches DuckDB's headers and compiles for ~15 s the first time; .ci/run has built
        # them already): an engine started inside a test then only loads them. What cannot
        # be built here is said by the engines themselves (and by tests/test_maskext.py)
        from flightsrv.engine import maskext

        for kind in maskext.kinds():
            try:
                maskext.build(kind=kind)
            except maskext.Unavailable:
                pass


def s3_backends(nodeid: str) -> list[str]:
    """The S3 servers the test ``nodeid`` runs on, in order."""
    mode = s3_mode()
    if mode in ("moto", "versity"):
        return [mode]
    if _is_spark_file(nodeid):  # the Spark workers keep the session's environment
        return ["moto"]
    if mode == "both" or nodeid.split("[", 1)[0].startswith(VERSITY_BY_DEFAULT):
        return ["moto", "versity"]
    return ["moto"]


def pytest_generate_tests(metafunc):
    if "s3_backend" in metafunc.fixturenames:
        backends = s3_backends(metafunc.definition.nodeid)
        if len(backends) > 1:
            metafunc.parametrize("s3_backend", backends, indirect=True)


@pytest.fixture
def s3_backend(request) -> str:
    """"moto" or "versity": the S3 server of this test (parametrized by
    ``pytest_generate_tests`` where a test runs on both)."""
    return getattr(request, "param", None) or s3_backends(request.node.nodeid)[0]


@pytest.fixture
def s3_server(s3_backend, request, monkeypatch):
    """The S3 server of this test, with the ``AWS_*`` environment pointing at it."""
    server = request.getfixturevalue("versity_s3" if s3_backend == "versity" else "moto_s3")
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return server


@pytest.fixture(scope="session")
def moto_s3():
    server = MotoProcess().start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def versity_s3(tmp_path_factory):
    from flightsrv.testing import versity_server as vs

    if vs.binary() is None:
        pytest.skip(f"Versity Gateway {vs.VERSION} is not built here: run `python -m "
                    "flightsrv.testing.versity_server build` (needs Go; .ci/run does it)")
    server = vs.VersityProcess(str(tmp_path_factory.mktemp("versitygw"))).start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3_uri(s3_server, request):
    name = request.node.name.split("[")[0][:40].replace("_", "-")
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_uri_factory(s3_server, request):
    """A function returning a fresh S3 warehouse location per call (for hypothesis tests,
    whose examples share one function-scoped fixture)."""
    name = request.node.name.split("[")[0][:32].replace("_", "-")

    def make() -> str:
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def local_uri(tmp_path):
    return str(tmp_path / "warehouse")


@pytest.fixture(params=["local", "s3"])
def warehouse_uri(request, tmp_path, s3_backend):
    if request.param == "local":
        return str(tmp_path / "warehouse")
    return request.getfixturevalue("s3_uri")


@pytest.fixture
def subprocess_env(s3_server):
    """Environment for child processes that talk to this test's S3 server."""
    env = dict(os.environ)
    env.update(s3_server.env())
    return env


def pytest_collection_modifyitems(config, items):
    """``slow`` tests (large hypothesis runs) run only when asked for: ``-m slow`` or
    ``FLIGHTSRV_SLOW=1``; the default run stays a few minutes. The Spark files go first, so the
    one worker that runs them (see ``pytest_xdist_make_scheduler``) starts the longest queue
    at once."""
    items.sort(key=lambda item: not _is_spark_file(item.nodeid))
    _mark_s3_items(config, items)
    if "slow" in (config.getoption("-m") or "") or os.environ.get("FLIGHTSRV_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or FLIGHTSRV_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _mark_s3_items(config, items):
    """Marks every test that runs on an S3 server ``s3`` and ``moto`` / ``versity``, and
    deselects the ``versity`` copies of local-store variants (they would run the local test
    a second time)."""
    keep, dropped = [], []
    only_moto = pytest.mark.skip(reason="a Versity Gateway test; FLIGHTSRV_S3=moto")
    for item in items:
        if s3_mode() == "moto" and item.get_closest_marker("versity"):
            item.add_marker(only_moto)
        if "s3_backend" not in getattr(item, "fixturenames", ()):
            keep.append(item)
            continue
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        backend = params.get("s3_backend") or s3_backends(item.nodeid)[0]
        if "local" in params.values():  # the local-store variant of a local/S3 test
            (dropped if backend != "moto" else keep).append(item)
            continue
        item.add_marker(pytest.mark.s3)
        item.add_marker(getattr(pytest.mark, backend))
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _is_spark_file(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith("test_spark")


def pytest_xdist_make_scheduler(config, log):
    """How ``-n N`` (pyproject.toml) shares the tests out. A test file that defines a fixture
    of module, class or session scope (a server, the JDBC build, the DuckDB 1.5.5 venv) is one
    unit of work, so that fixture is made once; every ``test_spark*.py`` file is one unit with
    the others, so one worker starts the one SparkSession (12-17 s and a JVM); every other
    test is a unit of its own, so the long CLI files spread over all workers.
    (pytest-xdist's own ``loadgroup`` marks are lost under pytest 9, which no longer reads
    the ``_nodeid`` xdist rewrites.)"""
    import re
    from pathlib import Path

    from xdist.scheduler import LoadScopeScheduling

    shared = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](module|class|session)")
    root = Path(str(config.rootpath))
    whole: dict[str, bool] = {}

    def keep_together(path: str) -> bool:
        if path not in whole:
            try:
                whole[path] = bool(shared.search((root / path).read_text()))
            except OSError:
                whole[path] = True
        return whole[path]

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if _is_spark_file(nodeid):
                return "spark"
            return path if keep_together(path) else nodeid

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def spark(request):
    pytest.importorskip("pyspark")
    server = request.getfixturevalue("versity_s3" if s3_mode() == "versity" else "moto_s3")
    server.apply_env()
    import flightsrv.spark as fs

    # the tests' Spark jobs are small and short: the C1 compiler alone and the serial
    # collector use about a third less CPU than the JVM's defaults (test_spark.py: 67 s ->
    # 43 s of CPU), and the suite runs on 2 cores
    s = fs.session("local[2]", "flightsrv-tests", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.extraJavaOptions":
            "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"})
    yield s
    s.stop()
