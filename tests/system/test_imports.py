"""Every module of keysvc imports on its own, in a fresh interpreter, and in any
order: no import cycle waits for a lazy import to break it."""

import pkgutil
import subprocess
import sys

import pytest

import keysvc

# keysvc.__main__ is left out: importing it runs the command.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(keysvc.__path__, prefix="keysvc.")
    if info.name != "keysvc.__main__"
)


def _imports(*modules: str) -> None:
    code = "".join(f"import {module}\n" for module in modules)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_package_has_its_data_layer() -> None:
    assert "keysvc.db.sqlite.store" in MODULES and "keysvc.http.views.keys" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone(module: str) -> None:
    _imports(module)


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_all_modules_import_in_either_order(order: str) -> None:
    _imports(*(MODULES if order == "sorted" else reversed(MODULES)))
