"""Lesson 04, steps 4 and 5: warp tiling, then a bigger register tile per thread.

* ``k04_warp_tiling`` - ``k04_vectorized`` with another map from threads to outputs. Each
  warp computes a compact WM x WN tile; its lanes form a (WM/TM) x (WN/TN) grid; a thread's
  TM x TN outputs are (TM/4) x (TN/4) blocks of 4 x 4 spaced a quarter-warp-tile apart. The
  lanes of a warp then read consecutive float4s of ``sA[k, :]`` and ``sB[k, :]``: no bank
  conflict on the fragment loads.
* ``k04_thread_tile`` - the register tile grows to 8 x 16 (128 accumulators). The one-k
  work becomes two device functions, ``load_fragments`` and ``outer_product``, called for
  two k per trip with two sets of fragment registers, so the next k's loads need not wait
  for this k's multiply-adds; ``launch_bounds`` tells ptxas how many registers a thread
  may use (65536 / (threads x blocks per SM)).

Shapes and strides: as ``k04_vectorized`` (float4-ready operands from the launcher; the
kernel masks the M, N and K edges).
"""
from functools import lru_cache

from numba import cuda, float32

from ..ptx_simt import SMEM_ALIGN, launch_bounds, ld_global_v4, ld_shared_v4, st_global_v4, st_shared_v4
from .k04_tiles import Tiles, config, vector_launch


@lru_cache(maxsize=None)
def make_warp_tiling(BM, BN, BK, WM, WN, TM, TN):
    """Warps of WM x WN; each lane a TM x TN tile of 4 x 4 blocks spaced 4*LM rows and
    4*LN columns apart, so a warp's fragment loads read consecutive float4s."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, TM=TM, TN=TN)
    LM = WM // TM                     # lanes down a warp tile
    LN = WN // TN                     # lanes across it
    WARPS_N = BN // WN
    NT = tiles.threads                # threads per block: (BM/TM) x (BN/TN)
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    PAD = 4                           # sA rows padded by 4 words: conflict-free transposed stores
    SA = (BK, BM + PAD)
    SB = (BK, BN)
    _, _, A_ROWS, B_ROWS = tiles.loads(vec=4)   # tile rows the block loads per float4 step

    @cuda.jit
    def warp_tiling(A, B, C, vec_c):
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
        warp = t // 32
        lane = t % 32
        # the thread's first row and column in the block tile: warp tile, then lane
        am = (warp // WARPS_N) * WM + (lane // LN) * 4
        bn = (warp % WARPS_N) * WN + (lane % LN) * 4
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
                    a = ld_shared_v4(sA, k, am + g * 4 * LM)   # 4*LM rows apart
                    for q in range(4):
                        rA[4 * g + q] = a[q]
                for h in range(TN // 4):           # TN/4 float4 loads of B's row k
                    b = ld_shared_v4(sB, k, bn + h * 4 * LN)
                    for q in range(4):
                        rB[4 * h + q] = b[q]
                for i in range(TM):                 # ...feed TM * TN multiply-adds
                    for j in range(TN):
                        acc[i, j] += rA[i] * rB[j]
                k += 1
            cuda.syncthreads()
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

    warp_tiling.threads = NT
    return warp_tiling


def warp_tiling(a, b, c, **cfg):
    """C = A @ B with warp tiles. Float4-ready operands as ``k04_vectorized``."""
    cfg = cfg or config("k04_warp_tiling")
    kernel = make_warp_tiling(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)


@lru_cache(maxsize=None)
def make_thread_tile(BM, BN, BK, WM, WN, TM, TN):
    """Warp tiling with a register tile of TM x TN per thread and two sets of fragments:
    two k per trip of the k loop, each loading its own set (k even: set 0, k odd: set 1)."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, TM=TM, TN=TN)
    LM = WM // TM                     # lanes down a warp tile
    LN = WN // TN                     # lanes across it
    WARPS_N = BN // WN
    NT = tiles.threads                # threads per block: (BM/TM) x (BN/TN)
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    PAD = 4                           # sA rows padded by 4 words: conflict-free transposed stores
    SA = (BK, BM + PAD)
    SB = (BK, BN)
    ACC = (TM, TN)
    RA = (2, TM)                      # register fragments, two sets (k even, k odd)
    RB = (2, TN)
    _, _, A_ROWS, B_ROWS = tiles.loads(vec=4)   # tile rows the block loads per float4 step
    # registers: at most 65536 / (NT * MIN_BLOCKS) per thread; more than 64 accumulators
    # need more than 128 registers, so such a block has an SM to itself
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

    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))
    def thread_tile(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (k, m): A transposed
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (k, n)
        rA = cuda.local.array(RA, float32)
        rB = cuda.local.array(RB, float32)
        acc = cuda.local.array(ACC, float32)
        M, N = C.shape
        K = A.shape[1]                 # A and B are float4-ready: widths multiples of 4
        KB = B.shape[0]
        NB = B.shape[1]
        t = cuda.threadIdx.x
        warp = t // 32
        lane = t % 32
        # the thread's first row and column in the block tile: warp tile, then lane
        am = (warp // WARPS_N) * WM + (lane // LN) * 4
        bn = (warp % WARPS_N) * WN + (lane % LN) * 4
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
                load_fragments(sA, sB, k, am, bn, rA, rB, 0)
                outer_product(rA, rB, 0, acc)
                load_fragments(sA, sB, k + 1, am, bn, rA, rB, 1)
                outer_product(rA, rB, 1, acc)
                k += 2            # two k per trip, by hand: numba has no "#pragma unroll"
            cuda.syncthreads()
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

    thread_tile.threads = NT
    thread_tile.launch_bounds = (NT, MIN_BLOCKS)
    return thread_tile


def thread_tile(a, b, c, **cfg):
    """C = A @ B, a TM x TN register tile per thread. Operands as ``k04_vectorized``."""
    cfg = cfg or config("k04_thread_tile")
    kernel = make_thread_tile(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)
