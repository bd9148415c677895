"""CEL source text to tokens: the token pattern, reserved words, and string/bytes literal unquoting."""

from __future__ import annotations

import re
from dataclasses import dataclass

from claims.cel.errors import CheckError

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
    |(?P<double>(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?))
    |(?P<uint>(?:0x[0-9a-fA-F]+|[0-9]+)[uU])
    |(?P<int>0x[0-9a-fA-F]+|[0-9]+)
    |(?P<string>[bB]?[rR]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
    |(?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
    |(?P<op>==|!=|<=|>=|&&|\|\||\.\?|\[\?|[-+*/%<>!?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)
RESERVED = {
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
}
_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "`": "`",
    "?": "?",
}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if not match:
            raise CheckError(pos, f"Syntax error: token recognition error at: '{text[pos]}'")
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(Token("eof", "<EOF>", len(text)))
    return tokens


def unquote(token: Token) -> str | bytes:
    raw = token.text
    is_bytes = raw[0] in "bB"
    if is_bytes:
        raw = raw[1:]
    is_raw = raw[0] in "rR"
    if is_raw:
        raw = raw[1:]
    quote = raw[:3] if raw[:3] in ('"""', "'''") else raw[0]
    body = raw[len(quote) : -len(quote)]
    if is_raw:
        out = body
    else:
        parts: list[str] = []
        i = 0
        while i < len(body):
            char = body[i]
            if char != "\\":
                parts.append(char)
                i += 1
                continue
            nxt = body[i + 1]
            if nxt in _ESCAPES:
                parts.append(_ESCAPES[nxt])
                i += 2
            elif nxt in "xX":
                parts.append(chr(int(body[i + 2 : i + 4], 16)))
                i += 4
            elif nxt == "u":
                parts.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
            elif nxt == "U":
                parts.append(chr(int(body[i + 2 : i + 10], 16)))
                i += 10
            elif nxt in "0123":
                parts.append(chr(int(body[i + 1 : i + 4], 8)))
                i += 4
            else:
                raise CheckError(token.pos, f"Syntax error: invalid escape sequence '\\{nxt}'")
        out = "".join(parts)
    return out.encode("utf-8") if is_bytes else out
