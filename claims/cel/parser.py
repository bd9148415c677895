"""The CEL parser: tokens to an AST of :class:`Node` (macros expanded while parsing), with cel-go's syntax
error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from claims.cel.errors import CheckError
from claims.cel.lexer import RESERVED, Token, tokenize, unquote
from claims.cel.types import DYN, CelType
from claims.cel.values import Uint


@dataclass(eq=False)
class Node:
    """AST node. kind: lit ident select index call list map cond comp bind."""

    kind: str
    pos: int
    value: Any = None
    args: list[Node] = field(default_factory=list)
    target: Node | None = None
    optional: bool = False
    type: CelType = DYN


_MACROS = {"all": 2, "exists": 2, "exists_one": 2, "map": (2, 3), "filter": 2}


class Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, text: str) -> Token | None:
        tok = self.peek()
        if tok.kind in ("op", "ident") and tok.text == text:
            self.i += 1
            return tok
        return None

    def expect(self, text: str) -> Token:
        tok = self.accept(text)
        if tok is None:
            bad = self.peek()
            raise CheckError(bad.pos, f"Syntax error: mismatched input '{bad.text}' expecting '{text}'")
        return tok

    def parse(self) -> Node:
        node = self.expr()
        if self.peek().kind != "eof":
            bad = self.peek()
            raise CheckError(bad.pos, f"Syntax error: extraneous input '{bad.text}' expecting <EOF>")
        return node

    def expr(self) -> Node:
        cond = self.binary(0)
        tok = self.accept("?")
        if tok is None:
            return cond
        then = self.binary(0)
        self.expect(":")
        other = self.expr()
        return Node("call", tok.pos, "_?_:_", [cond, then, other])

    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",),
        ("&&",),
        ("<", "<=", ">", ">=", "==", "!=", "in"),
        ("+", "-"),
        ("*", "/", "%"),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while True:
            tok = self.peek()
            if tok.kind in ("op", "ident") and tok.text in self._LEVELS[level]:
                self.i += 1
                right = self.binary(level + 1)
                name = "@in" if tok.text == "in" else f"_{tok.text}_"
                left = Node("call", tok.pos, name, [left, right])
            else:
                return left

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("!", "-"):
            self.i += 1
            if tok.text == "-" and self.peek().kind in ("int", "double") and self.peek().pos == tok.pos + 1:
                lit = self.member()
                if lit.kind == "lit" and not isinstance(lit.value, bool) and lit.pos == tok.pos + 1:
                    lit.value = -lit.value
                    lit.pos = tok.pos
                    return lit
                return Node("call", tok.pos, "-_", [lit])
            return Node("call", tok.pos, f"{tok.text}_", [self.unary()])
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            tok = self.peek()
            if tok.kind != "op":
                return node
            if tok.text in (".", ".?"):
                self.i += 1
                name = self.take()
                if name.kind != "ident":
                    raise CheckError(
                        name.pos, f"Syntax error: mismatched input '{name.text}' expecting IDENTIFIER"
                    )
                if tok.text == "." and self.peek().text == "(" and self.peek().kind == "op":
                    open_tok = self.take()
                    args = self.exprlist(")")
                    node = self.make_call(name.text, node, args, open_tok.pos)
                else:
                    node = Node("select", tok.pos, name.text, target=node, optional=tok.text == ".?")
            elif tok.text in ("[", "[?"):
                self.i += 1
                key = self.expr()
                self.expect("]")
                node = Node("index", tok.pos, None, [key], target=node, optional=tok.text == "[?")
            else:
                return node

    def exprlist(self, close: str) -> list[Node]:
        args: list[Node] = []
        if self.accept(close):
            return args
        while True:
            args.append(self.expr())
            if self.accept(close):
                return args
            self.expect(",")
            if self.accept(close):
                return args

    def make_call(self, name: str, target: Node | None, args: list[Node], pos: int) -> Node:
        if target is None and name == "has":
            if len(args) != 1 or args[0].kind != "select" or args[0].optional:
                raise CheckError(pos, "invalid argument to has() macro")
            return Node("has", pos, None, [args[0]])
        if target is not None and name in _MACROS:
            arity = _MACROS[name]
            if (len(args) in arity) if isinstance(arity, tuple) else len(args) == arity:
                if args[0].kind != "ident":
                    raise CheckError(args[0].pos, "argument must be a simple name")
                return Node("comp", pos, (name, args[0].value), args[1:], target=target)
        if target is not None and target.kind == "ident" and target.value == "cel" and name == "bind":
            if len(args) != 3 or args[0].kind != "ident":
                raise CheckError(pos, "cel.bind() variable name must be a simple identifier")
            return Node("bind", pos, args[0].value, [args[1], args[2]])
        if target is not None and target.kind == "ident" and target.value in ("optional", "sets", "strings"):
            return Node("call", pos, f"{target.value}.{name}", args)
        return Node("call", pos, name, args, target=target)

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "int":
            return Node("lit", tok.pos, int(tok.text, 0))
        if tok.kind == "uint":
            return Node("lit", tok.pos, Uint(int(tok.text[:-1], 0)))
        if tok.kind == "double":
            return Node("lit", tok.pos, float(tok.text))
        if tok.kind == "string":
            return Node("lit", tok.pos, unquote(tok))
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return Node("lit", tok.pos, tok.text == "true")
            if tok.text == "null":
                return Node("lit", tok.pos, None)
            if tok.text in RESERVED or tok.text == "in":
                raise CheckError(tok.pos, f"Syntax error: reserved identifier: {tok.text}")
            if self.peek().kind == "op" and self.peek().text == "(":
                open_tok = self.take()
                return self.make_call(tok.text, None, self.exprlist(")"), open_tok.pos)
            return Node("ident", tok.pos, tok.text)
        if tok.kind == "op":
            if tok.text == "(":
                node = self.expr()
                self.expect(")")
                return node
            if tok.text == "[":
                return Node("list", tok.pos, None, self.exprlist("]"))
            if tok.text == "{":
                entries: list[Node] = []
                if not self.accept("}"):
                    while True:
                        entries.append(self.expr())
                        self.expect(":")
                        entries.append(self.expr())
                        if self.accept("}"):
                            break
                        self.expect(",")
                        if self.accept("}"):
                            break
                return Node("map", tok.pos, None, entries)
            if tok.text == ".":
                ident = self.take()
                if ident.kind == "ident":
                    return Node("ident", ident.pos, ident.text)
        text = tok.text
        if tok.kind == "eof":
            raise CheckError(tok.pos, "Syntax error: mismatched input '<EOF>' expecting expression")
        raise CheckError(tok.pos, f"Syntax error: mismatched input '{text}' expecting expression")
