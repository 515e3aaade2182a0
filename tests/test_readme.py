"""The README's "S3 in five minutes" commands, run as written by bash in a fresh directory.

The one change: moto's port 5000 becomes a free port (the machine is shared). The install line
is skipped (the suite runs installed)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def section_commands(title: str) -> list[str]:
    text = README.read_text()
    body = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.s3
def test_s3_in_five_minutes(tmp_path):
    lines = section_commands("S3 in five minutes")
    assert lines[0].startswith("python -m pip install")
    port = str(free_port())
    script = "\n".join(["set -euo pipefail"] + [ln.replace("5000", port) for ln in lines[1:]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)  # no ~/.aws of the machine
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        try:  # the background moto_server is in the script's process group
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    lines = out.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.split() == ["id", "name"]):]
    assert [ln.split() for ln in table[2:]] == [["1", "ann"], ["3", "cy"], ["(2", "rows)"]]


def test_the_readme_lists_every_command():
    import argparse

    from flightsrv.cli.main import build_parser

    text = (Path(__file__).parent.parent / "README.md").read_text()
    para = " ".join(text[text.index("Commands: `flightsrv serve`"):].split("\n\n")[0].split())
    para = para.replace("| ", "|")
    spelled = {m for group in re.findall(r"`flightsrv ([^`]+)`", para)
               for m in _expand(group)}

    def leaves(parser, prefix):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield prefix
            return
        for name, child in subs[0].choices.items():
            yield from leaves(child, f"{prefix} {name}".strip())

    missing = [c for c in leaves(build_parser(), "") if c not in spelled]
    assert not missing, missing


def _expand(group: str) -> list[str]:
    """``table list|create`` -> ``table list``, ``table create``."""
    head, _, tail = group.partition(" ")
    if "|" not in tail:
        return [group]
    return [f"{head} {w}" for w in tail.split("|")]
