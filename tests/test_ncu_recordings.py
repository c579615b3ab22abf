"""Lessons 04 and 07 read two Nsight Compute recordings; their prose rests on what these
recordings show. Each test reads a shipped file with ``results.read_ncu`` and checks the
claims the lessons make from it, so that a new recording that says otherwise fails here
(the notebooks' tables are compared by nbval; the reading of them is checked here)."""
import re

import gemm_lessons  # noqa: F401  (first: it picks the engine)
import pytest

from gemm_lessons import results


def test_a_value_wider_than_its_column_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RECORDED", tmp_path)
    (tmp_path / "w.txt").write_text(
        "$ ncu --metrics a,b,c prog\n"
        "  kern (1, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Section: Command line profiler metrics\n"
        "    a                                    inst 9,643,229,184\n"
        "    b                                    byte  170,935,808\n"
        "    c                                               0\n"
        "    Cluster Scheduling Policy            PolicySpread\n")
    (launch,) = results.read_ncu("w.txt")[2]
    assert launch.metrics == {"a": 9643229184.0, "b": 170935808.0, "c": 0.0}


# ------------------------------------------------------------------ lesson 04: every step
def _k04():
    """{kernel: metrics} of ncu_k04_steps.txt in the order it profiled them, and the FFMAs
    (warp-wide) of one launch."""
    _, said, launches = results.read_ncu("ncu_k04_steps.txt")
    n = int(re.search(r"fp32 (\d+)x\1x\1", said[1]).group(1))
    order = said[1].split("in this order: ")[1].split(", ")
    assert len(order) == len(launches)
    return dict(zip(order, (l.metrics for l in launches))), n ** 3 / 32, said


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"


def _stalls(m):
    """Stall reasons (cycles per issued instruction) other than an issuing warp's own."""
    out = {k.split("stalled_")[1].split("_per_")[0]: v for k, v in m.items() if "stalled_" in k}
    return {k: v for k, v in out.items() if k not in ("selected", "not_selected")}


def _ratio(steps, before, after, value):
    return value(steps[after]) / value(steps[before])


def instr(ffma):
    return lambda m: m["smsp__inst_executed.sum"] / ffma


def lds(ffma):
    return lambda m: m["smsp__inst_executed_op_shared_ld.sum"] / ffma


def wavefronts(ffma):
    return lambda m: m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] / ffma


def conflicts(m):
    return (m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
            / m["smsp__inst_executed_op_shared_ld.sum"])


def issue(m):
    return m[ISSUE]


def time(m):
    return m["gpu__time_duration.sum"]


def warps(m):
    return m["sm__warps_active.avg.pct_of_peak_sustained_active"]


def stall(reason):
    return lambda m: m[STALL.format(reason)]


def test_k04_recording_is_an_h100_run_of_lesson_02_then_every_step(tool):
    steps, ffma, said = _k04()
    assert "H100" in said[0]                  # the lesson says H100 on every table
    assert list(steps) == tool("ncu_k04_steps").STEPS
    assert all(len(m) == 23 for m in steps.values())    # every metric read, none dropped


def test_k04_instructions_over_issue_share_account_for_the_time():
    steps, ffma, _ = _k04()
    clocks = [m["smsp__inst_executed.sum"] / (132 * 4) / (issue(m) / 100) / time(m)
              for m in steps.values()]
    assert max(clocks) / min(clocks) < 1.04 and 1.4 < min(clocks) < 1.7     # "nearly the same"


def test_k04_shared_loads_are_the_sass_counts_the_lesson_quotes():
    steps, ffma, _ = _k04()
    assert lds(ffma)(steps["k02_smem_tiling"]) == pytest.approx(1.25)       # per k, 1 FFMA
    assert 8 * lds(ffma)(steps["k04_1d_tiling"]) == pytest.approx(3.75)    # per k, 8 FFMAs


