"""The Docker files, checked without a Docker engine (none on CI): the Dockerfile's
instructions, ``.dockerignore`` and ``docker/compose.yaml`` are parsed and the facts that
make the image work are asserted. The entrypoint's and compose's arguments go through the
real ``flightsrv`` parser and ServerConfig."""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path

import yaml

from flightsrv.server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of docker/Dockerfile, continuation lines joined."""
    out, pending = [], ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continued line at the end of the Dockerfile"
    return out


def first(name: str) -> str:
    found = [rest for word, rest in instructions() if word == name]
    assert len(found) == 1, (name, found)
    return found[0]


def serve_config(argv: list[str]) -> ServerConfig:
    from flightsrv.cli.main import parse_args

    args = parse_args(["serve", *argv])
    cfg = ServerConfig.from_args(args)
    cfg.validate()
    return cfg


def test_dependencies_are_pinned_by_the_constraints_file():
    runs = [rest for word, rest in instructions() if word == "RUN" and "pip install" in rest]
    assert runs and all("-c constraints.txt" in r for r in runs), runs
    copied = [shlex.split(rest)[:-1] for word, rest in instructions() if word == "COPY"]
    assert any("constraints.txt" in srcs for srcs in copied), copied


def test_metrics_and_health_listen_on_every_interface_and_are_checked():
    entry = json.loads(first("ENTRYPOINT"))
    assert entry[:2] == ["flightsrv", "serve"]
    cfg = serve_config(entry[2:])
    assert cfg.host == "0.0.0.0" and cfg.metrics_host == "0.0.0.0"
    exposed = {int(p) for p in first("EXPOSE").split()}
    assert {cfg.port, cfg.metrics_port} <= exposed
    check = first("HEALTHCHECK")
    assert "CMD" in check and f"127.0.0.1:{cfg.metrics_port}/healthz" in check
    assert "curl" not in check and "wget" not in check  # neither is in python:slim


def test_the_image_runs_as_a_user_that_owns_the_data_directory():
    user = first("USER")
    assert user not in ("root", "0")
    run = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert f"chown {user}:{user} /data" in run or f"chown {user} /data" in run
    assert "--uid" in run  # a fixed id a host directory can be given (docs/DOCKER.md)
    env = first("ENV")
    assert "FLIGHTSRV_WAREHOUSE=/data/" in env and first("VOLUME") == "/data"


def _ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the context (last matching rule wins)."""
    verdict = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if pattern == "**" or fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") \
                or fnmatch.fnmatch(path, pattern.replace("**/", "")) \
                or fnmatch.fnmatch(path, pattern.replace("**/", "*/")):
            verdict = not keep
    return verdict


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest():
    needed = ["pyproject.toml", "README.md", "constraints.txt", "flightsrv/__init__.py",
              "flightsrv/cli/main.py"]
    for word, rest in instructions():
        if word == "COPY":
            for src in shlex.split(rest)[:-1]:
                assert not _ignored(src.rstrip("/")), src
    for path in needed:
        assert not _ignored(path), path
    for path in [".git/HEAD", "warehouse/people/x.parquet", "tests/test_cli.py",
                 "flightsrv/__pycache__/x.pyc", ".venv/bin/python"]:
        assert _ignored(path), path


def test_compose_runs_the_server_on_s3_with_a_bucket_made_at_start():
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = spec["services"]
    srv = services["flightsrv"]
    env = srv["environment"]
    assert env["FLIGHTSRV_WAREHOUSE"].startswith("s3://")
    bucket = env["FLIGHTSRV_WAREHOUSE"][5:].split("/")[0]
    endpoint = env["AWS_ENDPOINT_URL"]
    store = endpoint.split("//")[1].split(":")[0]
    assert store in services and "image" in services[store]
    assert services[store]["environment"]["MINIO_ROOT_USER"] == env["AWS_ACCESS_KEY_ID"]
    assert services[store]["environment"]["MINIO_ROOT_PASSWORD"] == env["AWS_SECRET_ACCESS_KEY"]
    # the bucket is created before the server starts, with the same credentials
    maker = services["create-bucket"]
    assert srv["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert maker["environment"] == {k: v for k, v in env.items() if k.startswith("AWS_")}
    script = maker["entrypoint"][-1]
    compile(script, "create-bucket", "exec")
    assert f'create_bucket(Bucket="{bucket}")' in script
    assert maker["build"]["dockerfile"] == "docker/Dockerfile" and maker["build"]["context"] == ".."
    assert maker["image"] == srv["image"]
    # the server's own arguments parse, after the image's entrypoint
    cfg = serve_config(json.loads(first("ENTRYPOINT"))[2:] + srv["command"])
    published = {p.split(":")[-1] for p in srv["ports"]}
    assert {str(cfg.port), str(cfg.metrics_port)} <= published
    assert cfg.demo


def test_docs_say_how_to_run_it():
    text = (ROOT / "docs" / "DOCKER.md").read_text()
    for needle in ("docker build -f docker/Dockerfile", "docker compose -f docker/compose.yaml",
                   "/healthz", "constraints.txt", "10001"):
        assert needle in text, needle
