from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from dashboard import metrics, views

# Each app owns its routes: fleet pages (fleet/urls.py), claim pages (claims/urls.py), the REST API
# (dashboard/api_urls.py). Keep this file to includes.
urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("readyz", views.readyz, name="readyz"),
    # Browsers ask for /favicon.ico on pages that name no icon (the browsable API's); the icon is a public
    # static asset like the stylesheets.
    path("favicon.ico", login_not_required(RedirectView.as_view(url=static("favicon.svg"), permanent=True))),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            extra_context={
                "sso": settings.CLAIMSCOPE_OIDC_ENABLED,
                "sso_label": settings.CLAIMSCOPE_OIDC_BUTTON,
            }
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("fleet/", include("fleet.urls")),
    path("claims/", include("claims.urls")),
    path("usage/", include("usage.urls")),
    path("api/", include("dashboard.api_urls")),
]
if settings.CLAIMSCOPE_OIDC_ENABLED:
    # Single sign-on (dashboard/oidc.py). Anonymous by nature: the views start and finish the login.
    from mozilla_django_oidc import views as oidc_views

    urlpatterns += [
        path(
            "oidc/authenticate/",
            login_not_required(oidc_views.OIDCAuthenticationRequestView.as_view()),
            name="oidc_authentication_init",
        ),
        path(
            "oidc/callback/",
            login_not_required(oidc_views.OIDCAuthenticationCallbackView.as_view()),
            name="oidc_authentication_callback",
        ),
    ]
