"""The layering of docs/architecture.md, enforced: which package may import which, no import cycle
between modules, and a wheel holding no top-level package but `memloop`."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

import memloop

ROOT = Path(memloop.__file__).parent

# layer -> the layers it may import (besides itself); docs/architecture.md draws the same arrows
ALLOWED = {
    "core": set(),
    "llm": {"core"},
    "environment": {"core", "llm"},
    "policies": {"core", "llm"},
    "feedback": {"core", "llm", "environment"},
    "runs": {"core", "llm", "environment", "policies", "feedback"},
    "results": {"core", "llm", "environment", "policies", "feedback", "runs"},
    "optimize": {"core", "llm", "environment", "policies", "feedback", "runs", "results"},
    "testing": {"core", "llm", "environment", "policies", "runs", "results", "optimize"},
    "experiments": {
        "core",
        "llm",
        "environment",
        "policies",
        "feedback",
        "runs",
        "results",
        "optimize",
    },
    "(root)": {"experiments"},
}


def module_name(path: Path) -> str:
    parts = ("memloop",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> memloop modules it imports (anywhere in the file, also inside functions).

    `from package import name` counts as importing the module `package.name` when that is a
    module, else the package itself.
    """
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            for target in targets:
                if target.startswith("memloop.") and target in modules and target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else "(root)"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_package_is_a_known_layer():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ALLOWED) - {"(root)"}


def test_layers_import_one_way():
    graph = import_graph()
    assert len(graph) > 60  # the walk saw the package
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if layer(t) != layer(m) and layer(t) not in ALLOWED[layer(m)]
    )
    assert bad == []


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(defaultdict(set, graph)) == [["a", "b", "c"]]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_reachable_follows_every_arrow():
    graph = defaultdict(set, {"a": {"b"}, "b": {"c"}, "d": {"a"}})
    assert reachable(graph, "a") == {"b", "c"}


def test_eval_policy_check_and_import_never_load_the_optimizer():
    """They load a policy and log a run through memloop.runs, never through memloop.optimize."""
    graph = import_graph()
    for command in ("eval_cmd", "policy_cmd", "import_cmd"):
        module = f"memloop.experiments.commands.{command}"
        assert module in graph
        reached = reachable(graph, module)
        assert "memloop.runs.inputs" in reached or "memloop.runs.spec" in reached, command
        assert sorted(m for m in reached if layer(m) == "optimize") == [], command


GRAPHED = ("optimize", "results", "runs")  # the layers whose module graphs the page draws


def documented_graph() -> dict[str, set[str]]:
    """The import graphs block of docs/architecture.md, as {module: modules of its layer}.

    A line is `layer.module -> a, b.c`: the targets are named within the module's layer
    (`optimize.searches.gepa -> context, searches.base` for memloop.optimize.context and
    memloop.optimize.searches.base).
    """
    text = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("Import graphs of `memloop.optimize`", 1)[1].split("```", 2)[1]
    out = {}
    for line in block.strip().splitlines():
        module, targets = (part.strip() for part in line.split("->"))
        package = module.split(".")[0]
        names = [] if targets == "(none)" else [t.strip() for t in targets.split(",")]
        out[f"memloop.{module}"] = {f"memloop.{package}.{n}" for n in names}
    return out


def test_the_documented_import_graphs_are_the_code():
    graph = import_graph()
    code = {
        m: {t for t in targets if layer(t) == layer(m)}
        for m, targets in graph.items()
        if layer(m) in GRAPHED and m.count(".") >= 2
    }
    assert documented_graph() == code


def test_no_test_module_imports_another():
    """Shared helpers live in memloop.testing and shared fixtures in conftest.py (issue 43): a
    test file that imports another one breaks when the files move, and runs its tests twice."""
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0].startswith(("test_", "conftest"))
            ]
    assert found == []


