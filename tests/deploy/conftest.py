"""Deploy tests use the real control plane (fixtures from tests/controlplane/fixtures.py, loaded for the
whole session by the root conftest.py, so every folder shares one control plane)."""
