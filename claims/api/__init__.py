"""The claims REST API: claims, pods, events, pending, leaks (views), diagnosis and triage endpoints."""
