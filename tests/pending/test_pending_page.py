"""The pending page and the claim diagnosis page on the diagnosed monday weekend (real PostgreSQL)."""

from __future__ import annotations

import json
import re
from collections import Counter
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from claims.models import ClaimDiagnosis, DiagnosisShape
from fleet import ingest
from fleet.models import Cluster, NamespaceGrant, ResourceClaim
from fleet.normalize import normalize
from simulator import nvidia
from tests.pending.conftest import PASSWORD
from tests.pending.scenario import BIG_WANT, expected_monday
from tests.stored_diagnoses import own_shape, stored_results

URL = "/claims/pending/"


def groups_shown(html: str) -> list[tuple[str, int]]:
    """(category, count) of every cause section on the page."""
    return [
        (cat, int(n))
        for n, cat in re.findall(
            r'<section class="cause" data-cause="[^"]+" data-count="(\d+)">'
            r'.*?<span class="cat cat-([a-z-]+)">',
            html,
            re.S,
        )
    ]


def found(pattern: str, text: str, group: int = 0) -> str:
    match = re.search(pattern, text, re.S)
    assert match is not None, f"{pattern!r} not on the page"
    return match.group(group)


def rows_shown(html: str) -> list[str]:
    return re.findall(r'<tr class="row" data-kind="\w+" data-name="([^"]+)"', html)


def test_the_page_groups_the_weekend_by_the_causes_the_scenario_constructed(signed_in, monday):
    expected = expected_monday()
    response = signed_in.get(URL)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert Counter(groups_shown(html)) == Counter(expected.groups)
    assert (
        f"{expected.big_pending} want {BIG_WANT}: only B200, B300 match, all {expected.big_devices} held"
        in html
    )
    assert (
        f"{expected.one_g_pending} want H100 1g.10gb: none free, {expected.idle_three_g} 3g.40gb slices idle"
        in html
    )
    assert len(rows_shown(html)) == sum(n for _, n in expected.groups)


def test_rows_show_age_humanized_with_the_exact_time_on_hover_and_link_to_the_diagnosis(signed_in, monday):
    claim = ResourceClaim.objects.filter(state="pending").order_by("created_at")[0]
    html = signed_in.get(URL).content.decode()
    row = found(rf'data-name="{claim.namespace}/{claim.name}".*?</tr>', html)
    assert f'href="/claims/c/sim/{claim.namespace}/{claim.name}/diagnosis/"' in row
    assert re.search(r'<time datetime="[^"]+" title="since [0-9-]+ [0-9:]+ UTC">\d+d \d+h</time>', row)
    assert claim.diagnosis.summary in row


def test_filters_by_namespace_cause_and_age_are_permalinks(signed_in, monday):
    expected = expected_monday()
    html = signed_in.get(URL, {"namespace": "inference"}).content.decode()
    assert len(rows_shown(html)) == expected.namespaces["inference"]
    assert all(name.startswith("inference/") for name in rows_shown(html))

    html = signed_in.get(URL, {"cause": "cel-error"}).content.decode()  # a bare category
    assert Counter(c for c, _ in groups_shown(html)) == Counter(
        c for c, _ in expected.groups if c == "cel-error"
    )
    key = found(r'data-cause="(capacity-[0-9a-f]{10})"', html, 1)  # from the cause table
    html = signed_in.get(URL, {"cause": key}).content.decode()
    assert groups_shown(html) == [("capacity", expected.big_pending)]

    assert rows_shown(signed_in.get(URL, {"min_age": "1d"}).content.decode())  # pending since March
    assert rows_shown(signed_in.get(URL, {"max_age": "1d"}).content.decode()) == []
    html = signed_in.get(URL, {"cluster": "sim", "namespace": "research", "sort": "-age"}).content.decode()
    assert 'value="research" selected' in html
    assert "/ws/pending/?cluster=sim&amp;namespace=research&amp;sort=-age" in html or "cluster=sim" in html


