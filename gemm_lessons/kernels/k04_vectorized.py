"""Lesson 04, step 3: 128-bit loads, the A tile transposed in shared memory.

``k04_vectorized`` is ``k04_2d_tiling`` with float4 loads: the A tile is stored
*transposed* in shared memory (``sA[k, m]``), so the TM values a thread needs are contiguous
and arrive as float4s; global loads and the B fragments are float4s too
(``gemm_lessons.ptx_simt``: one LLVM vector load or store per call, one PTX instruction).

Shapes and strides: float4 loads need rows that are contiguous and 16-byte aligned, with K
a multiple of 4 (for A) and N a multiple of 4 (for B). The launcher passes operands that
qualify as they are (any 4096 x 4096 torch tensor does) and copies the others into
zero-padded buffers (``k04_tiles.padded4``); the kernel masks the M, N and K edges.
``launch_unpadded`` leaves the copy out: the lesson's deliberate bug.
"""
from functools import lru_cache

from numba import cuda, float32

from .. import engines
from ..common import cdiv
from ..ptx_simt import SMEM_ALIGN, ld_global_v4, ld_shared_v4, st_global_v4, st_shared_v4
from .k04_tiles import Tiles, config, vector_launch


@lru_cache(maxsize=None)
def make_vectorized(BM, BN, BK, TM, TN):
    """2-D tiling with 128-bit loads: A tile transposed in shared memory (sA[k, m])."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN)
    TCOLS = BN // TN                  # threads across the block tile
    NT = tiles.threads                # threads per block: (BM/TM) x (BN/TN)
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    PAD = 4                           # sA rows padded by 4 words: conflict-free transposed stores
    SA = (BK, BM + PAD)
    SB = (BK, BN)
    _, _, A_ROWS, B_ROWS = tiles.loads(vec=4)   # tile rows the block loads per float4 step

    @cuda.jit
    def vectorized(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (k, m): A transposed
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (k, n)
        rA = cuda.local.array(TM, float32)          # a column of A's tile, in registers
        rB = cuda.local.array(TN, float32)          # a row of B's tile, in registers
        acc = cuda.local.array((TM, TN), float32)
        M, N = C.shape
        K = A.shape[1]                 # A and B are float4-ready: widths multiples of 4
        KB = B.shape[0]
        NB = B.shape[1]
        t = cuda.threadIdx.x
        tm = t // TCOLS             # the thread's tile: rows tm*TM.., columns tn*TN..
        tn = t % TCOLS
        ar, ac = t // KQ, (t % KQ) * 4     # its float4s: A[m0 + ar + i*A_ROWS, k0 + ac..+3]
        br, bc = t // NQ, (t % NQ) * 4     # and B[k0 + br + i*B_ROWS, n0 + bc..+3]
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):         # the A tile (0 outside A)
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    v = ld_global_v4(A, m0 + r, k0 + ac)    # one float4 along k...
                else:
                    v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
                for q in range(4):                 # ...stored transposed: sA[k, m]
                    sA[ac + q, r] = v[q]
            for i in range(BK // B_ROWS):         # the B tile (0 outside B)
                r = br + i * B_ROWS
                if k0 + r < KB and n0 + bc < NB:
                    v = ld_global_v4(B, k0 + r, n0 + bc)    # one float4 along n...
                else:
                    v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
                st_shared_v4(sB, r, bc, v)                 # ...stored as it is
            cuda.syncthreads()
            k = 0
            while k < BK:           # (a while loop: numba's range() adds bookkeeping here)
                for g in range(TM // 4):           # TM/4 float4 loads of A's column k
                    a = ld_shared_v4(sA, k, tm * TM + 4 * g)
                    for q in range(4):
                        rA[4 * g + q] = a[q]
                for h in range(TN // 4):           # TN/4 float4 loads of B's row k
                    b = ld_shared_v4(sB, k, tn * TN + 4 * h)
                    for q in range(4):
                        rB[4 * h + q] = b[q]
                for i in range(TM):                 # ...feed TM * TN multiply-adds
                    for j in range(TN):
                        acc[i, j] += rA[i] * rB[j]
                k += 1
            cuda.syncthreads()
        for i in range(TM):
            row = m0 + tm * TM + i
            if row < M:
                for h in range(TN // 4):
                    col = n0 + tn * TN + 4 * h
                    if vec_c and col + 3 < N:      # one 128-bit store
                        st_global_v4(C, row, col, (acc[i, 4 * h], acc[i, 4 * h + 1],
                                                   acc[i, 4 * h + 2], acc[i, 4 * h + 3]))
                    else:
                        for q in range(4):
                            if col + q < N:
                                C[row, col + q] = acc[i, 4 * h + q]

    return vectorized


def vectorized(a, b, c, **cfg):
    """C = A @ B with float4 loads. Copies A or B into a zero-padded buffer unless its rows
    are contiguous, 16-byte aligned and a multiple of 4 wide; masks the M, N, K edges."""
    cfg = cfg or config("k04_vectorized")
    kernel = make_vectorized(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], Tiles(**cfg).threads)


def launch_unpadded(a, b, c, **cfg):
    """A deliberately broken launcher (lesson 04's bug demo): ``vectorized`` without the
    copy into float4-ready buffers. An operand whose rows are not 16-byte aligned (K or N
    not a multiple of 4, a transposed view) makes a float4 load misaligned: the GPU stops
    with "misaligned address", and so does the simulator."""
    cfg = cfg or config("k04_vectorized")
    M, N = c.shape
    kernel = make_vectorized(**cfg)
    a, b = a.contiguous(), b.contiguous()    # contiguous, but not padded
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(cdiv(N, cfg["BN"]), cdiv(M, cfg["BM"])), Tiles(**cfg).threads,
           engines.numba_stream()](A, B, C, 0)

