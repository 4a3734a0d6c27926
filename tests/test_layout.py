"""The project's layout stays navigable: no two public types of its packages share a name.

Two classes with one name in different packages (``Outcome`` in ``fuzz.oracle`` and in
``guard.isolation``, ``Scheduler`` in ``scheduler_ref`` and in ``fuzz.live``) make imports,
grep and stack traces ambiguous. Read statically (AST): every module-level class and type alias
(``X = Literal[...]``, ``X = A | B``, ``X = Callable[...]``, ``X: TypeAlias = ...``,
``X = NewType(...)``; Python 3.11 has no ``type`` statement) of the packages below. Names starting with ``_`` are
private to their module and not counted; the tests' own helpers are not counted either.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from tests._support import REPO_ROOT

PACKAGES = ("guard", "fuzz", "scheduler_ref", "payloads", "loadtests", "schedguard", "bench")
SCRIPTS = ("scripts",)

# Names that may stand in more than one place, each with the reason it stays for now.
ALLOWED: dict[str, str] = {}


def _sources() -> Iterator[Path]:
    for top in (*PACKAGES, *SCRIPTS):
        yield from sorted((REPO_ROOT / top).rglob("*.py"))


def _is_type_expr(node: ast.expr) -> bool:
    """A value that is a type: a subscripted generic, a union of types, or ``NewType(...)``."""
    if isinstance(node, ast.Subscript):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return all(
            isinstance(side, ast.Name | ast.Attribute | ast.Subscript | ast.BinOp | ast.Constant)
            and (not isinstance(side, ast.BinOp) or _is_type_expr(side))
            and (not isinstance(side, ast.Constant) or side.value is None)
            for side in (node.left, node.right)
        )
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name == "NewType"
    return False


def _is_type_name(name: str) -> bool:
    """CapWords: not private, not a CONSTANT nor a one-letter TypeVar."""
    return name[:1].isupper() and any(c.islower() for c in name)


def public_types(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """``(name, line)`` of each public module-level class and type alias of ``tree``."""
    for node in tree.body:
        name: str | None = None
        if isinstance(node, ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if annotation.endswith("TypeAlias") or (
                node.value is not None and _is_type_expr(node.value)
            ):
                name = node.target.id
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _is_type_expr(node.value)
        ):
            name = node.targets[0].id
        if name is not None and _is_type_name(name):
            yield name, node.lineno


def type_names() -> dict[str, list[str]]:
    """Every public type name of the packages -> where it is defined (``path:line``)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in _sources():
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for name, line in public_types(tree):
            found[name].append(f"{path.relative_to(REPO_ROOT)}:{line}")
    return found


def test_no_two_public_types_share_a_name() -> None:
    clashes = {
        name: places
        for name, places in type_names().items()
        if len(places) > 1 and name not in ALLOWED
    }
    assert not clashes, "rename each to say what it is:\n" + "\n".join(
        f"  {name}: {', '.join(places)}" for name, places in sorted(clashes.items())
    )


def test_allowed_clashes_still_clash() -> None:
    """An allowed name that no longer clashes leaves the list."""
    names = type_names()
    stale = [name for name in ALLOWED if len(names.get(name, ())) < 2]
    assert not stale, f"no longer defined twice, remove from ALLOWED: {stale}"


def test_the_reading_sees_classes_and_aliases() -> None:
    source = (
        "class Alpha: ...\n"
        "class _Private: ...\n"
        "Beta = Literal['x', 'y']\n"
        "Gamma = Delta | None\n"
        "Epsilon: TypeAlias = int\n"
        "Zeta = NewType('Zeta', int)\n"
        "MiB = 1 << 20\n"
        "LIMIT = 3\n"
        "T = TypeVar('T')\n"
        "Other = Alpha\n"
        "def f() -> None:\n"
        "    class Inner: ...\n"
    )
    names = [name for name, _ in public_types(ast.parse(source))]
    assert names == ["Alpha", "Beta", "Gamma", "Epsilon", "Zeta"]