def test_sorting_orders_rows_by_age_either_way_and_by_namespace(signed_in, monday):
    by_age = [
        c.namespace + "/" + c.name
        for c in ResourceClaim.objects.filter(state="pending").order_by("created_at")
    ]
    flat = {"group": "none"}
    assert rows_shown(signed_in.get(URL, flat).content.decode()) == by_age
    assert rows_shown(signed_in.get(URL, {**flat, "sort": "-age"}).content.decode()) == by_age[::-1]
    namespaces = [
        r.split("/")[0]
        for r in rows_shown(signed_in.get(URL, {**flat, "sort": "namespace"}).content.decode())
    ]
    assert namespaces == sorted(namespaces)


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"min_age": "yesterday"}, "min_age"),
        ({"sort": "size"}, "sort"),
        ({"cause": "<script>"}, "cause"),
        ({"cluster": "nope"}, "cluster"),
        ({"namespace": "Bad_NS"}, "namespace"),
        ({"group": "x"}, "group"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(signed_in, monday, params, parameter):
    # The page re-renders its form (HTML) with the message beside the field; the fragment (fetched by the
    # page's script, never shown alone) answers in one line.
    response = signed_in.get(URL, params)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'id="pending-filters"' in html and "Will it fit?" in html
    assert re.search(r'<span class="error" role="alert">[^<]+</span>', html)
    assert 'id="pending-groups"' in html  # the rest of the page is still there, unfiltered by the bad value
    fragment = signed_in.get("/claims/pending/fragment/", params)
    assert fragment.status_code == 400
    assert fragment.content.decode().startswith(f"Bad parameter {parameter}:")


def test_a_bad_age_stays_in_its_field_with_its_message_and_the_good_filters_still_apply(signed_in, monday):
    response = signed_in.get(URL, {"min_age": "2 hours", "namespace": "research"})
    assert response.status_code == 400
    html = unescape(response.content.decode())
    assert '<input name="min_age" value="2 hours"' in html
    assert re.search(r'aria-invalid="true"></label><span class="error" role="alert">[^<]*2 hours', html)
    rows = rows_shown(response.content.decode())
    assert rows and all(r.startswith("research/") for r in rows)


def test_will_it_fit_defaults_to_the_cluster_the_page_is_filtered_to(signed_in, monday):
    ingest.get_or_create_cluster("another")
    html = signed_in.get(URL, {"cluster": "sim"}).content.decode()
    assert re.search(r'<option value="sim" selected>sim</option>', html.split('id="whatif"')[1])


@pytest.mark.parametrize("name", ["<b>x</b>", "a/b", "=1+2"])
def test_a_claim_stored_with_a_name_no_url_can_hold_does_not_break_the_page(signed_in, monday, name, caplog):
    # Names are refused at normalize now; a row stored before that (or by a broken source) must not take
    # the shared page down for every user.
    claim = ResourceClaim.objects.filter(state="pending").order_by("name").first()
    assert claim is not None
    ResourceClaim.objects.filter(pk=claim.pk).update(name=name)
    response = signed_in.get(URL, {"group": "none"})
    assert response.status_code == 200
    assert len(rows_shown(response.content.decode())) > 1
    assert signed_in.get("/claims/pending/fragment/").status_code == 200


def test_unknown_parameters_are_ignored(signed_in, monday):
    assert signed_in.get(URL, {"page": "2", "utm": "x"}).status_code == 200


def test_a_pod_whose_template_claim_was_never_created_is_listed(signed_in, monday):
    pod = nvidia.pod_object("research", "orphan", [("gpu", nvidia.from_template("no-such-template"))])
    pod["metadata"]["resourceVersion"] = "999999"
    ingest.apply_batch(
        Cluster.objects.get(name="sim"), "Pod", [ingest.Change("upsert", normalize("Pod", pod))]
    )
    html = signed_in.get(URL, {"namespace": "research"}).content.decode()
    assert 'data-kind="pod" data-name="research/orphan"' in html
    row = found(r'data-name="research/orphan".*?</tr>', html)
    assert "never created from template no-such-template" in row
    assert groups_shown(html).count(("not-created", 1)) == 1


def test_the_page_costs_a_bounded_number_of_queries(signed_in, monday):
    with CaptureQueriesContext(connection) as ctx:
        assert signed_in.get(URL).status_code == 200
    # session + user + permissions (~4), clusters (3), rows (3 or 4), namespace choices (2)
    assert len(ctx.captured_queries) <= 14, [q["sql"][:120] for q in ctx.captured_queries]


def test_the_diagnosis_page_puts_the_scheduler_beside_ours_with_groups_holders_and_heatmap_links(
    signed_in, monday
):
    claim = ResourceClaim.objects.get(namespace="ml-train", name__startswith="finetune-0-")
    response = signed_in.get(f"/claims/c/sim/ml-train/{claim.name}/diagnosis/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "The scheduler says" in html and "cannot allocate all claims" in html
    # The pod that uses the claim (through its template) is found on every database.
    assert f"<strong>pod {claim.owner_pod_name}</strong>" in html
    assert claim.diagnosis.summary in html
    assert re.search(
        r'<tr data-model="B200" data-profile=""><td>B200</td><td>whole GPU</td><td class="num">16</td>', html
    )
    holders = re.findall(
        r'<tr><td><a href="[^"]+">(ml-train/pretrain-[^<]+)</a></td><td><time datetime="([^"]+)"', html
    )
    assert len(holders) == 3
    assert [t for _, t in holders] == sorted(t for _, t in holders)  # oldest first
    assert 'href="/fleet/heatmap/?cluster=sim&amp;model=B200"' in html
    assert f'href="/fleet/c/sim/claims/ml-train/{claim.name}/"' in html
    detail = signed_in.get(f"/fleet/c/sim/claims/ml-train/{claim.name}/").content.decode()
    assert f'href="/claims/c/sim/ml-train/{claim.name}/diagnosis/"' in detail
    assert f"<tr><td>ml-train/{claim.owner_pod_name}</td>" in detail


def test_an_unknown_claim_or_cluster_is_a_404(signed_in, monday):
    assert signed_in.get("/claims/c/sim/ml-train/nope/diagnosis/").status_code == 404
    assert signed_in.get("/claims/c/nowhere/ml-train/nope/diagnosis/").status_code == 404


def test_namespace_visibility_hides_foreign_claims_pods_and_holders(client, monday):
    user = get_user_model().objects.create_user("bob", password=PASSWORD)
    NamespaceGrant.objects.create(user=user, namespace="research")
    client.force_login(user)
    html = client.get(URL).content.decode()
    assert {r.split("/")[0] for r in rows_shown(html)} == {"research"}
    assert "ml-train/" not in html and "inference/" not in html
    finetune = ResourceClaim.objects.get(namespace="ml-train", name__startswith="finetune-0-")
    assert client.get(f"/claims/c/sim/ml-train/{finetune.name}/diagnosis/").status_code == 404
    bad_cel = ResourceClaim.objects.get(namespace="research", name__startswith="bad-cel-")
    page = client.get(f"/claims/c/sim/research/{bad_cel.name}/diagnosis/").content.decode()
    assert "ml-train/pretrain" not in page  # the holders of the devices it would use are foreign
    assert "a claim in another namespace" in page


def test_nothing_without_login(client, monday):
    for url in (URL, "/claims/pending/fragment/", "/claims/c/sim/research/x/diagnosis/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


PROFILE_1G = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "mig-1g", "namespace": "inference"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": PROFILE_1G}}],
                        },
                    }
                ]
            }
        }
    },
}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: ResourceClaim\nspec: [unclosed", "pasted text: invalid YAML"),
        ('{"kind": "ResourceClaim", "spec": ', "pasted text: invalid JSON"),
        ("kind: Pod\nspec: {}\n", "no ResourceClaim or ResourceClaimTemplate in the pasted text (found Pod)"),
        ("kind: ResourceClaim\nspec: 3\n", "the ResourceClaim has no spec"),
        ("", "This field is required."),
    ],
)
def test_will_it_fit_explains_bad_input_in_the_form(signed_in, monday, text, message):
    response = signed_in.post(URL, {"cluster": "sim", "spec": text})
    assert response.status_code == 400
    html = unescape(response.content.decode())
    assert message in html
    assert 'id="whatif-result"' not in html
    assert "Causes" in html  # the rest of the page is still there


