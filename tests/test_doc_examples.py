"""Every code block of README.md and docs/*.md runs, so that no example can rot.

The rule, one for every page:

* Every fenced block names its language: ``python`` and ``bash`` blocks are programs, ``text``
  blocks show output or layouts and are not run (MyST directives such as ``{toctree}`` are not
  code).
* A ``python`` block is a whole program: it runs alone, in a fresh interpreter, with an empty
  temporary folder as its working directory.  No state is shared between blocks.  It may not
  leave a ``...`` placeholder.  A block that imports an optional library (torch, gymnasium, Ray,
  or the mpreplay modules that need Ray) is skipped, with the library's name, where that library
  is not installed, and runs where it is.
* A ``bash`` block runs the same way (``bash -euo pipefail``, the interpreter's own ``bin``
  folder first on ``PATH``, where pip puts the ``mpreplay`` command), unless the line just before
  it is ``<!-- not run: REASON -->``: demos, installs and benchmarks are proven elsewhere, and the
  reason says where or why.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "bash", "text"}
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.*\S.*) -->")
FENCE = re.compile(r"^```(?P<info>[^\s`]*)(?:\s.*)?$")  # a MyST directive has arguments after its name
TIMEOUT_S = 300
# Top-level modules an example may import that are not mpreplay's requirements, and the library
# each needs; mpreplay.sharded and mpreplay.testing import fine without Ray but do nothing.
OPTIONAL = {
    "torch": "torch",
    "gymnasium": "gymnasium",
    "ray": "ray",
    "mpreplay.sharded": "ray",
    "mpreplay.testing": "ray",
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the opening fence's line, from 1
    language: str  # the fence's info string ("" for a bare fence)
    code: str
    before: str  # the last non-blank line above the fence

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def not_run_reason(self) -> str | None:
        match = NOT_RUN.fullmatch(self.before.strip())
        return match["reason"] if match else None


def blocks_of(page: Path) -> list[Block]:
    found, lines, i = [], page.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        found.append(Block(page, i + 1, match["info"], "\n".join(lines[i + 1 : end]) + "\n", before))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]
PYTHON = [b for b in BLOCKS if b.language == "python"]
BASH_RUN = [b for b in BLOCKS if b.language == "bash" and b.not_run_reason is None]
BASH_NOT_RUN = [b for b in BLOCKS if b.language == "bash" and b.not_run_reason is not None]


def optional_libraries(code: str) -> set[str]:
    """The optional libraries a program imports (directly, or through an mpreplay module)."""
    needed = set()
    for node in ast.walk(ast.parse(code)):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        needed.update(
            library
            for name in names
            for module, library in OPTIONAL.items()
            if name == module or name.startswith(module + ".")
        )
    return needed


def python_param(block: Block):
    """A block as a test parameter; one that needs Ray carries the suite's ``ray`` mark."""
    return pytest.param(block, id=block.id, marks=[pytest.mark.ray] if "ray" in optional_libraries(block.code) else [])


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_the_pages_hold_examples_of_each_kind():
    assert PYTHON and BASH_RUN and BASH_NOT_RUN, "the collector found no blocks: the fence format changed?"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_every_code_block_names_its_language(block):
    assert block.language in LANGUAGES or block.language.startswith("{"), (
        f"{block.id}: a fence must say python, bash or text (got {block.language!r})"
    )


@pytest.mark.parametrize("block", [b for b in BLOCKS if NOT_RUN.fullmatch(b.before.strip())], ids=lambda b: b.id)
def test_a_not_run_marker_stands_right_before_a_bash_block(block):
    assert block.language == "bash", f"{block.id}: only a bash block may be marked not run"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_not_run_marker_belongs_to_a_block(page):
    markers = sum(1 for line in page.read_text(encoding="utf-8").split("\n") if NOT_RUN.fullmatch(line.strip()))
    marked = sum(1 for b in BLOCKS if b.page == page and b.not_run_reason is not None)
    assert markers == marked, f"{page.name}: a '<!-- not run: ... -->' line is not right before a block"


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_block_has_no_placeholder(block):
    placeholders = [
        node.lineno
        for node in ast.walk(ast.parse(block.code))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node.value.value is Ellipsis
    ]
    assert not placeholders, f"{block.id}: '...' at line(s) {placeholders} of the block; write the code out"


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("block", [python_param(b) for b in PYTHON])
def test_python_block_runs(block, tmp_path):
    for library in sorted(optional_libraries(block.code)):
        if importlib.util.find_spec(library) is None:
            pytest.skip(f"needs {library}, which is not installed")
    (tmp_path / "example.py").write_text(block.code, encoding="utf-8")
    proc = run([sys.executable, "example.py"], tmp_path)
    assert proc.returncode == 0, f"{block.id} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("block", BASH_RUN, ids=lambda b: b.id)
def test_bash_block_runs(block, tmp_path):
    proc = run(["bash", "-euo", "pipefail", "-c", block.code], tmp_path)
    assert proc.returncode == 0, f"{block.id} failed:\n{proc.stdout}\n{proc.stderr}"
