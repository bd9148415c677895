"""The Monday-morning triage: the window, the pure report, its reads, and its page."""
