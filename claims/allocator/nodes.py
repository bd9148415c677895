"""Node matching as the allocator does it: node selectors (labels and fields), taint tolerations, and the
node selector an allocation result carries.
"""

from __future__ import annotations

from collections.abc import Mapping

from claims.allocator.snapshot import Obj


def obj_name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def klog(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace", "")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def _requirement_matches(req: Obj, values: Mapping[str, str], key: str) -> bool:
    op = req.get("operator")
    wanted = req.get("values") or []
    present = key in values
    if op == "In":
        return present and values[key] in wanted
    if op == "NotIn":
        return not present or values[key] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if op == "Gt" else have < limit
    return False


def _selector_matches(selector: Obj, node: Obj) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": obj_name(node)}
    for term in selector.get("nodeSelectorTerms") or []:
        expressions, field_reqs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not expressions and not field_reqs:
            continue  # an empty term matches nothing
        if all(_requirement_matches(r, labels, r.get("key", "")) for r in expressions) and all(
            _requirement_matches(r, fields, r.get("key", "")) for r in field_reqs
        ):
            return True
    return False


def node_matches(node: Obj, node_name: str, all_nodes: bool, selector: Obj | None) -> bool:
    """``NodeMatches``: exactly one of nodeName / allNodes / nodeSelector decides."""
    if node_name:
        return node_name == obj_name(node)
    if all_nodes:
        return True
    if selector is not None:
        return _selector_matches(selector, node)
    return False


def allocation_node_selector(node: str, pinned: bool, selectors: list[Obj]) -> Obj | None:
    if pinned:
        return {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    if not selectors:
        return None
    term: Obj = {}
    for selector in selectors:
        for source in (selector.get("nodeSelectorTerms") or [])[:1]:
            for key in ("matchExpressions", "matchFields"):
                for req in source.get(key) or []:
                    if req not in term.setdefault(key, []):
                        term[key].append(req)
    return {"nodeSelectorTerms": [term]}


def tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if not key:
        return False  # an empty key requires operator Exists
    return bool(toleration.get("value", "") == taint.get("value", ""))
