"""python -m gemm_lessons: info, check, ladder, ptx."""
import pytest
import torch

from gemm_lessons import __main__ as cli

GPU = torch.cuda.is_available()


def test_info(py):
    r = py(None, args=["-m", "gemm_lessons", "info"])
    assert r.returncode == 0, r.stderr
    for word in ("engine:", "torch:", "triton:", "numba-cuda:", "k01_naive"):
        assert word in r.stdout


def test_check_one_kernel_and_unknown(py):
    # stderr is a pipe here, as in a log: no progress bar is written, even without --quiet
    r = py(None, args=["-m", "gemm_lessons", "check", "--kernel", "k01_coalesced"])
    assert r.returncode == 0, r.stderr
    assert "k01_coalesced: correct on 9 shapes (float32)" in r.stdout
    assert "\r" not in r.stderr and "k01_coalesced" not in r.stderr, r.stderr
    r = py(None, args=["-m", "gemm_lessons", "check", "--kernel", "nope"])
    assert r.returncode == 2 and "known kernels" in r.stderr


def test_check_exits_nonzero_on_a_wrong_kernel(monkeypatch, capsys):
    from gemm_lessons.kernels import k01_naive
    # the launcher looks its kernel up at call time: swap in the other mapping, whose grid
    # then covers the wrong part of C
    monkeypatch.setattr(k01_naive, "coalesced_kernel", k01_naive.naive_kernel)
    assert cli.main(["check", "--kernel", "k01_coalesced", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAILED k01_coalesced is wrong on" in out and "Likely cause" in out


def test_progress_bar_only_where_someone_watches(monkeypatch, capsys):
    import gemm_lessons as gl
    from gemm_lessons import guard

    def check(name, progress=None, **kw):       # nine shapes, each reported
        for _ in range(9):
            progress()
        return f"{name}: correct on 9 shapes (float32)"
    monkeypatch.setattr(gl, "check", check)
    for watched, quiet in ((True, False), (True, True), (False, False)):
        monkeypatch.setattr(guard, "interactive", lambda: watched)
        assert cli.main(["check", "--kernel", "k01_naive"] + ["--quiet"] * quiet) == 0
        out, err = capsys.readouterr()
        assert "k01_naive: correct on 9 shapes" in out
        assert ("0/9" in err) == (watched and not quiet), (watched, quiet, err)


@pytest.mark.skipif(GPU, reason="the no-GPU path")
def test_ladder_without_gpu_checks_and_explains(py):
    r = py(None, args=["-m", "gemm_lessons", "ladder", "--kernel", "k01_naive"])
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "ladder" not in r.stderr, r.stderr      # no bar in a pipe
    assert "timings need a GPU" in r.stdout
    assert "k01_naive: correct on the shape suite" in r.stdout


def test_ptx_without_gpu(py):
    r = py(None, args=["-m", "gemm_lessons", "ptx", "k01_coalesced", "--cc", "90",
                       "--grep", r"ld\.global\.f32"])
    assert r.returncode == 0, r.stderr
    assert "ld.global.f32" in r.stdout and "lines match" in r.stdout
    r = py(None, args=["-m", "gemm_lessons", "ptx", "k01_coalesced", "--resources"])
    assert r.returncode == 0 and "registers" in r.stdout and "spill_stores 0" in r.stdout


def test_ladder_table_formats_results():
    from gemm_lessons.harness import BenchResult
    r = BenchResult("k01_naive", torch.float32, 4096, 4096, 4096, ms=100.0, baseline_ms=5.0)
    table = cli.ladder_table([(1, r)])
    assert "| k01_naive | 01 | float32 | 4096 | 100.000 | 1.4 | 27.5 | 0.05 |" in table


# ---- bad arguments: one line on stderr, exit code 2, before anything compiles --------------

BAD = [
    (["ptx", "k01_naive", "--cc", "abc"],
     "--cc: expected a compute capability like 90 or 9.0, got 'abc'"),
    (["ptx", "k01_naive", "--cc", "9.x"], "--cc: expected a compute capability"),
    (["ptx", "k01_naive", "--cc", "2.0"], "older than any GPU"),
    (["ptx", "k01_naive", "--grep", "["], "--grep: not a regular expression: '['"),
    (["ptx", "k07_triton_swizzle"], "k07_triton_swizzle is a triton kernel: it has no numba PTX"),
    (["ptx", "nope"], "unknown kernel 'nope'; known kernels: k01_naive"),
    (["ladder", "--size", "-5"], "--size: expected a size from 1 to 65536, got -5"),
    (["ladder", "--size", "0"], "--size: expected a size from 1 to 65536, got 0"),
    (["ladder", "--size", "1e3"], "--size: expected a whole number like 4096, got '1e3'"),
    (["ladder", "--size", "100000"], "--size: expected a size from 1 to 65536, got 100000"),
    (["ladder", "--kernel", "nope"], "unknown kernel 'nope'"),
    (["ladder", "--out", "/no/such/folder/x.png"], "--out: no such folder"),
    (["ladder", "--csv", "/no/such/folder/x.csv"], "--csv: no such folder"),
    (["check", "--kernel", "k01_naive", "nope"], "unknown kernel 'nope'"),
    (["check", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["bogus"], "invalid choice: 'bogus'"),
    ([], "the following arguments are required"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) or "nothing" for a, _ in BAD])
def test_bad_argument_one_line_exit_2(argv, message, capsys, monkeypatch):
    # in-process, through the same main() that both entry points call; nothing may compile
    from gemm_lessons import compiled
    monkeypatch.setattr(compiled, "ptx", lambda *a, **k: pytest.fail("compiled before "
                                                                      "checking arguments"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert message in err, err
    assert "Traceback" not in err


def test_bad_argument_in_a_real_process(py):
    # the `python -m` path end to end: one line, exit code 2, no child traceback
    for argv, message in [(["ptx", "k01_naive", "--cc", "abc"], BAD[0][1]),
                          (["ptx", "k07_triton_swizzle"], BAD[4][1])]:
        r = py(None, args=["-m", "gemm_lessons", *argv], timeout=300)
        assert r.returncode == 2, r.stderr
        assert r.stdout == "" and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_compute_capability_forms():
    for text, cc in (("90", (9, 0)), ("9.0", (9, 0)), ("sm_90", (9, 0)), ("90a", (9, 0)),
                     ("80", (8, 0)), ("8.6", (8, 6)), ("100", (10, 0)), ("12.0", (12, 0)),
                     ("75", (7, 5))):
        assert cli._compute_capability(text) == cc, text


def test_help_has_examples_and_version(capsys):
    import gemm_lessons
    for argv in (["--help"], ["ptx", "--help"], ["ladder", "--help"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and "gemm-lessons ptx k01_coalesced --cc 90" in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"gemm_lessons {gemm_lessons.__version__}"


# the console script pip writes: `from gemm_lessons.__main__ import main; sys.exit(main())`
SCRIPT = "import sys; from gemm_lessons.__main__ import main; sys.exit(main())"


@pytest.mark.parametrize("entry", ["python -m", "script"])
def test_info_into_a_closed_pipe_ends_quietly(entry):
    # `gemm-lessons info | head -1`, made certain: the reader has left before the first write
    import os
    import subprocess
    import sys
    from pathlib import Path
    cmd = [sys.executable, "-m", "gemm_lessons", "info"] if entry == "python -m" else \
        [sys.executable, "-c", SCRIPT, "info"]
    env = {k: v for k, v in os.environ.items() if k != "GEMM_LESSONS_ENGINE"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr \
        and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


def test_ladder_without_timings_writes_no_plot(tmp_path, capsys):
    if GPU:
        pytest.skip("the no-GPU path")
    out = tmp_path / "ladder.png"
    rc = cli.main(["ladder", "--kernel", "k01_naive", "--size", "8", "--quiet",
                   "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert not out.exists() and "wrote" not in text
