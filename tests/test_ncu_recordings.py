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