def test_k04_step_1_halves_the_instructions_and_the_queue_waits():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k02_smem_tiling", "k04_1d_tiling", v)
    k02 = _stalls(s["k02_smem_tiling"])
    assert sorted(k02, key=k02.get)[-2:] in (["long_scoreboard", "mio_throttle"],
                                             ["mio_throttle", "long_scoreboard"])
    assert 0.45 < r(instr(f)) < 0.55 and r(lds(f)) < 0.5 and r(wavefronts(f)) < 0.5
    assert 0.28 < r(stall("mio_throttle")) < 0.4 and r(issue) > 1.3
    grow = lambda k: stall(k)(s["k04_1d_tiling"]) - stall(k)(s["k02_smem_tiling"])
    assert 0 < grow("short_scoreboard") < -grow("mio_throttle")   # "grow, by less"
    assert 0.28 < r(time) < 0.38


def test_k04_step_2_conflicts_raise_the_wavefronts_and_the_shared_memory_wait():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_1d_tiling", "k04_2d_tiling", v)
    assert 0.45 < r(lds(f)) < 0.55 and conflicts(s["k04_2d_tiling"]) == pytest.approx(2, abs=0.01)
    assert r(wavefronts(f)) > 1 and 1.8 < r(stall("short_scoreboard")) < 2.2
    st = _stalls(s["k04_2d_tiling"])
    assert max(st, key=st.get) == "short_scoreboard"
    assert r(warps) == pytest.approx(0.5, abs=0.02)
    assert r(instr(f)) < 1 and r(issue) < 1 and r(time) > 1


def test_k04_step_3_quarter_the_shared_loads_same_conflicts_per_load():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_2d_tiling", "k04_vectorized", v)
    assert r(lds(f)) == pytest.approx(0.25) and r(wavefronts(f)) < 1
    assert conflicts(s["k04_vectorized"]) == pytest.approx(2, abs=0.01)
    assert 0.12 < r(stall("short_scoreboard")) < 0.16           # "to a seventh"
    assert 0.6 < r(instr(f)) < 0.72 and r(issue) > 1             # "by a third"
    assert r(warps) == pytest.approx(0.5, abs=0.02)


def test_k04_step_4_removes_the_conflicts_but_not_the_global_memory_wait():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_vectorized", "k04_warp_tiling", v)
    assert conflicts(s["k04_warp_tiling"]) == 0 and r(stall("short_scoreboard")) < 1
    for name in ("k04_vectorized", "k04_warp_tiling"):
        st = _stalls(s[name])
        assert max(st, key=st.get) == "long_scoreboard", name
    assert 0.95 < r(stall("long_scoreboard")) < 1.05 and 0.9 < r(time) < 1


def test_k04_step_5_pays_through_the_block_tile():
    from gemm_lessons.kernels.k04_tiles import GPU_CONFIGS as G, Tiles
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_warp_tiling", "k04_thread_tile", v)
    assert 0.7 < r(lds(f)) < 0.9 and 0.7 < r(wavefronts(f)) < 0.9          # "small"
    assert 0.9 < r(instr(f)) < 1                                          # "fall a little"
    assert 0.5 < r(stall("long_scoreboard")) < 0.65 and 0.5 < r(stall("barrier")) < 0.65
    a, b = G["k04_warp_tiling"], G["k04_thread_tile"]
    assert (b["BM"], b["BN"]) == (128, 256) and (a["BM"], a["BN"]) == (128, 128)
    assert Tiles(**a).threads == Tiles(**b).threads == 256 and a["BK"] == b["BK"]
    assert b["TM"] * b["TN"] == 2 * a["TM"] * a["TN"]      # twice the FMAs per tile


def test_k04_step_6_ends_the_global_memory_wait():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_thread_tile", "k04_prefetch", v)
    assert stall("long_scoreboard")(s["k04_prefetch"]) < 0.01
    assert 0.97 < r(instr(f)) < 1.01 and r(issue) > 1 and 0.75 < r(time) < 0.85


def test_k04_step_7_changes_nothing_measurable():
    s, f, _ = _k04()
    r = lambda v: _ratio(s, "k04_prefetch", "k04_double_buffer", v)
    for v in (time, instr(f), issue):
        assert 0.98 < r(v) < 1.02
    assert all(stall("barrier")(s[k]) < 0.1 for k in ("k04_prefetch", "k04_double_buffer"))


