"""What a user's type checker sees: a short training-loop script type-checks under
``mypy --strict --disallow-any-expr`` (no ``Any`` from mpreplay reaches it), and the slips a
type checker is for -- a misspelt method, a string batch size -- are reported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mpreplay

pytest.importorskip("mypy", reason="mypy is in the lint extra: pip install -e '.[lint]'")

# The script a new user writes first (the README's quick start, typed as they would leave it).
USER_SCRIPT = """
    import numpy as np

    import mpreplay
    from mpreplay import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer

    env_dict = {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    rb = PrioritizedReplayBuffer(1000, env_dict, alpha=0.6, seed=0)
    slot = rb.add(obs=np.zeros(4), act=1, rew=0.5, done=0.0)
    batch = rb.sample(32, beta=0.4)
    obs = batch["obs"]
    reveal_type(obs)
    observations = np.asarray(obs, dtype=np.float32)  # numpy's reductions type as Any: not used here
    rb.update_priorities(batch["indexes"], np.ones(len(observations)))
    stored: int = rb.get_stored_size()
    rb.close()

    uniform = ReplayBuffer(100, {"obs": {}}, default_dtype=np.float64)
    uniform.add(obs=[1.0, 2.0])
    shared = MPPrioritizedReplayBuffer(100, {"obs": {"shape": 2}}, new_priority="max_ever")
    reveal_type(shared.sample(1)["weights"])
    uniform.close()
    shared.close()
"""

# What the types promise beyond the first script: ``add`` returns an int, ``batches()`` yields the
# ``Batch`` that ``sample`` returns, an env_dict may be annotated field by field, a file is a path
# or a binary file -- each under ``--strict --disallow-any-expr``, with no cast.
TYPED_SCRIPT = """
    import io

    import numpy as np

    import mpreplay
    from mpreplay import Batch, FieldOptions, ReplayBuffer

    slot: int = ReplayBuffer(8, {"obs": {}}).add(obs=1.0)
    table = mpreplay.Table(100, {"obs": {"shape": (4,)}, "rew": {}}, selector="prioritized")
    first: int = table.add(obs=np.zeros(4), rew=1.0)
    sampled: Batch = table.sample(8)
    with table.batches(8, beta=0.4) as batches:
        prefetched: Batch = next(batches)
        for batch in batches:
            weights = batch["weights"]
            break
    typed: dict[str, FieldOptions] = {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}
    other = mpreplay.Table(100, typed)
    file = io.BytesIO()
    table.save_transitions(file)
    file.seek(0)
    loaded: int = other.load_transitions(file)
    rows = other.read([0, 1])
    table.close()
    other.close()
"""

# Each line a slip that must be an error: (the line, what mypy's message says).
SLIPS = [
    ("rb.sampel(32)", 'has no attribute "sampel"'),
    ('rb.sample("32")', 'Argument 1 to "sample"'),
    ("rb.this_method_does_not_exist()", 'has no attribute "this_method_does_not_exist"'),
    ("rb.update_priorities(batch)", 'Missing positional argument "priorities"'),
    ('PrioritizedReplayBuffer(10, {"obs": {}}, sead=0)', 'Unexpected keyword argument "sead"'),
    ('ReplayBuffer(10, {"obs": (4,)})', 'incompatible type "dict[str, tuple[int]]"'),  # a shape, not options
    ('misspelt: dict[str, mpreplay.FieldOptions] = {"obs": {"shap": (4,)}}', 'Extra key "shap"'),
    ('misshaped: dict[str, mpreplay.FieldOptions] = {"obs": {"shape": "4"}}', 'TypedDict item "shape"'),
    ("rb.load_transitions(1)", 'Argument 1 to "load_transitions"'),
]


def readme_quick_start() -> str:
    """The README's first Python block: the buffer in one process."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module's runs: numpy's and mpreplay's types are read once."""
    return tmp_path_factory.mktemp("mypy-cache")


def run_mypy(script: str, folder: Path, cache: Path, *, any_expr: bool = False) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` (and ``--disallow-any-expr`` unless ``any_expr``) on ``script``, with the
    mpreplay under test on its path; mpreplay's own modules are read for their types only: their
    errors are not the user's (an installed package's never show), only the script's are."""
    path = folder / "user_script.py"
    path.write_text(textwrap.dedent(script))
    where = Path(mpreplay.__file__).parent.parent
    # An installed mpreplay is found as a user's is (mypy refuses site-packages on MYPYPATH).
    installed = where.name in ("site-packages", "dist-packages")
    env = {key: value for key, value in os.environ.items() if key != "MYPYPATH"}
    env |= {} if installed else {"MYPYPATH": str(where)}
    command = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent"]
    command += [] if any_expr else ["--disallow-any-expr"]
    command += ["--no-error-summary", "--cache-dir", str(cache), str(path)]
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=folder, timeout=600)


@pytest.mark.timeout(900)
def test_a_users_script_type_checks_strictly_with_no_any_from_mpreplay(tmp_path, mypy_cache):
    result = run_mypy(USER_SCRIPT, tmp_path, mypy_cache)
    errors = [line for line in result.stdout.splitlines() if line.startswith("user_script.py") and ": error:" in line]
    assert errors == [], result.stdout + result.stderr
    revealed = [line.split('Revealed type is "')[1] for line in result.stdout.splitlines() if "Revealed" in line]
    # numpy.generic has a type parameter of its own since numpy 2.2, Any unless given: numpy's
    # default, which --disallow-any-expr lets through; mpreplay's part is the array of generic.
    assert [re.sub(r"numpy\.generic(\[Any\])?", "numpy.generic", r) for r in revealed] == [
        'numpy.ndarray[tuple[int, ...], numpy.dtype[numpy.generic]]"'
    ] * 2, result.stdout


@pytest.mark.timeout(900)
def test_adds_batches_field_options_and_files_type_check_strictly_without_a_cast(tmp_path, mypy_cache):
    result = run_mypy(TYPED_SCRIPT, tmp_path, mypy_cache)
    errors = [line for line in result.stdout.splitlines() if line.startswith("user_script.py") and ": error:" in line]
    assert errors == [], result.stdout + result.stderr


@pytest.mark.timeout(900)
def test_a_misspelt_method_or_a_wrong_argument_is_a_type_error(tmp_path, mypy_cache):
    script = textwrap.dedent(USER_SCRIPT) + "\n".join(line for line, _ in SLIPS) + "\n"
    result = run_mypy(script, tmp_path, mypy_cache)
    for line, message in SLIPS:
        assert message in result.stdout, f"{line!r} passed the type check:\n{result.stdout}"


@pytest.mark.timeout(900)
def test_the_readmes_quick_start_type_checks_strictly(tmp_path, mypy_cache):
    # numpy's random draws and reductions are Any in numpy's own stubs: Any expressions allowed.
    result = run_mypy(readme_quick_start(), tmp_path, mypy_cache, any_expr=True)
    errors = [line for line in result.stdout.splitlines() if line.startswith("user_script.py") and ": error:" in line]
    assert errors == [], result.stdout + result.stderr
