"""A URLconf for the denial-logging tests: one Django view and one DRF view that refuse everyone."""

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


def staff_only(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied("staff only")


class AdminReport(APIView):
    permission_classes = [IsAdminUser]

    def get(self, request: Request) -> Response:
        return Response({"secret": True})


urlpatterns = [
    path("staff-only/", staff_only),
    path("api/report/", AdminReport.as_view()),
    path("", include("dashboard.urls")),
]
