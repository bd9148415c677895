"""The CEL type checker: resolves every call to an overload of ``claims.cel.types``, so that a selector the
apiserver rejects (``>=`` on a quantity, an unknown function) is a compile error here too.
"""

from __future__ import annotations

from claims.cel.errors import CheckError
from claims.cel.parser import Node
from claims.cel.types import (
    BOOL,
    BYTES,
    DECLS_BY_NAME,
    DEVICE,
    DEVICE_FIELDS,
    DOUBLE,
    DYN,
    INT,
    NULL,
    STRING,
    TYPE_A,
    TYPE_B,
    UINT,
    CelType,
    display_name,
    is_dyn,
    list_type,
    map_type,
    optional_type,
    substitute,
    unify,
)
from claims.cel.values import Uint


class Checker:
    def __init__(self) -> None:
        self.scopes: list[dict[str, CelType]] = [{"device": DEVICE}]

    def lookup(self, name: str) -> CelType | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def check(self, node: Node) -> CelType:
        node.type = self._check(node)
        return node.type

    def _check(self, node: Node) -> CelType:
        kind = node.kind
        if kind == "lit":
            value = node.value
            return {
                bool: BOOL,
                Uint: UINT,
                int: INT,
                float: DOUBLE,
                str: STRING,
                bytes: BYTES,
                type(None): NULL,
            }[type(value)]
        if kind == "ident":
            found = self.lookup(node.value)
            if found is None:
                raise CheckError(node.pos, f"undeclared reference to '{node.value}' (in container '')")
            return found
        if kind == "select":
            assert node.target is not None
            target = self.check(node.target)
            return self._select_type(node, target)
        if kind == "has":
            sel = node.args[0]
            assert sel.target is not None
            self._select_type(sel, self.check(sel.target))
            return BOOL
        if kind == "index":
            assert node.target is not None
            target = self.check(node.target)
            key = self.check(node.args[0])
            inner = target.params[0] if target.name == "optional_type" else target
            if inner.name == "list":
                result = self._resolve(
                    "_[_]", node, [inner, key], [(list_type(TYPE_A), INT)], inner.params[0]
                )
            elif inner.name == "map":
                result = self._resolve(
                    "_[_]", node, [inner, key], [(map_type(TYPE_A, TYPE_B), TYPE_A)], inner.params[1]
                )
            elif is_dyn(inner):
                result = DYN
            else:
                raise CheckError(
                    node.pos, f"found no matching overload for '_[_]' applied to '({inner}, {key})'"
                )
            if node.optional or target.name == "optional_type":
                return optional_type(result)
            return result
        if kind == "list":
            return list_type(self._homogeneous(node.args, node.pos))
        if kind == "map":
            keys = self._homogeneous(node.args[0::2], node.pos)
            values = self._homogeneous(node.args[1::2], node.pos)
            return map_type(keys, values)
        if kind == "comp":
            assert node.target is not None
            macro, var = node.value
            range_type = self.check(node.target)
            if range_type.name == "list" or range_type.name == "map":
                elem = range_type.params[0]
            elif is_dyn(range_type):
                elem = DYN
            else:
                raise CheckError(
                    node.target.pos,
                    f"expression of type '{range_type}' cannot be range of a comprehension "
                    "(must be list, map, or dynamic)",
                )
            self.scopes.append({var: elem})
            try:
                arg_types = [self.check(arg) for arg in node.args]
            finally:
                self.scopes.pop()
            has_predicate = macro != "map" or len(node.args) == 2
            if has_predicate and not unify(BOOL, arg_types[0], {}):
                raise CheckError(node.args[0].pos, f"expected type 'bool' but found '{arg_types[0]}'")
            if macro == "map":
                return list_type(arg_types[-1])
            if macro == "filter":
                return list_type(elem)
            return BOOL
        if kind == "bind":
            init = self.check(node.args[0])
            self.scopes.append({node.value: init})
            try:
                return self.check(node.args[1])
            finally:
                self.scopes.pop()
        if kind == "call":
            return self._check_call(node)
        raise CheckError(node.pos, f"unsupported expression {kind}")

    def _homogeneous(self, nodes: list[Node], pos: int) -> CelType:
        elem: CelType | None = None
        for item in nodes:
            item_type = self.check(item)
            if elem is None or is_dyn(elem):
                elem = item_type
            elif not is_dyn(item_type) and not unify(elem, item_type, {}):
                raise CheckError(item.pos, f"expected type '{elem}' but found '{item_type}'")
        return elem or DYN

    def _select_type(self, node: Node, target: CelType) -> CelType:
        inner = target.params[0] if target.name == "optional_type" else target
        if inner == DEVICE:
            if node.value not in DEVICE_FIELDS:
                raise CheckError(node.pos, f"undefined field '{node.value}'")
            result = DEVICE_FIELDS[node.value]
        elif inner.name == "map":
            if not unify(inner.params[0], STRING, {}):
                raise CheckError(node.pos, f"type '{inner}' does not support field selection")
            result = inner.params[1]
        elif is_dyn(inner):
            result = DYN
        else:
            raise CheckError(node.pos, f"type '{inner}' does not support field selection")
        if node.optional or target.name == "optional_type":
            return optional_type(result)
        return result

    def _resolve(
        self, name: str, node: Node, args: list[CelType], sigs: list[tuple[CelType, ...]], result: CelType
    ) -> CelType:
        for sig in sigs:
            if all(unify(p, a, {}) for p, a in zip(sig, args, strict=True)):
                return result
        raise CheckError(
            node.pos,
            f"found no matching overload for '{name}' applied to '({', '.join(str(a) for a in args)})'",
        )

    def _check_call(self, node: Node) -> CelType:
        name: str = node.value
        if name in ("_&&_", "_||_"):
            for arg in node.args:
                arg_type = self.check(arg)
                if not unify(BOOL, arg_type, {}):
                    raise CheckError(
                        node.pos,
                        f"found no matching overload for '{name}' applied to "
                        f"'({', '.join(str(a.type) for a in node.args)})'",
                    )
            return BOOL
        member = node.target is not None
        arg_types = ([self.check(node.target)] if node.target is not None else []) + [
            self.check(arg) for arg in node.args
        ]
        decls = DECLS_BY_NAME.get(name)
        if not decls:
            raise CheckError(node.pos, f"undeclared reference to '{name}' (in container '')")
        results: list[CelType] = []
        for _n, is_member, params, result in decls:
            if is_member != member or len(params) != len(arg_types):
                continue
            bound: dict[str, CelType] = {}
            if all(unify(p, a, bound) for p, a in zip(params, arg_types, strict=True)):
                results.append(substitute(result, bound))
        if not results:
            if member:
                applied = f"{arg_types[0]}.({', '.join(str(a) for a in arg_types[1:])})"
            else:
                applied = f"({', '.join(str(a) for a in arg_types)})"
            raise CheckError(
                node.pos, f"found no matching overload for '{display_name(name)}' applied to '{applied}'"
            )
        if all(r == results[0] for r in results):
            return results[0]
        return DYN
