"""Try the newest releases of every dependency, on purpose, and report what breaks.

A fresh machine installs the exact versions of ``constraints.txt`` (what CI tested). This
script is the other half: in a throwaway virtualenv it installs flightsrv with the newest
release of each of its dependencies (the ``test`` extra included), ignoring the upper bounds of
``pyproject.toml``, runs the test suite there and prints which versions moved and how the
suite did.

    python tools/try_newest.py                      # whole suite
    python tools/try_newest.py -- -m "not spark"    # arguments after -- go to pytest
    python tools/try_newest.py --lock               # if green, write constraints.txt

``bash .ci/run`` does the same with ``FLIGHTSRV_DEPS=newest``. Exit status: 0 when the suite
passed, 1 when it failed, 2 when the environment could not be built.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"


def requirement_names(extras: tuple[str, ...] = ("test",)) -> list[str]:
    """The project's dependencies as bare names (with their own extras), bounds dropped."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    names: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        spelled = req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "")
        names.setdefault(canonical(req.name), spelled)
    return sorted(names.values())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonical(name)] = version.strip()
    return out


def freeze(python: Path) -> dict[str, str]:
    text = subprocess.run([str(python), "-m", "pip", "freeze", "--exclude-editable"],
                          check=True, capture_output=True, text=True).stdout
    return {canonical(n): v for n, _, v in (ln.partition("==") for ln in text.splitlines()
                                            if "==" in ln)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", action="store_true",
                    help="when the suite passes, write the tried versions to constraints.txt")
    ap.add_argument("--venv", default=None,
                    help="where to build the virtualenv (default: a new temporary directory)")
    args = ap.parse_args(argv)

    venv = Path(args.venv or tempfile.mkdtemp(prefix="flightsrv-newest-"))
    python = venv / "bin" / "python"
    names = requirement_names()
    print(f"try_newest: building {venv} with the newest {len(names)} dependencies", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
        subprocess.run(pip + ["--upgrade", "--upgrade-strategy", "eager"] + names, check=True)
        subprocess.run(pip + ["--no-deps", "-e", str(ROOT)], check=True)
    except subprocess.CalledProcessError as exc:
        print(f"try_newest: could not build the environment: {exc}", file=sys.stderr)
        return 2

    now, locked = freeze(python), pinned(CONSTRAINTS)
    moved = [(n, locked.get(n, "-"), v) for n, v in sorted(now.items()) if locked.get(n) != v]
    print("\nversions that differ from constraints.txt:")
    print(f"  {'package':32} {'constraints.txt':18} newest")
    for name, old, new in moved or [("(none)", "", "")]:
        print(f"  {name:32} {old:18} {new}")

    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    print(f"\ntry_newest: python -m pytest {' '.join(pytest_args)}", flush=True)
    rc = subprocess.run([str(python), "-m", "pytest", *pytest_args], cwd=ROOT, env=env).returncode
    verdict = "passed" if rc == 0 else f"FAILED (pytest exit {rc})"
    print(f"\ntry_newest: the suite {verdict} with {len(moved)} package(s) newer than "
          "constraints.txt")
    if rc == 0 and args.lock:
        head = [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.startswith("#")]
        body = subprocess.run([str(python), "-m", "pip", "freeze", "--exclude-editable"],
                              check=True, capture_output=True, text=True).stdout
        CONSTRAINTS.write_text("\n".join(head) + "\n" + body)
        print(f"try_newest: wrote {CONSTRAINTS}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
