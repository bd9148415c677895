"""claimscope settings: one file, configured through the environment.

With no environment at all this is the demo: SQLite, an in-memory channel layer, a local-memory cache and
Celery tasks run in-process. ``DATABASE_URL`` switches to PostgreSQL and ``REDIS_URL`` to channels-redis,
a Redis cache and Celery on Redis. Bad values stop start-up with a message naming the variable.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.management.utils import get_random_secret_key

from dashboard.env import ConfigError, env_bool, env_int, env_list, env_networks, env_str, env_url
from dashboard.oidc_config import oidc_settings

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("CLAIMSCOPE_DATA_DIR", str(BASE_DIR / ".run")))

DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
PRODUCTION = DATABASE_URL is not None and not DATABASE_URL.startswith("sqlite")
if PRODUCTION and REDIS_URL is None:
    # PostgreSQL without Redis would leave workers' change events unseen by web processes, silently.
    raise ConfigError("REDIS_URL", "", "a redis:// URL: required with a PostgreSQL DATABASE_URL")
# uvicorn starts this many web processes. Without Redis, live pushes and in-process tasks stay in the one
# process that made them: a page served by another would never hear of a change.
if REDIS_URL is None and env_int("WEB_CONCURRENCY", 1, minimum=1) > 1:
    raise ConfigError("WEB_CONCURRENCY", env_str("WEB_CONCURRENCY"), "1 (unset) without REDIS_URL")

DEBUG = env_bool("DJANGO_DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY is required in production; the demo keeps a generated one in its data folder."""
    key = env_str("SECRET_KEY")
    if key:
        if len(key) < 50:  # what `check --deploy` asks for
            raise ConfigError("SECRET_KEY", "<hidden>", "a random string of at least 50 characters")
        return key
    if PRODUCTION:
        raise ConfigError(
            "SECRET_KEY", "", "a random string of at least 50 characters (required with DATABASE_URL)"
        )
    path = DATA_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = get_random_secret_key()
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(key)
    return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "fleet",
    "claims",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ASGI_APPLICATION = "dashboard.asgi.application"
WSGI_APPLICATION = None

