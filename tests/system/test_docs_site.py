"""The docs site (mkdocs.yml): the strict build make docs runs, run here so that make
test fails on a broken link, an anchor that is not there, a page missing from docs/ or
left out of the nav; the API reference is keysvc's own OpenAPI document; and the built
site loads nothing from elsewhere, checked in the build and in a real Chromium that
opens it from the disk with every other request refused.
"""

import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from keysvc.http.openapi import build_spec

ROOT = Path(__file__).resolve().parents[2]
# Never reinstall the environment running these tests.
STAMP = ".venv/.installed-test-stamp"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``root``'s mkdocs.yml into ``site``, as make docs."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


def nav_pages() -> list[str]:
    return re.findall(r"^\s+- [^:\n]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT, built)
    assert done.returncode == 0, done.stderr[-4000:]
    return built


def make_dry_run(target: str) -> str:
    """What ``make -n TARGET`` would run, the environment taken as installed."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "-n", "-o", STAMP, "-o", "system-deps",
         target],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_docs_is_this_strict_build() -> None:
    last = make_dry_run("docs").splitlines()[-1]
    assert last.endswith("/mkdocs build --strict --clean")


def test_make_docs_screenshots_takes_the_console_pages_pictures() -> None:
    """Each picture docs/console.md shows is one make docs-screenshots copies from the
    browser tests' screenshots (and is committed)."""
    (copied,) = re.findall(r"^for shot in ([^;]+);", make_dry_run("docs-screenshots"), re.M)
    shown = re.findall(r"\]\(img/([\w-]+)\.png\)", (ROOT / "docs" / "console.md").read_text())
    assert sorted(shown) == sorted(copied.split())
    for name in shown:
        assert (ROOT / "docs" / "img" / f"{name}.png").stat().st_size > 10_000


def test_every_page_in_docs_is_in_the_nav_and_built(site: Path) -> None:
    pages = nav_pages()
    written = {
        str(path.relative_to(ROOT / "docs"))
        for path in (ROOT / "docs").rglob("*.md")
        if "hooks" not in path.parts
    }
    assert len(pages) >= 25 and len(set(pages)) == len(pages)
    assert set(pages) == written
    for page in pages:
        assert (site / page.replace(".md", ".html")).is_file(), page


def test_the_changelog_page_is_the_changelog(site: Path) -> None:
    first = (ROOT / "CHANGELOG.md").read_text().splitlines()[0].lstrip("# ")
    assert f">{first}<" in (site / "changelog.html").read_text()


# The files the pages show as they are, included at build time (pymdownx.snippets), not
# pasted: there is no copy to keep in step with the file the tests run.
INCLUDED = {
    "forward-auth/nginx.md": "nginx-auth-request.conf",
    "forward-auth/caddy.md": "Caddyfile",
    "operations/postgresql.md": "nginx-two-instances.conf",
    "operations/systemd.md": "keysvc.service",
}


@pytest.mark.parametrize(("page", "name"), INCLUDED.items())
def test_the_pages_show_the_configuration_files_themselves(
    site: Path, page: str, name: str
) -> None:
    source = (ROOT / "docs" / page).read_text()
    assert f'--8<-- "docs/{name}"' in source
    built = (site / page.replace(".md", ".html")).read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", built))
    # Markdown shows a tab as spaces to the next multiple of 4 (the Caddyfile's indent).
    shown = (ROOT / "docs" / name).read_text().expandtabs(4)
    lines = [line for line in shown.splitlines() if line.strip()]
    assert len(lines) > 10
    missing = [line for line in lines if line not in text]
    assert missing == []


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The site's sources in a folder of their own, to break."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path)
    # The front page and Quickstart include parts of the README.
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def test_a_broken_link_an_anchor_or_a_page_fails_the_build(copy: Path) -> None:
    quickstart = copy / "docs" / "quickstart.md"
    quickstart.write_text(
        quickstart.read_text()
        + "\n[gone](nowhere.md) and [no such section](SECURITY.md#no-such-section)\n"
    )
    (copy / "docs" / "orphan.md").write_text("# Left out of the nav\n")
    (copy / "docs" / "development.md").unlink()
    done = build(copy, copy / "site")
    assert done.returncode != 0
    for named in ("nowhere.md", "no-such-section", "orphan.md", "development.md"):
        assert named in done.stderr, (named, done.stderr[-4000:])


def test_a_script_from_elsewhere_fails_the_build(copy: Path) -> None:
    page = copy / "docs" / "quickstart.md"
    page.write_text(
        page.read_text() + '\n<script src="https://cdn.example.net/mermaid.min.js"></script>\n'
    )
    done = build(copy, copy / "site")
    assert done.returncode != 0
    assert "quickstart.md loads from elsewhere" in done.stderr, done.stderr[-4000:]


def operations(spec: dict[str, object]) -> list[tuple[str, str]]:
    """(path or webhook name, operationId) of every operation, webhooks' too."""
    found = []
    for part in ("paths", "webhooks"):
        items = spec.get(part, {})
        assert isinstance(items, dict)
        for path, item in items.items():
            found += [(path, item[m]["operationId"]) for m in METHODS if m in item]
    return found


def test_the_api_reference_is_keysvcs_own_document(site: Path) -> None:
    spec = build_spec()
    assert json.loads((site / "api" / "openapi.json").read_text()) == spec
    page = (site / "api.html").read_text()
    listed = operations(spec)
    assert len(listed) > 30
    for _, operation_id in listed:
        assert f"<code>{operation_id}</code>" in page, operation_id


@pytest.fixture
def offline_page(browser: Browser) -> Iterator[tuple[Page, list[str]]]:
    """A page in Chromium that may load file: URLs only; the others are refused and
    listed, as are the page's errors."""
    context = browser.new_context()
    page = context.new_page()
    elsewhere: list[str] = []

    def only_files(route: Route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_files)
    page.on("pageerror", lambda error: elsewhere.append(f"page error: {error}"))
    yield page, elsewhere
    context.close()


def test_the_api_reference_renders_from_the_disk(
    site: Path, offline_page: tuple[Page, list[str]]
) -> None:
    page, elsewhere = offline_page
    page.goto((site / "api.html").as_uri())
    spec = build_spec()
    blocks = page.locator("#swagger-ui .opblock")
    expect(blocks.first).to_be_visible(timeout=30_000)
    expect(blocks).to_have_count(len(operations(spec)))
    assert elsewhere == []


def test_the_architecture_diagrams_render_from_the_disk(
    site: Path, offline_page: tuple[Page, list[str]]
) -> None:
    page, elsewhere = offline_page
    page.goto((site / "ARCHITECTURE.html").as_uri())
    # Material swaps each fence's <pre class="mermaid"> for a <div class="mermaid">
    # holding the drawn SVG (in a closed shadow root) once Mermaid has drawn it.
    expect(page.locator("pre.mermaid")).to_have_count(0, timeout=30_000)
    drawn = page.locator("div.mermaid")
    expect(drawn).to_have_count(2)
    for index in range(2):
        box = drawn.nth(index).bounding_box()
        assert box is not None and box["height"] > 200, box
    assert elsewhere == []
