"""``flightsrv store check [LOCATION]``: run the conditional-write contract against a store
and say whether flightsrv can commit safely there.

The checks (conditional PUTs on new, existing, stale and missing keys; ranged and conditional
ranged GETs; multipart with ranged UploadPartCopy; CompleteMultipartUpload with If-None-Match;
ListObjectsV2 paging; a bounded concurrent If-Match race on one counter) write only under
``LOCATION/_flightsrv_storecheck/<random>/`` and delete what they wrote. Exit code 0: safe;
1: a required guarantee is missing (named); 2: the command line is wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys

from flightsrv.cli.common import EXIT_FAILED, EXIT_OK, UsageError


def cmd_check(args) -> int:
    from flightsrv.runtime import DEFAULT_RUNTIME
    from flightsrv.store import open_store
    from flightsrv.store.contract import run_contract

    location = args.location or args.warehouse
    if "://" in location and not location.startswith(("s3://", "file://")):
        raise UsageError("store check takes a path, file://PATH or s3://BUCKET/PREFIX",
                         location=location)
    if location.startswith("s3://") and not location[5:].split("/", 1)[0]:
        raise UsageError("an s3:// location needs a bucket", location=location)
    if not 1 <= args.threads <= 64 or not 1 <= args.increments <= 1000:
        raise UsageError("--threads must be 1-64 and --increments 1-1000")
    store = open_store(location)
    # a local directory must not become a warehouse by being checked: what the check's
    # writes made of the store's own state (.flightsrv/, the directory itself) goes after
    root = getattr(store, "root", None) if not location.startswith("s3://") else None
    made = []  # what does not exist yet, outermost first: the check's writes make it
    if root is not None:
        path = root
        while not os.path.exists(path) and os.path.dirname(path) != path:
            made.insert(0, path)
            path = os.path.dirname(path)
        if os.path.join(root, ".flightsrv") not in made and \
                not os.path.exists(os.path.join(root, ".flightsrv")):
            made.append(os.path.join(root, ".flightsrv"))
    err = sys.stderr

    def started(i, n, name):
        err.write(f"[{i}/{n}] {name} ...\n")
        err.flush()

    def finished(i, n, check):
        err.write(f"[{i}/{n}] {check.name}: {'ok' if check.ok else 'FAILED'}\n")
        err.flush()

    try:
        report = run_contract(store, DEFAULT_RUNTIME.ids.new_id()[:12], threads=args.threads,
                              increments=args.increments,
                              on_start=None if args.quiet else started,
                              on_check=None if args.quiet else finished)
    finally:
        for path in reversed(made):  # .flightsrv/ first, then each directory left empty
            if path == os.path.join(root, ".flightsrv"):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for c in report.checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<24} {c.detail}")
        if report.safe:
            print(f"verdict: SAFE: {report.store} enforces every guarantee flightsrv's commits "
                  "rely on")
        else:
            print(f"verdict: UNSAFE: {report.store} does not provide: "
                  + "; ".join(report.missing)
                  + ". Concurrent commits there could overwrite each other: do not use it "
                  "as a flightsrv warehouse")
    return EXIT_OK if report.safe else EXIT_FAILED


def add_parser(sub, command) -> None:
    s = sub.add_parser("store", help="check an object store",
                       description=__doc__.split("\n\n", 1)[1])
    ss = s.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    p = command(ss, "check", "run the conditional-write contract against a store and give a "
                "verdict (exit 0 safe, 1 unsafe)", cmd_check)
    p.add_argument("location", nargs="?", metavar="PATH|s3://BUCKET/PREFIX",
                   help="the store to check (default: the --warehouse location)")
    p.add_argument("--threads", type=int, default=8,
                   help="writers in the concurrent If-Match race")
    p.add_argument("--increments", type=int, default=25,
                   help="increments each racing writer makes")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
