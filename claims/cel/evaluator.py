"""The closure compiler: a checked AST becomes nested Python closures that read a device's dict directly
(no conversion into CEL values), with CEL's error absorption in ``&&``/``||`` and its comprehensions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from claims.cel.errors import EvalError
from claims.cel.parser import Node
from claims.cel.types import DEVICE
from claims.cel.values import (
    EMPTY,
    FUNCTIONS,
    DomainMap,
    Optional_,
    Uint,
    cel_equal,
    compare_values,
    is_number,
    no_overload,
    to_string,
)

_Act = dict[str, Any]
Program = Callable[[_Act], Any]


def _lookup(container: Any, key: Any, optional: bool) -> Any:
    """Map/list access; returns Optional_ when ``optional``; raises ``no such key``."""
    if isinstance(container, Optional_):
        if not container.has_value():
            return container
        container, optional = container.value, True
    if isinstance(container, Mapping):
        try:
            present = key in container
        except TypeError:
            no_overload("_[_]", container, key)
        if present:
            value = container[key]
        elif isinstance(container, DomainMap):
            value = EMPTY
        elif optional:
            return Optional_._NONE
        else:
            raise EvalError(f"no such key: {to_string(key)}")
        return Optional_(value) if optional else value
    if isinstance(container, list):
        if isinstance(key, bool) or not is_number(key) or (isinstance(key, float) and key != int(key)):
            no_overload("_[_]", container, key)
        index = int(key)
        if not 0 <= index < len(container):
            if optional:
                return Optional_._NONE
            raise EvalError(f"index out of range: {index}")
        return Optional_(container[index]) if optional else container[index]
    no_overload("_[_]", container, key)


def _arith(op: str, a: Any, b: Any) -> Any:
    if op == "_+_":
        if (type(a) is type(b) and isinstance(a, str | bytes | list | float)) or (
            isinstance(a, int)
            and isinstance(b, int)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and isinstance(a, Uint) == isinstance(b, Uint)
        ):
            return _int_result(a + b, a)
        no_overload(op, a, b)
    numeric = is_number(a) and is_number(b) and type(a) is type(b)
    if not numeric:
        no_overload(op, a, b)
    if op == "_-_":
        return _int_result(a - b, a)
    if op == "_*_":
        return _int_result(a * b, a)
    if op == "_/_":
        if isinstance(a, float):
            return a / b if b else (float("nan") if a == 0 else float("inf") * (1 if a > 0 else -1))
        if b == 0:
            raise EvalError("division by zero")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return _int_result(quotient, a)
    if op == "_%_":
        if isinstance(a, float):
            no_overload(op, a, b)
        if b == 0:
            raise EvalError("modulus by zero")
        return _int_result(abs(a) % abs(b) * (1 if a >= 0 else -1), a)
    no_overload(op, a, b)


def _int_result(value: Any, like: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        if isinstance(like, Uint):
            if not 0 <= value < 2**64:
                raise EvalError("unsigned integer overflow")
            return Uint(value)
        if not -(2**63) <= value < 2**63:
            raise EvalError("integer overflow")
    return value


def compile_node(node: Node) -> Program:
    kind = node.kind
    if kind == "lit":
        value = node.value
        return lambda act: value
    if kind == "ident":
        name = node.value

        def ident(act: _Act) -> Any:
            return act[name]

        return ident
    if kind == "select":
        assert node.target is not None
        target = compile_node(node.target)
        key, optional = node.value, node.optional
        if not optional and node.target.type == DEVICE:
            return lambda act: target(act)[key]

        def select(act: _Act) -> Any:
            container = target(act)
            if not optional and type(container) is dict and key in container:
                return container[key]
            return _lookup(container, key, optional)

        return select
    if kind == "has":
        sel = node.args[0]
        assert sel.target is not None
        target = compile_node(sel.target)
        key = sel.value

        def has(act: _Act) -> bool:
            container = target(act)
            if isinstance(container, Mapping):
                return key in container
            no_overload("has", container)

        return has
    if kind == "index":
        assert node.target is not None
        target = compile_node(node.target)
        key_fn = compile_node(node.args[0])
        optional = node.optional
        return lambda act: _lookup(target(act), key_fn(act), optional)
    if kind == "list":
        items = [compile_node(arg) for arg in node.args]
        return lambda act: [item(act) for item in items]
    if kind == "map":
        keys = [compile_node(arg) for arg in node.args[0::2]]
        values = [compile_node(arg) for arg in node.args[1::2]]

        def make_map(act: _Act) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            for k, v in zip(keys, values, strict=True):
                key = k(act)
                if key in out:
                    raise EvalError(f"Failed with repeated key: {key}")
                out[key] = v(act)
            return out

        return make_map
    if kind == "bind":
        init, body = compile_node(node.args[0]), compile_node(node.args[1])
        var = node.value

        def bind(act: _Act) -> Any:
            return body({**act, var: init(act)})

        return bind
    if kind == "comp":
        return _compile_comprehension(node)
    if kind == "call":
        return _compile_call(node)
    raise AssertionError(kind)


def _compile_comprehension(node: Node) -> Program:
    assert node.target is not None
    macro, var = node.value
    range_fn = compile_node(node.target)
    fns = [compile_node(arg) for arg in node.args]

    def items(act: _Act) -> list[Any]:
        value = range_fn(act)
        if isinstance(value, Mapping):
            return list(value.keys())
        if isinstance(value, list):
            return value
        no_overload(macro, value)

    def run(act: _Act) -> Any:
        scope = dict(act)
        elements = items(act)
        if macro in ("all", "exists"):
            want = macro == "exists"
            error: EvalError | None = None
            for element in elements:
                scope[var] = element
                try:
                    result = fns[0](scope)
                except EvalError as exc:
                    error = error or exc
                    continue
                if not isinstance(result, bool):
                    no_overload(macro, result)
                if result is want:
                    return want
            if error is not None:
                raise error
            return not want
        if macro == "exists_one":
            count = 0
            for element in elements:
                scope[var] = element
                if _truthy(fns[0](scope), macro):
                    count += 1
            return count == 1
        out: list[Any] = []
        for element in elements:
            scope[var] = element
            if macro == "filter":
                if _truthy(fns[0](scope), macro):
                    out.append(element)
            elif len(fns) == 1:
                out.append(fns[0](scope))
            elif _truthy(fns[0](scope), macro):
                out.append(fns[1](scope))
        return out

    return run


def _truthy(value: Any, fn: str) -> bool:
    if not isinstance(value, bool):
        no_overload(fn, value)
    return value


def _compile_call(node: Node) -> Program:
    name: str = node.value
    args = [compile_node(arg) for arg in node.args]
    if name in ("_&&_", "_||_"):
        left, right = args
        decisive = name == "_||_"

        def logic(act: _Act) -> bool:
            error: EvalError | None = None
            try:
                a = left(act)
                if a is decisive:
                    return decisive
                if not isinstance(a, bool):
                    no_overload(name, a)
            except EvalError as exc:
                error = exc
            b = right(act)  # an error here wins over an error on the left, as in cel-go
            if b is decisive:
                return decisive
            if not isinstance(b, bool):
                no_overload(name, b)
            if error is not None:
                raise error
            return not decisive

        return logic
    if name == "_?_:_":
        cond, then, other = args
        return lambda act: then(act) if _truthy(cond(act), name) else other(act)
    if name == "!_":
        (operand,) = args
        return lambda act: not _truthy(operand(act), name)
    if name == "-_":
        (operand,) = args

        def neg(act: _Act) -> Any:
            value = operand(act)
            if not is_number(value) or isinstance(value, Uint):
                no_overload(name, value)
            return _int_result(-value, value)

        return neg
    if name in ("_==_", "_!=_"):
        left, right = args
        if name == "_==_":
            return lambda act: cel_equal(left(act), right(act))
        return lambda act: not cel_equal(left(act), right(act))
    if name in ("_<_", "_<=_", "_>_", "_>=_"):
        left, right = args
        test: Callable[[int], bool] = {
            "_<_": lambda c: c < 0,
            "_<=_": lambda c: c <= 0,
            "_>_": lambda c: c > 0,
            "_>=_": lambda c: c >= 0,
        }[name]
        return lambda act: test(compare_values(left(act), right(act), name))
    if name in ("_+_", "_-_", "_*_", "_/_", "_%_"):
        left, right = args
        return lambda act: _arith(name, left(act), right(act))
    if name == "@in":
        elem_fn, container_fn = args

        def contains(act: _Act) -> bool:
            elem, container = elem_fn(act), container_fn(act)
            if isinstance(container, list):
                return any(cel_equal(elem, item) for item in container)
            if isinstance(container, Mapping):
                return elem in container and not isinstance(elem, list | dict)
            no_overload("@in", elem, container)

        return contains
    impl = FUNCTIONS[name]
    if node.target is not None:
        receiver = compile_node(node.target)
        args = [receiver, *args]

    def call(act: _Act) -> Any:
        values = [arg(act) for arg in args]
        try:
            return impl(*values)
        except EvalError:
            raise
        except (TypeError, AttributeError, KeyError, ValueError, IndexError):
            no_overload(name, *values)

    return call
