"""claimscope settings: one file, configured through the environment.

With no environment at all this is the demo: SQLite, an in-memory channel layer, a local-memory cache and
Celery tasks run in-process. ``DATABASE_URL`` switches to PostgreSQL and ``REDIS_URL`` to channels-redis,
a Redis cache and Celery on Redis. Bad values stop start-up with a message naming the variable.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import dj_database_url
from django.core.management.utils import get_random_secret_key

from dashboard.env import ConfigError, env_bool, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("CLAIMSCOPE_DATA_DIR", str(BASE_DIR / ".run")))

DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
PRODUCTION = DATABASE_URL is not None and not DATABASE_URL.startswith("sqlite")

DEBUG = env_bool("DJANGO_DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY is required in production; the demo keeps a generated one in its data folder."""
    key = env_str("SECRET_KEY")
    if key:
        if len(key) < 32:
            raise ConfigError("SECRET_KEY", "<hidden>", "at least 32 characters")
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
    path.write_text(key)
    path.chmod(0o600)
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
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60))}
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
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
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

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

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
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = PRODUCTION and env_bool("SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# claimscope's own settings.
CLAIMSCOPE_INGEST_GROUP = "fleet-changes"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
