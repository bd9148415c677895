"""manage.py of the test issuer (run from the repository root: python -m tests.oidc_issuer.manage ...)."""

import os
import sys

if __name__ == "__main__":
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_issuer.settings"
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
