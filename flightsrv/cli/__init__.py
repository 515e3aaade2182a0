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

from flightsrv.cli.main import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]
