"""ASGI entry point: HTTP through Django, websockets through Channels (authenticated, origin-checked)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from dashboard.security import TrustedProxyMiddleware  # noqa: E402

# Forwarded headers are resolved first, so the origin check, sessions and logs see the real client.
application = ProtocolTypeRouter(
    {
        "http": TrustedProxyMiddleware(django_asgi_app),
        "websocket": TrustedProxyMiddleware(
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

if settings.CLAIMSCOPE_WARM_HEATMAP:
    import threading

    from fleet import feed

    threading.Thread(target=feed.warm, name="heatmap-warm", daemon=True).start()
