"""Every module of keysvc imports on its own, in an interpreter holding no keysvc
module, and in any order: no import cycle waits for a lazy import to break it.

A fresh interpreter per module would cost a second each, mostly spent loading the
same third-party libraries. So one interpreter loads the libraries keysvc depends on
(their top-level packages: aiohttp, not aiohttp.web) and no keysvc module, then
forks a child per module; each child imports its module from that state and reports
the traceback of a failure. Whole orders of the package still get fresh interpreters.
"""

import json
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
# The distributions of pyproject.toml's dependencies (and the PostgreSQL extra), by
# their top-level package.
LIBRARIES = (
    "aiohttp",
    "aiosqlite",
    "apispec",
    "asyncpg",
    "cryptography",
    "marshmallow",
    "prometheus_client",
    "swagger_ui",
    "uvloop",
)
# Run in the parent interpreter: the libraries, then a forked child per module named on
# stdin, its traceback (or "") collected; one JSON object of them on stdout.
FORKER = """
import importlib, json, os, sys, traceback
for library in sys.argv[1:]:
    importlib.import_module(library)
assert not [name for name in sys.modules if name.split(".")[0] == "keysvc"]
failures = {}
for module in json.load(sys.stdin):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            report = b""
        except BaseException:
            report = traceback.format_exc().encode()
        with os.fdopen(write, "wb") as out:
            out.write(report)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        failures[module] = inp.read().decode()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failures[module] += f"the child exited with status {status}"
json.dump(failures, sys.stdout)
"""


def _imports(*modules: str) -> None:
    code = "".join(f"import {module}\n" for module in modules)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def alone() -> dict[str, str]:
    """Each module's traceback when imported alone ("" when it imports)."""
    result = subprocess.run(
        [sys.executable, "-c", FORKER, *LIBRARIES],
        input=json.dumps(MODULES),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    failures: dict[str, str] = json.loads(result.stdout)
    return failures


def test_the_package_has_its_data_layer() -> None:
    assert "keysvc.db.sqlite.store" in MODULES and "keysvc.http.views.keys" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone(module: str, alone: dict[str, str]) -> None:
    assert alone[module] == ""


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_all_modules_import_in_either_order(order: str) -> None:
    _imports(*(MODULES if order == "sorted" else reversed(MODULES)))
