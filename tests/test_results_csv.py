"""The recorded CSVs' one writer (``gemm_lessons.results``): a row's columns, the ladder's
``write_csv`` read back by ``read_csv``, and ``merge_csv`` replacing only the rows of the
kernels and shapes measured again."""
import gemm_lessons  # noqa: F401  (first: it picks the engine)
import pytest
import torch

from gemm_lessons import results
from gemm_lessons.harness import BenchResult


def test_a_row_has_every_column_in_order():
    r = results.row("k", 7, torch.bfloat16, 1, 2, 3, 0.5, 0.25, device="GPU",
                    versions={"torch": "2.13.0", "triton": "3.9.0"})
    assert list(r) == results.FIELDS
    assert r["dtype"] == "bfloat16" and r["ms"] == "0.500000" and r["baseline_ms"] == "0.250000"
    assert r["versions"] == "torch 2.13.0; triton 3.9.0"
    assert results.row("k", 7, "float16", 1, 2, 3, 1, 1, device="", versions="as is")["versions"] \
        == "as is"


def test_the_ladder_csv_reads_back(tmp_path):
    path = tmp_path / "ladder.csv"
    runs = [BenchResult("a", torch.float16, 64, 64, 64, ms=2.0, baseline_ms=1.0),
            BenchResult("b", torch.float32, 32, 16, 8, ms=1.0, baseline_ms=3.0)]
    results.write_csv(path, runs, [4, 8], device="GPU", versions={"torch": "x"})
    results.write_csv(path, runs[:1], [4], device="GPU", versions={"torch": "x"})  # replaced
    rows, device, versions = results.read_csv(path)
    assert [(lesson, r.kernel, r.dtype, r.ratio) for lesson, r in rows] == \
        [(4, "a", torch.float16, 0.5)]
    assert (device, versions) == ("GPU", "torch x")


def test_merge_replaces_only_what_was_measured_again(tmp_path):
    path = tmp_path / "suite.csv"

    def row(kernel, M, ms):
        return results.row(kernel, 9, "float16", M, 8, 8, ms, 1.0, device="", versions="")
    assert results.merge_csv(path, [row("x", 16, 1.0), row("x", 32, 2.0), row("y", 16, 3.0)]) == 0
    assert results.merge_csv(path, [row("x", 16, 5.0)]) == 2          # two rows kept
    got = {(r.kernel, r.M): r.ms for _, r in results.read_csv(path)[0]}
    assert got == {("x", 16): 5.0, ("x", 32): 2.0, ("y", 16): 3.0}
    results.merge_csv(path, [row("z", 64, 1.0)], keep=False)           # the file replaced
    assert [r.kernel for _, r in results.read_csv(path)[0]] == ["z"]


NCU = """$ ncu --section LaunchStats python prog.py
what the program printed
[123] python3.12@127.0.0.1
  void ns::kern<8, float>(int, T2) (2, 64, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Launch Statistics
    -------------------------------- --------------- ---------------
    Metric Name                          Metric Unit    Metric Value
    -------------------------------- --------------- ---------------
    Block Size                                                   384
    Cluster Scheduling Policy                           PolicySpread
    Elapsed Cycles                cycle       76,613
    -------------------------------- --------------- ---------------

    OPT   Est. Speedup: 3.03%
          The grid for this launch is configured to execute only 128 blocks    less than 132
  other_kernel (1024, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us         4.45
"""


def test_a_recorded_ncu_report_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RECORDED", tmp_path)
    (tmp_path / "r.txt").write_text(NCU)
    cmd, said, launches = results.read_ncu("r.txt")
    assert cmd == "ncu --section LaunchStats python prog.py"
    assert said == ["what the program printed"]          # ncu's process line left out
    first, second = launches
    assert (first.short_name, first.grid, first.block) == ("ns::kern", (2, 64, 1), (384, 1, 1))
    assert first.metrics == {"Block Size": 384.0, "Elapsed Cycles": 76613.0}   # numbers only
    assert (second.short_name, second["Duration"]) == ("other_kernel", 4.45)
    (tmp_path / "bad.txt").write_text("no command line\n")
    with pytest.raises(ValueError, match="command"):
        results.read_ncu("bad.txt")


def test_every_shipped_ncu_recording_names_its_command_and_launches():
    for path in sorted(results.RECORDED.glob("ncu_*.txt")):
        cmd, _, launches = results.read_ncu(path.name)
        assert cmd.startswith("ncu ") and launches, path.name
        assert all(l.metrics for l in launches), path.name


def test_lesson_09s_recording_has_the_launches_the_lesson_unpacks():
    _, said, launches = results.read_ncu("ncu_k09_1024x1024x16384.txt")
    names = [l.short_name for l in launches]
    assert len(names) == 6 and "bias" in names[0] and "splitK" in names[2]
    assert "splitKreduce" in names[3] and names[4] == names[5] == "fused_tma_splitk_kernel"
    assert any("autotuner picked" in line for line in said)


def test_geomean_is_the_one_average_of_ratios():
    from gemm_lessons.common import geomean
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert geomean(iter([4.0])) == pytest.approx(4.0)
    assert geomean([]) != geomean([])                     # NaN for none
