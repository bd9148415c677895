"""The Celery app. Without REDIS_URL tasks run in-process (settings.CELERY_TASK_ALWAYS_EAGER)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("claimscope")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
