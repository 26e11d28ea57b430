"""The shape of the code itself (issue 23): modules use each other only through public names,
and their imports form no cycle but the commented lazy ones that display programs and read
values. Read from the source with `ast`, as a reviewer would."""
import ast
import pathlib

import pytest

import progdesc as pd

ROOT = pathlib.Path(pd.__file__).resolve().parent.parent
# Private names of the standard library's own modules that Python documents for use.
STDLIB_PRIVATE = {"sys._getframe", "os._exit"}
# The one module that may reach into JAX's internals (each use tested in test_jax_compat.py).
JAX_COMPAT = "progdesc.jax_compat"
# What a lazy import (inside a function) that closes an import cycle may reach: the
# convenience methods that display a program and that read a Variable's value.
LAZY_TARGETS = ("progdesc.display", "progdesc.schedule", "progdesc.recording.values")


def _modules():
    mods = {}
    for path in sorted(ROOT.glob("progdesc/**/*.py")) + sorted(ROOT.glob("lowering/**/*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = _modules()
TREES = {mod: ast.parse(path.read_text(encoding="utf-8")) for mod, path in MODULES.items()}


def _imported(mod, node):
    """The progdesc/lowering modules an import statement of `mod` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]
            parts = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES
                 or a.name.endswith("_pb2") else base for a in node.names]
    found = set()
    for name in names:
        if name.rpartition(".")[2].endswith("_pb2"):   # generated: imports none of ours
            continue
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != mod:
            found.add(name)
    return found


def _imports(mod):
    """({module imported at import time}, [(module, line, node) imported inside a function])."""
    top, lazy = set(), []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _imported(mod, child):
                    if in_function:
                        lazy.append((target, child.lineno))
                    else:
                        top.add(target)
            walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    walk(TREES[mod], False)
    return top, lazy


IMPORTS = {mod: _imports(mod) for mod in MODULES}


def _reaches(start, goal):
    seen, todo = {start}, [start]
    while todo:
        mod = todo.pop()
        if mod == goal:
            return True
        for dep in IMPORTS[mod][0] - seen:
            seen.add(dep)
            todo.append(dep)
    return False


def test_module_level_imports_form_no_cycle():
    state = {}

    def visit(mod, stack):
        state[mod] = "open"
        for dep in sorted(IMPORTS[mod][0]):
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(
                stack[stack.index(dep):] + [mod, dep])
            if dep not in state:
                visit(dep, stack + [mod])
        state[mod] = "done"

    for mod in MODULES:
        if mod not in state:
            visit(mod, [])


def test_lazy_imports_that_close_a_cycle_only_display_or_read_values_and_say_so():
    lines = {mod: path.read_text(encoding="utf-8").splitlines() for mod, path in MODULES.items()}
    wrong = []
    for mod, (_, lazy) in IMPORTS.items():
        for target, line in lazy:
            if not _reaches(target, mod):
                continue
            text = lines[mod][line - 1]
            if not target.startswith(LAZY_TARGETS) or "lazy" not in text:
                wrong.append(f"{MODULES[mod].relative_to(ROOT)}:{line}: {text.strip()}")
    assert not wrong, "lazy imports closing a cycle:\n" + "\n".join(wrong)


def test_framework_loads_only_the_text_printer_of_display():
    assert {d for d in IMPORTS["progdesc.framework"][0]
            if d.startswith("progdesc.display")} <= {"progdesc.display.text"}


def _defined_here(tree):
    """Names a module defines itself: functions, classes, assigned names and attributes set
    on self/cls (its own private names may be used on any object of its classes)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Store):
            names.update(e.attr for e in node.elts if isinstance(e, ast.Attribute))
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    for node in ast.walk(tree):   # __slots__ = ("name", "_value", ...)
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant))
    return names


def _private(name):
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_module_uses_another_modules_private_names(mod):
    tree, own = TREES[mod], _defined_here(TREES[mod])
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            internal = any(_private(part) for part in (node.module or "").split("."))
            wrong += [f"line {node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if (_private(a.name) or internal) and mod != JAX_COMPAT]
        elif isinstance(node, ast.Import):
            wrong += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if any(_private(part) for part in a.name.split(".")) and mod != JAX_COMPAT]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if node.attr not in own and text not in STDLIB_PRIVATE and mod != JAX_COMPAT:
                wrong.append(f"line {node.lineno}: {text}")
    assert not wrong, f"{MODULES[mod].relative_to(ROOT)} uses private names:\n" + "\n".join(wrong)
