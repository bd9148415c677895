"""Errors of the DRA CEL environment: compile errors (the apiserver rejects the selector), runtime errors
(the scheduler aborts the attempt), and the internal errors of the checker and the evaluator.
"""

from __future__ import annotations


class CelCompileError(Exception):
    """The expression does not parse or type-check (the apiserver rejects it)."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(message)
        self.expression = expression
        self.message = message


class CelRuntimeError(Exception):
    """Evaluation failed for a device; the scheduler aborts the attempt with this error."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(message)
        self.expression = expression
        self.message = message


class EvalError(Exception):
    """Internal: a CEL error value (absorbed by ``&&``/``||`` when the other side decides)."""


class CheckError(Exception):
    def __init__(self, pos: int, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


def format_issue(expression: str, pos: int, message: str) -> str:
    """cel-go ``Issues.String()`` form: ``ERROR: <input>:L:C: msg`` plus the source line and a caret."""
    line_no = expression.count("\n", 0, pos) + 1
    line_start = expression.rfind("\n", 0, pos) + 1
    line_end = expression.find("\n", pos)
    line = expression[line_start : line_end if line_end != -1 else len(expression)]
    col = pos - line_start
    return f"ERROR: <input>:{line_no}:{col + 1}: {message}\n | {line}\n | {'.' * col}^"
