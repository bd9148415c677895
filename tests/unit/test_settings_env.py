"""Bad configuration stops start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.env import ConfigError, env_bool, env_int, env_url

ROOT = Path(__file__).resolve().parents[2]


def start(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    base.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=base, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://localhost"}, "REDIS_URL"),
        ({"DATABASE_URL": "postgres://u@h/db", "REDIS_URL": "redis://h:6379/0"}, "SECRET_KEY"),
        ({"DATABASE_URL": "postgres://u@h/db", "SECRET_KEY": "k" * 60}, "REDIS_URL"),
        (
            {"DATABASE_URL": "postgres://u@h/db", "REDIS_URL": "redis://h/0", "SECRET_KEY": "short"},
            "SECRET_KEY",
        ),
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG"),
        ({"WEB_CONCURRENCY": "2"}, "WEB_CONCURRENCY"),  # several web processes need Redis between them
        ({"CLAIMSCOPE_WATCH_FLUSH_MS": "0"}, "CLAIMSCOPE_WATCH_FLUSH_MS"),  # a window of nothing
        ({"CLAIMSCOPE_WATCH_FLUSH_MS": "250000"}, "CLAIMSCOPE_WATCH_FLUSH_MS"),  # four minutes, not 250 ms
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(env, needle, tmp_path):
    result = start(CLAIMSCOPE_DATA_DIR=str(tmp_path), **env)
    assert result.returncode != 0
    assert needle in result.stderr


def test_no_environment_is_the_demo_configuration(tmp_path):
    result = start(CLAIMSCOPE_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "secret_key").exists()


def test_readers():
    assert env_bool("X", env={"X": "yes"}) is True
    assert env_bool("X", env={}) is False
    assert env_int("N", 3, env={"N": "7"}) == 7
    with pytest.raises(ConfigError, match="N='x' is invalid: expected an integer"):
        env_int("N", 3, env={"N": "x"})
    assert env_int("N", 3, 1, {"N": "10"}, maximum=10) == 10
    with pytest.raises(ConfigError, match="N='11' is invalid: expected an integer from 1 to 10"):
        env_int("N", 3, 1, {"N": "11"}, maximum=10)
    with pytest.raises(ConfigError, match="expected an integer <= 10"):
        env_int("N", 3, env={"N": "11"}, maximum=10)
    with pytest.raises(ConfigError, match=r"\*\*\*"):
        env_url("DATABASE_URL", ("postgres",), env={"DATABASE_URL": "mysql://u:secret@h/db"})
    assert env_url("R", ("redis",), env={"R": "redis://h:1/0"}) == "redis://h:1/0"
