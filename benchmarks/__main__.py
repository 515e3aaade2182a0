"""Run every benchmark (or ``--only NAME``) and write ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import pkgutil
import sys
import time
import traceback

from benchmarks.harness import Row, new_context, render


def discover() -> dict:
    import benchmarks

    mods = {}
    for info in pkgutil.iter_modules(benchmarks.__path__):
        if info.name.startswith("bench_"):
            mod = importlib.import_module(f"benchmarks.{info.name}")
            mods[getattr(mod, "NAME", info.name[6:])] = mod
    return dict(sorted(mods.items()))


def write_results(path: str, table: str) -> None:
    """Put a run's generated ``table`` at the top of ``path`` in place of the previous
    run's, keeping every written section after it (from the first ``## `` heading on):
    the measurements and their discussion stay when a run, whole or partial, is
    recorded."""
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        at = old.find("\n## ")
        if at >= 0:
            kept = old[at:]
    with open(path + ".tmp", "w") as f:
        f.write(table.rstrip("\n") + "\n" + kept)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("--scale", choices=["small", "full"], default="small")
    p.add_argument("--only", action="append", help="benchmark name (repeatable)")
    p.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    args = p.parse_args(argv)
    mods = discover()
    chosen = [n for n in mods if not args.only or n in args.only]
    unknown = [n for n in args.only or [] if n not in mods]
    if unknown:
        sys.stderr.write(f"unknown benchmark(s): {', '.join(unknown)}; have: {', '.join(mods)}\n")
        return 2
    ctx = new_context(args.scale)
    rows: list[Row] = []
    failed: list[str] = []
    start = time.time()
    try:
        for name in chosen:
            sys.stderr.write(f"== {name} ({args.scale})\n")
            t0 = time.time()
            try:
                got = mods[name].run(ctx)
            except Exception as exc:  # report, keep going, fail the run at the end
                traceback.print_exc()
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
                got = [Row(name, "-", "failed", "-", None, note=f"{type(exc).__name__}: {exc}")]
            rows.extend(got)
            sys.stderr.write(f"   {name}: {time.time() - t0:.1f}s\n")
    finally:
        ctx.close()
    text = render(rows, args.scale, dt.date.today().isoformat(), time.time() - start)
    print(text)
    if not args.no_write:
        path = os.path.join(os.path.dirname(__file__), "RESULTS.md")
        if args.only and os.path.exists(path):
            text += ("\n_Partial run (" + ", ".join(args.only) + ")._\n")
        write_results(path, text)
    if failed:
        sys.stderr.write("benchmarks FAILED:\n" + "".join(f"  {f}\n" for f in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
