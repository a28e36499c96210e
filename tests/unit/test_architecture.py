"""The import graph, read from the source (ast, nothing imported): no import circle, and
arrows point one way — the online path (cache_core/, udfs/) never imports infra/, jobs/ or
dashboard/; the Flink job and the dashboard never import the launchers (infra/) or each
other; nothing imports bench/; and no module imports a dashboard page (pages use the
control plane, never the reverse)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("cache_core", "udfs", "jobs", "dashboard", "infra", "bench")
LOWER = ("cache_core", "udfs")
UPPER = ("infra", "jobs", "dashboard")
NEVER_IMPORTS = {"cache_core": {"infra", "jobs", "dashboard", "bench"}, "udfs": {"infra", "jobs", "dashboard", "bench"},
                 "jobs": {"infra", "dashboard", "bench"}, "dashboard": {"infra", "jobs", "bench"},
                 "infra": {"bench"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _run_time_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (imports that never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_run_time_nodes(child)])
            continue
        yield node
        yield from _run_time_nodes(node)


def _imports(name: str, path: Path, known: set[str], type_checking: bool = False) -> set[str]:
    """The project modules ``name`` imports when it runs (at the top or in a function); with
    ``type_checking``, also those it imports for annotations only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if type_checking else _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from a import b`` names module a.b when there is one, else something in a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules), type_checking) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _top(module: str) -> str:
    return module.split(".")[0]


def _is_page(module: str) -> bool:
    return module in ("dashboard.app", "dashboard.Home") or module.startswith("dashboard.pages")


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_no_circles_through_annotations_either():
    # an import under TYPE_CHECKING never runs, but a reader still has to hold both modules in mind
    assert _cycles(_graph(type_checking=True)) == []


def test_the_online_path_imports_no_launcher_job_or_dashboard():
    upward = sorted((module, target) for module, targets in _graph().items() if _top(module) in LOWER
                    for target in targets if _top(target) in UPPER)
    assert upward == []


def test_layers_import_only_downward():
    wrong = sorted((module, target) for module, targets in _graph().items()
                   for target in targets if _top(target) in NEVER_IMPORTS.get(_top(module), ()))
    assert wrong == []


def test_no_module_imports_a_dashboard_page():
    into_pages = sorted((module, target) for module, targets in _graph().items() if not _is_page(module)
                        for target in targets if _is_page(target))
    assert into_pages == []


def test_the_checks_see_a_circle_and_an_upward_arrow():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph()
    assert "cache_core.decision.rule" in graph["cache_core.cache"]
    assert "cache_core.settings" in graph["cache_core.chclient"]
    assert "cache_core.experiments" not in graph["cache_core.lifetime"]  # for type checking only
    assert "cache_core.experiments" in _graph(type_checking=True)["cache_core.lifetime"]
