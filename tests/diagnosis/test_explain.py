"""``python manage.py explain`` offline (--fleet) on the kubectl fixture, and its error messages."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from simulator import nvidia
from tests.diagnosis.fleet import CAP

FLEET = str(Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml")


def explain(*args: str) -> str:
    out = StringIO()
    call_command("explain", *args, stdout=out)
    return out.getvalue()


def test_json_output_has_the_documented_keys() -> None:
    result = json.loads(explain("research/giant-kv-0", "--fleet", FLEET, "--json"))
    assert {"category", "summary", "requests", "suggestions", "placement", "lint"} <= set(result)
    assert result["category"] == "no-match"
    assert "memory 79Gi < 300Gi on 8 H100" in result["summary"]


def test_a_pending_claim_is_explained_by_name_with_its_holders() -> None:
    text = explain("research/finetune-70b-0-gpus-ffxl7", "--fleet", FLEET)
    assert text.startswith("[capacity] Request gpus needs 8: 16 devices match (16 B200), 5 free")
    assert "held by ml-train/notebook-alice-gpu" in text


def test_a_pod_whose_claim_was_never_created_is_explained() -> None:
    text = explain("research/typo-0", "--fleet", FLEET)
    assert text.startswith("[not-created]")
    assert 'resourceclaimtemplate.resource.k8s.io "gpu-1x-typo" not found' in text


def test_a_template_file_is_checked_before_submitting(tmp_path: Path) -> None:
    template = nvidia.claim_template(
        "team",
        "t",
        [nvidia.exactly_request("gpu", "gpu.nvidia.com", 1, [f"{CAP}.memory >= quantity('40Gi')"])],
    )
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(template))
    text = explain(str(path), "--fleet", FLEET)
    assert text.startswith("[cel-error]")
    assert "lint error cel-compile" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["research/nope", "--fleet", FLEET], "no ResourceClaim or Pod research/nope in the fleet"),
        (["research/x", "--fleet", "/nonexistent.yaml"], "/nonexistent.yaml: No such file or directory"),
        (["nonsense", "--fleet", FLEET], "'nonsense' is neither NAMESPACE/NAME nor an existing file"),
        (["/nonexistent-claim.yaml", "--fleet", FLEET], "No such file or directory"),
    ],
)
def test_bad_input_gives_a_clear_message(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        explain(*args)


def test_a_file_that_is_not_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: [unclosed\n")
    with pytest.raises(CommandError, match="invalid YAML"):
        explain(str(path), "--fleet", FLEET)
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(CommandError, match="no ResourceClaim, ResourceClaimTemplate, Pod in the file"):
        explain(str(empty), "--fleet", FLEET)
