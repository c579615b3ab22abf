"""Lesson 04: register tiling, from 1 output per thread to cuBLAS speed, in four steps.

Lesson 02's kernel does one multiply-add per two shared-memory loads. Shared memory is fast,
but not that fast: the inner loop is limited by loads, not arithmetic. The cure is to make
each thread compute *several* outputs, keeping the operands it reuses in registers:

* ``k04_1d_tiling`` — each thread computes TM outputs down a column of C. One value of B,
  loaded once into a register, serves TM multiply-adds.
* ``k04_2d_tiling`` — each thread computes a TM x TN tile: per k it loads TM values of A and
  TN of B into registers (``rA``, ``rB``) and does TM * TN multiply-adds, their outer
  product. With 8 x 8: 64 FMAs per 16 loads.
* ``k04_vectorized`` — the same with 128-bit loads: the A tile is stored *transposed* in
  shared memory (``sA[k, m]``), so the TM values a thread needs are contiguous and arrive as
  float4s; global loads are float4s too (``gemm_lessons.ptx_simt``).
* ``k04_register_tiling`` — the finished kernel: warp tiling (a warp's 32 threads cover a
  compact WM x WN tile, and each thread's rows and columns are float4s spaced so that a warp
  reads shared memory without bank conflicts), larger thread tiles (16 x 8), the next tile
  loaded from global memory into registers while this one is multiplied, and two shared
  buffers, so one ``syncthreads`` per tile is enough.

Names follow the course: BM x BN block tile, BK deep; TM x TN outputs per thread; WM x WN per
warp; ``sA``/``sB`` shared tiles, ``rA``/``rB`` register fragments, ``acc`` accumulators.

Loops and registers: numba has no ``#pragma unroll``. A ``cuda.local.array`` indexed only by
constants after LLVM unrolls the small ``for i in range(TM)`` loops lives in registers
(check: no ``ld.local`` in the PTX); the k loop of the last kernel calls the one-k step twice
per trip by hand, because LLVM does not unroll a loop that large.

Shapes and strides: the first two kernels index A and B through their strides and mask at
every boundary. The last two need, for their 128-bit loads, rows that are contiguous and
16-byte aligned with K a multiple of 4 (for A) and N a multiple of 4 (for B); the launcher
passes operands that qualify as they are (any 4096 x 4096 torch tensor does) and copies
the others into zero-padded buffers. The kernels mask the remaining M, N and K edges.
"""
from functools import lru_cache

import torch
from numba import cuda, float32, int64

from .. import engines
from ..ptx_simt import SMEM_ALIGN, launch_bounds, ld_global_v4, ld_shared_v4, st_global_v4, st_shared_v4
from . import FP32, Kernel

# Simulator configs are small (each CUDA thread is a Python thread there); GPU configs large.
SIM_CONFIGS = {
    "k04_1d_tiling": dict(BM=32, BN=32, BK=8, TM=8),
    "k04_2d_tiling": dict(BM=32, BN=32, BK=4, TM=4, TN=4),
    "k04_vectorized": dict(BM=32, BN=32, BK=8, TM=4, TN=4),
    "k04_register_tiling": dict(BM=32, BN=32, BK=8, WM=32, WN=16, TM=4, TN=4),
}
GPU_CONFIGS = {
    "k04_1d_tiling": dict(BM=64, BN=64, BK=8, TM=8),
    "k04_2d_tiling": dict(BM=128, BN=128, BK=8, TM=8, TN=8),
    "k04_vectorized": dict(BM=128, BN=128, BK=8, TM=8, TN=8),
    # 8 warps of 64 x 64, 8 x 16 outputs per thread (256 threads, one block per SM), the main
    # loop overlapped with the next tile's loads (OVERLAP): the best of tools/sweep_k04.py's
    # configurations on an H200 (0.90x cuBLAS at 4096 and 8192)
    "k04_register_tiling": dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16, OVERLAP=True),
}


def config(name):
    """The tile configuration ``name`` runs with here (GPU or simulator)."""
    return dict((GPU_CONFIGS if engines.on_gpu() else SIM_CONFIGS)[name])


def _cdiv(a, b):
    return (a + b - 1) // b


