"""The test suite's own shape: no test module imports another test module; what tests
share lives in helper modules (tests/helpers.py, tests/nginx.py, tests/api/metrics.py...),
so that each test module can be collected, and run on any xdist worker, by itself."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(TESTS.rglob("*.py"))


def imported(tree: ast.Module) -> set[str]:
    """Every module an import statement names, and ``package.name`` for each name a
    ``from package import name`` takes (which may be a module)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {
        str(path.relative_to(TESTS)): sorted(
            name
            for name in imported(ast.parse(path.read_text(), filename=str(path)))
            if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
        )
        for path in MODULES
    }
    assert {path: names for path, names in offenders.items() if names} == {}
