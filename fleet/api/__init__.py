"""The REST API of the fleet: devices, slices, nodes, classes, pools, the summary, history, watch status and
tokens (under /api/v1/, wired by dashboard.api_urls)."""
