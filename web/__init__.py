"""HTTP and websocket plumbing shared by every app: safe renderers (JSON, spreadsheet-safe CSV), client
addresses, and the websocket consumer base bound to a login session. Imports no app."""
