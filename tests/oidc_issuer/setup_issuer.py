"""Creates the test issuer's user and the claimscope client: ``python -m tests.oidc_issuer.setup_issuer`` with
ISSUER_* variables (see tests/security/test_oidc.py)."""

from __future__ import annotations

import os

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_issuer.settings"
django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402

call_command("migrate", verbosity=0)
user = User.objects.create_user(
    os.environ["ISSUER_USERNAME"],
    email=os.environ["ISSUER_EMAIL"],
    password=os.environ["ISSUER_PASSWORD"],
    first_name="Sam",
)
for name in os.environ.get("ISSUER_GROUPS", "").split():
    user.groups.add(Group.objects.get_or_create(name=name)[0])
Application.objects.create(
    name="claimscope",
    client_id=os.environ["ISSUER_CLIENT_ID"],
    client_secret=os.environ["ISSUER_CLIENT_SECRET"],  # stored hashed
    client_type=Application.CLIENT_CONFIDENTIAL,
    authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
    redirect_uris=os.environ["ISSUER_REDIRECT_URI"],
    algorithm=Application.RS256_ALGORITHM,
    skip_authorization=True,
)