def test_memloop_names_no_moved_module():
    """The old paths of moved modules are for plug-ins and old scripts (memloop.core.moved); the
    package itself imports, and names in its targets, only the new ones."""
    import memloop.optimize  # noqa: F401  (makes its aliases)
    from memloop.core.moved import moved

    old = moved()
    assert len(old) == 11
    homes = {ROOT / "core" / "moved.py", ROOT / "optimize" / "__init__.py"}
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(ROOT.rglob("*.py"))
        if path not in homes
        for name in old
        if re.search(re.escape(name) + r"\b", path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_a_moved_module_is_the_new_module_under_its_old_name():
    import importlib

    from memloop.core import plugins
    from memloop.core.moved import moved

    for old, new in moved().items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    cls = plugins.import_target("memloop.optimize.playbook:PlaybookEvolver")
    assert cls.__module__ == "memloop.optimize.evolvers.playbook"
    from memloop.optimize.cycles import CycleRecord  # what a plug-in search imported
    from memloop.runs.cycles import CycleRecord as Same

    assert CycleRecord is Same


TRACKER = {ROOT / "runs" / "tracker.py", ROOT / "runs" / "tracker_store.py"}


def mlflow_uses(tree: ast.AST) -> list[str]:
    """MLflow imports, and calls of a method on an MLflow client (a name `mlc`, `client`, or
    `tracker.client(...)` itself), in one module's tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "mlflow"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mlflow":
            found.append(f"from {node.module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("mlc", "mlflow_client"):
                found.append(f"{owner.id}.{node.func.attr}(...)")
            elif isinstance(owner, ast.Call) and ast.unparse(owner.func) == "tracker.client":
                found.append(f"tracker.client(...).{node.func.attr}(...)")
    return found


def test_only_the_tracker_talks_to_mlflow():
    found = {
        str(path.relative_to(ROOT)): uses
        for path in sorted(ROOT.rglob("*.py"))
        if path not in TRACKER
        and (uses := mlflow_uses(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
    # the check sees what it looks for
    assert mlflow_uses(ast.parse("import mlflow\nmlc.get_run(r)")) == ["mlflow", "mlc.get_run(...)"]
    tracker = "\n".join(p.read_text(encoding="utf-8") for p in sorted(TRACKER))
    assert len(mlflow_uses(ast.parse(tracker))) > 20


RECORDER = ROOT / "runs" / "recorder.py"
RUN_LIFETIME = ("log_run", "open_run", "finish_run", "create_run", "set_terminated")


def run_lifetime_calls(tree: ast.AST) -> list[str]:
    """Calls that open or end an MLflow run (`tracker.log_run(...)`, `mlc.set_terminated(...)`)."""
    return [
        ast.unparse(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in RUN_LIFETIME
    ]


def test_only_the_recorder_opens_and_finishes_runs():
    """runs/recorder.py is the one way a run reaches MLflow: no other module opens or ends one."""
    found = {
        str(path.relative_to(ROOT)): calls
        for path in sorted(ROOT.rglob("*.py"))
        if path not in TRACKER | {RECORDER}
        and (calls := run_lifetime_calls(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
    # the check sees what it looks for, and the recorder is where the runs are opened and ended
    assert run_lifetime_calls(ast.parse("tracker.finish_run(mlc, r)")) == ["tracker.finish_run"]
    assert sorted(run_lifetime_calls(ast.parse(RECORDER.read_text(encoding="utf-8")))) == [
        "tracker.finish_run",
        "tracker.finish_run",
        "tracker.log_run",
    ]


POLICY_CLASS = """
class Mine:
    name = "mine"

    def __init__(self, options, client, workdir):
        pass

    respond = answer = memory_view = lambda self, *a, **k: None
"""


def test_every_registry_follows_one_precedence_rule(tmp_path, monkeypatch):
    """Policies and optimizers: built-in > registered > entry point > `module:Class`; nothing
    takes a built-in's name (docs/architecture.md states the rule)."""
    from memloop.core.plugins import Registry
    from memloop.optimize import registry as optimizers
    from memloop.policies import registry as policies
    from memloop.testing.evolvers import EMPTY_SEARCH_MODULE

    assert isinstance(policies.REGISTRY, Registry) and isinstance(optimizers.REGISTRY, Registry)
    site = tmp_path / "site"
    for package, text in (("mypolicy", POLICY_CLASS), ("mysearch", EMPTY_SEARCH_MODULE)):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(text)
    dist = site / "mine-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mine\nVersion: 0.1\n")
    # each package also claims a built-in's name, and a name that will be registered
    (dist / "entry_points.txt").write_text(
        "[memloop.policies]\nawi = mypolicy:Mine\nshared = mypolicy:Mine\nonly = mypolicy:Mine\n"
        "[memloop.optimizers]\nepisode = mysearch:Mine\nshared = mysearch:Mine\n"
        "only = mysearch:Mine\n"
    )
    monkeypatch.syspath_prepend(str(site))
    import mypolicy  # type: ignore[import-not-found]
    import mysearch  # type: ignore[import-not-found]

    class Registered(mypolicy.Mine):
        pass

    class RegisteredSearch(mysearch.Mine):
        name = "registered"

    monkeypatch.setattr(policies.REGISTRY, "registered", {})
    monkeypatch.setattr(optimizers.REGISTRY, "registered", {})
    policies.register("shared", Registered)
    optimizers.register("shared", RegisteredSearch)
    for module, builtin, cls in (
        (policies, "awi", Registered),
        (optimizers, "episode", RegisteredSearch),
    ):
        reg = module.REGISTRY
        # 1. a built-in wins over an entry point of its name, and cannot be registered over
        assert reg.lookup(builtin) == module.BUILTIN[builtin]
        with pytest.raises(ValueError, match="a built-in's name"):
            module.register(builtin, cls)
        # 2. a registered class wins over an entry point of its name
        assert reg.lookup("shared") is cls
        # 3. an entry point, then 4. a target
        assert reg.lookup("only") in ("mypolicy:Mine", "mysearch:Mine")
        assert reg.lookup("pkg.mod:Cls") == "pkg.mod:Cls" and reg.lookup("nothing") is None
        assert reg.names().count(builtin) == 1 and reg.names()[-2:] == ["shared", "only"]
    # and what the YAML names is built from it
    from memloop.policies.config import parse_policy_config

    assert optimizers.build_search("shared").name == "registered"
    assert optimizers.build_search("episode").name == "episode"
    config = parse_policy_config({"type": "shared"}, "test")
    assert policies.plugin_class(config) is Registered


