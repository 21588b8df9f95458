"""The documentation site: it builds with warnings as errors, its API reference has an entry for
every public name, and the README's links lead somewhere.

The site is built once per test session from a copy of ``docs/`` (the build writes the
reference's generated pages into its source folder, which must stay the checkout's own), with
the command the development page gives.  Without the ``docs`` extra (Sphinx, MyST, Furo) those
tests skip; CI installs it with the other extras and runs them.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from helpers import REPO_ROOT, stability_modules

BUILD_TIMEOUT_S = 600


def reference_modules(page: str) -> list[str]:
    """The modules a page of docs/api/ documents: its autosummary's entries."""
    text = (REPO_ROOT / "docs" / "api" / page).read_text(encoding="utf-8")
    return re.findall(r"^   (mpreplay[\w.]*)$", text, flags=re.MULTILINE)


# The modules whose __all__ the reference documents in full: those docs/stability.md promises.
MODULES = stability_modules("Public")


def test_the_reference_documents_exactly_the_modules_stability_promises():
    assert MODULES, "docs/stability.md lists no public module"
    assert sorted(reference_modules("index.md")) == sorted(MODULES)


def test_the_internal_reference_documents_exactly_the_modules_stability_calls_internal():
    internal = stability_modules("Internal")
    assert internal, "docs/stability.md lists no internal module"
    assert sorted(reference_modules("internal.md")) == sorted(internal)
    assert not set(internal) & set(MODULES), "a module both public and internal"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's folder, built by ``python -m sphinx -W --keep-going -n -b html``."""
    for module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(module, reason=f"{module} is not installed (the docs extra: pip install -e '.[docs]')")
    work = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO_ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("generated"))
    shutil.copy(REPO_ROOT / "README.md", work / "README.md")  # docs/install.md includes a part of it
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-b",
            "html",
            str(work / "docs"),
            str(work / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    return work / "html", proc


def inventory(html: Path) -> set[str]:
    """The Python objects the site documents: the names in its objects.inv."""
    data = (html / "objects.inv").read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if re.match(r"\S+ py:\w+ ", line)}


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_the_site_builds_with_warnings_as_errors(site):
    html, proc = site
    assert proc.returncode == 0, f"the docs build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert (html / "index.html").is_file()


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_a_reference_entry(site, module):
    html, proc = site
    assert (html / "objects.inv").is_file(), f"no inventory: the build failed\n{proc.stderr[-3000:]}"
    documented = inventory(html)
    missing = [name for name in importlib.import_module(module).__all__ if f"{module}.{name}" not in documented]
    assert not missing, f"{module}: no reference entry for {missing} (is the module in docs/api/index.md?)"


def readme_links() -> list[str]:
    text = re.sub(r"```.*?```", "", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", target)]


def github_anchors(markdown: str) -> set[str]:
    """The anchors the repository host (and MyST, myst_heading_anchors) gives a page's headings."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_readme_links_lead_to_files_and_headings_that_exist():
    links = readme_links()
    assert links, "the README links nowhere: the link pattern changed?"
    for target in links:
        path, _, anchor = target.partition("#")
        page = REPO_ROOT / path if path else REPO_ROOT / "README.md"
        assert page.is_file(), f"README links to {target}: no such file"
        if anchor:
            assert anchor in github_anchors(page.read_text(encoding="utf-8")), (
                f"README links to {target}: no such heading"
            )


def markdown_section(text: str, heading: str) -> str:
    """The body of the section ``heading`` (a whole heading line) of a Markdown page, to the next
    heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n") + len(heading) + 1
    end = re.search(rf"^#{{1,{level}}} ", text[start:], flags=re.MULTILINE)
    return text[start : start + end.start()] if end else text[start:]


def figures(text: str) -> set[str]:
    """The numbers a text quotes (``9.1``, ``16,433``, ``84``), links' targets left out."""
    return set(re.findall(r"\d+(?:[.,]\d+)*", re.sub(r"\]\([^)]*\)", "]", text)))


# The README's sections that quote measured figures.
README_FIGURE_SECTIONS = ["## When to pick mpreplay", "## What mpreplay does", "## Benchmarks"]


@pytest.mark.parametrize("heading", README_FIGURE_SECTIONS)
def test_every_figure_the_readme_quotes_is_in_the_benchmarks_at_a_glance(heading):
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    glance = markdown_section((REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"), "## At a glance")
    quoted = figures(markdown_section(readme, heading))
    assert quoted, f"README's {heading!r} quotes no figure: the section moved?"
    assert sorted(quoted - figures(glance)) == [], f"README's {heading!r} quotes figures docs/benchmarks.md does not"
