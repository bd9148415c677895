from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard import views

# Each app owns its routes: fleet pages (fleet/urls.py), claim pages (claims/urls.py), the REST API
# (dashboard/api_urls.py). Keep this file to includes.
urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("fleet/", include("fleet.urls")),
    path("claims/", include("claims.urls")),
    path("api/", include("dashboard.api_urls")),
]
