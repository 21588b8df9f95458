"""Smoke test of ``mpreplay bench memory --quick`` (figures are the benchmark's business)."""

from mpreplay.bench import memory


def test_the_memory_benchmark_runs_and_reports_every_layout(capsys):
    assert memory.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for layout in memory.LAYOUTS:
        assert layout.split(" + ")[0] in out
