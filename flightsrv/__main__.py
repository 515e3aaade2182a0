"""``python -m flightsrv``: the ``flightsrv`` command (docs/CLI.md), for an environment
whose scripts directory is not on PATH."""

from flightsrv.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
