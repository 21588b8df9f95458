"""The version names what it stores (docs/stability.md, "Versions"): a change of the segment
manifest's format or of the file format makes a new minor version; each CHANGELOG section says
which formats its version stores, and the top one is the package's version; the version is
written in one place, which the metadata, ``mpreplay --version`` and ``mpreplay.__version__``
read."""

from __future__ import annotations

import configparser
import itertools
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

import mpreplay
from mpreplay import fileformat, manifest

# The (manifest format, file format) pairs mpreplay has stored, each with the minor version that
# introduced it.  A format change adds a row here, with a new minor version: a patch version
# never changes a format, and no minor version introduces two pairs.  (0.1.0 had no manifest.)
FORMATS_INTRODUCED = {
    (3, 2): (0, 2),
    # Manifest format 4, and file format 2 with format 5, were 0.3.0's while unreleased: replaced
    # before any release.
    (5, 3): (0, 3),
}

SECTION = re.compile(r"^## (\d+)\.(\d+)\.(\d+) \((.+)\)$", re.MULTILINE)
STORES = re.compile(r"^Stores: segment manifest format (\d+)\b.*; file format (\d+)\b", re.MULTILINE)


def version_tuple(version: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    assert match, f"{version!r} is not MAJOR.MINOR.PATCH"
    return int(match[1]), int(match[2]), int(match[3])


def changelog_sections() -> list[tuple[tuple[int, int, int], str, tuple[int, int] | None]]:
    """Each section of CHANGELOG.md, newest first: (version, its date or "unreleased", the
    (manifest format, file format) its "Stores:" line names, or None without one)."""
    text = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    heads = list(SECTION.finditer(text))
    sections = []
    for head, after in zip(heads, heads[1:] + [None], strict=True):
        body = text[head.end() : after.start() if after else len(text)]
        stores = STORES.search(body)
        formats = (int(stores[1]), int(stores[2])) if stores else None
        sections.append(((int(head[1]), int(head[2]), int(head[3])), head[4], formats))
    return sections


CODE_FORMATS = (manifest.VERSION, fileformat.FORMAT_VERSION)


def test_the_formats_this_code_stores_were_introduced_by_a_minor_version_of_the_table():
    assert CODE_FORMATS in FORMATS_INTRODUCED, (
        f"the code stores manifest format {CODE_FORMATS[0]} and file format {CODE_FORMATS[1]}, which no "
        "minor version introduced: a format change needs a new minor version (bump mpreplay/_version.py, "
        "add a row to FORMATS_INTRODUCED and a CHANGELOG section that names the formats)"
    )


def test_the_package_version_is_at_least_the_minor_version_that_introduced_its_formats():
    major, minor, _ = version_tuple(mpreplay.__version__)
    introduced = FORMATS_INTRODUCED.get(CODE_FORMATS)
    assert introduced is not None and (major, minor) >= introduced, (
        f"mpreplay {mpreplay.__version__} stores formats {CODE_FORMATS}, introduced by {introduced}"
    )


def test_the_newest_formats_are_the_ones_the_code_stores():
    newest = max(FORMATS_INTRODUCED, key=FORMATS_INTRODUCED.__getitem__)
    assert newest == CODE_FORMATS, f"the code stores {CODE_FORMATS}, older than {newest}"


def test_each_minor_version_introduces_one_pair_of_formats_and_no_format_number_goes_back():
    by_version = sorted(FORMATS_INTRODUCED.items(), key=lambda item: item[1])
    versions = [version for _, version in by_version]
    assert len(set(versions)) == len(versions), f"a minor version introduced two pairs of formats: {by_version}"
    for (older, _), (newer, _) in itertools.pairwise(by_version):
        assert newer[0] >= older[0] and newer[1] >= older[1] and newer != older, by_version


def test_the_changelogs_top_section_is_the_package_version():
    (top, _, _), *_ = changelog_sections()
    assert top == version_tuple(mpreplay.__version__), (
        f"CHANGELOG.md's top section is {top}, the package is {mpreplay.__version__}"
    )


def test_only_the_top_section_of_the_changelog_is_unreleased():
    sections = changelog_sections()
    assert all(when != "unreleased" for _, when, _ in sections[1:]), [s[:2] for s in sections]


def test_changelog_sections_are_newest_first():
    versions = [version for version, _, _ in changelog_sections()]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), versions


