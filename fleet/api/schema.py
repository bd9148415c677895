"""OpenAPI post-processing: document the error responses every endpoint can give."""

from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "description": "Errors: 'detail' for auth, 404 and throttling; one key per bad query parameter for 400.",
    "additionalProperties": {},
}
CSV = {"schema": {"type": "string", "description": "CSV: a header row, then one row per object"}}
_DESCRIPTIONS = {
    "400": "A query parameter is invalid (the body names it)",
    "401": "Not authenticated (session cookie or 'Authorization: Token <key>')",
    "403": "Not allowed",
    "404": "No such object",
    "406": "No representation matches the Accept header",
    "429": "Too many requests (throttled)",
}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Every operation may answer 401/403/429; with parameters, 400; with a path id, 404."""
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") == "id":
                    parameter["schema"] = {"type": "integer", "minimum": 1}
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "string" and "enum" not in schema:
                    schema.setdefault("minLength", 1)  # an empty value is a 400 (fleet.api.base.reject_empty)
            codes = ["401", "403", "406", "429"]
            if operation.get("parameters"):
                codes.append("400")
            if "{" in path:
                codes.append("404")
            for code in codes:
                operation["responses"].setdefault(
                    code,
                    {"description": _DESCRIPTIONS[code], "content": {"application/json": {"schema": ERROR}}},
                )
            if any(p.get("name") == "format" for p in operation.get("parameters", [])):
                # ?format=csv renders any answer, errors included, as CSV (web/renderers.py).
                for response in operation["responses"].values():
                    response.setdefault("content", {}).setdefault("text/csv", CSV)
    return result
