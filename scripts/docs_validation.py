"""Writes docs/reference/validation.md: every problem the run's validation can report (``validate_config``, the plan
command, a program's params), grouped by the parameter it names, each as the line a user reads.

The problems are read from the package's sources with ``ast``; nothing of the package or of Airflow is imported (the
installed wheel may be older than the sources). A problem is a ``Problem(field, message, fix)`` call, a
``SliceError(field, problem, fix)`` raise, or a ``(field, problem, fix)`` tuple of a function declared to return
them (``candidates._entry_problems``); a call that only passes on another problem's parts is left out. Its text is
rendered as far as the sources tell it before a run: constants are filled in, a field named in a loop over
constants (or by the function a rule receives, ``config_rules._named_candidates``'s) is written out for each, and
what only the run knows is shown as ``<name>``. ``tests/unit/test_troubleshooting_docs.py`` fails while the page
differs from what this writes.

Usage: ``python -m scripts.docs_validation``.
"""

from __future__ import annotations

import ast
import itertools
import operator
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "tpu_rl"
PAGE = REPO / "docs" / "reference" / "validation.md"

#: The callables whose three arguments are (field, message, fix).
PROBLEM_CALLS = ("Problem", "SliceError")
#: A function returning problems as plain tuples says so in its return annotation.
TUPLE_PROBLEMS = "list[tuple[str, str, str]]"
#: More variants of one problem than this are shown with the varying part as a placeholder.
MAX_VARIANTS = 8
#: Attributes that name nothing by themselves: a placeholder takes the name of what they belong to.
_GENERIC = {"name", "value", "message", "field", "text"}
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARISONS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "x", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
#: String methods a rule's text may call on a known value.
_STR_METHODS = {"endswith", "startswith", "strip", "rstrip", "lower", "join", "get", "items"}


class Unknown(Exception):
    """A value only the run knows."""


@dataclass
class Module:
    """One source file: its tree, its module-level names, its imports from the package, and each node's parent."""

    name: str
    path: Path
    tree: ast.Module
    constants: dict[str, ast.expr] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.name.removeprefix("tpu_rl.")


@dataclass(frozen=True)
class Ctx:
    """Where an expression is read: its module, its function (None: module level) and what its names are bound to."""

    module: Module
    function: ast.AST | None = None
    env: tuple[tuple[str, Any], ...] = ()

    def bound(self, name: str) -> Any:
        return dict(self.env).get(name, Unknown)

    def binding(self, **names: Any) -> Ctx:
        return Ctx(self.module, self.function, tuple({**dict(self.env), **names}.items()))


@dataclass(frozen=True)
class Ref:
    """An expression and where it is read: what a name is bound to until its value is asked for."""

    node: ast.expr
    ctx: Ctx


@dataclass(frozen=True)
class Entry:
    """One problem as a user reads it, and the rule (module and function) that reports it."""

    field: str
    line: str
    rule: str