def test_will_it_fit_diagnoses_a_pasted_template_as_json(signed_in, monday):
    expected = expected_monday()
    response = signed_in.post(URL, {"cluster": "sim", "spec": json.dumps(CLAIM)})
    assert response.status_code == 200
    html = unescape(response.content.decode())
    result = found(r'<div id="whatif-result">.*', html)
    assert 'data-category="fragmentation"' in result
    assert f"{expected.idle_three_g} x 3g.40gb" in result
    assert "No lint findings." in result or '<table class="grid lint">' in result


def test_will_it_fit_shows_lint_findings(signed_in, monday):
    text = json.dumps(CLAIM).replace(".profile == '1g.10gb'", ".gpuMemoryGiB >= 80")
    html = unescape(signed_in.post(URL, {"cluster": "sim", "spec": text}).content.decode())
    assert '<table class="grid lint">' in html
    assert "No device in the fleet publishes attribute gpu.nvidia.com/gpuMemoryGiB" in html


def test_will_it_fit_needs_the_csrf_token(monday, admin_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(URL, {"cluster": "sim", "spec": json.dumps(CLAIM)}).status_code == 403
    page = client.get(URL)
    token = found(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode(), 1)
    response = client.post(URL, {"cluster": "sim", "spec": json.dumps(CLAIM), "csrfmiddlewaretoken": token})
    assert response.status_code == 200


def test_will_it_fit_hides_holders_from_other_namespaces(client, monday):
    user = get_user_model().objects.create_user("carol", password=PASSWORD)
    NamespaceGrant.objects.create(user=user, namespace="research")
    client.force_login(user)
    html = unescape(client.post(URL, {"cluster": "sim", "spec": json.dumps(CLAIM)}).content.decode())
    result = found(r'<div id="whatif-result">.*', html)
    assert "inference/chat-1g" not in result
    assert "a claim in another namespace" in result


def test_the_live_fragment_is_filtered_and_scoped_like_the_page(client, monday):
    user = get_user_model().objects.create_user("dave", password=PASSWORD)
    NamespaceGrant.objects.create(user=user, namespace="inference")
    client.force_login(user)
    expected = expected_monday()
    html = client.get("/claims/pending/fragment/", {"sort": "-age"}).content.decode()
    assert "<html" not in html
    assert len(rows_shown(html)) == expected.namespaces["inference"]
    assert {r.split("/")[0] for r in rows_shown(html)} == {"inference"}


def test_an_allocated_claim_has_nothing_to_diagnose(signed_in, monday):
    claim = ResourceClaim.objects.filter(state="reserved")[0]
    html = signed_in.get(f"/claims/c/sim/{claim.namespace}/{claim.name}/diagnosis/").content.decode()
    assert f"The claim is {claim.state}: nothing to diagnose." in html


def test_a_pending_claim_not_diagnosed_yet_is_diagnosed_on_the_page_without_storing(signed_in, monday):
    claim = ResourceClaim.objects.get(namespace="research", name__startswith="huge-kv-")
    ClaimDiagnosis.objects.filter(claim=claim).delete()
    html = unescape(signed_in.get(f"/claims/c/sim/research/{claim.name}/diagnosis/").content.decode())
    assert "(just now, not stored yet)" in html
    assert "No device in the fleet matches request gpu" in html
    assert not ClaimDiagnosis.objects.filter(claim=claim).exists()  # the task owns the table
    row = found(r'data-name="research/huge-kv-[^"]+".*?</tr>', unescape(signed_in.get(URL).content.decode()))
    assert "No diagnosis stored yet." in row


def test_a_cause_shows_its_first_rows_and_its_permalink_lists_them_all(signed_in, monday, monkeypatch):
    from claims import views

    monkeypatch.setattr(views, "ROWS_PER_CAUSE", 1)
    expected = expected_monday()
    html = unescape(signed_in.get(URL).content.decode())
    assert Counter(groups_shown(html)) == Counter(expected.groups)  # every cause keeps its count
    assert len(rows_shown(html)) == len(expected.groups)
    key = found(r'data-cause="(capacity-[0-9a-f]{10})"', html, 1)
    more = expected.big_pending - 1
    assert f'<a href="?cause={key}">{more} more: show all {expected.big_pending}</a>' in html
    assert len(rows_shown(signed_in.get(URL, {"cause": key}).content.decode())) == expected.big_pending
    flat = signed_in.get(URL, {"group": "none"}).content.decode()
    assert len(rows_shown(flat)) == sum(n for _, n in expected.groups)


def test_the_list_reads_each_result_without_its_holders_and_placement(monday):
    # What only a claim's own page shows stays in the database (PostgreSQL drops it in the query, SQLite
    # in Python); the rest of each result is as stored.
    from claims.selectors import pending_items, with_results
    from fleet.access.visibility import Visibility

    everything = Visibility.everything()
    listed = [i for i in pending_items(everything, "sim") if i.kind == "claim"]
    assert listed and all(i.result is None for i in listed)  # the list itself reads no result
    items = with_results(listed, everything)
    stored = stored_results()
    assert all(i.ref in stored for i in items)
    with_holders = 0
    for item in items:
        whole = stored[item.ref]
        with_holders += any(r.get("holders") for r in whole["requests"])
        expected = {k: v for k, v in whole.items() if k != "placement"}
        expected["requests"] = [{k: v for k, v in r.items() if k != "holders"} for r in whole["requests"]]
        assert item.result == expected, item.name
    assert with_holders > 0


@pytest.mark.parametrize(
    "result",
    [
        "not an object",
        [1, 2],
        {"category": "capacity", "requests": "x"},
        {"requests": [1, "a", {"holders": []}]},
    ],
)
def test_a_malformed_stored_result_does_not_break_the_page(signed_in, monday, result):
    claim = ResourceClaim.objects.filter(state="pending").order_by("name").first()
    assert claim is not None
    DiagnosisShape.objects.filter(pk=own_shape(claim).pk).update(result=result)
    response = signed_in.get(URL, {"group": "none"})
    assert response.status_code == 200
    assert f"{claim.namespace}/{claim.name}" in rows_shown(response.content.decode())
    assert signed_in.get("/claims/pending/fragment/").status_code == 200


def test_each_stored_diagnosis_keeps_the_cause_of_its_whole_result(monday):
    # The list groups by the stored key: it must be what cause_of gives for the result stored with it.
    from claims.causes import Pending, cause_of

    rows = ClaimDiagnosis.objects.select_related("claim", "claim__cluster", "shape")
    assert rows.exists()
    for d in rows:
        c = d.claim
        key = cause_of(Pending(c.cluster.name, c.namespace, c.name, c.synced_at, d.result)).key
        assert d.group_key == key, c.name


def test_groups_read_the_result_of_their_oldest_member_only(signed_in, monday, monkeypatch):
    from claims import selectors

    read: list[str] = []
    with_results = selectors.with_results

    def recorded(items, vis):
        read.extend(f"{i.namespace}/{i.name}" for i in items)
        return with_results(items, vis)

    monkeypatch.setattr(selectors, "with_results", recorded)
    html = unescape(signed_in.get(URL).content.decode())
    expected = expected_monday()
    assert Counter(groups_shown(html)) == Counter(expected.groups)
    firsts = re.findall(
        r'<section class="cause".*?<tbody><tr class="row" data-kind="claim" data-name="([^"]+)"', html, re.S
    )
    assert sorted(read) == sorted(firsts) and len(read) == len(expected.groups)
    # The summary quoting the oldest member's numbers came from that read.
    assert f"only B200, B300 match, all {expected.big_devices} held" in html


def test_a_diagnosis_stored_without_its_key_is_grouped_from_its_result(signed_in, monday):
    expected = expected_monday()
    before = unescape(signed_in.get(URL).content.decode())
    claims = list(ResourceClaim.objects.filter(diagnosis__isnull=False).order_by("name"))
    shapes = [own_shape(c) for c in claims]
    # A key lost (a damaged row) is computed from the result.
    DiagnosisShape.objects.filter(id__in=[s.pk for s in shapes[::2]]).update(group_key="")
    # A key not of the row's category is not used either.
    other = next(s for s in shapes[1::2] if s.category != "capacity")
    DiagnosisShape.objects.filter(pk=other.pk).update(group_key="capacity-0123456789")
    after = unescape(signed_in.get(URL).content.decode())
    assert Counter(groups_shown(after)) == Counter(expected.groups)
    assert re.findall(r'data-cause="([^"]+)"', after) == re.findall(r'data-cause="([^"]+)"', before)


def test_a_summary_naming_a_foreign_claim_is_redacted_in_rows_and_causes(client, monday):
    # Summaries name holders ("held by ml-train/pretrain-0"); the list reads them from their own column.
    claim = ResourceClaim.objects.filter(state="pending", namespace="research").order_by("created_at")[0]
    said = "All 4 matching devices are held by ml-train/pretrain-secret."
    shape = own_shape(claim)
    DiagnosisShape.objects.filter(pk=shape.pk).update(summary=said, result={**shape.result, "summary": said})
    user = get_user_model().objects.create_user("carol", password=PASSWORD)
    NamespaceGrant.objects.create(user=user, namespace="research")
    client.force_login(user)
    for params in ({}, {"group": "none"}):
        html = unescape(client.get(URL, params).content.decode())
        row = found(rf'data-name="research/{claim.name}".*?</tr>', html)
        assert "pretrain-secret" not in html
        assert "held by a claim in another namespace" in row


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_the_pending_list_reads_one_committed_state():
    # The list reads its rows, then the results of the rows it quotes: a commit between the two reads
    # must not show in the second only.
    from claims.selectors import one_snapshot

    other = connection.copy()
    try:
        with one_snapshot():
            assert connection.in_atomic_block
            before = Cluster.objects.count()
            with other.cursor() as cursor:  # autocommit: visible to any new snapshot at once
                cursor.execute(
                    "INSERT INTO fleet_cluster (name, description, created_at) VALUES ('late', '', now())"
                )
            assert Cluster.objects.count() == before
        assert Cluster.objects.count() == before + 1
    finally:
        other.close()


def test_the_page_and_its_fragment_read_rows_and_quoted_results_in_one_snapshot(
    signed_in, monday, monkeypatch
):
    from contextlib import contextmanager

    from claims import selectors

    depth, reads = [0], []

    @contextmanager
    def snapshot():
        depth[0] += 1
        yield
        depth[0] -= 1

    def spied(name):
        real = getattr(selectors, name)

        def read(*args, **kwargs):
            reads.append((name, depth[0]))
            return real(*args, **kwargs)

        return read

    monkeypatch.setattr(selectors, "one_snapshot", snapshot)
    for name in ("pending_items", "with_results"):
        monkeypatch.setattr(selectors, name, spied(name))
    for url in (URL, "/claims/pending/fragment/"):
        assert signed_in.get(url).status_code == 200
    assert {name for name, _ in reads} == {"pending_items", "with_results"}
    assert all(d == 1 for _, d in reads), reads


def test_a_restricted_reader_groups_by_the_same_keys_as_everyone(client, monday):
    # Keys come from whole results: a redacted part (here a suggestion naming a foreign holder) does not
    # change the group, so permalinks to a cause are the same for every reader.
    from claims.tasks import cause_key

    claim = ResourceClaim.objects.filter(state="pending", namespace="research").order_by("created_at")[0]
    shape = own_shape(claim)
    result = {
        **shape.result,
        "category": "fits",
        "suggestions": ["Wait for ml-train/pretrain-secret to end."],
    }
    key = cause_key("sim", claim, result)
    DiagnosisShape.objects.filter(pk=shape.pk).update(category="fits", result=result, group_key=key)
    pages = {}
    for name, grants in (("erin", ["research", "ml-train"]), ("dave", ["research"])):
        user = get_user_model().objects.create_user(name, password=PASSWORD)
        for namespace in grants:
            NamespaceGrant.objects.create(user=user, namespace=namespace)
        client.force_login(user)
        pages[name] = unescape(client.get(URL, {"cause": key}).content.decode())
        assert rows_shown(pages[name]) == [f"research/{claim.name}"], name
    assert "Fix:</strong> Wait for ml-train/pretrain-secret to end." in pages["erin"]
    assert "pretrain-secret" not in pages["dave"]
    assert "Fix:</strong> Wait for a claim in another namespace to end." in pages["dave"]
