"""The API token page: each user creates (or replaces) and revokes their own token.

Tokens are DRF's ``authtoken`` tokens (one per user), sent as ``Authorization: Token <key>``; staff can
also manage them in the admin.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from rest_framework.authtoken.models import Token


@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    """GET shows the user's token; POST ``action=create`` replaces it with a new one, ``action=revoke``
    deletes it (requests with the old key fail from then on)."""
    user_id = int(request.user.pk or 0)  # LoginRequiredMiddleware: only logged-in users get here
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            Token.objects.filter(user_id=user_id).delete()
            Token.objects.create(user_id=user_id)
            messages.success(request, "New API token created; the previous one (if any) no longer works.")
        elif action == "revoke":
            deleted, _ = Token.objects.filter(user_id=user_id).delete()
            messages.success(request, "API token revoked." if deleted else "You had no API token.")
        else:
            return HttpResponse("action must be create or revoke", status=400, content_type="text/plain")
        return redirect("api:tokens")
    token = Token.objects.filter(user_id=user_id).first()
    return render(request, "api/tokens.html", {"token": token})
