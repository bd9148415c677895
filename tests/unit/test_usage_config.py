"""CLAIMSCOPE_PROMETHEUS: entries parsed, bad ones refused with a message naming them."""

from __future__ import annotations

import pytest

from usage.config import PrometheusConfig, PrometheusConfigError, parse


def test_it_reads_urls_tokens_cas_and_label_matchers():
    configs = parse(
        "prod=https://prom.example:9090/;token_file=/run/secrets/prom;ca_file=/etc/ca.pem;label=cluster:prod,"
        " lab=http://127.0.0.1:9090"
    )
    assert configs["prod"] == PrometheusConfig(
        "prod", "https://prom.example:9090", "/run/secrets/prom", "/etc/ca.pem", (("cluster", "prod"),)
    )
    assert configs["lab"].url == "http://127.0.0.1:9090"
    assert configs["prod"].matchers() == 'cluster="prod"'
    assert parse("") == {}


@pytest.mark.parametrize(
    ("entry", "compressed"),
    [
        ("a=http://127.0.0.1:9090", False),
        ("a=http://[::1]:9090", False),
        ("a=http://localhost:9090", False),
        ("a=http://prometheus:9090", False),
        ("a=https://prometheus.monitoring.svc:9090", False),
        ("a=https://prometheus.monitoring.svc.cluster.local:9090", False),
        ("a=https://prom.example:9090", True),
        ("a=http://10.0.0.7:9090", True),
        ("a=http://127.0.0.1:9090;compress=yes", True),
        ("a=https://prom.example:9090;compress=no", False),
    ],
)
def test_answers_are_compressed_only_from_outside_the_cluster_network_unless_configured(entry, compressed):
    assert parse(entry)["a"].compressed() is compressed


def test_label_values_are_escaped_in_queries():
    config = parse('a=http://p:9090;label=team:x"y')["a"]
    assert config.matchers() == 'team="x\\"y"'


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("prod", "'prod' is not cluster=URL"),
        ("Prod=http://p:9090", "cluster name 'Prod'"),
        ("prod=ftp://p", "is not an http(s) URL"),
        ("prod=http://p:9090;tokenfile=/x", "unknown option 'tokenfile'"),
        ("prod=http://p:9090;label=9bad:x", "label '9bad:x'"),
        ("prod=http://p:9090;token_file", "option 'token_file' is not key=value"),
        ("prod=http://p:9090;compress=maybe", "compress='maybe' is not yes or no"),
        ("a=http://p:9090,a=http://q:9090", "cluster 'a' is listed twice"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(value, named):
    with pytest.raises(PrometheusConfigError, match="CLAIMSCOPE_PROMETHEUS") as caught:
        parse(value)
    assert named in str(caught.value)
