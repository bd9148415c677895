from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.browser.conftest import screenshot

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_user_logs_in_and_sees_the_fleet(live_server, page):
    get_user_model().objects.create_user("alice", password="correct horse battery staple")
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    page.goto(live_server.url + "/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Physical GPUs and devices")
    screenshot(page, "fleet-home")
    rows = page.locator("table.grid").first.locator("tbody tr")
    assert rows.count() == 4  # B200, B300, H100, H200
    assert page.console_errors == []
    # Logging out lands back on our login page, saying so (not the admin's "Logged out" page).
    page.click("text=Log out")
    page.wait_for_url("**/accounts/login/?logged_out=1")
    assert page.locator("text=You are logged out.").count() == 1
    assert page.locator("input[name=username]").count() == 1
    assert page.console_errors == []