if DATABASE_URL:
    # Health checks: a persistent connection the server dropped (restart, failover, idle timeout) is
    # replaced at the next request or feed build instead of failing it.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60), conn_health_checks=True
        )
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(DATA_DIR / "claimscope.sqlite3")),
            # WAL lets the web server read while the in-process workers write.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            # Tests on SQLite use a file like the demo does (not Django's shared in-memory database, whose
            # table locks fail a page served by another thread while the test writes).
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", str(DATA_DIR / "test-claimscope.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    # redis-py 8 reads with a 5 s socket timeout by default, exactly channels-redis's 5 s BZPOPMIN: an idle
    # websocket consumer then dies with "Timeout reading" whenever its event loop lags. Read longer.
    CHANNEL_LAYERS = {
        "default": {
            # channels-redis, closing sockets cleanly when Redis goes away (dashboard/channel_layer.py)
            "BACKEND": "dashboard.channel_layer.ReconnectingRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery: on Redis in production; without a broker, tasks run in-process (the demo).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = REDIS_URL is None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A backstop, not a cap: a prefork worker child (the default queue) whose resident memory is above this (KiB)
# when a task ends is replaced by a fresh one; the peak during a task is not limited. The diagnosis worker's
# threads are not replaced: its process keeps each cluster's fleet (bench/README.md "Memory of the diagnosis
# task" and "Leaner diagnosis updates": about 0.9 GB at L under churn).
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env_int("CLAIMSCOPE_WORKER_MAX_MEMORY_MB", 1536, minimum=64) * 1024
# Watchers (fleet/tasks/watch.py, docs/watchers.md): one stream per (cluster, kind) on the "watch" queue.
# The pending-claim diagnoses on the "diagnosis" queue, consumed by one process (threads): the fleet each
# cluster's incremental update applies its changes to lives in that process's memory (claims/tasks.py), so
# a second process would hold a second copy and start it with a full recompute.
CELERY_TASK_ROUTES = {
    "fleet.tasks.watch.*": {"queue": "watch"},
    "claims.tasks.update_diagnoses": {"queue": "diagnosis"},
    "claims.tasks.recompute_diagnoses": {"queue": "diagnosis"},
}
CELERY_BEAT_SCHEDULE = {
    "restart-lapsed-streams": {
        "task": "fleet.tasks.watch.restart_lapsed_streams",
        # With the 10 s lock: a lost worker's streams run again within about 10-13 s (docs/watchers.md).
        "schedule": float(env_int("CLAIMSCOPE_WATCH_BEAT_SECONDS", 3, minimum=1)),
    }
}
CLAIMSCOPE_WATCH_TIMEOUT = env_int("CLAIMSCOPE_WATCH_TIMEOUT", 0, minimum=0)  # 0: random 5-10 minutes
CLAIMSCOPE_WATCH_LOCK_TTL = env_int("CLAIMSCOPE_WATCH_LOCK_TTL", 10, minimum=1)
CLAIMSCOPE_WATCH_FORBIDDEN_RETRY = env_int("CLAIMSCOPE_WATCH_FORBIDDEN_RETRY", 300, minimum=1)
CLAIMSCOPE_WATCH_BACKOFF_MAX = env_int("CLAIMSCOPE_WATCH_BACKOFF_MAX", 30, minimum=1)
# How long a stream gathers watch events into one batch after the first: each batch is a transaction, a
# change event and a read-model refresh, so a shorter window trades CPU for latency (docs/watchers.md).
# Up to 10 s: a longer window only delays every change (a batch also closes at 500 events).
CLAIMSCOPE_WATCH_FLUSH_MS = env_int("CLAIMSCOPE_WATCH_FLUSH_MS", 250, minimum=1, maximum=10_000)
# A file a worker's consumer touches every 10 s while it consumes (dashboard/celery.py), for a liveness
# probe that fails when the consumer is dead but the process is not. Empty: none.
CLAIMSCOPE_WORKER_ALIVE_FILE = env_str("CLAIMSCOPE_WORKER_ALIVE_FILE", "")
# Build the heatmap's GPU cache in the background when the ASGI server starts (fleet.feed.warm), so the
# first page after a deploy does not pay the one full read of the fleet (seconds on 40k GPUs).
CLAIMSCOPE_WARM_HEATMAP = env_bool("CLAIMSCOPE_WARM_HEATMAP", False)
# Allocation history (fleet/tasks/history.py): a sample a minute, downsampling hourly.
# Not `tasks` modules: autodiscovery does not find them.
CELERY_IMPORTS: tuple[str, ...] = ("fleet.tasks.history",)
CELERY_BEAT_SCHEDULE |= {
    "history-sample": {"task": "fleet.tasks.history.sample_allocation", "schedule": 60.0},
    "history-downsample": {"task": "fleet.tasks.history.downsample_history", "schedule": 3600.0},
    # Claim history (claims/history.py) and kept pending causes: older than the retention go, daily.
    "claim-history-prune": {"task": "claims.tasks.prune_claim_history", "schedule": 86400.0},
}
CLAIMSCOPE_CLAIM_HISTORY_DAYS = env_int("CLAIMSCOPE_CLAIM_HISTORY_DAYS", 400, minimum=1)
# Pending-claim diagnoses are updated incrementally from the change events (claims/tasks.py); a full
# recompute of every cluster checks them this often.
CLAIMSCOPE_DIAGNOSIS_CHECK_SECONDS = env_int("CLAIMSCOPE_DIAGNOSIS_CHECK_SECONDS", 900, minimum=60)
CELERY_BEAT_SCHEDULE |= {
    "diagnosis-check": {
        "task": "claims.tasks.check_diagnoses",
        "schedule": float(CLAIMSCOPE_DIAGNOSIS_CHECK_SECONDS),
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Logging out lands on our login page (with a "logged out" note), not the admin's "Logged out" page.
LOGOUT_REDIRECT_URL = "/accounts/login/?logged_out=1"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# Serve straight from the finders when collectstatic has not run (demo, tests); production collects.
WHITENOISE_USE_FINDERS = not PRODUCTION
if WHITENOISE_USE_FINDERS:
    # Without collectstatic there is no STATIC_ROOT, by design; WhiteNoise's warning about it is noise.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.tokens.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_str("API_THROTTLE_ANON", "60/min"),
        "user": env_str("API_THROTTLE_USER", "1200/min"),
        # Rejected API tokens per client address (fleet.api.tokens): guessing stays slow.
        "invalid_token": env_str("API_THROTTLE_INVALID_TOKEN", "10/min"),
    },
    # Throttles key on REMOTE_ADDR, which TrustedProxyMiddleware already resolved; with the default (None)
    # DRF would read X-Forwarded-For from any client, who could then pick a fresh address per request.
    "NUM_PROXIES": 0,
}
API_TOKEN_DAYS = env_int("API_TOKEN_DAYS", 90, minimum=1)
# Who sees which namespaces (fleet.access.visibility): "grants" (fleet.NamespaceGrant), or "kubernetes":
# the clusters' own RBAC for the SSO identity (fleet.access.kube_rbac), grants for clusters without shared
# identity.
CLAIMSCOPE_VISIBILITY = env_str("CLAIMSCOPE_VISIBILITY", "grants")
if CLAIMSCOPE_VISIBILITY not in ("grants", "kubernetes"):
    raise ConfigError("CLAIMSCOPE_VISIBILITY", CLAIMSCOPE_VISIBILITY, "grants or kubernetes")
CLAIMSCOPE_RBAC_CLUSTERS = env_list("CLAIMSCOPE_RBAC_CLUSTERS", [])
CLAIMSCOPE_RBAC_CACHE_SECONDS = env_int("CLAIMSCOPE_RBAC_CACHE_SECONDS", 30, minimum=0)
CLAIMSCOPE_RBAC_USERNAME_CLAIM = env_str("CLAIMSCOPE_RBAC_USERNAME_CLAIM", "email")
CLAIMSCOPE_RBAC_USERNAME_PREFIX = env_str("CLAIMSCOPE_RBAC_USERNAME_PREFIX", "")
CLAIMSCOPE_RBAC_GROUPS_CLAIM = env_str("CLAIMSCOPE_RBAC_GROUPS_CLAIM", "groups")
CLAIMSCOPE_RBAC_GROUPS_PREFIX = env_str("CLAIMSCOPE_RBAC_GROUPS_PREFIX", "")
SPECTACULAR_SETTINGS = {
    "TITLE": "claimscope API",
    "DESCRIPTION": "Read-only REST API over a Kubernetes DRA GPU fleet (see docs/api.md).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "fleet.api.schema.add_error_responses",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",  # swagger-ui served from our static files, never a CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Security. Production (DATABASE_URL set) is HTTPS-only; SECURE_COOKIES=0 turns that off for tests over
# plain http. The documented production environment passes `manage.py check --deploy` (docs/operations.md).
if DEBUG and PRODUCTION:
    raise ConfigError(
        "DJANGO_DEBUG",
        env_str("DJANGO_DEBUG"),
        "unset or 0 when DATABASE_URL is set (production): DEBUG shows "
        "settings and tracebacks to every visitor",
    )
HTTPS_ONLY = PRODUCTION and env_bool("SECURE_COOKIES", True)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = HTTPS_ONLY
CSRF_COOKIE_SECURE = HTTPS_ONLY
SECURE_SSL_REDIRECT = HTTPS_ONLY
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if HTTPS_ONLY else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
# Reverse proxies whose X-Forwarded-For/-Proto are believed (dashboard.security.TrustedProxyMiddleware, for
# HTTP and websockets): none by default. Django's SECURE_PROXY_SSL_HEADER is not used: it would believe
# X-Forwarded-Proto from any peer.
TRUSTED_PROXIES = env_networks("TRUSTED_PROXIES")
if env_bool("BEHIND_TLS_PROXY", False):
    raise ConfigError("BEHIND_TLS_PROXY", "1", "unset: name the proxy in TRUSTED_PROXIES instead")
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# django-csp: our own static JS/CSS only. Plotly inserts <style> rules at run time (style-src needs
# 'unsafe-inline'), uses data:/blob: images for its icons and downloads, and no eval in its non-WebGL traces.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],  # 'self' includes same-origin ws:/wss: (CSP level 3)
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Login rate limit (django-axes, database handler: shared by all web replicas): 5 failures for one
# username from one address lock that pair out for 15 minutes; a success resets the count.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The peer address after TrustedProxyMiddleware, never a header read by axes itself (django-ipware, if it
# were ever installed, would believe X-Forwarded-For from anyone).
AXES_CLIENT_IP_CALLABLE = "web.clients.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "429.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_DISABLE_ACCESS_LOG = True  # failures are kept; successful logins are not worth a row each
AXES_VERBOSE = False  # dashboard.security logs failures and lockouts in our own format
INSTALLED_APPS += ["csp", "axes"]
AUTHENTICATION_BACKENDS = [
    "dashboard.security.LoginAttemptBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Optional single sign-on (OpenID Connect, mozilla-django-oidc): on when CLAIMSCOPE_OIDC_CLIENT_ID is set
# (docs/operations.md). The client secret comes from the environment only.
_oidc = oidc_settings(os.environ)
CLAIMSCOPE_OIDC_ENABLED = bool(_oidc.pop("CLAIMSCOPE_OIDC_ENABLED"))
CLAIMSCOPE_OIDC_ISSUER = str(_oidc.pop("CLAIMSCOPE_OIDC_ISSUER", ""))
CLAIMSCOPE_OIDC_NAMESPACES_CLAIM = str(_oidc.pop("CLAIMSCOPE_OIDC_NAMESPACES_CLAIM", ""))
CLAIMSCOPE_OIDC_BUTTON = str(_oidc.pop("CLAIMSCOPE_OIDC_BUTTON", ""))
if CLAIMSCOPE_OIDC_ENABLED:
    globals().update(_oidc)  # the library's OIDC_* settings
    INSTALLED_APPS += ["mozilla_django_oidc"]
    AUTHENTICATION_BACKENDS.append("dashboard.oidc.ClaimscopeOIDCBackend")
# Probes first (before host checks and the HTTPS redirect); CSP and 403 logging right after
# SecurityMiddleware, outside CSRF and auth so they see their answers; axes last, as it requires.
_after_security = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1
MIDDLEWARE = [
    "dashboard.security.ProbeMiddleware",
    *MIDDLEWARE[:_after_security],
    "csp.middleware.CSPMiddleware",
    "dashboard.security.DenialLogMiddleware",
    *MIDDLEWARE[_after_security:],
    "axes.middleware.AxesMiddleware",
    "fleet.access.audit.ExportAuditMiddleware",  # after DRF has named the user: CSV and token reads
]

# claimscope's own settings.
CLAIMSCOPE_INGEST_GROUP = "fleet-changes"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# Utilization (usage/, docs/utilization.md): DCGM series from each cluster's Prometheus, sampled by beat.
from usage.config import PrometheusConfigError  # noqa: E402
from usage.config import parse as _parse_prometheus  # noqa: E402

try:
    CLAIMSCOPE_PROMETHEUS = _parse_prometheus(env_str("CLAIMSCOPE_PROMETHEUS"))
except PrometheusConfigError as _exc:
    raise ConfigError("CLAIMSCOPE_PROMETHEUS", env_str("CLAIMSCOPE_PROMETHEUS"), str(_exc)) from None
CLAIMSCOPE_USAGE_INTERVAL = env_int("CLAIMSCOPE_USAGE_INTERVAL", 60, minimum=5)
CLAIMSCOPE_IDLE_BELOW_PERCENT = env_int("CLAIMSCOPE_IDLE_BELOW_PERCENT", 5, minimum=0)
CLAIMSCOPE_IDLE_WINDOW_MINUTES = env_int("CLAIMSCOPE_IDLE_WINDOW_MINUTES", 60, minimum=1)
# /metrics (dashboard/metrics.py) is served only with this bearer token set.
CLAIMSCOPE_METRICS_TOKEN = env_str("CLAIMSCOPE_METRICS_TOKEN")
INSTALLED_APPS += ["usage", "simulator"]
CELERY_IMPORTS += ("usage.tasks",)
CELERY_BEAT_SCHEDULE |= {
    "usage-sample": {"task": "usage.tasks.sample_utilization", "schedule": float(CLAIMSCOPE_USAGE_INTERVAL)},
    "usage-downsample": {"task": "usage.tasks.downsample_trends", "schedule": 3600.0},
}
