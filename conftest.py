"""Session-wide test plugins.

The real control plane's fixtures live in one plugin so that every folder that needs Kubernetes
(controlplane, watch, deploy, diagnosis) shares ONE control plane per test session.
"""

pytest_plugins = ["tests.controlplane.fixtures"]
