""".ci/constraints.txt: the exact versions make installs, within pyproject.toml's ranges.

A fresh clone (CI) installs what the file pins, so it tests what was tested here.
These tests fail when the file and pyproject.toml drift apart (a dependency or the
build backend named there without a pin, a pin outside the range it declares), or
when a pinned package is missing from the environment running the tests or has
another version there.
"""

import importlib.metadata
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.constraints import ROOT, pins, same_version


def declared() -> list[Requirement]:
    """pyproject.toml's build backend, dependencies and extras that apply to this Python."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    wanted = [(text, "") for text in pyproject["build-system"]["requires"]]
    wanted += [(text, "") for text in project["dependencies"]]
    for extra, texts in project.get("optional-dependencies", {}).items():
        wanted += [(text, extra) for text in texts]
    requirements = [(Requirement(text), extra) for text, extra in wanted]
    return [
        requirement
        for requirement, extra in requirements
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra})
    ]


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    pinned = pins()
    requirements = declared()
    assert {"setuptools", "aiohttp", "pytest"} <= {r.name for r in requirements}
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} has no pin: run make constraints"
        version = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} is outside pyproject.toml's {requirement}"
        )


def test_the_environment_is_the_pinned_one() -> None:
    pinned = pins()
    assert "aiohttp" in pinned and "pytest" in pinned
    assert "keysvc" not in pinned  # the project itself is installed from the clone
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
    }
    wrong = {
        name: (version, installed.get(name))
        for name, version in pinned.items()
        if not same_version(installed.get(name), version)
    }
    assert not wrong, f"pinned vs installed (make install reinstalls them): {wrong}"