def test_the_changelogs_top_section_names_the_formats_the_code_stores():
    (_, _, formats), *_ = changelog_sections()
    assert formats == CODE_FORMATS, (
        f"CHANGELOG.md's top section says it stores {formats}; the code stores {CODE_FORMATS} "
        "(its 'Stores: segment manifest format M ...; file format F ...' line)"
    )


@pytest.mark.parametrize("section", changelog_sections(), ids=lambda s: "{}.{}.{}".format(*s[0]))
def test_every_changelog_section_since_the_manifest_names_formats_a_minor_version_introduced(section):
    (major, minor, _), _, formats = section
    if (major, minor) < min(FORMATS_INTRODUCED.values()):
        return  # before the manifest: nothing to name
    assert formats is not None, f"{major}.{minor}: no 'Stores:' line"
    assert formats in FORMATS_INTRODUCED and FORMATS_INTRODUCED[formats] <= (major, minor), (
        f"{major}.{minor} stores {formats}, which FORMATS_INTRODUCED has as {FORMATS_INTRODUCED.get(formats)}"
    )


def test_the_versions_of_one_minor_version_store_the_same_formats():
    seen: dict[tuple[int, int], tuple[tuple[int, int, int], tuple[int, int] | None]] = {}
    for version, _, formats in changelog_sections():
        first = seen.setdefault(version[:2], (version, formats))
        assert first[1] == formats, (
            f"{version} stores {formats} and {first[0]} stores {first[1]}: a format change needs a new minor version"
        )


def test_setup_cfg_reads_the_version_from_the_one_module_that_defines_it():
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    assert config["metadata"]["version"] == "attr: mpreplay._version.__version__"


def test_the_version_string_is_written_in_mpreplay_version_py_only():
    # An assignment of the version string: `__version__ = "0.3.0"`, `version="0.3.0"`, `version = 0.3.0`.
    literal = re.compile(rf"version\w*\s*=\s*['\"]?{re.escape(mpreplay.__version__)}\b", re.IGNORECASE)
    sources = [*REPO_ROOT.glob("*"), *(REPO_ROOT / "tools").glob("*"), *(REPO_ROOT / "docs").glob("*")]
    sources += (REPO_ROOT / "mpreplay").rglob("*")
    written = [
        str(path.relative_to(REPO_ROOT))
        for path in sources
        if path.suffix in (".py", ".pyx", ".pyi", ".cfg", ".toml") and literal.search(path.read_text(encoding="utf-8"))
    ]
    assert sorted(set(written)) == ["mpreplay/_version.py"]


def test_mpreplay_version_prints_the_package_version():
    run = subprocess.run(
        [sys.executable, "-m", "mpreplay", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout == f"mpreplay {mpreplay.__version__}\n"


def test_a_saved_file_records_the_package_version_and_the_file_format(tmp_path):
    with mpreplay.ReplayBuffer(4, {"obs": {}}) as rb:
        rb.add(obs=1.0)
        rb.save_transitions(tmp_path / "rows.npz")
    record = fileformat.read_metadata(tmp_path / "rows.npz")
    assert (record["mpreplay_version"], record["format_version"]) == (mpreplay.__version__, fileformat.FORMAT_VERSION)


def deprecations() -> list[tuple[str, str, str]]:
    """docs/stability.md's table of removed names: (name, warns since, goes in) of each row."""
    text = (REPO_ROOT / "docs" / "stability.md").read_text(encoding="utf-8")
    return re.findall(r"^\| (.+?) \| (\d+\.\d+\.\d+) \| (\d+\.\d+\.\d+) \|", text, flags=re.MULTILINE)


def test_stability_lists_deprecations():
    assert deprecations(), "docs/stability.md's table of deprecated names is gone or its layout changed"


@pytest.mark.parametrize("name, since, goes", deprecations())
def test_a_deprecated_name_warns_from_a_version_not_after_this_one_and_goes_in_a_later_minor_version(name, since, goes):
    version = version_tuple(mpreplay.__version__)
    assert version_tuple(since) <= version, f"{name}: warns since {since}, after {mpreplay.__version__}"
    assert version_tuple(goes)[:2] > version[:2], f"{name}: goes in {goes}; this is {mpreplay.__version__}: remove it"
