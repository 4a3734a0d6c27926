"""Every stable error code in the source is documented in docs/ERRORS.md (so the doc cannot go stale).

Codes are found statically (AST), in every ``.py`` file under :data:`SOURCE_DIRS`, wherever a
value is passed to a parameter named ``code`` or ``*_code`` of a function or class defined there.
That covers the constructors of :class:`guard.errors.GuardError` and its subclasses (first
argument ``code``), helpers such as ``_limit(code, message, path)``, and records with an
``error_code`` field (``TemplateScan``), in whatever module they are added later. Also:

- module-level constants named ``CODE_*`` or ``*_CODE`` (codes exported for others);
- dict literals shaped like an OpenAI error body, ``{"error": {..., "code": X}}``.

A value counts when it is a string literal, a module-level string constant (by name, as
``module.NAME``, or re-exported), either branch of ``a if c else b``, a local variable assigned
such values (tuple unpacking included), the values of a module-level dict or tuple indexed by a
key, or ``{...}.get(key, default)``. Some dynamic forms are accepted because their codes are
found elsewhere: a parameter whose own name is code-like (its callers are checked), a code-like
local bound by a loop or unpacking from an unknown source, and an attribute named ``code`` /
``*_code`` (an existing error's code passed on). Anything else -- an f-string, a call, a name
not like ``code`` -- cannot be checked, so it fails :func:`test_every_code_is_static` with its
location: write the code as a literal or a constant instead.

The other way round, every code in the first column of the doc's tables must still be raised
somewhere (:func:`test_no_stale_codes_documented`).
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests._support import REPO_ROOT

ROOT = REPO_ROOT
SOURCE_DIRS = ("guard", "scheduler_ref")
DOC = ROOT / "docs" / "ERRORS.md"
CODE_SHAPE = re.compile(r"^[a-z][a-z0-9_]*$")
_CONST_CODE_NAME = re.compile(r"^(CODE_[A-Z0-9_]+|[A-Z0-9_]+_CODE)$")


def _code_like(name: str) -> bool:
    return name == "code" or name.endswith("_code")


@dataclass
class Site:
    path: str
    line: int
    expr: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.expr}"


@dataclass
class Extraction:
    codes: dict[str, list[Site]] = field(default_factory=dict)  # code -> where it is used
    unresolved: list[Site] = field(default_factory=list)

    def add(self, code: str, site: Site) -> None:
        self.codes.setdefault(code, []).append(site)


_Fn = ast.FunctionDef | ast.AsyncFunctionDef
_VALUE_NODES = (ast.Constant, ast.Dict, ast.Tuple, ast.List, ast.Set)


@dataclass
class _Module:
    path: str
    package: str  # dotted name of the package the module is in
    tree: ast.Module
    values: dict[str, ast.expr]  # module-level NAME = <str constant or literal collection>
    imported: dict[str, str]  # local name -> dotted origin ("pkg.mod" or "pkg.mod.NAME")
    defs: dict[str, list[list[str]]]  # functions and classes defined here -> their parameters


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if method and not static and names:
        names = names[1:]  # self / cls
    return names + [p.arg for p in a.kwonlyargs]


def _load(path: Path, rel: str) -> _Module:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    parts = rel.removesuffix(".py").split("/")
    package = ".".join(parts[:-1])  # relative imports resolve here, in __init__ too
    values: dict[str, ast.expr] = {}
    imported: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, _VALUE_NODES):
            values[target.id] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imported[alias.asname] = alias.name
                else:
                    imported[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y / from . import y
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{base}.{alias.name}"
    return _Module(rel, package, tree, values, imported, {})


class _Extractor:
    def __init__(self, modules: list[_Module]) -> None:
        self.modules = modules
        self.by_name: dict[str, _Module] = {}
        for m in modules:
            dotted = m.path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            self.by_name[dotted] = m
        self.methods: dict[str, list[list[str]]] = {}
        self._collect_signatures()
        self.out = Extraction()

    # ------------------------------------------------------------------------------ signatures

    def _collect_signatures(self) -> None:
        """Each module's functions and classes (a class: its ``__init__``, else its dataclass
        fields, else its first base's signature); methods by name, for ``obj.method(...)``."""
        bases: list[tuple[_Module, str, list[ast.expr]]] = []
        for mod in self.modules:
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef):
                    init = None
                    for b in node.body:
                        if isinstance(b, _Fn):
                            if b.name == "__init__":
                                init = b
                            else:
                                self.methods.setdefault(b.name, []).append(_params(b, method=True))
                    if init is not None:
                        mod.defs.setdefault(node.name, []).append(_params(init, method=True))
                    elif any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                        fields = [
                            b.target.id
                            for b in node.body
                            if isinstance(b, ast.AnnAssign)
                            and isinstance(b.target, ast.Name)
                            and "ClassVar" not in ast.unparse(b.annotation)
                        ]
                        mod.defs.setdefault(node.name, []).append(fields)
                    else:
                        bases.append((mod, node.name, node.bases))
                elif isinstance(node, _Fn):
                    # Module-level functions and closures (methods are in their class body).
                    for inner in node.body:
                        if isinstance(inner, _Fn):
                            mod.defs.setdefault(inner.name, []).append(_params(inner, method=False))
            for node in mod.tree.body:
                if isinstance(node, _Fn):
                    mod.defs.setdefault(node.name, []).append(_params(node, method=False))
        for _ in range(10):  # subclasses of subclasses, in any order
            for mod, name, base_nodes in bases:
                if name in mod.defs:
                    continue
                for base in base_nodes:
                    sig = self._callee(mod, base)
                    if sig:
                        mod.defs[name] = sig
                        break

    def _imported_module(self, mod: _Module, name: str) -> _Module | None:
        origin = mod.imported.get(name)
        return None if origin is None else self.by_name.get(origin)

    def _origin(self, mod: _Module, name: str) -> tuple[_Module, str] | None:
        """Where an imported ``name`` is defined, if in the scanned sources."""
        origin = mod.imported.get(name)
        if origin is None or "." not in origin:
            return None
        src_name, _, attr = origin.rpartition(".")
        src = self.by_name.get(src_name)
        return None if src is None else (src, attr)

    def _callee(self, mod: _Module, func: ast.expr) -> list[list[str]]:
        if isinstance(func, ast.Name):
            if func.id in mod.defs:
                return mod.defs[func.id]
            found = self._origin(mod, func.id)
            return found[0].defs.get(found[1], []) if found else []
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name):
                src = self._imported_module(mod, func.value.id)
                if src is not None:
                    return src.defs.get(func.attr, [])
            return self.methods.get(func.attr, [])
        return []

    # ------------------------------------------------------------------------ value resolution

    def _module_value(self, mod: _Module, name: str) -> ast.expr | None:
        for _ in range(10):  # follow re-exports: `from a import X` where a imported X from b
            if name in mod.values:
                return mod.values[name]
            found = self._origin(mod, name)
            if found is None:
                return None
            mod, name = found
        return None

    @staticmethod
    def _element(node: ast.expr | None, index: int | None) -> list[ast.expr] | None:
        """``node`` itself (``index`` None) or its ``index``-th element, if a tuple literal."""
        if node is None:
            return None
        if index is None:
            return [node]
        if isinstance(node, ast.Tuple) and index < len(node.elts):
            return [node.elts[index]]
        return None

    def _bindings(
        self, mod: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str
    ) -> list[ast.expr] | None:
        """What a local ``name`` is assigned, unpacking tuple literals and tuple-valued tables;
        None if any binding is of another kind (loop target, ``with``, augmented, ...)."""
        out: list[ast.expr] = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                for target in targets:
                    index: int | None = None
                    if isinstance(target, ast.Name) and target.id == name:
                        index = None
                    elif isinstance(target, ast.Tuple) and any(
                        isinstance(e, ast.Name) and e.id == name for e in target.elts
                    ):
                        index = next(
                            i for i, e in enumerate(target.elts)
                            if isinstance(e, ast.Name) and e.id == name
                        )  # fmt: skip
                    else:
                        continue
                    if value is None:
                        continue  # a bare annotation binds nothing
                    if index is not None and isinstance(value, ast.Subscript):
                        table = (
                            self._module_value(mod, value.value.id)
                            if isinstance(value.value, ast.Name)
                            else None
                        )
                        rows = self._members(table)
                        if rows is None:
                            return None
                        for row in rows:
                            elt = self._element(row, index)
                            if elt is None:
                                return None
                            out += elt
                        continue
                    elt = self._element(value, index)
                    if elt is None:
                        return None
                    out += elt
            elif isinstance(
                node,
                ast.For | ast.AsyncFor | ast.With | ast.AsyncWith | ast.AugAssign | ast.NamedExpr,
            ):
                bound = [
                    n for n in ast.walk(getattr(node, "target", None) or ast.Tuple(elts=[]))
                ] + [
                    n for item in getattr(node, "items", []) if item.optional_vars is not None
                    for n in ast.walk(item.optional_vars)
                ]  # fmt: skip
                if any(isinstance(n, ast.Name) and n.id == name for n in bound):
                    return None
        return out

    @staticmethod
    def _members(node: ast.expr | None) -> list[ast.expr] | None:
        if isinstance(node, ast.Dict):
            return list(node.values)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return list(node.elts)
        return None

    def _values(
        self, mod: _Module, node: ast.expr, scope: list[ast.AST], depth: int = 0
    ) -> list[str] | None:
        """The codes ``node`` can take; ``[]`` for an accepted pass-through; None if unknown."""
        if depth > 10:
            return None
        if isinstance(node, ast.Constant):
            if node.value is None:
                return []
            return [node.value] if isinstance(node.value, str) else None
        if isinstance(node, ast.IfExp):
            return self._union(mod, [node.body, node.orelse], scope, depth)
        if isinstance(node, ast.BoolOp):
            return self._union(mod, node.values, scope, depth)
        if isinstance(node, ast.Name):
            fn = next((s for s in reversed(scope) if isinstance(s, _Fn)), None)
            if fn is not None:
                a = fn.args
                if node.id in {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}:
                    # Its callers pass the code, and are checked, only if it is named like one.
                    return [] if _code_like(node.id) else None
                local = self._bindings(mod, fn, node.id)
                if local is None:
                    return [] if _code_like(node.id) else None
                if local:
                    return self._union(mod, local, scope, depth)
            value = self._module_value(mod, node.id)
            if isinstance(value, ast.Constant):
                return self._values(mod, value, scope, depth + 1)
            return None
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                src = self._imported_module(mod, node.value.id)
                if src is not None:
                    value = self._module_value(src, node.attr)
                    if isinstance(value, ast.Constant):
                        return self._values(src, value, [], depth + 1)
            # `exc.code`, `self.error_code`: an existing error's code, created (and found) elsewhere.
            return [] if _code_like(node.attr) else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            members = self._members(self._module_value(mod, node.value.id))
            return None if members is None else self._union(mod, members, [], depth)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and 1 <= len(node.args) <= 2
        ):
            # `{404: "not_found", ...}.get(status, "http_error")`, or TABLE.get(key, default).
            table = node.func.value
            if isinstance(table, ast.Name):
                resolved = self._module_value(mod, table.id)
                table = resolved if resolved is not None else table
            members = self._members(table) if isinstance(table, ast.Dict) else None
            if members is None:
                return None
            return self._union(mod, [*members, *node.args[1:]], scope, depth)
        return None

    def _union(
        self, mod: _Module, nodes: list[ast.expr], scope: list[ast.AST], depth: int
    ) -> list[str] | None:
        out: list[str] = []
        for n in nodes:
            v = self._values(mod, n, scope, depth + 1)
            if v is None:
                return None
            out += v
        return out

    def _record(self, mod: _Module, node: ast.expr, scope: list[ast.AST]) -> None:
        site = Site(mod.path, node.lineno, ast.unparse(node))
        values = self._values(mod, node, scope)
        if values is None:
            self.out.unresolved.append(site)
        for value in values or []:
            self.out.add(value, site)

    # ------------------------------------------------------------------------------- walking

    def _signatures_of(self, mod: _Module, call: ast.Call, scope: list[ast.AST]) -> list[list[str]]:
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
        ):
            # `super().__init__("code", ...)`: the signature of the enclosing class's base.
            cls = next((s for s in reversed(scope) if isinstance(s, ast.ClassDef)), None)
            for base in cls.bases if cls is not None else []:
                if sig := self._callee(mod, base):
                    return sig
            return []
        return self._callee(mod, func)

    def _call(self, mod: _Module, call: ast.Call, scope: list[ast.AST]) -> None:
        bound: dict[int, ast.expr] = {}
        for params in self._signatures_of(mod, call, scope):
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred):
                    break
                if i < len(params) and _code_like(params[i]):
                    bound[id(arg)] = arg
            for kw in call.keywords:
                if kw.arg is not None and _code_like(kw.arg) and kw.arg in params:
                    bound[id(kw.value)] = kw.value
        for arg in bound.values():
            self._record(mod, arg, scope)

    def _error_body(self, mod: _Module, node: ast.Dict, scope: list[ast.AST]) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and key.value == "error"
                and isinstance(value, ast.Dict)
            ):
                for k, v in zip(value.keys, value.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "code":
                        self._record(mod, v, scope)

    def _walk(self, mod: _Module, node: ast.AST, scope: list[ast.AST]) -> None:
        if isinstance(node, ast.Call):
            self._call(mod, node, scope)
        elif isinstance(node, ast.Dict):
            self._error_body(mod, node, scope)
        inner = [*scope, node] if isinstance(node, _Fn | ast.ClassDef) else scope
        for child in ast.iter_child_nodes(node):
            self._walk(mod, child, inner)

    def run(self) -> Extraction:
        for mod in self.modules:
            for name, value in mod.values.items():
                if (
                    _CONST_CODE_NAME.match(name)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    self.out.add(value.value, Site(mod.path, value.lineno, name))
            self._walk(mod, mod.tree, [])
        return self.out


def extract(root: Path = ROOT, dirs: tuple[str, ...] = SOURCE_DIRS) -> Extraction:
    modules = []
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            modules.append(_load(path, path.relative_to(root).as_posix()))
    return _Extractor(modules).run()


def documented(text: str) -> set[str]:
    """Codes written in backticks anywhere in the doc."""
    return set(re.findall(r"`([a-z][a-z0-9_]*)`", text))


# ----------------------------------------------------------------------------------- tests


@functools.cache
def _sources() -> Extraction:
    return extract()


def test_every_code_is_static() -> None:
    unresolved = _sources().unresolved
    assert not unresolved, (
        "error codes that cannot be read statically (use a string literal or a module-level "
        "constant; a helper's parameter must be named `code`):\n"
        + "\n".join(f"  {s}" for s in unresolved)
    )


def test_codes_are_snake_case() -> None:
    bad = {c: s for c, s in _sources().codes.items() if not CODE_SHAPE.match(c)}
    assert not bad, "codes must be stable snake_case:\n" + "\n".join(
        f"  {c!r} at {sites[0]}" for c, sites in bad.items()
    )


def test_every_code_is_documented() -> None:
    codes = _sources().codes
    assert DOC.is_file(), f"{DOC} is missing"
    missing = sorted(set(codes) - documented(DOC.read_text(encoding="utf-8")))
    assert not missing, f"error codes raised but not documented in {DOC.relative_to(ROOT)}:\n" + (
        "\n".join(f"  `{c}` (raised at {codes[c][0]})" for c in missing)
    )


def test_no_stale_codes_documented() -> None:
    # The first column of the doc's tables lists codes; each must still be raised somewhere.
    listed = set(re.findall(r"^\| `([a-z][a-z0-9_]*)` \|", DOC.read_text(encoding="utf-8"), re.M))
    stale = sorted(listed - set(_sources().codes))
    assert not stale, f"documented in {DOC.relative_to(ROOT)} but raised nowhere: {stale}"


def test_extraction_finds_known_codes() -> None:
    # Guards the extractor itself: each way a code is written today must be seen.
    codes = _sources().codes
    for code in (
        "template_depth_exceeded",  # constant, via a dataclass's error_code field
        "template_unbalanced",
        "prompt_tokens_exceeded",  # literal in a helper that builds LimitExceeded
        "queue_full",  # Overloaded(...) literal
        "model_not_found",  # NotFound(...) literal
        "chat_template_not_allowed",  # CODE_* constant
        "out_of_memory",  # a GuardError subclass defined in scheduler_ref
        "guided_regex_unsafe",  # constant of another module, through a code= parameter
    ):
        assert code in codes, code


def _extract_snippet(tmp_path: Path, source: str) -> Extraction:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text('OTHER = "other_code"\n')
    (pkg / "mod.py").write_text(textwrap.dedent(source))
    return extract(tmp_path, ("pkg",))


def test_extractor_on_a_snippet(tmp_path: Path) -> None:
    out = _extract_snippet(
        tmp_path,
        """
        from dataclasses import dataclass
        from pkg.consts import OTHER
        from pkg import consts

        MINE = "mine_code"
        CODE_EXPORTED = "exported_code"
        TABLE = {"a": "from_table_a", "b": "from_table_b"}

        class GuardError(Exception):
            def __init__(self, code, message, *, status=None): ...

        class Limit(GuardError):
            pass

        @dataclass
        class Scan:
            depth: int
            error_code: str | None = None

        def fail(code, message):
            raise Limit(code, message)

        def f(kind, flag):
            fail("via_helper", "m")
            raise GuardError(MINE if flag else OTHER, "m", status=409)

        def g(exc, kind):
            Scan(1, "in_field")
            Limit(consts.OTHER, "m")
            Limit(exc.code, "again")  # passed on: not a new code
            Limit(TABLE[kind], "m")
            c = "local_code"
            Limit(c, "m")
            body = {"error": {"message": "m", "code": "in_body"}}
            Limit({1: "from_get"}.get(kind, "get_default"), "m")
            Limit(f"dyn_{kind}", "m")
            Limit(kind, "m")
        """,
    )
    assert set(out.codes) == {
        "mine_code", "exported_code", "other_code", "via_helper", "in_field", "from_table_a",
        "from_table_b", "local_code", "in_body", "from_get", "get_default",
    }  # fmt: skip
    assert sorted(s.expr for s in out.unresolved) == ["f'dyn_{kind}'", "kind"]


def test_documented_reads_backticked_codes() -> None:
    assert documented("| `a_b` | 400 | `x` `Not_this` |") == {"a_b", "x"}


def _iter_codes() -> Iterator[str]:  # pragma: no cover - a helper for writing the doc
    for code, sites in sorted(_sources().codes.items()):
        yield f"{code}: {', '.join(map(str, sites))}"


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(_iter_codes()))
    for site in _sources().unresolved:
        print("UNRESOLVED", site)
