"""No import circles in our own packages (build/pipeline and entrypoint).

The graph counts every import, at module level, inside functions and through
importlib.import_module with a literal name, since a lazy import that closes a
loop is still a loop a reader has to untangle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"pipeline": REPO / "build" / "pipeline", "entrypoint": REPO / "entrypoint"}


def _module_name(package: str, path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [package, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str, root: Path) -> dict[str, set[str]]:
    modules = {_module_name(package, path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                    module = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            elif (  # importlib.import_module("pkg.mod"): an import all the same
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets = [node.args[0].value]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package: str) -> None:
    cycle = find_cycle(import_graph(package, PACKAGES[package]))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from . import b\n")
    (root / "b.py").write_text("def f():\n    from demo.a import x\n")
    assert find_cycle(import_graph("demo", root)) == ["demo.a", "demo.b", "demo.a"]


def test_every_test_folder_is_a_package() -> None:
    """Folders of test modules carry __init__.py, so pytest names their modules by
    package (tests.gguf.conftest, not a bare conftest that collides with another)."""
    tests = Path(__file__).resolve().parent
    folders = {path.parent for path in tests.rglob("test_*.py")}
    missing = sorted(
        str(f.relative_to(tests)) for f in folders if not (f / "__init__.py").is_file()
    )
    assert not missing, f"no __init__.py in tests/{', tests/'.join(missing)}"


OUTSIDE_TESTS = ("bench", "build", "checks", "entrypoint", "fixtures", "patches")


def imports_of(path: Path) -> set[str]:
    """Top-level names a file imports (and `python -m NAME` strings it spells)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("tests.")
        ):
            names.add(node.value)
    return names


def test_nothing_outside_tests_imports_from_it() -> None:
    """Helpers that benches, checks or fixtures share live in fixtures/, so tests/ can be
    read, moved or left out without breaking them."""
    found = []
    for top in OUTSIDE_TESTS:
        for path in sorted((REPO / top).rglob("*.py")):
            bad = sorted(n for n in imports_of(path) if n == "tests" or n.startswith("tests."))
            found += [f"{path.relative_to(REPO)}: {name}" for name in bad]
    assert found == []


# entrypoint's wings, lowest first: a module imports from its own wing or a lower one.
# The package's front (cli, app, __main__) sits above them all.
ENTRYPOINT_WINGS = ("errors", "host", "argv", "watch", "start", "doctor")


def wing_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ENTRYPOINT_WINGS:
        return ENTRYPOINT_WINGS.index(parts[1])
    return len(ENTRYPOINT_WINGS)  # entrypoint, entrypoint.cli, .app, .__main__


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} ({ENTRYPOINT_WINGS[wing_of(source)]}) imports {target}"
        for source, targets in graph.items()
        for target in targets
        if wing_of(target) > wing_of(source)
    )


def test_entrypoint_is_in_wings() -> None:
    """Every module sits in a wing, or is the front (cli, app, __main__)."""
    root = PACKAGES["entrypoint"]
    loose = sorted(p.name for p in root.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "app.py", "cli.py", "errors.py"]
    wings = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert wings == sorted(ENTRYPOINT_WINGS[1:])


def test_entrypoint_wings_import_one_way() -> None:
    assert upward_imports(import_graph("entrypoint", PACKAGES["entrypoint"])) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    root = tmp_path / "entrypoint"
    for wing in ("host", "watch"):
        (root / wing).mkdir(parents=True)
        (root / wing / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "watch" / "probe.py").write_text("x = 1\n")
    (root / "host" / "gpus.py").write_text("def f():\n    from entrypoint.watch import probe\n")
    assert upward_imports(import_graph("entrypoint", root)) == [
        "entrypoint.host.gpus (host) imports entrypoint.watch",
        "entrypoint.host.gpus (host) imports entrypoint.watch.probe",
    ]
