"""Imports flow one way: down the floors (LAYERS), with no cycle between the product's modules, and no product
module imports a test or the lab; no module is named as a standard-library one; loopback is typed once, the
algorithm names in one module. Read
from the source (every import statement, wherever it sits in the module), so an import hidden inside a function
counts as much as one at the top."""

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("deployment", "operations", "serving_benchmark", "tuning")
ENTRY_POINTS = tuple(sorted(path.name for path in REPO.glob("*.py")))  # deploy.py, bench.py, pin.py, ...
# Above the product: the tools beside it, and the data pyinfra loads (the group data runs the site's over it).
ON_TOP = ("tools", "group_data", "inventory")
NOT_PRODUCT = ("tests", "lab", "speed", "tools")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_files() -> dict[str, Path]:
    """Every product module on the controller (host programs run on hosts, on their own)."""
    files = {module_name(path): path for top in PRODUCT for path in (REPO / top).rglob("*.py")
             if "host_scripts" not in path.parts}
    return {**files, **{Path(name).stem: REPO / name for name in ENTRY_POINTS}}


def controller_files() -> dict[str, Path]:
    """The product's modules, the host programs (the controller imports some: ownership's account mark, the
    engine's answers), and what sits on top of them: the tools, the group data and the inventories."""
    programs = {module_name(path): path for path in (REPO / "operations").glob("*/host_scripts/*.py")}
    on_top = {module_name(path): path for top in ON_TOP for path in (REPO / top).rglob("*.py")}
    return {**product_files(), **programs, **on_top}


def imported(path: Path, modules: set[str]) -> set[str]:
    """The modules `path` imports (and so the packages above them, whose __init__ runs first)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).strip(".")
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules}
    found = set()
    for name in names:
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return found


def graph() -> dict[str, set[str]]:
    files = controller_files()
    return {name: {m for m in imported(path, set(files)) if m in files and m != name} for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_product_and_its_imports():
    edges = graph()
    assert {"operations.basics.gathering", "operations.server.unit", "operations.gpu.facts", "deployment.hosts",
            "deploy"} <= set(edges)
    assert "operations.basics.gathering" in edges["operations.run.preflight"]
    assert "operations.server" in edges["operations.server.unit"]  # a submodule's package runs first


def test_no_import_cycle_in_the_product():
    assert cycles(graph()) == []


def test_the_basics_import_no_subject():
    for name, imports in graph().items():
        if name.startswith("operations.basics"):
            subjects = sorted(m for m in imports if m.startswith("operations.") and not m.startswith("operations.basics"))
            assert subjects == [], f"{name} imports {subjects}"


def test_no_product_module_imports_a_test_a_tool_or_the_lab():
    for name, path in product_files().items():
        foreign = sorted(m for m in imported(path, set()) if m.split(".")[0] in NOT_PRODUCT)
        assert foreign == [], f"{name} imports {foreign}"


def test_the_subjects_a_deployment_is_made_of_import_it_not():
    """deployment.hosts builds a deployment from the subjects' slices (deployment/<subject>/) and the knobs they
    are parsed with: none of them imports it back."""
    edges = graph()
    subjects = {m.split(".")[1] for m in edges["deployment.hosts"] if m.startswith("deployment.") and m.count(".") == 2}
    back = sorted(name for name, imports in edges.items()
                  if (name.split(".")[:2][-1] in subjects or name in ("deployment.knobs", "deployment.schema"))
                  and name.startswith("deployment.") and "deployment.hosts" in imports)
    assert {"gpu", "server", "weights", "nodes"} <= subjects and {"deployment.knobs", "deployment.schema"} <= \
        edges["deployment.hosts"] and back == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The product's floors, lowest first: a module imports its own floor and those below it, never one above.
LAYERS = (
    # The host programs: they run on hosts without the product (the controller imports a few of their names).
    tuple(sorted(module_name(path) for path in (REPO / "operations").glob("*/host_scripts"))),
    # The model of what to deploy (deployment/), no pyinfra in it. What every slice of it builds on: the
    # knobs, their parsers, addresses, the site directory; `deployment` itself (its __init__, a docstring) is
    # placed here by `layer`.
    ("deployment.knobs", "deployment.network", "deployment.site_directory", "deployment.schema"),
    # One host's subjects: each reads its own slice of the host's data.
    ("deployment.python", "deployment.nodes", "deployment.gpu", "deployment.server", "deployment.weights"),
    # A host's deployments, from every such subject's slice at once; the class files; the hosts' roles in the
    # fleet; the tuned files.
    ("deployment.hosts", "deployment.site_data", "deployment.roles", "deployment.tuned"),
    # Over the fleet: a gateway routes to other hosts' deployments.
    ("deployment.gateway",),
    # The facts and operations acting on that model. What every subject builds on: facts, files, units;
    # `operations` itself (its __init__, a docstring) is placed here by `layer`.
    ("operations.basics",),
    # One host's subjects.
    ("operations.python", "operations.nodes", "operations.gpu", "operations.server", "operations.weights"),
    # A run over every subject at once: preflight before any host changes, the table it ends with.
    ("operations.run",),
    # The subjects over the fleet: a gateway routes to other hosts' deployments, Prometheus scrapes them.
    ("operations.gateway", "operations.monitoring"),
    # The operator's tools beside the deploy.
    ("operations.status", "operations.uninstall", "operations.logs", "serving_benchmark"),
    # The tuner: the deployment's candidates, measured through the serving benchmark.
    ("tuning",),
    # The operator's commands, the tools beside them, and the data pyinfra loads.
    (*(Path(name).stem for name in ENTRY_POINTS), *ON_TOP),
)


# Where the packages' own __init__s sit: the model's (a docstring) on its lowest floor; operations' (a docstring
# and the bytecode setting, importing nothing of the product) with the host programs, which it holds: the
# controller's import of one (LOOPBACK) runs it first.
LOWEST = {"deployment": "deployment.knobs", "operations": "operations.basics.host_scripts"}


def layer(module: str) -> int | None:
    """The index in LAYERS of `module`'s package; None outside them."""
    if module in LOWEST:
        return layer(LOWEST[module])
    for index, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(f"{p}.") for p in packages):
            return index
    return None


