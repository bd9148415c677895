"""Pure parts of the security plumbing: OIDC settings from the environment, redaction helpers, SSO claims."""

from __future__ import annotations

import pytest

from dashboard.env import ConfigError
from dashboard.oidc import namespaces_from_claim, username_for
from dashboard.oidc_config import oidc_settings
from fleet.access.visibility import (
    HIDDEN_LABEL,
    HIDDEN_REF,
    Visibility,
    redact_diagnosis,
    redact_heatmap_rows,
    redact_text,
)

FULL = {
    "CLAIMSCOPE_OIDC_ISSUER": "https://sso.example.org/realms/x",
    "CLAIMSCOPE_OIDC_AUTHORIZATION_ENDPOINT": "https://sso.example.org/auth",
    "CLAIMSCOPE_OIDC_TOKEN_ENDPOINT": "https://sso.example.org/token",
    "CLAIMSCOPE_OIDC_USERINFO_ENDPOINT": "https://sso.example.org/userinfo",
    "CLAIMSCOPE_OIDC_JWKS_ENDPOINT": "https://sso.example.org/certs",
    "CLAIMSCOPE_OIDC_CLIENT_ID": "claimscope",
    "CLAIMSCOPE_OIDC_CLIENT_SECRET": "s3cret",
}
VIS = Visibility(False, frozenset({("c1", "team-a"), ("*", "shared")}))


def test_oidc_is_off_without_variables_and_on_with_all_of_them() -> None:
    assert oidc_settings({}) == {"CLAIMSCOPE_OIDC_ENABLED": False}
    on = oidc_settings(FULL)
    assert on["CLAIMSCOPE_OIDC_ENABLED"] and on["OIDC_RP_SIGN_ALGO"] == "RS256" and on["OIDC_USE_PKCE"]
    assert on["OIDC_RP_CLIENT_SECRET"] == "s3cret" and on["OIDC_OP_JWKS_ENDPOINT"].endswith("/certs")


@pytest.mark.parametrize("missing", sorted(k for k in FULL if k != "CLAIMSCOPE_OIDC_CLIENT_ID"))
def test_a_missing_oidc_variable_is_named(missing: str) -> None:
    with pytest.raises(ConfigError) as error:
        oidc_settings({k: v for k, v in FULL.items() if k != missing})
    assert error.value.name == missing


def test_oidc_variables_without_a_client_id_are_an_error_not_silently_ignored() -> None:
    with pytest.raises(ConfigError) as error:
        oidc_settings({k: v for k, v in FULL.items() if k != "CLAIMSCOPE_OIDC_CLIENT_ID"})
    assert error.value.name == "CLAIMSCOPE_OIDC_CLIENT_ID"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CLAIMSCOPE_OIDC_SIGN_ALGO", "HS256"),
        ("CLAIMSCOPE_OIDC_SCOPES", "email profile"),
        ("CLAIMSCOPE_OIDC_TOKEN_ENDPOINT", "sso.example.org/token"),
        ("CLAIMSCOPE_OIDC_TIMEOUT", "0"),
    ],
)
def test_a_bad_oidc_value_is_named(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as error:
        oidc_settings(FULL | {name: value})
    assert error.value.name == name


def test_sso_usernames_come_from_the_subject_and_stay_valid() -> None:
    assert username_for("1234") == "oidc-1234"
    odd = username_for("user with spaces/and:colons")
    assert odd.startswith("oidc-") and " " not in odd and len(odd) <= 150
    assert username_for("a" * 500) != username_for("a" * 499)


def test_a_namespaces_claim_reads_lists_strings_and_cluster_prefixes() -> None:
    assert namespaces_from_claim(["research", "prod/ml-train"]) == [(None, "research"), ("prod", "ml-train")]
    assert namespaces_from_claim("a, b") == [(None, "a"), (None, "b")]
    assert namespaces_from_claim(["Not_A_Namespace", 3, ""]) == []
    assert namespaces_from_claim(None) == []


def test_redaction_hides_foreign_references_in_text_and_keeps_visible_ones() -> None:
    text = "held by team-b/train-7, team-a/x-1, shared/y; device gpu.nvidia.com/node-1/gpu-0"
    out = redact_text(text, VIS, "c1")
    assert "team-b" not in out and "train-7" not in out and HIDDEN_REF in out
    assert "team-a/x-1" in out and "shared/y" in out and "gpu.nvidia.com/node-1/gpu-0" in out
    assert redact_text(text, VIS, "c2").count(HIDDEN_REF) == 2  # team-a is granted in c1 only
    assert redact_text(text, Visibility.everything(), "c1") == text


def test_diagnosis_holders_of_other_namespaces_lose_their_name_and_pods() -> None:
    result = {
        "summary": "held by team-b/train-7 (oldest first).",
        "requests": [
            {"holders": [{"claim": "team-b/train-7", "pods": ["p1"]}, {"claim": "team-a/x", "pods": ["p2"]}]}
        ],
    }
    out = redact_diagnosis(result, VIS, "c1")
    assert out["requests"][0]["holders"] == [
        {"claim": HIDDEN_REF, "pods": []},
        {"claim": "team-a/x", "pods": ["p2"]},
    ]
    assert "train-7" not in out["summary"]


def test_heatmap_rows_with_counts_only_pass_unchanged_and_unshared() -> None:
    rows = {"c1/n": ["c1", "n", "B200", "pool", [[0, 7, 4, "", 1]]]}
    assert redact_heatmap_rows(rows, VIS) is rows
    named = {"c1/n": ["c1", "n", "B200", "pool", [[0, 7, 4, "", ["team-b/train-7", "team-a/x"]]]]}
    out = redact_heatmap_rows(named, VIS)
    assert out["c1/n"][4][0][4] == [HIDDEN_LABEL, "team-a/x"]
    assert "team-b" not in str(out) and "team-b" in str(named)  # the shared input is not modified
