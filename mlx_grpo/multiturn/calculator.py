"""The built-in `calculator` tool: arithmetic on numbers, read with Python's parser and evaluated node by
node over a closed set of operations. Never `eval`: a model's text is data. Sizes are bounded so that no
expression can take long or build a huge number (`9**9**9**9` is refused, not computed)."""

from __future__ import annotations

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 60  # integers beyond this many digits are refused (a product of two 30-digit numbers still fits)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression to evaluate, using numbers, + - * / // % ** and parentheses, e.g. "4821 * 7793".
    """
    value = evaluate_expression(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError naming what is not allowed."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise ValueError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.replace(",", ""), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ValueError(f"'{ast.unparse(node)}' is not allowed: only numbers, + - * / // % ** and parentheses")


def _bounded(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= 10 ** MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not finite")
    return value