def load(root: Path = SRC) -> dict[str, Module]:
    """Every module under ``root`` (the package ``tpu_rl``), parsed, by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(("tpu_rl", *parts[:-1])) if parts[-1] == "__init__" else ".".join(("tpu_rl", *parts))
        module = Module(name, path, ast.parse(path.read_text(), str(path)))
        _index(module)
        modules[name] = module
    return modules


def _index(module: Module) -> None:
    for node in ast.walk(module.tree):
        for child in ast.iter_child_nodes(node):
            module.parents[child] = node
    for node in module.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            module.constants[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            module.constants[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tpu_rl"):
            for alias in node.names:
                module.imports[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.FunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    module.functions[f"{node.name}.{item.name}"] = item


class Reader:
    """Reads values and texts out of the sources (:meth:`value`, :meth:`render`), as far as they are known."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self._depth = 0
        self.bindings = Bindings(self)

    # -- where names lead ---------------------------------------------------------------------------------

    def enclosing(self, module: Module, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        while (node := module.parents.get(node)) is not None:
            if isinstance(node, kinds):
                return node
        return None

    def function_of(self, module: Module, node: ast.AST) -> ast.AST | None:
        return self.enclosing(module, node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))

    def local_names(self, function: ast.AST | None) -> set[str]:
        """Names bound inside ``function``: its parameters and every name it stores."""
        if function is None:
            return set()
        arguments = function.args
        names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
        return names | {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def global_ref(self, module: Module, name: str) -> Ref | None:
        """A module-level name of ``module``, or one it imports from the package."""
        if name in module.constants:
            return Ref(module.constants[name], Ctx(module))
        source, attribute = module.imports.get(name, (None, None))
        if source is None:
            return None
        target = self.modules.get(f"{source}.{attribute}") or self.modules.get(source)
        if target is None or target.name == f"{source}.{attribute}":
            return None
        return self.global_ref(target, attribute)

    def module_alias(self, node: ast.expr, ctx: Ctx) -> Module | None:
        """The package's module a name stands for (``from tpu_rl import candidates``)."""
        if not isinstance(node, ast.Name):
            return None
        source, attribute = ctx.module.imports.get(node.id, (None, None))
        return self.modules.get(f"{source}.{attribute}") if source else None

    def function_ref(self, func: ast.expr, ctx: Ctx) -> tuple[Module, ast.FunctionDef] | None:
        """The package's function a call names (``f(...)`` or ``module.f(...)``)."""
        if isinstance(func, ast.Name) and func.id in ctx.module.functions:
            return ctx.module, ctx.module.functions[func.id]
        if isinstance(func, ast.Attribute) and (owner := self.module_alias(func.value, ctx)):
            if func.attr in owner.functions:
                return owner, owner.functions[func.attr]
        return None

    def assignments(self, name: str, ctx: Ctx) -> list[ast.expr] | None:
        """What the local ``name`` is assigned, when plain assignments are all that bind it (None otherwise)."""
        function = ctx.function
        if function is None or name not in self.local_names(function):
            return None
        values, binders = [], 0
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
                binders += 1
                parent = ctx.module.parents.get(node)
                if isinstance(parent, ast.Assign) and parent.targets == [node]:
                    values.append(parent.value)
                elif isinstance(parent, ast.Tuple) and (element := _unpacked(ctx.module, parent, node)) is not None:
                    values.append(element)
        parameters = name in {a.arg for a in function.args.args + function.args.kwonlyargs}
        return values if values and len(values) == binders and not parameters else None

    # -- values -------------------------------------------------------------------------------------------

    def value(self, node: ast.expr, ctx: Ctx) -> Any:
        """The value of ``node`` as the sources give it (a Ref for a dict's value, read when asked for)."""
        self._depth += 1
        try:
            if self._depth > 60:
                raise Unknown
            return self._value(node, ctx)
        finally:
            self._depth -= 1

    def deref(self, found: Any) -> Any:
        while isinstance(found, Ref):
            found = self.value(found.node, found.ctx)
        return found

    def _value(self, node: ast.expr, ctx: Ctx) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name_value(node.id, ctx)
        if isinstance(node, ast.Attribute):
            if owner := self.module_alias(node.value, ctx):
                ref = self.global_ref(owner, node.attr)
                return self.value(ref.node, ref.ctx) if ref else self._raise()
            found = self.value(node.value, ctx)
            return getattr(found, node.attr) if isinstance(found, types.SimpleNamespace) else self._raise()
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.deref(self.value(element, ctx)) for element in node.elts)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.value(key, ctx): Ref(item, ctx) for key, item in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = self.deref(self.value(node.left, ctx)), self.deref(self.value(node.right, ctx))
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.Subscript):
            container, key = self.value(node.value, ctx), self.value(node.slice, ctx)
            try:
                return self.deref(container[key])
            except (KeyError, IndexError, TypeError):
                raise Unknown from None
        if isinstance(node, ast.IfExp):
            return self.value(node.body if self.value(node.test, ctx) else node.orelse, ctx)
        if isinstance(node, ast.Call):
            return self._call_value(node, ctx)
        if isinstance(node, ast.JoinedStr):
            return "".join(self._known_part(part, ctx) for part in node.values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARISONS:
            left, right = self.deref(self.value(node.left, ctx)), self.deref(self.value(node.comparators[0], ctx))
            return _COMPARISONS[type(node.ops[0])](left, right)
        raise Unknown

    def _known_part(self, part: ast.expr, ctx: Ctx) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        known, spec = self.deref(self.value(part.value, ctx)), _constant_spec(part.format_spec)
        if spec is None or not isinstance(known, (str, int, float)):
            raise Unknown
        return format(repr(known) if part.conversion == ord("r") else known, spec)

    @staticmethod
    def _raise() -> Any:
        raise Unknown

    def _name_value(self, name: str, ctx: Ctx) -> Any:
        bound = ctx.bound(name)
        if bound is not Unknown:
            return self.deref(bound)
        if name in self.local_names(ctx.function):
            raise Unknown
        ref = self.global_ref(ctx.module, name)
        if ref is None:
            raise Unknown
        return self.value(ref.node, ref.ctx)

    def _call_value(self, node: ast.Call, ctx: Ctx) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1:
            return len(self.deref(self.value(node.args[0], ctx)))
        first = node.args[0] if node.args else None
        if isinstance(func, ast.Name) and func.id == "next" and isinstance(first, ast.GeneratorExp):
            return self._first(node, ctx)
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            owner = self.deref(self.value(func.value, ctx))
            if not isinstance(owner, (str, dict)):
                raise Unknown
            arguments = [self.deref(self.value(argument, ctx)) for argument in node.args]
            if func.attr == "join":
                return owner.join(str(item) for item in arguments[0])
            return self.deref(getattr(owner, func.attr)(*arguments))
        if inlined := self.inline(node, ctx):
            return self.value(*inlined)
        raise Unknown

    def _first(self, node: ast.Call, ctx: Ctx) -> Any:
        """``next((x for ... if ...), default)``, over elements the sources give."""
        generator = node.args[0].generators[0]
        for bound in self.bindings.loop(generator.target, generator.iter, ctx) or self._raise():
            here = ctx.binding(**bound)
            if all(self.deref(self.value(condition, here)) for condition in generator.ifs):
                return self.value(node.args[0].elt, here)
        return self.value(node.args[1], ctx) if len(node.args) > 1 else self._raise()

    def inline(self, call: ast.Call, ctx: Ctx) -> tuple[ast.expr, Ctx] | None:
        """The expression a call returns, where the callee is a lambda a name is bound to or a function of the
        package that only returns one expression, with its parameters bound to the call's arguments."""
        callee = self._lambda(call.func, ctx)
        if callee is None and (found := self.function_ref(call.func, ctx)):
            module, function = found
            body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                callee = Ref(body[0].value, Ctx(module, function))
        if callee is None:
            return None
        function = callee.ctx.function if not isinstance(callee.node, ast.Lambda) else callee.node
        body = callee.node.body if isinstance(callee.node, ast.Lambda) else callee.node
        names = [a.arg for a in function.args.args]
        defaults = dict(zip(names[len(names) - len(function.args.defaults) :], function.args.defaults, strict=True))
        bound = {name: Ref(default, callee.ctx) for name, default in defaults.items()}
        bound.update({name: Ref(argument, ctx) for name, argument in zip(names, call.args, strict=False)})
        bound.update({k.arg: Ref(k.value, ctx) for k in call.keywords if k.arg})
        return body, Ctx(callee.ctx.module, function, tuple(bound.items()))

    def _lambda(self, func: ast.expr, ctx: Ctx) -> Ref | None:
        """The lambda a called name is bound to, followed through names bound to names."""
        while isinstance(func, ast.Name) and isinstance(bound := ctx.bound(func.id), Ref):
            func, ctx = bound.node, bound.ctx
        return Ref(func, ctx) if isinstance(func, ast.Lambda) else None

    # -- texts ----------------------------------------------------------------------------------------------

    def render(self, node: ast.expr, ctx: Ctx) -> list[str]:
        """Every text ``node`` may be, what only the run knows shown as ``<name>``."""
        return self.texts(node, ctx) or [self.placeholder(node, ctx)]

    def texts(self, node: ast.expr, ctx: Ctx) -> list[str] | None:
        """The texts ``node`` may be, or None when it is not a text the sources spell out."""
        try:
            known = self.deref(self.value(node, ctx))
        except Unknown:
            known = Unknown
        if isinstance(known, (str, int, float)) and not isinstance(known, bool):
            return [str(known)]
        self._depth += 1
        try:
            return None if self._depth > 60 else self._structure(node, ctx)
        finally:
            self._depth -= 1

    def _structure(self, node: ast.expr, ctx: Ctx) -> list[str] | None:
        if isinstance(node, ast.JoinedStr):
            return _variants([self._part(part, ctx) for part in node.values], node.values, self, ctx)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.texts(node.left, ctx), self.texts(node.right, ctx)
            if left is None and right is None:
                return None
            sides = [left or [self.placeholder(node.left, ctx)], right or [self.placeholder(node.right, ctx)]]
            return _variants(sides, [node.left, node.right], self, ctx)
        if isinstance(node, ast.IfExp):
            body, orelse = self.texts(node.body, ctx), self.texts(node.orelse, ctx)
            return None if body is None or orelse is None else list(dict.fromkeys(body + orelse))
        if isinstance(node, ast.Name):
            bound = ctx.bound(node.id)
            if isinstance(bound, Ref):
                return self.texts(bound.node, bound.ctx)
            values = self.assignments(node.id, ctx)
            if values is not None:
                found = [self.texts(value, ctx) for value in values]
                return None if None in found else list(dict.fromkeys(itertools.chain(*found)))
            ref = None if node.id in self.local_names(ctx.function) else self.global_ref(ctx.module, node.id)
            return self.texts(ref.node, ref.ctx) if ref else None
        if isinstance(node, ast.Subscript):
            return self._item_texts(node, ctx)
        if isinstance(node, ast.Call) and (inlined := self.inline(node, ctx)):
            return self.texts(*inlined)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
            return self._joined_texts(node, ctx)
        return None

    def item(self, node: ast.Subscript, ctx: Ctx) -> Ref | None:
        """The expression ``container[key]`` stands for, when the container is a literal the sources give."""
        container = (
            self.item(node.value, ctx)
            if isinstance(node.value, ast.Subscript)
            else self.bindings.literal(Ref(node.value, ctx))
        )
        if container is None:
            return None
        try:
            key = self.deref(self.value(node.slice, ctx))
        except Unknown:
            return None
        literal = container.node
        if isinstance(literal, ast.Dict):
            for name, item in zip(literal.keys, literal.values, strict=True):
                if name is not None and self._known(name, container.ctx) == key:
                    return Ref(item, container.ctx)
        if (
            isinstance(literal, (ast.Tuple, ast.List))
            and isinstance(key, int)
            and -len(literal.elts) <= key < len(literal.elts)
        ):
            return Ref(literal.elts[key], container.ctx)
        return None

    def _known(self, node: ast.expr, ctx: Ctx) -> Any:
        try:
            return self.deref(self.value(node, ctx))
        except Unknown:
            return Unknown

    def _item_texts(self, node: ast.Subscript, ctx: Ctx) -> list[str] | None:
        """A literal's item; or, for the first of a list a rule builds, whichever of its elements it may be."""
        if (found := self.item(node, ctx)) is not None:
            return self.texts(found.node, found.ctx)
        if not (isinstance(node.slice, ast.Constant) and node.slice.value == 0):
            return None
        elements = self.bindings.elements(node.value, ctx) or []
        texts = [self.texts(e.node, e.ctx) if isinstance(e, Ref) else None for e in elements]
        return None if not texts or None in texts else list(dict.fromkeys(itertools.chain(*texts)))

    def _joined_texts(self, node: ast.Call, ctx: Ctx) -> list[str] | None:
        """``sep.join(parts)`` of a list the rule appends texts to: each part alone, and all of them joined."""
        separator, parts = self._known(node.func.value, ctx), node.args[0] if node.args else None
        if not isinstance(separator, str) or not isinstance(parts, ast.Name) or ctx.function is None:
            return None
        appended = [
            call.args[0]
            for call in ast.walk(ctx.function)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == parts.id
            and len(call.args) == 1
        ]
        found = [self.texts(part, ctx) for part in appended]
        if not found or None in found:
            return None
        alone = list(itertools.chain(*found))
        return list(dict.fromkeys(alone + ([separator.join(f[0] for f in found)] if len(found) > 1 else [])))

    def _part(self, part: ast.expr, ctx: Ctx) -> list[str]:
        """One piece of an f-string: its constant, or its value formatted as the f-string would, or its texts."""
        if isinstance(part, ast.Constant):
            return [str(part.value)]
        spec = _constant_spec(part.format_spec)
        try:
            known = self.deref(self.value(part.value, ctx))
            if isinstance(known, (str, int, float)) and spec is not None:
                return [format(repr(known) if part.conversion == ord("r") else known, spec)]
        except (Unknown, ValueError, TypeError):
            pass
        found = self.texts(part.value, ctx)
        if found is None:
            return [self.placeholder(part.value, ctx)]
        return [repr(text) for text in found] if part.conversion == ord("r") else found

    def placeholder(self, node: ast.expr, ctx: Ctx) -> str:
        return f"<{self.readable(node, ctx)}>"

    def readable(self, node: ast.expr, ctx: Ctx) -> str:
        """What a placeholder calls a value: the last name of its expression, lower case."""
        if isinstance(node, ast.Name):
            bound = ctx.bound(node.id)
            if isinstance(bound, Ref) and isinstance(bound.node, (ast.Name, ast.Constant)):
                return self.readable(bound.node, bound.ctx)
            return node.id.lower()
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.Attribute):
            short_owner = isinstance(node.value, ast.Name) and len(node.value.id) <= 2
            return self.readable(node.value, ctx) if node.attr in _GENERIC and not short_owner else node.attr
        if isinstance(node, ast.Subscript):
            key = node.slice
            return (
                key.value
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
                else self.readable(node.value, ctx)
            )
        if isinstance(node, ast.Call):
            return self._readable_call(node, ctx)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return self.readable(node.generators[0].iter, ctx)
        if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
            return f"{self._leaf(node.left, ctx)} {_SYMBOLS[type(node.op)]} {self._leaf(node.right, ctx)}"
        if isinstance(node, ast.IfExp):
            return self.readable(node.body, ctx)
        return ast.unparse(node)

    def _readable_call(self, node: ast.Call, ctx: Ctx) -> str:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "len":
            return "n"
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 2:
            found = self.texts(node.args[1], ctx)
            return found[0] if found and len(found) == 1 else "value"
        if isinstance(func, ast.Attribute) and self.module_alias(func.value, ctx):
            return func.attr
        if isinstance(func, ast.Attribute):
            return self.readable(node.args[0] if func.attr == "join" else func.value, ctx)
        return self.readable(node.args[0], ctx) if node.args else self.readable(func, ctx)

    def _leaf(self, node: ast.expr, ctx: Ctx) -> str:
        try:
            known = self.deref(self.value(node, ctx))
        except Unknown:
            return self.readable(node, ctx)
        return str(known) if isinstance(known, (str, int, float)) else self.readable(node, ctx)


