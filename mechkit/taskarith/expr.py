"""Arithmetic expressions over named task vectors: ``"cap + 0.5*past - low"``.

Parsed with :mod:`ast` and evaluated by walking the tree, never with ``eval``: only names, numbers,
``+``, ``-``, ``*``, ``/`` by a number, unary minus and parentheses are accepted, plus
``analogy(a, b, c)`` (= c + b − a). Every number must be finite (``1e999`` is not), and the
vectors the expression names must share their base model
(:func:`~mechkit.taskarith.vector.check_compatible`).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping

from mechkit.errors import MechkitError
from mechkit.taskarith.vector import TaskVector, analogy, check_compatible

MAX_LENGTH = 10_000  # characters: far beyond any sum of named vectors a person writes
_FIX = "write e.g. 'cap + 0.5*past - low' using names given with --vector NAME=FILE"


def _eval(node: ast.AST, env: Mapping[str, TaskVector]):
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _finite(float(node.value))
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise MechkitError(f"unknown task vector {node.id!r} in the expression", _FIX)
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _eval(node.left, env), _eval(node.right, env)
        return _binop(node.op, left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "analogy" \
            and len(node.args) == 3 and not node.keywords:
        args = [_eval(a, env) for a in node.args]
        if all(isinstance(a, TaskVector) for a in args):
            return analogy(*args)
    raise MechkitError(f"unsupported expression element: {ast.dump(node)[:60]}", _FIX)


def _binop(op: ast.operator, left, right):
    vec_l, vec_r = isinstance(left, TaskVector), isinstance(right, TaskVector)
    if isinstance(op, (ast.Add, ast.Sub)):
        if vec_l and vec_r:
            return left + right if isinstance(op, ast.Add) else left - right
        if not vec_l and not vec_r:
            return _finite(left + right if isinstance(op, ast.Add) else left - right)
    elif isinstance(op, ast.Mult) and vec_l != vec_r:
        return left * right if vec_l else right * left
    elif isinstance(op, ast.Mult) and not vec_l and not vec_r:
        return _finite(left * right)
    elif isinstance(op, ast.Div) and not vec_r and right != 0:
        return left * _finite(1.0 / right) if vec_l else _finite(left / right)
    raise MechkitError("a task-vector expression can add vectors and scale them by numbers, nothing else", _FIX)


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise MechkitError(f"a number in the expression is {number} (too large to be finite)", _FIX)
    return number


def evaluate_expression(expression: str, vectors: Mapping[str, TaskVector]) -> TaskVector:
    """The task vector an expression denotes.

    >>> import torch
    >>> a = TaskVector({"w": torch.ones(1)})
    >>> evaluate_expression("2*a - a/2", {"a": a}).deltas["w"].item()
    1.5
    """
    if len(expression) > MAX_LENGTH:
        raise MechkitError(f"the expression is {len(expression)} characters long (at most {MAX_LENGTH})", _FIX)
    try:
        tree = ast.parse(expression, mode="eval")
        check_compatible([vectors[n] for n in dict.fromkeys(node.id for node in ast.walk(tree)
                                                             if isinstance(node, ast.Name) and node.id in vectors)])
        result = _eval(tree, vectors)
    except SyntaxError:
        raise MechkitError(f"cannot parse the expression {expression[:60]!r}", _FIX) from None
    except (RecursionError, MemoryError):
        raise MechkitError("the expression nests too deeply to evaluate", _FIX) from None
    if not isinstance(result, TaskVector):
        raise MechkitError(f"the expression {expression!r} is a number, not a task vector", _FIX)
    return result


__all__ = ["evaluate_expression"]
