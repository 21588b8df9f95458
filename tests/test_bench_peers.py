"""The peers' plumbing: workers, their protocol, and how a peer that cannot run is reported.

CI has no peers' venv (it is gigabytes); the tests that need one run only where
``MPREPLAY_PEERS`` names it.  No timing is asserted.
"""

import io
import json
import os
import stat
import sys

import pytest
from helpers import table_cells

from mpreplay.bench import mp_peers, mp_processes, peer_worker, peers, per, per_peers, queue

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_peers_venv")]


def _fake_venv(tmp_path, modules: dict[str, str]):
    """A directory laid out as a venv whose python is this interpreter seeing only ``modules``
    (name -> source) besides the standard library and what this interpreter has installed."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name, source in modules.items():
        (lib / f"{name}.py").write_text(source)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{lib}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


def _first_cells(text: str) -> set[str]:
    """The first cell of every table row, from rich's layout or the plain one."""
    return {cells[0] for cells in table_cells(text) if cells}


def test_without_a_venv_every_peer_is_unavailable_saying_how_to_make_one():
    found = peers.launch(peers.PEERS, None)
    for name in peers.PEERS:
        assert isinstance(found[name], peers.Unavailable)
        assert "--setup DIR" in found[name].reason


def test_a_venv_without_an_interpreter_is_named_in_the_reason(tmp_path):
    found = peers.launch(["torchrl"], str(tmp_path))["torchrl"]
    assert isinstance(found, peers.Unavailable)
    assert f"no interpreter at {tmp_path}/bin/python" in found.reason


def test_the_environment_variable_names_the_venv(tmp_path, monkeypatch):
    monkeypatch.setenv(peers.ENV_VAR, str(tmp_path))
    assert peers.peers_python(None) == (None, f"no interpreter at {tmp_path}/bin/python: {peers.SETUP_HINT}")


def test_a_peer_whose_library_fails_to_import_is_unavailable_with_the_import_error(tmp_path):
    directory = _fake_venv(tmp_path, {"flashbax": "raise ImportError('built for another jax')"})
    found = peers.launch(["flashbax"], directory)["flashbax"]
    assert found == peers.Unavailable("flashbax", "does not load: ImportError: built for another jax")


def test_a_worker_that_dies_at_start_is_unavailable_with_its_last_words(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\necho 'this interpreter is broken' >&2\nexit 3\n")
    python.chmod(0o755)
    found = peers.launch(["tianshou"], str(tmp_path))["tianshou"]
    assert isinstance(found, peers.Unavailable)
    assert "exited (3)" in found.reason and "this interpreter is broken" in found.reason


def test_what_a_library_prints_to_stdout_does_not_garble_the_answers(tmp_path):
    directory = _fake_venv(tmp_path, {"flashbax": "print('hello from the library')\n__version__ = '9.9'"})
    worker = peers.launch(["flashbax"], directory)["flashbax"]
    assert isinstance(worker, peers.PeerProcess)
    try:
        assert worker.hello["versions"]["flashbax"] == "9.9"
    finally:
        worker.close()


def test_the_worker_answers_each_command_with_one_line_of_json():
    requests = io.StringIO(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"cmd": "hello"},
                {"cmd": "per_build", "capacity": 100, "seed": 0},
                {"cmd": "per_run", "frames": 40, "min_cpu": 0.01},
                {"cmd": "quit"},
                {"cmd": "hello"},
            ]
        )
    )
    answers = io.StringIO()
    peer_worker.serve("floor", requests, answers)
    hello, built, ran = [json.loads(line) for line in answers.getvalue().splitlines()]  # nothing after quit
    assert hello["ok"] and "numpy" in hello["versions"]
    assert built["ok"] and built["seconds"] >= 0
    assert ran["ok"] and ran["cpu"] >= 0.01 and ran["frames"] % 40 == 0


def test_a_failing_command_is_answered_with_its_error_and_the_worker_goes_on():
    worker = peers.start("floor", sys.executable)
    assert isinstance(worker, peers.PeerProcess)
    try:
        with pytest.raises(peers.PeerError, match="per_run needs a per_build first"):
            worker.request("per_run", frames=10)
        with pytest.raises(peers.PeerError, match="unknown command 'per_walk'"):
            worker.request("per_walk")
        worker.request("per_build", capacity=64, seed=1)
        assert worker.request("per_run", frames=10)["cpu"] >= 0
    finally:
        worker.close()


def test_every_local_contender_runs_the_loop_in_its_worker():
    workers = peers.launch(peers.LOCAL, None)
    try:
        for name, worker in workers.items():
            if name == "cpprb" and isinstance(worker, peers.Unavailable):
                continue  # cpprb is optional
            worker.request("per_build", capacity=200, seed=0)
            assert worker.request("per_run", frames=100)["cpu"] > 0
    finally:
        peers.close_all(workers.values())


def test_bench_per_with_a_missing_venv_reports_each_peer_unavailable_and_measures_the_rest(tmp_path, capsys):
    directory = str(tmp_path / "nowhere")
    assert per.main(["--only-peers", "--quick", "--peers", directory, "--tput-capacity", "600"]) == 0
    out = capsys.readouterr().out
    for name in peers.PEERS:
        assert f"{name}: unavailable: no interpreter at {directory}/bin/python" in out
    buffers = _first_cells(out)
    assert {"mpreplay", "floor", "mpreplay compressed", "mpreplay plain"} <= buffers
    assert not buffers & set(peers.PEERS)


def test_only_peers_without_a_venv_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        per.main(["--only-peers"])
    assert exc.value.code == 2
    assert "--only-peers" in capsys.readouterr().err