def _unpacked(module: Module, target: ast.Tuple, node: ast.Name) -> ast.expr | None:
    """What ``a, b = x, y`` assigns the name ``node`` of its target."""
    statement = module.parents.get(target)
    if not (isinstance(statement, ast.Assign) and statement.targets == [target]):
        return None
    value = statement.value
    if not isinstance(value, (ast.Tuple, ast.List)) or len(value.elts) != len(target.elts):
        return None
    return value.elts[target.elts.index(node)]


def _constant_spec(spec: ast.JoinedStr | None) -> str | None:
    """An f-string part's format spec when it is constant ("" without one), else None."""
    if spec is None:
        return ""
    return "".join(p.value for p in spec.values) if all(isinstance(p, ast.Constant) for p in spec.values) else None


def _variants(parts: list[list[str]], nodes: list[ast.expr], reader: Reader, ctx: Ctx) -> list[str]:
    """Every text the parts combine to; past :data:`MAX_VARIANTS`, the part with the most variants is shown as its
    placeholder instead."""
    parts = list(parts)
    while len(parts) > 1 and _count(parts) > MAX_VARIANTS:
        widest = max(range(len(parts)), key=lambda i: len(parts[i]))
        node = nodes[widest]
        parts[widest] = [reader.placeholder(node.value if isinstance(node, ast.FormattedValue) else node, ctx)]
    return list(dict.fromkeys("".join(combination) for combination in itertools.product(*parts)))