def _check_loads(NT, BM, BN, BK, vec=1):
    """The tiles split evenly over the threads: each loads the same number of elements
    (float4s when vec=4) of each tile, at fixed offsets computed once."""
    if NT % (BK // vec) or NT % (BN // vec) or BM % (NT // (BK // vec)) \
            or BK % (NT // (BN // vec)):
        raise ValueError(f"tiles BM={BM}, BN={BN}, BK={BK} do not split evenly over {NT} "
                         "threads")


# ----------------------------------------------------------------------- step 1: 1-D tiles
@lru_cache(maxsize=None)
def make_1d_tiling(BM=64, BN=64, BK=8, TM=8):
    """Each thread computes TM consecutive rows of one column of C (BM/TM x BN threads)."""
    NT = (BM // TM) * BN              # threads per block
    A_ROWS, B_ROWS = NT // BK, NT // BN   # tile rows the whole block loads per step
    _check_loads(NT, BM, BN, BK)

    @cuda.jit
    def tiling_1d(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)   # (m, k)
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        acc = cuda.local.array(TM, float32)         # TM outputs, in registers
        M, K = A.shape
        N = B.shape[1]
        t = cuda.threadIdx.x
        tn = t % BN                 # the thread's column in the block tile (lanes along n)
        tm = t // BN                # its group of TM rows
        ar, ac = t // BK, t % BK    # its elements of the tiles: sA[ar + i*A_ROWS, ac] and
        br, bc = t // BN, t % BN    # sB[br + i*B_ROWS, bc] (k, then n, fastest: coalesced)
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            acc[i] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):         # the A tile (0 outside A)
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    sA[r, ac] = A[m0 + r, k0 + ac]
                else:
                    sA[r, ac] = 0.0
            for i in range(BK // B_ROWS):         # the B tile (0 outside B)
                r = br + i * B_ROWS
                if k0 + r < K and n0 + bc < N:
                    sB[r, bc] = B[k0 + r, n0 + bc]
                else:
                    sB[r, bc] = 0.0
            cuda.syncthreads()
            k = 0
            while k < BK:           # (a while loop: numba's range() adds bookkeeping here)
                b = sB[k, tn]                     # one load from shared memory...
                for i in range(TM):               # ...used by TM multiply-adds
                    acc[i] += sA[tm * TM + i, k] * b
                k += 1
            cuda.syncthreads()
        for i in range(TM):
            if m0 + tm * TM + i < M and n0 + tn < N:
                C[m0 + tm * TM + i, n0 + tn] = acc[i]

    return tiling_1d


def tiling_1d(a, b, c, **cfg):
    """C = A @ B, TM outputs per thread. Any shape (masks), any strides (no copy)."""
    cfg = cfg or config("k04_1d_tiling")
    BM, BN, TM = cfg["BM"], cfg["BN"], cfg["TM"]
    M, N = c.shape
    kernel = make_1d_tiling(**cfg)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(_cdiv(N, BN), _cdiv(M, BM)), (BM // TM) * BN, engines.numba_stream()](A, B, C)


# ----------------------------------------------------------------------- step 2: 2-D tiles
@lru_cache(maxsize=None)
def make_2d_tiling(BM=128, BN=128, BK=8, TM=8, TN=8):
    """Each thread computes a TM x TN tile of C from register fragments rA, rB."""
    TCOLS = BN // TN                  # threads across the block tile
    NT = (BM // TM) * TCOLS           # threads per block
    A_ROWS, B_ROWS = NT // BK, NT // BN   # tile rows the whole block loads per step
    _check_loads(NT, BM, BN, BK)

    @cuda.jit
    def tiling_2d(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)   # (m, k)
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        rA = cuda.local.array(TM, float32)          # a column of A's tile, in registers
        rB = cuda.local.array(TN, float32)          # a row of B's tile, in registers
        acc = cuda.local.array((TM, TN), float32)
        M, K = A.shape
        N = B.shape[1]
        t = cuda.threadIdx.x
        tm = t // TCOLS             # the thread's tile: rows tm*TM.., columns tn*TN..
        tn = t % TCOLS
        ar, ac = t // BK, t % BK    # its elements of the tiles, as in step 1
        br, bc = t // BN, t % BN
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    sA[r, ac] = A[m0 + r, k0 + ac]
                else:
                    sA[r, ac] = 0.0
            for i in range(BK // B_ROWS):
                r = br + i * B_ROWS
                if k0 + r < K and n0 + bc < N:
                    sB[r, bc] = B[k0 + r, n0 + bc]
                else:
                    sB[r, bc] = 0.0
            cuda.syncthreads()
            k = 0
            while k < BK:
                for i in range(TM):                 # TM + TN loads from shared memory...
                    rA[i] = sA[tm * TM + i, k]
                for j in range(TN):
                    rB[j] = sB[k, tn * TN + j]
                for i in range(TM):                 # ...feed TM * TN multiply-adds
                    for j in range(TN):
                        acc[i, j] += rA[i] * rB[j]
                k += 1
            cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                if m0 + tm * TM + i < M and n0 + tn * TN + j < N:
                    C[m0 + tm * TM + i, n0 + tn * TN + j] = acc[i, j]

    return tiling_2d


def tiling_2d(a, b, c, **cfg):
    """C = A @ B, TM x TN outputs per thread. Any shape (masks), any strides (no copy)."""
    cfg = cfg or config("k04_2d_tiling")
    BM, BN, TM, TN = cfg["BM"], cfg["BN"], cfg["TM"], cfg["TN"]
    M, N = c.shape
    kernel = make_2d_tiling(**cfg)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    threads = (BM // TM) * (BN // TN)
    kernel[(_cdiv(N, BN), _cdiv(M, BM)), threads, engines.numba_stream()](A, B, C)


# ------------------------------------------------------ operands for 128-bit (float4) loads
def _float4_ready(t):
    """Rows contiguous and 16-byte aligned, width a multiple of 4: float4 loads work."""
    return (t.stride(1) == 1 and t.stride(0) % 4 == 0 and t.shape[1] % 4 == 0
            and t.data_ptr() % 16 == 0)


def _padded4(t):
    """``t`` as is if float4 loads work on it, else a copy with its width rounded up to a
    multiple of 4 (zeros in the new columns), contiguous and aligned."""
    if _float4_ready(t):
        return t
    rows, cols = t.shape
    out = torch.zeros(rows, _cdiv(cols, 4) * 4, dtype=t.dtype, device=t.device)
    out[:, :cols] = t
    return out


def _vector_launch(kernel, a, b, c, BM, BN, threads):
    """Launch a float4 kernel: pad A (width K) and B (width N) if needed, then go."""
    M, N = c.shape
    a4, b4 = _padded4(a), _padded4(b)
    vec_c = int(N % 4 == 0 and c.data_ptr() % 16 == 0)   # float4 stores into C allowed
    A, B, C = engines.as_numba(a4), engines.as_numba(b4), engines.as_numba(c)
    kernel[(_cdiv(N, BN), _cdiv(M, BM)), threads, engines.numba_stream()](A, B, C, vec_c)


# ------------------------------------------------- step 3: transposed A tile, float4 loads
@lru_cache(maxsize=None)
def make_vectorized(BM=128, BN=128, BK=8, TM=8, TN=8):
    """2-D tiling with 128-bit loads: A tile transposed in shared memory (sA[k, m])."""
    TCOLS = BN // TN
    NT = (BM // TM) * TCOLS
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    PAD = 4                           # sA rows padded by 4 words: conflict-free transposed stores
    SA = (BK, BM + PAD)
    SB = (BK, BN)
    A_ROWS, B_ROWS = NT // KQ, NT // NQ   # tile rows the whole block loads per step
    _check_loads(NT, BM, BN, BK, vec=4)

    @cuda.jit
    def vectorized(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (k, m): A transposed
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (k, n)
        rA = cuda.local.array(TM, float32)
        rB = cuda.local.array(TN, float32)
        acc = cuda.local.array((TM, TN), float32)
        M, N = C.shape
        K = A.shape[1]                 # A and B are float4-ready: widths multiples of 4
        KB = B.shape[0]
        NB = B.shape[1]
        t = cuda.threadIdx.x
        tm = t // TCOLS
        tn = t % TCOLS
        ar, ac = t // KQ, (t % KQ) * 4     # its float4s: A[m0 + ar + i*A_ROWS, k0 + ac..+3]
        br, bc = t // NQ, (t % NQ) * 4     # and B[k0 + br + i*B_ROWS, n0 + bc..+3]
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):          # A tile: one float4 along k...
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    v = ld_global_v4(A, m0 + r, k0 + ac)
                else:
                    v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
                for q in range(4):                 # ...stored transposed: sA[k, m]
                    sA[ac + q, r] = v[q]
            for i in range(BK // B_ROWS):          # B tile: float4 along n, stored as is
                r = br + i * B_ROWS
                if k0 + r < KB and n0 + bc < NB:
                    v = ld_global_v4(B, k0 + r, n0 + bc)
                else:
                    v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
                st_shared_v4(sB, r, bc, v)
            cuda.syncthreads()
            k = 0
            while k < BK:
                for g in range(TM // 4):           # TM/4 float4 loads of A's column k
                    a = ld_shared_v4(sA, k, tm * TM + 4 * g)
                    for q in range(4):
                        rA[4 * g + q] = a[q]
                for h in range(TN // 4):           # TN/4 float4 loads of B's row k
                    b = ld_shared_v4(sB, k, tn * TN + 4 * h)
                    for q in range(4):
                        rB[4 * h + q] = b[q]
                for i in range(TM):
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
    threads = (cfg["BM"] // cfg["TM"]) * (cfg["BN"] // cfg["TN"])
    _vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], threads)


# --------------------------------------------- step 4: warp tiling, double buffering: final
def _unrolled(step, n):
    """A device function ``run(j, args)`` that calls ``step(j, args)``, then
    ``step(j + 1, args)``, ... ``step(j + n - 1, args)`` (``args``: a tuple): a loop unrolled
    while the kernel is built (numba has no "#pragma unroll"). Every call is inlined, so in
    ``step`` the index is a constant: ``rA[j % 2, i]`` is a register, ``buf + j`` an address
    offset, no loop counter."""
    if n == 1:
        return step
    first, rest = _unrolled(step, n // 2), _unrolled(step, n - n // 2)
    half = n // 2

    @cuda.jit(device=True, inline="always")
    def run(j, args):
        first(j, args)
        rest(j + half, args)
    return run


@lru_cache(maxsize=None)
def make_register_tiling(BM=128, BN=128, BK=8, WM=64, WN=32, TM=8, TN=8, KSTEPS=2,
                         PIPELINE=False, MIN_BLOCKS=None, OVERLAP=False):
    """The finished SIMT kernel (see the module docstring). Each warp computes a WM x WN
    tile; its lanes form an (WM/TM) x (WN/TN) grid; each thread holds TM x TN accumulators,
    as (TM/4) x (TN/4) blocks of 4 x 4 spaced a quarter-warp-tile apart.

    ``OVERLAP=True`` is the main loop of CUTLASS's SIMT GEMM: the BK steps of a tile fully
    unrolled (KSTEPS is ignored), each step loading the next k's fragments before it
    multiplies; the next tile is stored to the other shared buffer, and the barrier taken,
    *before the last step*, so that step's multiply-adds hide the wait for the next tile's
    first fragments (otherwise every warp waits for shared memory after each barrier)."""
    LM = WM // TM                     # lanes down a warp tile
    LN = WN // TN                     # lanes across it
    if LM * LN != 32:
        raise ValueError(f"a warp tile of {WM}x{WN} with {TM}x{TN} per thread needs "
                         f"{LM * LN} lanes, not 32")
    WARPS_N = BN // WN
    NT = (BM // WM) * WARPS_N * 32    # threads per block
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    A_LOADS = BM * KQ // NT           # float4s of A per thread per tile
    B_LOADS = BK * NQ // NT           # float4s of B per thread per tile
    A_ROWS, B_ROWS = NT // KQ, NT // NQ   # tile rows the whole block loads per float4 step
    if A_LOADS * NT != BM * KQ or B_LOADS * NT != BK * NQ or NT % KQ or NT % NQ:
        raise ValueError("the tiles must split evenly into float4 loads over the threads")
    if not OVERLAP and (KSTEPS not in (2, 4) or BK % KSTEPS):
        raise ValueError("KSTEPS (k per trip of the inner loop) is 2 or 4 and divides BK")
    if OVERLAP and BK % 2:
        raise ValueError("OVERLAP alternates two fragment sets over the k steps: BK is even")
    PAD = 4                           # sA rows padded: conflict-free transposed stores
    SA = (2 * BK, BM + PAD)           # two buffers: rows 0..BK-1 and BK..2BK-1
    SB = (2 * BK, BN)
    ACC = (TM, TN)
    RA = (2, TM)                      # register fragments, two sets (k even, k odd)
    RB = (2, TN)
    GA = (A_LOADS, 4)                 # the next tile, on its way from global memory
    GB = (B_LOADS, 4)
    if MIN_BLOCKS is None:            # 8 x 8 per thread fits in 128 registers: 2 blocks per SM
        MIN_BLOCKS = 2 if TM * TN <= 64 and NT * 2 * 128 <= 65536 else 1

    @cuda.jit(device=True, inline="always")
    def load_fragments(sA, sB, k, am, bn, rA, rB, s):
        """rA[s] <- the thread's TM values of column k of the A tile, rB[s] <- its TN values
        of row k of the B tile: TM/4 + TN/4 float4 loads from shared memory."""
        for g in range(TM // 4):
            a = ld_shared_v4(sA, k, am + g * 4 * LM)
            for q in range(4):
                rA[s, 4 * g + q] = a[q]
        for h in range(TN // 4):
            b = ld_shared_v4(sB, k, bn + h * 4 * LN)
            for q in range(4):
                rB[s, 4 * h + q] = b[q]

    @cuda.jit(device=True, inline="always")
    def outer_product(rA, rB, s, acc):
        """acc += rA[s] (a column) x rB[s] (a row): TM * TN multiply-adds."""
        for i in range(TM):
            for j in range(TN):
                acc[i, j] += rA[s, i] * rB[s, j]

    @cuda.jit(device=True, inline="always")
    def load_tile(A, B, k0, rowsA, ac, br, colB, gA, gB, k_edge):
        """Global -> registers: this thread's float4s of the A and B tiles at k0, from rows
        ``rowsA[i]`` of A (clamped to M - 1: read, never stored) and column ``colB`` of B
        (clamped likewise). With ``k_edge`` (the last tile), k past K reads 0."""
        K = B.shape[0]            # A may be wider than K: zero columns added by the launcher
        for i in range(A_LOADS):
            if not k_edge or k0 + ac < K:
                v = ld_global_v4(A, rowsA[i], k0 + ac)
            else:
                v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            for q in range(4):
                gA[i, q] = v[q]
        for i in range(B_LOADS):
            r = k0 + br + i * B_ROWS
            if not k_edge or r < K:
                v = ld_global_v4(B, r, colB)
            else:
                v = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            for q in range(4):
                gB[i, q] = v[q]

    @cuda.jit(device=True, inline="always")
    def store_tile(sA, sB, buf, ar, ac, br, bc, gA, gB):
        """Registers -> shared buffer ``buf`` (row offset 0 or BK); A transposed."""
        for i in range(A_LOADS):
            for q in range(4):
                sA[buf + ac + q, ar + i * A_ROWS] = gA[i, q]
        for i in range(B_LOADS):
            st_shared_v4(sB, buf + br + i * B_ROWS, bc, (gB[i, 0], gB[i, 1], gB[i, 2], gB[i, 3]))

    @cuda.jit(device=True, inline="always")
    def tile(A, B, sA, sB, buf, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc):
        """One BK-deep tile: publish the registers loaded earlier into shared buffer
        ``buf``, start loading the next tile, multiply this one."""
        ar, ac, br, bc = ix[0], ix[1], ix[2], ix[3]
        store_tile(sA, sB, buf, ar, ac, br, bc, gA, gB)
        cuda.syncthreads()        # one barrier per tile: the other buffer is the one in use
        K = B.shape[0]
        if k0 + 2 * BK <= K:      # the next tile lies inside K: no masks
            load_tile(A, B, k0 + BK, rowsA, ac, br, colB, gA, gB, False)  # in flight below
        elif k0 + BK < K:         # the last tile, cut by K
            load_tile(A, B, k0 + BK, rowsA, ac, br, colB, gA, gB, True)
        if PIPELINE:              # fragments of the first k, before the loop
            load_fragments(sA, sB, buf, am, bn, rA, rB, 0)
        k = 0
        while k < BK:             # KSTEPS k per trip, by hand: numba has no "#pragma unroll"
            if PIPELINE:          # load the next k's fragments, then multiply this k's
                load_fragments(sA, sB, buf + k + 1, am, bn, rA, rB, 1)
                outer_product(rA, rB, 0, acc)
                if KSTEPS == 4:
                    load_fragments(sA, sB, buf + k + 2, am, bn, rA, rB, 0)
                    outer_product(rA, rB, 1, acc)
                    load_fragments(sA, sB, buf + k + 3, am, bn, rA, rB, 1)
                    outer_product(rA, rB, 0, acc)
                if k + KSTEPS < BK:
                    load_fragments(sA, sB, buf + k + KSTEPS, am, bn, rA, rB, 0)
                outer_product(rA, rB, 1, acc)
            else:                 # load, multiply; ptxas moves the loads up where it can
                load_fragments(sA, sB, buf + k, am, bn, rA, rB, 0)
                outer_product(rA, rB, 0, acc)
                load_fragments(sA, sB, buf + k + 1, am, bn, rA, rB, 1)
                outer_product(rA, rB, 1, acc)
                if KSTEPS == 4:
                    load_fragments(sA, sB, buf + k + 2, am, bn, rA, rB, 0)
                    outer_product(rA, rB, 0, acc)
                    load_fragments(sA, sB, buf + k + 3, am, bn, rA, rB, 1)
                    outer_product(rA, rB, 1, acc)
            k += KSTEPS

    # ---- OVERLAP: a tile is BK - 1 calls of k_step(j), j a constant (see _unrolled), then
    # the last step, in overlapped_tile. Every step loads the next k's fragments into one
    # set of registers while it multiplies the other set (set j % 2 holds step j's).
    @cuda.jit(device=True, inline="always")
    def k_step(j, frag):
        """Step j (< BK - 1) of the tile whose shared buffer starts at row ``buf``."""
        sA, sB, buf, am, bn, rA, rB, acc = frag
        load_fragments(sA, sB, buf + j + 1, am, bn, rA, rB, (j + 1) % 2)
        outer_product(rA, rB, j % 2, acc)

    first_steps = _unrolled(k_step, BK - 1)

    @cuda.jit(device=True, inline="always")
    def overlapped_tile(A, B, sA, sB, buf, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc):
        """The BK-deep tile at k0, in shared buffer ``buf`` (its first fragments loaded).
        Before the last step: the next tile (in registers since the previous tile) goes to
        the other buffer, the barrier, and the one after it starts loading from global memory;
        the last step's multiply-adds then hide the next tile's first fragment loads."""
        first_steps(0, (sA, sB, buf, am, bn, rA, rB, acc))
        K = B.shape[0]
        ar, ac, br, bc = ix[0], ix[1], ix[2], ix[3]
        if k0 + BK < K:                          # there is a next tile (k0 + BK)
            store_tile(sA, sB, BK - buf, ar, ac, br, bc, gA, gB)
            if k0 + 3 * BK <= K:                 # and one after it: start loading that
                load_tile(A, B, k0 + 2 * BK, rowsA, ac, br, colB, gA, gB, False)
            elif k0 + 2 * BK < K:
                load_tile(A, B, k0 + 2 * BK, rowsA, ac, br, colB, gA, gB, True)
            cuda.syncthreads()                   # the one barrier per tile
            load_fragments(sA, sB, BK - buf, am, bn, rA, rB, BK % 2)
        outer_product(rA, rB, (BK - 1) % 2, acc)

    # launch bounds: at most 65536 / (NT * MIN_BLOCKS) registers per thread
    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))
    def register_tiling(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (buffer k, m): A^T
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (buffer k, n)
        rA = cuda.local.array(RA, float32)
        rB = cuda.local.array(RB, float32)
        acc = cuda.local.array(ACC, float32)
        gA = cuda.local.array(GA, float32)
        gB = cuda.local.array(GB, float32)
        ix = cuda.local.array(4, int64)              # tile-load offsets (see below)
        rowsA = cuda.local.array(A_LOADS, int64)     # rows of A this thread loads
        M, N = C.shape
        K = B.shape[0]
        t = cuda.threadIdx.x
        warp = t // 32
        lane = t % 32
        # the thread's first row and column in the block tile: warp tile, then lane
        am = (warp // WARPS_N) * WM + (lane // LN) * 4
        bn = (warp % WARPS_N) * WN + (lane % LN) * 4
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        # the thread's share of the tile loads: float4 i of the A tile is row ar + i*A_ROWS,
        # columns ac..ac+3; float4 i of the B tile is row br + i*B_ROWS, columns bc..bc+3
        ix[0], ix[1] = t // KQ, (t % KQ) * 4
        ix[2], ix[3] = t // NQ, (t % NQ) * 4
        for i in range(A_LOADS):
            rowsA[i] = min(m0 + ix[0] + i * A_ROWS, M - 1)
        colB = min(n0 + ix[3], B.shape[1] - 4)
        load_tile(A, B, 0, rowsA, ix[1], ix[2], colB, gA, gB, True)
        k0 = 0
        if OVERLAP:               # the first tile in buffer 0, the second on its way,
            store_tile(sA, sB, 0, ix[0], ix[1], ix[2], ix[3], gA, gB)   # fragments of k = 0
            if 2 * BK <= K:
                load_tile(A, B, BK, rowsA, ix[1], ix[2], colB, gA, gB, False)
            elif BK < K:
                load_tile(A, B, BK, rowsA, ix[1], ix[2], colB, gA, gB, True)
            cuda.syncthreads()
            load_fragments(sA, sB, 0, am, bn, rA, rB, 0)
            while k0 < K:         # two tiles per trip: buffers 0 and BK, both constants
                overlapped_tile(A, B, sA, sB, 0, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB,
                                acc)
                if k0 + BK < K:
                    overlapped_tile(A, B, sA, sB, BK, k0 + BK, ix, rowsA, colB, am, bn, gA, gB,
                                    rA, rB, acc)
                k0 += 2 * BK
        else:
            while k0 < K:         # two tiles per trip: buffers 0 and BK, both constants
                tile(A, B, sA, sB, 0, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc)
                if k0 + BK < K:
                    tile(A, B, sA, sB, BK, k0 + BK, ix, rowsA, colB, am, bn, gA, gB, rA, rB,
                         acc)
                k0 += 2 * BK
        # C = acc. Row i of the thread tile is row i % 4 of its (i // 4)-th 4 x 4 block.
        if vec_c and m0 + BM <= M and n0 + BN <= N:
            for i in range(TM):   # a block inside C: 128-bit stores, no masks
                row = m0 + am + (i // 4) * 4 * LM + i % 4
                for h in range(TN // 4):
                    st_global_v4(C, row, n0 + bn + h * 4 * LN,
                                 (acc[i, 4 * h], acc[i, 4 * h + 1], acc[i, 4 * h + 2], acc[i, 4 * h + 3]))
        else:
            for i in range(TM):   # a block on the edge of C: one masked store per element
                for j in range(TN):
                    row = m0 + am + (i // 4) * 4 * LM + i % 4
                    col = n0 + bn + (j // 4) * 4 * LN + j % 4
                    if row < M and col < N:
                        C[row, col] = acc[i, j]

    register_tiling.threads = NT
    register_tiling.launch_bounds = (NT, MIN_BLOCKS)
    return register_tiling


def register_tiling(a, b, c, **cfg):
    """C = A @ B, the finished SIMT kernel. Copies A or B into a zero-padded buffer unless
    its rows are contiguous, 16-byte aligned and a multiple of 4 wide (float4 loads); masks
    the M, N, K edges in the kernel."""
    cfg = cfg or config("k04_register_tiling")
    kernel = make_register_tiling(**cfg)
    _vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)


# ----------------------------------------------------------------------------- registry
_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
_SIG_VEC = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64)"   # vec_c: a Python int


def _ptx_final(cc):
    k = make_register_tiling(**GPU_CONFIGS["k04_register_tiling"])
    return k.py_func, _SIG_VEC, {"launch_bounds": k.launch_bounds}


KERNELS = [
    Kernel("k04_1d_tiling", 4, "numba", FP32,
           "1-D register tiling: TM outputs per thread, one B value reused TM times",
           launch=tiling_1d, source=make_1d_tiling,
           ptx=lambda cc: (make_1d_tiling(**GPU_CONFIGS["k04_1d_tiling"]).py_func, _SIG)),
    Kernel("k04_2d_tiling", 4, "numba", FP32,
           "2-D register tiling: TM x TN outputs per thread from register fragments",
           launch=tiling_2d, source=make_2d_tiling,
           ptx=lambda cc: (make_2d_tiling(**GPU_CONFIGS["k04_2d_tiling"]).py_func, _SIG)),
    Kernel("k04_vectorized", 4, "numba", FP32,
           "2-D register tiling with float4 loads: A tile transposed in shared memory",
           launch=vectorized, source=make_vectorized,
           ptx=lambda cc: (make_vectorized(**GPU_CONFIGS["k04_vectorized"]).py_func, _SIG_VEC)),
    Kernel("k04_register_tiling", 4, "numba", FP32,
           "warp tiling, conflict-free float4 fragments, double-buffered tiles: the finished SIMT GEMM",
           launch=register_tiling, source=make_register_tiling, ptx=_ptx_final),
]