def test_k04_step_8_fewer_instructions_and_dispatch_stalls():
    s, f, _ = _k04()
    before, after = s["k04_double_buffer"], s["k04_register_tiling"]
    r = lambda v: v(after) / v(before)
    assert r(instr(f)) < 1 and r(issue) > 1
    assert stall("short_scoreboard")(before) < 0.3 and 0.8 < r(stall("short_scoreboard")) < 1
    falls = {k: _stalls(before)[k] - v for k, v in _stalls(after).items()}   # cycles
    assert max(falls, key=falls.get) == "dispatch_stall"


def test_k04_what_is_left_after_the_last_step():
    s, f, _ = _k04()
    m = s["k04_register_tiling"]
    not_ffma = 1 - f / m["smsp__inst_executed.sum"]
    assert 1 / 14 < not_ffma < 1 / 12                       # "about one in thirteen"
    assert 0.2 < 1 - issue(m) / 100 < 0.25                   # "more than one in five"


# ------------------------------------------------------------------ lesson 07: tile order
def _k07():
    _, said, launches = results.read_ncu("ncu_k07_tile_order.txt")
    out = {}
    for line, l in zip(said[1:], launches):
        n, order = re.search(r"(\d+)\^3 fp16 (\S+)", line).groups()
        out[int(n), order] = l.metrics
    return out, said[0]


def test_k07_recording_is_an_h100_run_of_both_orders_at_both_sizes():
    rec, device = _k07()
    assert "H100" in device
    assert set(rec) == {(n, o) for n in (4096, 8192) for o in ("grouped", "row-major")}
    assert all(len(m) == 3 for m in rec.values())


def test_k07_at_8192_grouping_reads_about_half_and_is_faster():
    from gemm_lessons.kernels import k07_triton_swizzle as k07
    rec, _ = _k07()
    g, r = rec[8192, "grouped"], rec[8192, "row-major"]
    dram, hit, t = "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct", "gpu__time_duration.sum"
    operands, b, l2 = 2 * 8192 * 8192 * 2, 8192 * 8192 * 2, 50e6
    assert b / l2 > 2                                        # "more than twice the L2"
    assert 10.5 < r[dram] / operands < 11.5                  # "about eleven times over"
    rate = lambda m: m[dram] / m[t]                          # bytes per ns = GB/s
    assert 0.45 < rate(r) / 3350 < 0.6                       # "half of the DRAM bandwidth"
    assert all(rate(m) / 3350 < 0.35 for k, m in rec.items() if k != (8192, "row-major"))
    assert 0.45 < g[dram] / r[dram] < 0.55 and g[hit] > r[hit] and g[t] < r[t]
    assert k07.first_wave(8192, 8192, 128, 256, 1, 132) == (5, 32)
    assert k07.first_wave(8192, 8192, 128, 256, 8, 132) == (8, 17)
    model = (k07.wave_traffic(8192, 8192, 128, 256, 8, 132)
             / k07.wave_traffic(8192, 8192, 128, 256, 1, 132))
    assert model > g[dram] / r[dram]                         # the model's saving is smaller


def test_k07_at_4096_the_order_matters_little():
    from gemm_lessons.kernels import k07_triton_swizzle as k07
    rec, _ = _k07()
    g, r = rec[4096, "grouped"], rec[4096, "row-major"]
    dram, hit, t = "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct", "gpu__time_duration.sum"
    assert 4096 * 4096 * 2 < 50e6                             # B fits in L2
    assert all(2 < m[dram] / (2 * 4096 * 4096 * 2) < 3 for m in (g, r))
    assert g[dram] > r[dram] and g[hit] < r[hit] and 0.95 < g[t] / r[t] < 1
    assert k07.wave_traffic(4096, 4096, 128, 256, 8, 132) > \
        k07.wave_traffic(4096, 4096, 128, 256, 1, 132)      # the model predicted more bytes
    assert 8 * 4096 // 256 == 128                             # one group: 8 rows of 16 tiles


def test_k07_the_h200_timings_agree_on_the_direction():
    from gemm_lessons import triton_plots
    rec = triton_plots.recorded("h200_triton_sweep.csv")
    for n in (4096, 8192):
        g = rec[("k07_triton_swizzle", "float16", n, n, n)]
        r = rec[("k07_triton_rowmajor", "float16", n, n, n)]
        assert g.ms < r.ms, n
