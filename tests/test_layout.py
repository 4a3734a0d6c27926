"""The project's layout stays navigable: no two public types of its packages share a name, and
the scripts outside the packages use the packages' faces.

The import contracts between and inside the packages (layers, independence, no cycles, private
modules kept private) are import-linter's (pyproject.toml, ``make lint``); what it cannot say is
read here.

Two classes with one name in different packages (``Outcome`` in ``fuzz.oracle`` and in
``guard.isolation``, ``Scheduler`` in ``scheduler_ref`` and in ``fuzz.live``) make imports,
grep and stack traces ambiguous. Read statically (AST): every module-level class and type alias
(``X = Literal[...]``, ``X = A | B``, ``X = Callable[...]``, ``X: TypeAlias = ...``,
``X = NewType(...)``; Python 3.11 has no ``type`` statement) of the packages below. Names starting with ``_`` are
private to their module and not counted; the tests' own helpers are not counted either.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from tests._support import REPO_ROOT

PACKAGES = ("guard", "fuzz", "scheduler_ref", "payloads", "loadtests", "schedguard", "bench")
# The packages whose _modules are private: import-linter's root packages (bench/'s own _modules
# are its scripts' helpers).
ROOT_PACKAGES: tuple[str, ...] = tuple(
    tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "root_packages"
    ]
)
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


# Scripts (bench/, scripts/) are no package, so import-linter does not read them: a private
# module of a package is reached from them only with a reason, which goes when the import does.
ALLOWED_PRIVATE: dict[str, str] = {}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(tree: ast.Module) -> Iterator[str]:
    """The private modules of the packages that ``tree`` imports (``pkg._mod``, ``pkg.sub._mod``,
    ``from pkg import _mod``)."""
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            modules += [f"{node.module}.{a.name}" for a in node.names if _is_private(a.name)]
        for module in modules:
            parts = module.split(".")
            if parts[0] in ROOT_PACKAGES and any(_is_private(part) for part in parts[1:]):
                yield module


def script_private_imports() -> set[str]:
    found = set()
    for top in ("bench", *SCRIPTS):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_bytes(), filename=str(path))
            for module in private_imports(tree):
                found.add(f"{path.relative_to(REPO_ROOT)} -> {module}")
    return found


def test_scripts_import_no_private_module_of_a_package() -> None:
    reached = sorted(script_private_imports() - set(ALLOWED_PRIVATE))
    assert not reached, "import it from the package's face (its __init__):\n" + "\n".join(
        f"  {line}" for line in reached
    )


def test_allowed_private_imports_are_still_made() -> None:
    """An allowed private import that is gone leaves the list."""
    stale = sorted(set(ALLOWED_PRIVATE) - script_private_imports())
    assert not stale, f"no longer imported, remove from ALLOWED_PRIVATE: {stale}"


def test_the_reading_finds_private_modules_of_the_packages() -> None:
    source = (
        "import guard.http._client\n"
        "from guard.tokens._counter import get_counter\n"
        "from fuzz.targets import _vocab, Budgets\n"
        "from guard.tokens import get_counter\n"
        "from _mock_upstream import serve\n"
        "from guard import __version__\n"
        "def f():\n"
        "    from schedguard._serve import serve\n"
    )
    assert sorted(private_imports(ast.parse(source))) == [
        "fuzz.targets._vocab",
        "guard.http._client",
        "guard.tokens._counter",
        "schedguard._serve",
    ]


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