def against_the_layers(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(name, other) for name, imports in edges.items() for other in imports
            if layer(name) is not None and layer(other) is not None and layer(other) > layer(name)}


def test_every_import_runs_down_the_layers():
    edges = graph()
    assert {"pin", "uninstall", "tools.gpu.classify", "group_data.all", "inventory.b200"} <= set(edges)
    assert "operations.basics.host_scripts.owned_sockets" in edges["deployment.network"]
    assert {name for name in edges if layer(name) is None} == set()  # every package placed
    assert against_the_layers(edges) == set()


def test_the_layer_check_sees_an_arrow_upwards():
    assert against_the_layers({"deployment.hosts": {"operations.gpu.smoke", "deployment.knobs"},
                               "operations.run.summary": {"deployment.gateway.config", "operations.basics"},
                               "deployment.gateway.membership": {"deployment.hosts"}}) == {
        ("deployment.hosts", "operations.gpu.smoke")}


def test_no_product_module_is_longer_than_450_lines():
    """Past 450 lines a module here has held several jobs each time (the gateway's workers, the bench's sweep)."""
    programs = [path for top in PRODUCT for path in (REPO / top).rglob("*.py")]
    entry_points = [REPO / name for name in ENTRY_POINTS]
    longer = {str(path.relative_to(REPO)): n for path in [*programs, *entry_points]
              if (n := len(path.read_text().splitlines())) > 450}
    assert longer == {}


