"""The ``flightsrv`` command line, one module per command group:

- ``main``    the entry point: parser assembly, global options, the error boundary
- ``common``  exit codes, UsageError, opening the warehouse, input files, durations, secrets
- ``output``  result formats (table, csv, jsonl, parquet) and ``--output FILE``
- ``serve``   ``flightsrv serve``
- ``sql``     ``flightsrv sql`` (in process or ``--server``; one statement, a script, a shell)
- ``table``   ``flightsrv table ...``
- ``tools``   ``flightsrv demo``, ``flightsrv user hash``, ``flightsrv pipeline``

Started as the ``flightsrv`` executable, Ctrl-C while the modules load (seconds on a busy
machine) exits 130 quietly; ``main()`` puts Python's own handler back.
"""

import os as _os
import signal as _signal
import sys as _sys


def _interrupted_while_loading(signum, frame):  # pragma: no cover - timing of a human
    _sys.stderr.write("flightsrv: interrupted\n")
    _os._exit(130)


if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "flightsrv" \
        and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _interrupted_while_loading)


def _allocator_gives_back() -> None:
    """``flightsrv serve`` caps its data memory (RLIMIT_DATA, ``--memory-headroom``), which
    counts address space. DuckDB's allocator (jemalloc, ``DUCKDB_JE_MALLOC_CONF``) keeps the
    address space of memory it freed by default (``retain``), so after one query near the
    cap the process could no longer allocate anything, Python included: every RPC failed
    with MemoryError and /healthz stopped answering. With ``retain:false`` freed memory
    leaves the address space. Set before DuckDB loads (its allocator reads it once); a
    ``retain`` the environment already sets wins."""
    if "serve" not in _sys.argv[1:] or "duckdb" in _sys.modules:
        return
    conf = _os.environ.get("DUCKDB_JE_MALLOC_CONF", "")
    if "retain:" not in conf:
        _os.environ["DUCKDB_JE_MALLOC_CONF"] = ",".join(x for x in (conf, "retain:false") if x)


_argv0 = _os.path.normpath(_sys.argv[0]) if _sys.argv and _sys.argv[0] else ""
# the executable, python -m flightsrv[.cli] (while ``-m`` imports the package, argv[0] is
# "-m")
if _os.path.basename(_argv0) == "flightsrv" or _argv0 == "-m" or _argv0.endswith(
        (_os.path.join("flightsrv", "__main__.py"),
         _os.path.join("flightsrv", "cli", "__main__.py"))):
    _allocator_gives_back()

from flightsrv.cli.main import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]
