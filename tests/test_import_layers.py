"""The package's import graph, read from the source: no circles, and no layer imports one above it.

Every import statement counts, including those inside functions (a lazy import is still a
dependency). Layers, top down: kafkalog_ds -> python_datasource -> storage; storage never imports
Spark. Inside storage the subpackages (records, objects, cleaner, staging, export) depend on each other
in one direction only, and the export (storage/export) is the engine's top: only the command line uses it.
"""

from __future__ import annotations

import ast
import pathlib

from tests.helpers import REPO

ROOT = pathlib.Path(REPO).resolve()
PACKAGES = ("storage", "python_datasource", "kafkalog_ds")
LAYERS = {"storage": 0, "python_datasource": 1, "kafkalog_ds": 2}


def _modules(root: pathlib.Path = ROOT) -> dict[str, tuple[pathlib.Path, bool]]:
    out = {}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _imported_names(module: str, is_pkg: bool, node: ast.AST) -> list[str]:
    """Dotted names an import statement may refer to (a module, or a name inside one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def import_graph(root: pathlib.Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between the project's modules, every top-level package each module imports)."""
    mods = _modules(root)
    edges: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        deps, ext = set(), set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_names(mod, is_pkg, node):
                ext.add(name.split(".")[0])
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):  # a parent __init__ is implicit
                    deps.add(name)
        edges[mod], external[mod] = deps, ext
    return edges, external


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


def _subpackage(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if parts[0] == "storage" and len(parts) > 2 else None


def test_no_import_circles():
    edges, _ = import_graph()
    cycles = find_cycles(edges)
    assert not cycles, "import circles: " + "; ".join(
        " <-> ".join(c) + f" ({', '.join(f'{a} imports {sorted(edges[a] & set(c))}' for a in c)})" for c in cycles
    )


def test_no_module_imports_a_layer_above_it():
    edges, external = import_graph()
    bad = []
    for mod, deps in edges.items():
        layer = LAYERS[mod.split(".")[0]]
        bad += [f"{mod} imports {d}" for d in sorted(deps) if LAYERS[d.split(".")[0]] > layer]
        if mod.startswith("storage") and "pyspark" in external[mod]:
            bad.append(f"{mod} imports pyspark")
    assert not bad, "layer violations: " + "; ".join(bad)


def test_storage_subpackages_depend_one_way():
    edges, _ = import_graph()
    sub: dict[str, set[str]] = {}
    for mod, deps in edges.items():
        a = _subpackage(mod)
        if a is not None:
            sub.setdefault(a, set()).update(b for d in deps if (b := _subpackage(d)) not in (None, a))
    for a in list(sub.values()):
        for b in a:
            sub.setdefault(b, set())
    assert not find_cycles(sub), f"storage subpackages import each other: {sub}"


def test_the_export_is_the_engines_top():
    """storage/export writes a broker's files from the engine's logs; nothing else in storage depends on it."""
    edges, _ = import_graph()
    export = lambda m: m == "storage.export" or m.startswith("storage.export.")  # noqa: E731
    bad = [
        f"{mod} imports {d}"
        for mod, deps in edges.items()
        if mod.split(".")[0] == "storage" and not export(mod)
        for d in sorted(deps)
        if export(d)
    ]
    assert not bad, bad


def test_the_checks_see_a_circle(tmp_path):
    """The graph reader itself: a planted lazy circle and an upward import are found."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "storage" / "a.py").write_text("from .b import x\n")
    (tmp_path / "storage" / "b.py").write_text("def f():\n    from . import a\n    import kafkalog_ds.cli\n")
    (tmp_path / "kafkalog_ds" / "cli.py").write_text("")
    edges, _ = import_graph(tmp_path)
    assert find_cycles(edges) == [["storage.a", "storage.b"]]
    assert "kafkalog_ds.cli" in edges["storage.b"]


def test_storage_keeps_at_most_20_top_level_modules():
    """A family of three or more modules is a package; the top level stays readable at a glance."""
    top = sorted(p.name for p in (ROOT / "storage").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 20, top


def _top_level_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_benchmarks_and_tests_import_nothing_from_each_other():
    """What both need lives in tools/; a benchmark run must not depend on the test suite's layout."""
    for path in (ROOT / "benchmarks").rglob("*.py"):
        assert "tests" not in _top_level_imports(path), path
    for path in (ROOT / "tests").rglob("*.py"):
        assert "benchmarks" not in _top_level_imports(path), path


def test_spark_lookup_of_the_data_source_imports_nothing_heavy_of_ours():
    """Spark's lookup of data sources by name imports `pyspark_kafkalog` in a Python process of its own, once
    per JVM, before any query: that import must not pull in numpy, pyarrow or the log engine (docs/spark.md,
    "Finding the data source")."""
    import subprocess
    import sys

    code = (
        "import sys, pyspark_kafkalog\n"
        "heavy = ('numpy', 'pyarrow', 'numba', 'fsspec', 'storage.log', 'storage.records',\n"
        "         'python_datasource.options')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_drivers_commit_process_loads_no_numba_and_no_encoder(tmp_path):
    """Spark runs a stream writer's commit() in a Python process of its own on the driver: importing the writer
    module and running a transactional commit (the stamp's CRC update, the producer state, the markers) must
    not load numba or the encoder, which would cost its first commit a few hundred ms (docs/spark.md), nor
    fsspec, which a log on local disk never needs (0.1 s). The staging happens in another process, as in a
    task."""
    import subprocess
    import sys

    stage = (
        "import pickle, sys, pyarrow as pa\n"
        "from storage.log_manager import LogManager\n"
        "from storage.staging.record_stager import RecordStager\n"
        "lm = LogManager(sys.argv[1])\n"
        "lm.get_or_create_topic('t', 2)\n"
        "staged = []\n"
        "for task in range(2):\n"
        "    st = RecordStager(lm, 7, topic='t', compression=0, task_index=task)\n"
        "    st.add(pa.table({'key': [b'k%d' % i for i in range(50)], 'value': [b'v'] * 50}))\n"
        "    staged.append(st.finish())\n"
        "open(sys.argv[2], 'wb').write(pickle.dumps(staged))\n"
    )
    commit = (
        "import pickle, sys, python_datasource.writer\n"
        "from storage.log_manager import LogManager\n"
        "from storage.staging.staged_commit import commit_staged\n"
        "r = commit_staged(LogManager(sys.argv[1]), 7, 0, pickle.loads(open(sys.argv[2], 'rb').read()), "
        "transactional=True)\n"
        "assert r.records == 100, r\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'fsspec') or m.startswith("
        "('storage.staging.record_stager', 'storage.records.builder', 'storage.records._record_kernels'))))"
    )
    root, msgs = str(tmp_path / "root"), str(tmp_path / "staged.pkl")
    subprocess.run([sys.executable, "-c", stage, root, msgs], cwd=REPO, check=True)
    out = subprocess.run([sys.executable, "-c", commit, root, msgs], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_install_shows_spark_the_data_source_module(tmp_path):
    """Spark's data source lookup lists `pyspark_*` modules with pkgutil.iter_modules in a Python worker: the
    installed package (editable ones included: pyproject's package-dir) must show it from any directory."""
    import subprocess
    import sys

    code = "import pkgutil; print(sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "pyspark_kafkalog" in out.stdout, out.stdout