def test_reverb_runs_from_the_reverb_venv_inside_the_peers_directory(tmp_path):
    found = peers.launch([peers.REVERB], str(tmp_path))[peers.REVERB]
    assert isinstance(found, peers.Unavailable)
    assert f"no interpreter at {tmp_path}/reverb/bin/python" in found.reason


def test_without_a_python_3_11_the_reverb_venv_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 12, 0, "final", 0))
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    python, reason = peers.python_for_reverb()
    assert python is None
    assert "CPython 3.8-3.11" in reason and "--reverb-python PATH" in reason


def test_setup_without_a_python_for_reverb_fails_and_makes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers, "python_for_reverb", lambda: (None, "no CPython 3.11 here"))
    assert peers.setup(str(tmp_path / "venvs"), venvs=[peers.REVERB]) == 1
    assert "no Reverb venv: no CPython 3.11 here" in capsys.readouterr().err
    assert not (tmp_path / "venvs").exists()


def test_the_reverb_pins_are_exact_and_shipped_beside_the_others():
    pins = [
        line.split("==")
        for line in peers.REVERB_REQUIREMENTS.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert {name for name, _ in pins} >= {"dm-reverb", "tensorflow-cpu", "numpy"}
    assert all(len(pin) == 2 and pin[1] for pin in pins)


def test_bench_mp_refuses_json_or_plot_without_peers(capsys):
    from mpreplay.bench import mp

    with pytest.raises(SystemExit) as exc:
        mp.main(["--quick", "--json", "x.json"])
    assert exc.value.code == 2
    assert "give --peers DIR" in capsys.readouterr().err


# -- with the real peers' venv ---------------------------------------------------------------
_VENV = os.environ.get(peers.ENV_VAR)
needs_venv = pytest.mark.skipif(
    not _VENV or not os.path.exists(os.path.join(_VENV, "bin", "python")),
    reason=f"no peers' venv: set {peers.ENV_VAR}=DIR after `python -m mpreplay.bench.peers --setup DIR`",
)


needs_reverb = pytest.mark.skipif(
    not _VENV or not os.path.exists(os.path.join(_VENV, "reverb", "bin", "python")),
    reason=f"no Reverb venv: set {peers.ENV_VAR}=DIR after `python -m mpreplay.bench.peers --setup DIR` (DIR/reverb)",
)
_SHORT = {"seconds": 0.6, "warmup": 0.3, "slices": 3}


def _one_case(name: str, writers: int, learner: bool, rows: int):
    worker = peers.launch([name], _VENV)[name]
    assert isinstance(worker, peers.PeerProcess), worker
    try:
        worker.request(
            "mp_open", obs={"label": "(4,) float32", "shape": [4], "dtype": "float32", "capacity": 600}, batch=32
        )
        answer = worker.request("mp_case", writers=writers, learner=learner, rows=rows, timing=_SHORT)
        worker.request("mp_close")
    finally:
        worker.close()
    return mp_processes.summarize(mp_peers.window_of(answer), "(4,) float32", name, 600, writers, learner, rows, 32)


@needs_reverb
def test_reverb_runs_writers_and_a_learner_against_its_server_whose_cpu_counts():
    line = _one_case("reverb", 1, True, 32)
    assert line.inserts > 0 and line.steps > 0
    assert line.server_cpu is not None and line.server_cpu > 0
    assert line.cpu == pytest.approx(line.writer_cpu + line.learner_cpu + line.server_cpu)


@needs_venv
def test_torchrl_runs_writer_processes_beside_the_learner_that_made_its_buffer():
    line = _one_case("torchrl", 2, True, 1)
    assert line.inserts > 0 and line.steps > 0
    assert line.server_cpu is None


@needs_reverb
def test_reverbs_queue_hands_each_rollout_out_once():
    worker = peers.launch(["reverb"], _VENV)["reverb"]
    assert isinstance(worker, peers.PeerProcess), worker
    try:
        answer = worker.request("queue_case", writers=2, steps=8, frame=[84, 84], size=4, timing=_SHORT)
    finally:
        worker.close()
    line = queue.line_of("reverb", 2, mp_peers.window_of(answer), answer["duplicates"])
    assert line.rollouts > 0 and line.duplicates == 0


@needs_venv
@pytest.mark.parametrize("name", peers.PEERS)
def test_each_peer_of_the_venv_loads_and_runs_the_loop(name):
    worker = peers.launch([name], _VENV)[name]
    assert isinstance(worker, peers.PeerProcess), worker
    try:
        worker.request("per_build", capacity=300, seed=0)
        assert worker.request("per_run", frames=50)["cpu"] > 0
    finally:
        worker.close()


def test_targets_compare_each_sampled_layout_with_mpreplay_storing_it_the_same_way(capsys):
    tput = per_peers.Measured(
        rows=[
            {"contender": name, "cpu_ms": ms}
            for name, ms in [
                ("mpreplay compressed", 1.0),
                ("mpreplay plain", 3.0),
                ("cpprb compressed", 2.0),
                ("cpprb plain", 2.4),
                ("torchrl plain", 30.0),
            ]
        ]
    )
    per_peers.targets(None, tput)
    rows = {
        cells[0]: cells[1:]
        for cells in table_cells(capsys.readouterr().out)
        if cells and cells[0].startswith("sample(256)")
    }
    assert rows["sample(256), compressed"][:3] == ["cpprb compressed", "2.00", "yes"]
    assert rows["sample(256), plain"][:3] == ["cpprb plain", "0.80", "no"]