def test_shared_command_options_are_defined_once():
    """--cache, --tracking-uri, --no-progress, --cycles and the "at least 1" check live in
    experiments/commands/options.py; a command adds them from there."""
    commands = ROOT / "experiments" / "commands"
    shared = ('"--cache"', '"--tracking-uri"', '"--no-progress"', '"--cycles"', "at least 1")
    found = {
        path.name: [s for s in shared if s in path.read_text(encoding="utf-8")]
        for path in sorted(commands.glob("*.py"))
        if path.name != "options.py"
    }
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert all(s in (commands / "options.py").read_text(encoding="utf-8") for s in shared)


def test_the_tests_mirror_the_packages():
    """A test file lives in tests/<layer>/ for the layer it tests, or at the top when it checks
    the whole house (this file, the docs); basenames stay unique (pytest imports them by name)."""
    tests = Path(__file__).resolve().parent
    files = sorted(tests.rglob("test_*.py"))
    folders = {p.parent.name for p in files if p.parent != tests}
    assert folders <= set(ALLOWED) - {"(root)", "testing"}
    assert len(folders) >= 8
    assert sorted(p.name for p in files if p.parent == tests) == [
        "test_architecture.py",
        "test_docs_commands.py",
        "test_docs_data.py",
    ]
    names = [p.name for p in files]
    assert len(names) == len(set(names))
