"""The simulator instruments: sectors per global request, bank-conflict ways per shared request."""
import gemm_lessons as gl  # noqa: I001  (before numba: it picks the engine)
import torch
from numba import cuda
from gemm_lessons import counters, harness
from gemm_lessons.counters import Access, bank_ways, sectors_per_request


def acc(addrs, nbytes=4, space="shared"):
    return [Access(space, "x", "load", (0, 0, 0), 0, i, 0, a, nbytes) for i, a in enumerate(addrs)]


def test_sector_arithmetic():
    assert sectors_per_request(acc([4 * i for i in range(32)])) == 4          # coalesced fp32
    assert sectors_per_request(acc([4 * 64 * i for i in range(32)])) == 32    # a column walk
    assert sectors_per_request(acc([128] * 32)) == 1                          # broadcast
    assert sectors_per_request(acc([16 * i for i in range(32)], 16)) == 16    # float4 per lane


def test_bank_arithmetic():
    assert bank_ways(acc([4 * i for i in range(32)])) == 1            # one word per bank
    assert bank_ways(acc([0] * 32)) == 1                              # broadcast, no conflict
    assert bank_ways(acc([4 * 32 * i for i in range(32)])) == 32      # stride 32 words: one bank
    assert bank_ways(acc([4 * 33 * i for i in range(32)])) == 1       # padded stride 33
    assert bank_ways(acc([8 * i for i in range(32)])) == 2            # stride 2 words


def test_lesson01_sectors_naive_vs_coalesced():
    a, b = harness.make_operands(64, 64, 8)
    c = torch.empty(64, 64)
    found = {}
    for name in ("k01_naive", "k01_coalesced"):
        with counters.trace(A=a, B=b, C=c) as t:
            gl.matmul(a, b, kernel=name, out=c)
        found[name] = t.global_summary()
    assert found["k01_naive"] == {"A": {"load": 32.0}, "B": {"load": 1.0}, "C": {"store": 32.0}}
    assert found["k01_coalesced"] == {"A": {"load": 1.0}, "B": {"load": 4.0}, "C": {"store": 4.0}}
    assert torch.allclose(c, a @ b, atol=1e-5)   # tracing does not change the result


def test_shared_memory_ways_row_vs_column_walk():
    @cuda.jit
    def walk(out, by_column):
        s = cuda.shared.array((32, 32), dtype=out.dtype)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        s[ty, tx] = tx + 32 * ty
        cuda.syncthreads()
        out[ty, tx] = s[tx, ty] if by_column else s[ty, tx]

    for by_column, ways in ((False, 1), (True, 32)):
        out = torch.empty(32, 32)
        with counters.trace() as t:
            walk[1, (32, 4)](gl.engines.as_numba(out), by_column)
        assert t.max_shared_ways("load") == ways
        assert t.max_shared_ways("store") == 1


def test_simulate_gives_the_same_counts_from_a_gpu_process(monkeypatch):
    # on a GPU, simulate() runs the simulator in a child process: exercise that path here
    from gemm_lessons import common
    here = counters.simulate("k01_naive", 64, 32, 8).global_summary()
    monkeypatch.setattr(common, "simulated", lambda: False)
    child = counters.simulate("k01_naive", 64, 32, 8).global_summary()
    assert here == child == {"A": {"load": 32.0}, "B": {"load": 1.0}, "C": {"store": 32.0}}
