"""The CEL types of the DRA environment and the declarations of its functions and operators: the overloads
the checker resolves every call against, as cel-go declares them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CelType:
    name: str
    params: tuple[CelType, ...] = ()
    is_var: bool = False

    def __str__(self) -> str:
        if self.params:
            return f"{self.name}({', '.join(str(p) for p in self.params)})"
        return self.name


INT, UINT, DOUBLE = CelType("int"), CelType("uint"), CelType("double")
STRING, BOOL, BYTES, NULL = CelType("string"), CelType("bool"), CelType("bytes"), CelType("null_type")
DYN, ANY, TYPE = CelType("dyn"), CelType("any"), CelType("type")
QUANTITY, SEMVER = CelType("kubernetes.Quantity"), CelType("kubernetes.Semver")
DEVICE = CelType("kubernetes.DRADevice")
TYPE_A, TYPE_B = CelType("A", is_var=True), CelType("B", is_var=True)


def list_type(t: CelType) -> CelType:
    return CelType("list", (t,))


def map_type(k: CelType, v: CelType) -> CelType:
    return CelType("map", (k, v))


def optional_type(t: CelType) -> CelType:
    return CelType("optional_type", (t,))


_ATTR_VALUE = ANY
DEVICE_FIELDS = {
    "driver": STRING,
    "attributes": map_type(STRING, map_type(STRING, _ATTR_VALUE)),
    "capacity": map_type(STRING, map_type(STRING, QUANTITY)),
    "allowMultipleAllocations": BOOL,
}
_NUMERIC = (INT, UINT, DOUBLE)


def is_dyn(t: CelType) -> bool:
    return t.name in ("dyn", "any")


def unify(param: CelType, arg: CelType, bound: dict[str, CelType]) -> bool:
    if is_dyn(arg) or is_dyn(param):
        return True
    if param.is_var:
        if param.name in bound:
            return unify(bound[param.name], arg, bound)
        bound[param.name] = arg
        return True
    if param.name != arg.name or len(param.params) != len(arg.params):
        return False
    return all(unify(p, a, bound) for p, a in zip(param.params, arg.params, strict=True))


def substitute(t: CelType, bound: dict[str, CelType]) -> CelType:
    if t.is_var:
        return bound.get(t.name, DYN)
    if t.params:
        return CelType(t.name, tuple(substitute(p, bound) for p in t.params))
    return t


# (name, receiver-style, params, result). Receiver is params[0] for member overloads.
_Decl = tuple[str, bool, tuple[CelType, ...], CelType]
_DECLS: list[_Decl] = []


def _decl(name: str, member: bool, params: tuple[CelType, ...], result: CelType) -> None:
    _DECLS.append((name, member, params, result))


for _op in ("_<_", "_<=_", "_>_", "_>=_"):
    for _t in (STRING, BYTES, BOOL):
        _decl(_op, False, (_t, _t), BOOL)
    for _l in _NUMERIC:
        for _r in _NUMERIC:  # CrossTypeNumericComparisons
            _decl(_op, False, (_l, _r), BOOL)
for _op in ("_==_", "_!=_"):
    _decl(_op, False, (TYPE_A, TYPE_A), BOOL)
for _t in (INT, UINT, DOUBLE):
    for _op in ("_+_", "_-_", "_*_", "_/_"):
        _decl(_op, False, (_t, _t), _t)
for _t in (INT, UINT):
    _decl("_%_", False, (_t, _t), _t)
_decl("_+_", False, (STRING, STRING), STRING)
_decl("_+_", False, (BYTES, BYTES), BYTES)
_decl("_+_", False, (list_type(TYPE_A), list_type(TYPE_A)), list_type(TYPE_A))
_decl("-_", False, (INT,), INT)
_decl("-_", False, (DOUBLE,), DOUBLE)
_decl("!_", False, (BOOL,), BOOL)
_decl("@in", False, (TYPE_A, list_type(TYPE_A)), BOOL)
_decl("@in", False, (TYPE_A, map_type(TYPE_A, TYPE_B)), BOOL)
_decl("_?_:_", False, (BOOL, TYPE_A, TYPE_A), TYPE_A)
for _t in (STRING, BYTES, list_type(TYPE_A), map_type(TYPE_A, TYPE_B)):
    _decl("size", False, (_t,), INT)
    _decl("size", True, (_t,), INT)
for _name in ("contains", "startsWith", "endsWith", "matches"):
    _decl(_name, True, (STRING, STRING), BOOL)
_decl("matches", False, (STRING, STRING), BOOL)
for _t in (INT, UINT, DOUBLE, STRING):
    _decl("int", False, (_t,), INT)
    _decl("uint", False, (_t,), UINT)
    _decl("double", False, (_t,), DOUBLE)
for _t in (INT, UINT, DOUBLE, STRING, BYTES, BOOL):
    _decl("string", False, (_t,), STRING)
_decl("bool", False, (STRING,), BOOL)
_decl("bool", False, (BOOL,), BOOL)
_decl("bytes", False, (STRING,), BYTES)
_decl("dyn", False, (TYPE_A,), DYN)
_decl("type", False, (TYPE_A,), TYPE)
# Kubernetes quantity library
_decl("quantity", False, (STRING,), QUANTITY)
_decl("isQuantity", False, (STRING,), BOOL)
for _name, _res in (("isInteger", BOOL), ("asInteger", INT), ("asApproximateFloat", DOUBLE), ("sign", INT)):
    _decl(_name, True, (QUANTITY,), _res)
for _name in ("add", "sub"):
    _decl(_name, True, (QUANTITY, QUANTITY), QUANTITY)
    _decl(_name, True, (QUANTITY, INT), QUANTITY)
# Kubernetes semver library
_decl("semver", False, (STRING,), SEMVER)
_decl("semver", False, (STRING, BOOL), SEMVER)
_decl("isSemver", False, (STRING,), BOOL)
_decl("isSemver", False, (STRING, BOOL), BOOL)
for _name in ("major", "minor", "patch"):
    _decl(_name, True, (SEMVER,), INT)
for _t in (QUANTITY, SEMVER):
    _decl("isGreaterThan", True, (_t, _t), BOOL)
    _decl("isLessThan", True, (_t, _t), BOOL)
    _decl("compareTo", True, (_t, _t), INT)
# ext.Strings v2
_decl("charAt", True, (STRING, INT), STRING)
_decl("indexOf", True, (STRING, STRING), INT)
_decl("indexOf", True, (STRING, STRING, INT), INT)
_decl("lastIndexOf", True, (STRING, STRING), INT)
_decl("lastIndexOf", True, (STRING, STRING, INT), INT)
_decl("lowerAscii", True, (STRING,), STRING)
_decl("upperAscii", True, (STRING,), STRING)
_decl("trim", True, (STRING,), STRING)
_decl("reverse", True, (STRING,), STRING)
_decl("replace", True, (STRING, STRING, STRING), STRING)
_decl("replace", True, (STRING, STRING, STRING, INT), STRING)
_decl("split", True, (STRING, STRING), list_type(STRING))
_decl("split", True, (STRING, STRING, INT), list_type(STRING))
_decl("substring", True, (STRING, INT), STRING)
_decl("substring", True, (STRING, INT, INT), STRING)
_decl("join", True, (list_type(STRING),), STRING)
_decl("join", True, (list_type(STRING), STRING), STRING)
_decl("strings.quote", False, (STRING,), STRING)
# Kubernetes regex library
_decl("find", True, (STRING, STRING), STRING)
_decl("findAll", True, (STRING, STRING), list_type(STRING))
_decl("findAll", True, (STRING, STRING, INT), list_type(STRING))
# Kubernetes lists library
_decl("isSorted", True, (list_type(TYPE_A),), BOOL)
for _name in ("sum", "min", "max"):
    _decl(_name, True, (list_type(TYPE_A),), TYPE_A)
_decl("indexOf", True, (list_type(TYPE_A), TYPE_A), INT)
_decl("lastIndexOf", True, (list_type(TYPE_A), TYPE_A), INT)
# ext.Sets
for _name in ("sets.contains", "sets.equivalent", "sets.intersects"):
    _decl(_name, False, (list_type(TYPE_A), list_type(TYPE_A)), BOOL)
# optional types
_decl("optional.of", False, (TYPE_A,), optional_type(TYPE_A))
_decl("optional.ofNonZeroValue", False, (TYPE_A,), optional_type(TYPE_A))
_decl("optional.none", False, (), optional_type(DYN))
_decl("hasValue", True, (optional_type(TYPE_A),), BOOL)
_decl("value", True, (optional_type(TYPE_A),), TYPE_A)
_decl("orValue", True, (optional_type(TYPE_A), TYPE_A), TYPE_A)
_decl("or", True, (optional_type(TYPE_A), optional_type(TYPE_A)), optional_type(TYPE_A))

DECLS_BY_NAME: dict[str, list[_Decl]] = {}
for _d in _DECLS:
    DECLS_BY_NAME.setdefault(_d[0], []).append(_d)


def display_name(name: str) -> str:
    return "@in" if name == "@in" else name
