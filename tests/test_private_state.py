"""Objects change only through their own methods: no module assigns, deletes or mutates an underscored
attribute of an object other than `self` or `cls`, read from the source.

Caught: `x._a = ...`, `x._a += ...`, `x._a: T = ...`, `del x._a`, the same through chains
(`x._a[k] = ...`, `x._a.b = ...`, `del x._a[:n]`, tuple targets), and the mutating calls of lists, dicts
and sets on such an attribute (`x._a.append(...)`). Reading another object's private attribute is
not caught here.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("storage", "python_datasource", "kafkalog_ds")
OWN = {"self", "cls"}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "add", "discard"}


def _foreign_private(node: ast.AST) -> ast.Attribute | None:
    """The first `<obj>._name` in an attribute/subscript chain whose object is not self or cls."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in OWN):
                return node
        node = node.value
    return None


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        todo = [node.target]
    elif isinstance(node, ast.Delete):
        todo = list(node.targets)
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        todo = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        todo = [node.optional_vars]
    elif isinstance(node, ast.NamedExpr):
        todo = [node.target]
    else:
        return []
    out = []
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo += t.elts
        else:
            out.append(t)
    return out


def foreign_writes(source: str, filename: str = "<source>") -> list[str]:
    """`line: code` of every write to another object's underscored attribute in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        for target in _targets(node):
            if _foreign_private(target) is not None:
                found.append(f"{node.lineno}: {ast.unparse(target)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _foreign_private(node.func.value) is not None
        ):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_no_module_writes_another_objects_private_state():
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad += [f"{path.relative_to(ROOT)}:{w}" for w in foreign_writes(path.read_text(), str(path))]
    assert not bad, "private state written from outside its object (add a method to it): " + "; ".join(bad)


def test_the_check_sees_each_kind_of_write():
    """The reader itself: every form is caught, and self/cls, dunders and public attributes are not."""
    caught = [
        "log._segments = []",
        "log._n += 1",
        "log._x: int = 0",
        "del log._bases[:2]",
        "seg._index._cache[0] = 1",
        "a, log._b = 1, 2",
        "log._segments.append(seg)",
        "for log._i in range(3): pass",
    ]
    for code in caught:
        assert foreign_writes(code), code
    fine = ["self._segments = []", "cls._cache = {}", "log.size = 1", "obj.__dict__ = {}", "x = log._segments"]
    for code in fine:
        assert not foreign_writes(code), code