def _count(parts: list[list[str]]) -> int:
    total = 1
    for part in parts:
        total *= len(part)
    return total


class Bindings:
    """What the names of a problem's field stand for: a loop's elements (``for name in ("a", "b")``), the values a
    rule's parameter gets at its call sites, the elements a generator of the package yields."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def of_field(self, node: ast.expr, ctx: Ctx) -> list[dict[str, Any]]:
        """Each way the names of ``node`` may be bound: every combination of its loops' elements and its function's
        call sites."""
        names = sorted(self.names(node, ctx))
        parameters = _parameters(ctx.function)
        groups, binders = [], set()
        if used := [name for name in names if name in parameters]:
            groups.append(self.call_sites(ctx, used) or [{}])
        for name in names:
            binder = self.binder(name, node, ctx)
            if binder is not None and id(binder[1]) not in binders:
                binders.add(id(binder[1]))
                groups.append(self.loop(*binder, ctx) or [{}])
        return [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in itertools.product(*groups)]

    def names(self, node: ast.expr, ctx: Ctx, depth: int = 0) -> set[str]:
        """The names ``node`` reads, and those the local names among them are assigned from."""
        found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name in list(found) if depth < 5 else ():
            for value in self.reader.assignments(name, ctx) or ():
                found |= self.names(value, ctx, depth + 1)
        return found

    def binder(self, name: str, node: ast.AST, ctx: Ctx) -> tuple[ast.expr, ast.expr] | None:
        """(target, iterable) of the loop or comprehension that binds ``name`` where ``node`` reads it."""
        module = ctx.module
        while (node := module.parents.get(node)) is not None and node is not ctx.function:
            generators = (
                [(node.target, node.iter)]
                if isinstance(node, ast.For)
                else [(g.target, g.iter) for g in getattr(node, "generators", [])]
            )
            for target, iterable in generators:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    return target, iterable
        return None

    def loop(self, target: ast.expr, iterable: ast.expr, ctx: Ctx) -> list[dict[str, Any]] | None:
        """The bindings of ``target`` for each element of ``iterable``, or None when its elements are not known."""
        elements = self.elements(iterable, ctx)
        if elements is None:
            return None
        unpacked = [self.unpack(target, element) for element in elements]
        return None if any(u is None for u in unpacked) else unpacked

    def unpack(self, target: ast.expr, element: Any) -> dict[str, Any] | None:
        if isinstance(target, ast.Name):
            return {target.id: element}
        if not isinstance(target, ast.Tuple):
            return None
        if isinstance(element, Ref):
            literal = self.literal(element)
            if not isinstance(literal.node, (ast.Tuple, ast.List)):
                return None
            element = tuple(Ref(e, literal.ctx) for e in literal.node.elts)
        if not isinstance(element, tuple) or len(element) != len(target.elts):
            return None
        merged: dict[str, Any] = {}
        for inner, item in zip(target.elts, element, strict=True):
            if (found := self.unpack(inner, item)) is None:
                return None
            merged.update(found)
        return merged

    def literal(self, ref: Ref) -> Ref:
        """``ref`` followed through names (bound ones, module-level ones) to the expression they stand for."""
        node, ctx = ref.node, ref.ctx
        for _ in range(20):
            if not isinstance(node, ast.Name):
                break
            bound = ctx.bound(node.id)
            if isinstance(bound, Ref):
                node, ctx = bound.node, bound.ctx
                continue
            values = self.reader.assignments(node.id, ctx)
            global_ref = (
                None
                if node.id in self.reader.local_names(ctx.function)
                else self.reader.global_ref(ctx.module, node.id)
            )
            if values is not None and len(values) == 1:
                node = values[0]
            elif global_ref is not None:
                node, ctx = global_ref.node, global_ref.ctx
            else:
                break
        return Ref(node, ctx)

    def elements(self, iterable: ast.expr, ctx: Ctx) -> list[Any] | None:
        """What a loop over ``iterable`` gets, each as a Ref (a pair of Refs for a dict's items), or None."""
        found = self.literal(Ref(iterable, ctx))
        node, ctx = found.node, found.ctx
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [Ref(element, ctx) for element in node.elts]
        if isinstance(node, ast.Dict):
            return [Ref(key, ctx) for key in node.keys if key is not None]
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and len(node.generators) == 1:
            generator = node.generators[0]
            outer = self.loop(generator.target, generator.iter, ctx)
            return None if outer is None else [Ref(node.elt, ctx.binding(**bound)) for bound in outer]
        if isinstance(node, ast.Call):
            return self._call_elements(node, ctx)
        return None

    def _call_elements(self, node: ast.Call, ctx: Ctx) -> list[Any] | None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("items", "keys") and not node.args:
            mapping = self.literal(Ref(func.value, ctx))
            if not isinstance(mapping.node, ast.Dict):
                return None
            pairs = zip(mapping.node.keys, mapping.node.values, strict=True)
            if func.attr == "keys":
                return [Ref(key, mapping.ctx) for key, _ in pairs]
            return [(Ref(key, mapping.ctx), Ref(item, mapping.ctx)) for key, item in pairs]
        if isinstance(func, ast.Name) and func.id in ("sorted", "list", "tuple", "set", "reversed") and node.args:
            return self.elements(node.args[0], ctx)
        if found := self.reader.function_ref(func, ctx):
            module, function = found
            yields = [n for n in ast.walk(function) if isinstance(n, ast.Yield) and n.value is not None]
            return [Ref(y.value, Ctx(module, function)) for y in yields] or None
        return None

    def call_sites(self, ctx: Ctx, used: list[str], depth: int = 0) -> list[dict[str, Any]]:
        """The bindings of the parameters ``used`` at each call of the function in its module, an argument that a
        caller's loop or its own call sites bind written out for each (``depth``: callers of callers followed)."""
        function, module, found = ctx.function, ctx.module, []
        for call in ast.walk(module.tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function.name):
                continue
            caller = Ctx(module, self.reader.function_of(module, call))
            arguments = _arguments(function, call)
            fixed = {
                name: _refs(value, caller) if isinstance(value, tuple) else Ref(value, caller)
                for name, value in arguments.items()
                if name not in used
            }
            options = [
                self.possible(arguments[name], caller, depth) if name in arguments else [Unknown] for name in used
            ]
            for combination in itertools.product(*options):
                bound = {n: v for n, v in zip(used, combination, strict=True) if v is not Unknown}
                found.append({**fixed, **bound})
        return found

    def possible(self, argument: Any, ctx: Ctx, depth: int = 0) -> list[Any]:
        """What an argument may be: the elements of the caller's loop that binds it, the caller's own callers' values
        for a parameter, or the argument itself (a tuple of them for ``*args``)."""
        if isinstance(argument, tuple):
            return [_refs(argument, ctx)]
        if isinstance(argument, ast.Name):
            if (binder := self.binder(argument.id, argument, ctx)) is not None:
                bindings = self.loop(*binder, ctx)
                if bindings:
                    return [bound[argument.id] for bound in bindings if argument.id in bound]
            if argument.id in _parameters(ctx.function) and depth < 5:
                outer = self.call_sites(ctx, [argument.id], depth + 1)
                if outer and all(argument.id in bound for bound in outer):
                    return [bound[argument.id] for bound in outer]
        return [Ref(argument, ctx)]


def _refs(arguments: tuple[ast.expr, ...], ctx: Ctx) -> tuple[Ref, ...]:
    return tuple(Ref(argument, ctx) for argument in arguments)


def _parameters(function: ast.AST | None) -> list[str]:
    if function is None:
        return []
    arguments = function.args
    names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    return names + [a.arg for a in (arguments.vararg,) if a is not None]


def _arguments(function: ast.FunctionDef, call: ast.Call) -> dict[str, Any]:
    """The call's argument of each parameter (a tuple of them for ``*args``)."""
    positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    bound: dict[str, Any] = dict(zip(positional, call.args, strict=False))
    if function.args.vararg is not None:
        bound[function.args.vararg.arg] = tuple(call.args[len(positional) :])
    bound.update({keyword.arg: keyword.value for keyword in call.keywords if keyword.arg})
    return bound


class Problems:
    """Every problem validation can report, read from the sources (see the module docstring)."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.reader = Reader(modules)
        self.bindings = self.reader.bindings

    def entries(self) -> list[Entry]:
        """Each problem once, in the order of the sources."""
        found: dict[tuple[str, str], Entry] = {}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                parts = self._parts(module, node)
                for entry in self._entries(module, node, *parts) if parts else ():
                    found.setdefault((entry.field, entry.line), entry)
        return list(found.values())

    def wrappers(self) -> list[Entry]:
        """The forms that add words to another rule's problem (its field and fix passed on as they are)."""
        found = {}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                parts = self._parts(module, node)
                if parts is None or not isinstance(parts[2], ast.Attribute):
                    continue
                ctx = Ctx(module, self.reader.function_of(module, node))
                for message in self.reader.texts(parts[1], ctx) or ():
                    if any(ch.isalpha() for ch in re.sub(r"<[^<>]*>", "", message)):
                        line = self.line("<field>", message, "<fix>")
                        found.setdefault(line, Entry("<field>", line, self._rule(module, ctx.function)))
        return list(found.values())

    def _parts(self, module: Module, node: ast.AST) -> tuple[ast.expr, ast.expr, ast.expr] | None:
        """(field, message, fix) of a problem the node makes, or None."""
        if isinstance(node, ast.Call) and _callee(node.func) in PROBLEM_CALLS and len(node.args) == 3:
            return node.args[0], node.args[1], node.args[2]
        if isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Load) and len(node.elts) == 3:
            function = self.reader.function_of(module, node)
            returns = getattr(function, "returns", None)
            in_annotation = returns is not None and any(node is n for n in ast.walk(returns))
            if returns is not None and ast.unparse(returns) == TUPLE_PROBLEMS and not in_annotation:
                return node.elts[0], node.elts[1], node.elts[2]
        return None

    def _entries(self, module: Module, node: ast.AST, field_: ast.expr, message: ast.expr, fix: ast.expr):
        ctx = Ctx(module, self.reader.function_of(module, node))
        if self.reader.texts(fix, ctx) is None:  # another problem's parts, passed on (a wrapper)
            return
        for bound in self.bindings.of_field(field_, ctx):
            here = ctx.binding(**bound)
            texts = [self.reader.render(part, here) for part in (field_, message, fix)]
            for name, words, remedy in itertools.product(*texts):
                if re.fullmatch(r"<[^<>]*>", name):  # a field the run names: any parameter
                    words, remedy, name = (
                        words.replace(name, "<parameter>"),
                        remedy.replace(name, "<parameter>"),
                        ("<parameter>"),
                    )
                yield Entry(name, self.line(name, words, remedy), self._rule(module, ctx.function))

    def line(self, name: str, message: str, fix: str) -> str:
        """The problem as ``Problem.__str__`` (config_rules.py) writes it, read from its source."""
        module = self.modules["tpu_rl.config_rules"]
        function = module.functions["Problem.__str__"]
        returned = next(n.value for n in ast.walk(function) if isinstance(n, ast.Return))
        problem = types.SimpleNamespace(field=name, message=message, fix=fix)
        (text,) = self.reader.render(returned, Ctx(module, function, (("self", problem),)))
        return text

    @staticmethod
    def _rule(module: Module, function: ast.AST | None) -> str:
        name = getattr(function, "name", "")
        return f"{module.short}.{name}" if name else module.short


