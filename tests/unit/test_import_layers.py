"""The layers import one way (docs/architecture.md, "Import rules"): the engine knows no Django, the domain no HTTP.

The first test imports every module of ``inference`` in a fresh interpreter and looks for Django
in ``sys.modules``.  The others read every module's imports from its source (``ast``), those inside
functions included, so a lazy import cannot hide an edge: between the apps, and between the modules
of each app, where no module may import itself through a circle of others.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What each app may import, besides itself, the standard library and third-party packages.
ALLOWED = {
    "inference": set(),
    "keys": set(),
    "audit": {"keys"},
    "api": {"audit", "inference", "keys"},
    "dashboard": {"inference", "keys"},
    "accounts": {"dashboard", "keys"},
    "organization": {"api", "audit", "keys"},
    "completions_site": {"accounts", "api", "audit", "dashboard", "inference", "keys", "organization"},
}


def imported_apps(module: Path) -> set[str]:
    """The apps that ``module`` imports (absolute imports only; relative ones stay in its app)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(), filename=str(module))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & ALLOWED.keys()


def app_imports(app: str) -> dict[str, set[str]]:
    """``{module path: other apps it imports}`` for every module of ``app`` that imports one."""
    found = {}
    for module in sorted((ROOT / app).rglob("*.py")):
        others = imported_apps(module) - {app}
        if others:
            found[str(module.relative_to(ROOT))] = others
    return found


def app_graph() -> dict[str, set[str]]:
    """``{app: apps it imports}`` over the whole project."""
    return {app: set().union(*app_imports(app).values()) for app in ALLOWED}


def test_inference_imports_no_django():
    script = (
        "import importlib, pkgutil, sys, inference\n"
        "for info in pkgutil.walk_packages(inference.__path__, 'inference.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=600
    )

    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("app", ["keys", "inference"])
def test_nothing_under_the_domain_or_the_engine_imports_api(app):
    importers = {module: others for module, others in app_imports(app).items() if "api" in others}

    assert importers == {}


@pytest.mark.parametrize("app", sorted(ALLOWED))
def test_each_app_imports_only_what_the_layout_allows(app):
    forbidden = {module: others - ALLOWED[app] for module, others in app_imports(app).items()}

    assert {module: others for module, others in forbidden.items() if others} == {}


def test_no_import_cycle_between_the_apps():
    graph = app_graph()
    cycles = []

    def visit(app: str, path: list[str]) -> None:
        for imported in sorted(graph[app]):
            if imported in path:
                cycles.append([*path[path.index(imported) :], imported])
            else:
                visit(imported, [*path, imported])

    for app in sorted(graph):
        visit(app, [app])

    assert cycles == []


def test_the_walk_sees_lazy_imports(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from api.views import completions\n    import keys.models\n")

    assert imported_apps(module) == {"api", "keys"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports when it runs (inside functions too; not under
    ``if TYPE_CHECKING:``, which only annotations read)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    checking = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                # ``from package import submodule`` runs the submodule; the package is its parent,
                # imported before any of its modules, so it is no edge of its own.
                submodule = f"{target}.{alias.name}"
                found.update(name for name in [submodule if submodule in modules else target] if name in modules)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
    return found - {module_name(path)}


def import_circles(app: str) -> list[list[str]]:
    """Every circle of runtime imports among the modules of ``app``, each as the route that closes it
    (``["api.a", "api.b", "api.a"]``)."""
    paths = {module_name(path): path for path in (ROOT / app).rglob("*.py")}
    graph = {name: runtime_imports(path, set(paths)) for name, path in paths.items()}

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [[start]], set()
        while stack:
            route = stack.pop()
            for following in graph[route[-1]]:
                if following == goal:
                    return [*route, goal]
                if following not in seen:
                    seen.add(following)
                    stack.append([*route, following])
        return None

    return [route for name in sorted(graph) if (route := reaches(name, name))]


@pytest.mark.parametrize("app", sorted(ALLOWED))
def test_no_module_of_an_app_imports_itself_in_a_circle(app):
    circles = import_circles(app)

    assert not circles, "import circles: " + "; ".join(" -> ".join(route) for route in circles)


def test_the_circle_walk_finds_a_lazy_circle(tmp_path, monkeypatch):
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import x\n")
    (package / "b.py").write_text("def f():\n    from app.a import y\n")
    (package / "c.py").write_text("from . import a\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)

    assert import_circles("app") == [["app.a", "app.b", "app.a"], ["app.b", "app.a", "app.b"]]


def test_importing_a_submodule_from_its_package_is_no_edge_to_the_package(tmp_path, monkeypatch):
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("from .b import x\n")
    (package / "a.py").write_text("x = 1\n")
    (package / "b.py").write_text("from . import a\nx = a.x\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)

    assert runtime_imports(package / "b.py", {"app", "app.a", "app.b"}) == {"app.a"}
    assert import_circles("app") == []
