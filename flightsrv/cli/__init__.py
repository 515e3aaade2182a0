"""The ``flightsrv`` command line, one module per command group:

- ``main``    the entry point: parser assembly, global options, the error boundary
- ``common``  exit codes, UsageError, opening the warehouse, input files, durations, secrets
- ``output``  result formats (table, csv, jsonl, parquet) and ``--output FILE``
- ``serve``   ``flightsrv serve``
- ``sql``     ``flightsrv sql`` (in process or ``--server``; one statement, a script, a shell)
- ``table``   ``flightsrv table ...``
- ``tools``   ``flightsrv demo``, ``flightsrv user hash``, ``flightsrv pipeline``
"""

from flightsrv.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