def _callee(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


# -- the page ----------------------------------------------------------------------------------------------------

INTRO = """\
# What validation refuses

<!-- Generated from src/tpu_rl by `python -m scripts.docs_validation`: do not edit. -->

Every problem the checks of a run's parameters can report, grouped by the parameter it names, each as the line a
user reads: `<field>: <message>; fix: <fix>.` Text in angle brackets (`<value>`) is the run's own value, or what
the rule computes from it; a rule of a capacity candidate names the candidate's key
(`capacity_candidates[<index>].zone`), and is listed under `capacity_candidates`.

The checks run before anything is created in the cloud, in the same order everywhere, and report every problem at
once:

- `validate_config`, the first task of a run, fails the run without a retry with
  {config_error}, then one line `- <problem>` per problem;
- the plan command (`make plan CONF=...`, [how-to](../how-to/plan.md)) prints the same lines and exits non-zero;
- a program's `params` are checked when its file is parsed: each problem comes back as `params.<problem>` in the
  program's import error ([troubleshooting](../troubleshooting/index.md));
- the run's Training tab shows them instead of the run's figures.

What each parameter means, its default and bounds: [parameters.md](parameters.md). What to do when a task fails
after validation: [troubleshooting](../troubleshooting/index.md).
"""


def page(root: Path = SRC) -> str:
    """The page's text, from the sources under ``root``."""
    modules = load(root)
    problems = Problems(modules)
    order = _parameter_order(modules)
    groups: dict[str, list[Entry]] = {}
    for entry in problems.entries():
        groups.setdefault(_group(entry.field), []).append(entry)
    ranked = sorted(groups, key=lambda g: (g != "<parameter>", order.get(g, len(order)), g))
    sections = [INTRO.format(config_error=_config_error(problems))]
    sections.append("## Contents\n\n" + ", ".join(f"[{_title(g)}](#{_anchor(g)})" for g in ranked) + "\n")
    for group in ranked:
        sections.append(_section(group, groups[group], group in order))
    if wrapped := problems.wrappers():
        sections.append(
            "## Problems with more words\n\nA rule's problem, as another check reports it: the field and the fix are "
            "the rule's.\n\n" + "\n".join(_bullet(entry) for entry in wrapped) + "\n"
        )
    return "\n".join(sections)


def _config_error(problems: Problems) -> str:
    """The first line of validate_config's failure, from ``ConfigError`` (config_rules.py)."""
    module = problems.modules["tpu_rl.config_rules"]
    function = module.functions["ConfigError.__init__"]
    call = next(n for n in ast.walk(function) if isinstance(n, ast.Call) and _callee(n.func) == "__init__")
    text = problems.reader.render(call.args[0], Ctx(module, function))[0]
    return _code(text.split("\n", 1)[0])


def _parameter_order(modules: dict[str, Module]) -> dict[str, int]:
    """The run's parameters (``RunConfig``'s fields, config.py) in the form's order."""
    tree = modules["tpu_rl.config"].tree
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunConfig")
    names = [n.target.id for n in config.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return {name: index for index, name in enumerate(names)}


def _group(field_: str) -> str:
    return field_ if field_ == "<parameter>" else re.split(r"[\[.]", field_, maxsplit=1)[0]


def _title(group: str) -> str:
    """The section's title: the parameter, in code; or what a rule that checks any parameter reports."""
    return "Any parameter" if group == "<parameter>" else f"`{group}`"


def _anchor(group: str) -> str:
    """The id MkDocs' table of contents gives the section's heading (its default slugify)."""
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", _title(group)).strip().lower())


def _section(group: str, entries: list[Entry], is_parameter: bool) -> str:
    if group == "<parameter>":
        lead = "Problems a rule reports for whichever parameter it checks."
    elif is_parameter:
        lead = f"The parameter: [`{group}`](parameters.md#{group})."
    else:
        lead = "Not a parameter of the form."
    return f"## {_title(group)}\n\n{lead}\n\n" + "\n".join(_bullet(entry) for entry in entries) + "\n"


def _bullet(entry: Entry) -> str:
    return f"- {_code(entry.line)} ({_code(entry.rule)})"


def _code(text: str) -> str:
    """A code span of ``text``, with a fence longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def main() -> None:
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
