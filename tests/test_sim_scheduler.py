"""The simulator's block scheduler (gemm_lessons.sim_scheduler): same barrier semantics,
exceptions still reach the caller, and ``import gemm_lessons`` still imports no numba."""
import subprocess
import sys

import numpy as np
import pytest

import gemm_lessons as gl  # noqa: I001  (before numba: it picks the engine)
from numba import cuda, int32

pytestmark = pytest.mark.skipif(gl.backend() == "cuda", reason="the simulator's scheduler")


def test_installed_on_the_simulator_without_importing_numba_early():
    code = ("import sys, gemm_lessons\n"
            "assert 'numba' not in sys.modules\n"
            "import numba.cuda.simulator.kernel as K\n"
            "from gemm_lessons import sim_scheduler\n"
            "print(K.BlockManager.run is sim_scheduler._run)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_barriers_of_a_256_thread_block_order_every_thread():
    @cuda.jit
    def rotate(out, rounds):
        s = cuda.shared.array(256, int32)
        i = cuda.threadIdx.x
        s[i] = i
        for _ in range(rounds):
            cuda.syncthreads()
            v = s[(i + 1) % 256]          # read the neighbour's value of this round
            cuda.syncthreads()
            s[i] = v
        out[i] = s[i]

    out = np.full(256, -1, dtype=np.int32)
    rotate[1, 256](out, 5)
    assert (out == (np.arange(256) + 5) % 256).all()


def test_an_exception_in_one_thread_reaches_the_caller():
    @cuda.jit
    def fails(out):
        i = cuda.threadIdx.x
        cuda.syncthreads()
        out[i + 64 * (i == 7)] = 1.0      # thread 7 writes past the end

    with pytest.raises(IndexError):
        fails[1, 64](np.zeros(64))


@cuda.jit(device=True)
def _busy(x):
    return x + 1.0


def test_after_an_exception_no_thread_of_the_block_still_runs():
    # the other threads call a device function many times after thread 7 failed: each call
    # swaps this module's `cuda` for the simulator's; the caller must not see that
    @cuda.jit
    def fails_early(out):
        i = cuda.threadIdx.x
        if i == 7:
            out[1000] = 1.0                # thread 7 fails at once
        v = 0.0
        for _ in range(20):
            for _ in range(500):
                v = _busy(v)
            cuda.syncthreads()             # where an aborted thread stops
        out[i] = v

    import threading
    from numba.cuda.simulator.kernel import BlockThread
    with pytest.raises(IndexError):
        fails_early[1, 32](np.zeros(32))
    assert not [t for t in threading.enumerate() if isinstance(t, BlockThread) and t.is_alive()]
    assert globals()["cuda"] is cuda and hasattr(cuda, "jit")
