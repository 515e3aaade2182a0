"""``flightsrv warehouse ...``: maintenance of a whole warehouse (not of one table).

- ``warehouse vacuum``: delete the files that prefixes *without a table* hold, i.e. what a
  create that failed before it committed left behind (a table's own unreferenced files are
  ``flightsrv table vacuum``'s). Older than ``--grace`` only (default 7 days, at least 1 hour
  unless ``--allow-short-grace``): a create in progress writes its files before the commit
  that creates its table.
"""

from __future__ import annotations

from flightsrv.cli import output
from flightsrv.cli.common import format_duration, open_warehouse, parse_duration
from flightsrv.errors import ConfigurationError

MIN_GRACE_HOURS = 1


def cmd_vacuum(args) -> int:
    from flightsrv.progress import Progress

    output.check_output_args(args)
    if args.grace < MIN_GRACE_HOURS * 3600 and not args.allow_short_grace:
        raise ConfigurationError(
            f"warehouse vacuum --grace {format_duration(args.grace)} is below the minimum "
            f"grace of {MIN_GRACE_HOURS} hour: it can delete the files of a create that has "
            "not committed yet; pass --allow-short-grace if no writer is running",
            minimum_hours=MIN_GRACE_HOURS)
    wh = open_warehouse(args)
    kw = {"grace": _duration(args.grace), "dry_run": args.dry_run}
    if not args.dry_run:
        kw["progress"] = Progress("vacuum orphans")
    result = wh.vacuum_orphans(**kw)
    output.write_rows(_render().result_rows(result), args)
    return 0


def add_parser(sub, command) -> None:
    w = sub.add_parser("warehouse", help="maintain the whole warehouse",
                       description=__doc__.split("\n\n", 1)[1])
    ws = w.add_subparsers(dest="warehouse_command", required=True, metavar="COMMAND")
    p = command(ws, "vacuum", "delete files under prefixes that hold no table (failed "
                "creates)", cmd_vacuum)
    p.add_argument("--grace", type=parse_duration, default=7 * 86400, metavar="DURATION",
                   help="keep files younger than this, e.g. 7d, 2h (at least 1h unless "
                        "--allow-short-grace) (default: 7d)")
    p.add_argument("--allow-short-grace", action="store_true",
                   help="allow a grace below 1h (only when no writer is running)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    output.add_output_options(p)


def _render():
    """The result renderers, imported when a result is shown: they import every
    maintenance and erasure module, which most commands never need."""
    from flightsrv.cli import render

    return render


def _duration(seconds: float):
    # imported here: the maintenance package loads compaction and the whole table format
    from flightsrv.table.maintenance.common import duration

    return duration(seconds)