def test_the_hub_client_is_imported_only_where_the_hub_is_asked():
    """Every product module imported, the hub's client is not: huggingface_hub and its HTTP stack (~380
    modules, 0.2-0.5 s of a run on the lab's controller) load in the calls that ask the hub, which
    uninstall.py, bench.py and a gateway's deploy never make."""
    modules = sorted(name for name in product_files() if name.split(".")[0] in PRODUCT)
    program = ("import importlib, sys\n"
               f"for name in {modules!r}:\n"
               "    importlib.import_module(name)\n"
               "print(sorted(m for m in ('huggingface_hub', 'httpx2') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True)
    assert len(modules) > 70 and run.stdout.split() == ["[]"], run.stdout


def shipped_python() -> list[Path]:
    """Every Python file the product ships: its modules, the host programs, the entry points, the tools, the
    group data and the inventories."""
    return sorted([*(path for top in (*PRODUCT, *ON_TOP) for path in (REPO / top).rglob("*.py")),
                   *(REPO / name for name in ENTRY_POINTS)])


def own_name(path: Path) -> str:
    return path.parent.name if path.name == "__init__.py" else path.stem


def test_no_module_is_named_as_a_standard_library_module():
    """A host program runs with its folder first on sys.path and is registered under its own name
    (host_programs._LOADER), an entry point runs from the checkout's root: there a module named `secrets` or
    `token` is what `import secrets` gets. Elsewhere the name still misleads its readers."""
    assert sorted(str(path.relative_to(REPO)) for path in shipped_python()
                  if own_name(path) in sys.stdlib_module_names) == []


def test_the_standard_library_check_sees_a_shadowing_name():
    assert [own_name(Path(p)) in sys.stdlib_module_names
            for p in ("operations/basics/secrets.py", "operations/site/__init__.py", "operations/basics/secret_files.py")
            ] == [True, True, False]


def test_loopback_is_typed_in_one_file_which_the_others_ask():
    """Typed in the host programs' module (owned_sockets.py): the hosts run those without the product, and the
    controller's deployment.network takes it from there; the group data asks network too. The templates
    render the values they are given."""
    from deployment import network
    from operations.basics.host_scripts import owned_sockets

    files = [*shipped_python(), *(REPO / "templates").rglob("*.j2")]
    assert [str(path.relative_to(REPO)) for path in files if "127.0.0.1" in path.read_text()] == [
        "operations/basics/host_scripts/owned_sockets.py"]
    assert network.LOOPBACK is owned_sockets.LOOPBACK


def defines_a_fact(path: Path) -> bool:
    return any(isinstance(node, ast.ClassDef) and any(getattr(base, "id", getattr(base, "attr", None)) == "FactBase"
                                                     for base in node.bases)
               for node in ast.walk(ast.parse(path.read_text())))


def test_the_gathering_imports_no_fact():
    """operations.basics.gathering gathers any subject's facts: what one of them needs (the file states' digest
    key on stdin) the fact hands in (`stdin`), and the gathering imports no module that defines a fact."""
    files = controller_files()
    facts = sorted(name for name in graph()["operations.basics.gathering"] if defines_a_fact(files[name]))
    assert defines_a_fact(files["operations.basics.file_states"]) and facts == []


# Every product source an algorithm's name could be typed in: the modules, their host programs (they run on
# hosts, with the engine's names where they read its answers) and every entry point.
ALGORITHM_READERS = (*PRODUCT, *ENTRY_POINTS)


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (prose and examples, not values the code uses)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def test_the_algorithm_names_are_typed_in_one_product_module():
    """No string the product's code uses names an algorithm (SGLang's name as a word, or the whole of the
    bench's mode of it), but in the table's module (deployment/server/speculative.py): the others ask it."""
    from deployment.server import speculative
    names = re.compile(r"\b(" + "|".join(speculative.ALGORITHMS) + r")\b")
    modes = set(speculative.modes())
    table = REPO / "deployment" / "server" / "speculative.py"
    sources = [path for root in ALGORITHM_READERS for path in ([REPO / root] if (REPO / root).is_file()
                                                                else sorted((REPO / root).rglob("*.py")))]
    written = []
    for source in sources:
        if source == table:
            continue
        tree = ast.parse(source.read_text())
        prose = docstrings(tree)
        written += [f"{source.relative_to(REPO)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                    and (names.search(node.value) or node.value in modes)]
    assert len(sources) > 100 and written == []
