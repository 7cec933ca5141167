"""The package's shape: no import cycles between its modules, counting every import: those inside
functions (a lazy import that closes a cycle is still a cycle) and those under `if TYPE_CHECKING:`
(a cycle of types is a tie all the same, hidden from the import system only)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "proxy"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("proxy"):
            found.add(node.module)  # type: ignore[arg-type]
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("proxy"))
    return found


def test_no_import_cycles():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in top_level_imports(path, name) if m in modules and m != name} for name, path in modules.items()}
    # A module importing its own package (`from . import sibling`) is how packages work, not a
    # cycle: the package is imported before any of its modules. A package's __init__ importing its
    # modules is an import like any other (what imports the package runs them).
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def imports_aiohttp(path: Path) -> bool:
    """Whether the module imports aiohttp anywhere in it (in functions too, `TYPE_CHECKING` too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.partition(".")[0] == "aiohttp" for name in names):
            return True
    return False


def test_no_http_server_below_the_handlers():
    """The exceptions, the identity of a request and the engine know no HTTP server: aiohttp is
    proxy/api's (and the upstreams'), so the engine never reaches it through errors or identity."""
    pure = [PACKAGE / "errors.py", PACKAGE / "identity.py", *sorted((PACKAGE / "engine").rglob("*.py"))]
    assert [str(p.relative_to(PACKAGE)) for p in pure if imports_aiohttp(p)] == []
    # What errors.py and identity.py import of the package knows none either (config, ...).
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    seen: set[str] = set()
    todo = ["proxy.errors", "proxy.identity"]
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo.extend(top_level_imports(modules[name], name))
    assert sorted(name for name in seen if imports_aiohttp(modules[name])) == []
