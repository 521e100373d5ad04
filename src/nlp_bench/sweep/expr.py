"""A small, safe expression language for grid files: arithmetic, comparisons, boolean logic,
conditionals and min/max/abs/int over the point's parameters. Parsed with `ast` and walked by hand;
nothing reaches `eval`, so a grid file cannot run code."""

from __future__ import annotations

import ast
import operator
from typing import Any

from nlp_bench.errors import SpecError, did_you_mean

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}
_FUNCTIONS = {"min": min, "max": max, "abs": abs, "int": int}


class EvaluationError(SpecError):
    """An expression that is well formed but fails for one point (say, a division by zero): that point
    is dropped with this reason, the sweep goes on."""


class Expression:
    """A parsed expression; `names` are the parameters it reads."""

    def __init__(self, text: str, where: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"{where}: expected an expression string, got {text!r}")
        self.text, self.where = text, where
        try:
            self.tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as exc:
            raise SpecError(f"{where}: cannot parse {text!r}: {exc.msg}") from None
        self.names: set[str] = set()
        self._check(self.tree)

    def _check(self, node: ast.AST) -> None:
        allowed = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp, ast.Name, ast.Constant, ast.Call,
                   ast.Tuple, ast.List, ast.Load, ast.And, ast.Or, *_BINARY, *_UNARY, *_COMPARE)
        for child in ast.walk(node):
            if not isinstance(child, allowed):
                raise SpecError(f"{self.where}: {type(child).__name__} is not allowed in {self.text!r}")
            if isinstance(child, ast.Call) and not (isinstance(child.func, ast.Name) and child.func.id in _FUNCTIONS
                                                    and not child.keywords):
                raise SpecError(f"{self.where}: only {', '.join(_FUNCTIONS)} may be called in {self.text!r}")
            if isinstance(child, ast.Name) and child.id not in _FUNCTIONS:
                self.names.add(child.id)
            if isinstance(child, ast.Constant) and not isinstance(child.value, (int, float, str, bool)):
                raise SpecError(f"{self.where}: constant {child.value!r} is not allowed in {self.text!r}")

    def __call__(self, env: dict[str, Any]) -> Any:
        try:
            return self._eval(self.tree, env)
        except SpecError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise EvaluationError(f"{self.text!r} failed: {exc}") from None

    def _eval(self, node: ast.AST, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise SpecError(f"{self.where}: unknown parameter {node.id!r} in {self.text!r}"
                                f"{did_you_mean(node.id, env)}")
            return env[node.id]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise SpecError(f"{self.where}: exponent {right} is too large in {self.text!r}")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, env))
        if isinstance(node, ast.BoolOp):
            values = (self._eval(v, env) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators, strict=False):
                right = self._eval(comparator, env)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self._eval(e, env) for e in node.elts)
        if isinstance(node, ast.Call):
            return _FUNCTIONS[node.func.id](*(self._eval(a, env) for a in node.args))
        raise SpecError(f"{self.where}: cannot evaluate {self.text!r}")
