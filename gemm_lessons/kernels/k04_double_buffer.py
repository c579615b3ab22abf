"""Lesson 04, steps 6 and 7: the next tile loaded while this one is multiplied, then two
shared buffers.

* ``k04_prefetch`` - ``k04_thread_tile`` with its tile loads split in two: global memory ->
  registers (``load_tile``, issued right after the barrier, so the loads are in flight while
  the multiply-adds run) and registers -> shared memory (``store_tile``, at the start of the
  next tile, once the barrier after the multiply-adds says every warp is done reading).
* ``k04_double_buffer`` - two shared buffers alternate, so one ``syncthreads`` per tile is
  enough: a buffer is written only after every warp has passed the barrier that follows its
  last read.

The rows of A and the column of B a thread loads are clamped to the matrix (read, never
stored); only the last tile, cut by K, pays for masks.
"""
from functools import lru_cache

from numba import cuda, float32, int64

from ..ptx_simt import SMEM_ALIGN, launch_bounds, ld_global_v4, ld_shared_v4, st_global_v4, st_shared_v4
from .k04_tiles import Tiles, config, vector_launch


@lru_cache(maxsize=None)
def make_prefetch(BM, BN, BK, WM, WN, TM, TN):
    """Thread tiles, the next tile loaded early: from global memory into registers while
    this one is multiplied, then into shared memory once every warp is done with it."""
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
    # float4s of each tile per thread; tile rows the block loads per float4 step
    A_LOADS, B_LOADS, A_ROWS, B_ROWS = tiles.loads(vec=4)
    GA = (A_LOADS, 4)                 # the next tile, on its way from global memory
    GB = (B_LOADS, 4)
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
        """Registers -> shared memory from row ``buf`` on; A transposed."""
        for i in range(A_LOADS):
            for q in range(4):
                sA[buf + ac + q, ar + i * A_ROWS] = gA[i, q]
        for i in range(B_LOADS):
            st_shared_v4(sB, buf + br + i * B_ROWS, bc, (gB[i, 0], gB[i, 1], gB[i, 2], gB[i, 3]))

    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))
    def prefetch(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (k, m): A transposed
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (k, n)
        rA = cuda.local.array(RA, float32)
        rB = cuda.local.array(RB, float32)
        acc = cuda.local.array(ACC, float32)
        gA = cuda.local.array(GA, float32)
        gB = cuda.local.array(GB, float32)
        rowsA = cuda.local.array(A_LOADS, int64)     # rows of A this thread loads
        M, N = C.shape
        K = B.shape[0]
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
        for i in range(A_LOADS):
            rowsA[i] = min(m0 + ar + i * A_ROWS, M - 1)
        colB = min(n0 + bc, B.shape[1] - 4)
        load_tile(A, B, 0, rowsA, ac, br, colB, gA, gB, True)
        for k0 in range(0, K, BK):
            store_tile(sA, sB, 0, ar, ac, br, bc, gA, gB)    # the tile loaded earlier
            cuda.syncthreads()
            if k0 + 2 * BK <= K:      # the next tile lies inside K: no masks
                load_tile(A, B, k0 + BK, rowsA, ac, br, colB, gA, gB, False)  # in flight below
            elif k0 + BK < K:         # the last tile, cut by K
                load_tile(A, B, k0 + BK, rowsA, ac, br, colB, gA, gB, True)
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

    prefetch.threads = NT
    prefetch.launch_bounds = (NT, MIN_BLOCKS)
    return prefetch


def prefetch(a, b, c, **cfg):
    """C = A @ B, the next tile loaded while this one is multiplied. Operands as
    ``k04_vectorized``."""
    cfg = cfg or config("k04_prefetch")
    kernel = make_prefetch(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)


@lru_cache(maxsize=None)
def make_double_buffer(BM, BN, BK, WM, WN, TM, TN):
    """Thread tiles, two shared buffers: the next tile comes from global memory into
    registers while this one is multiplied, then goes to the other buffer."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, TM=TM, TN=TN)
    LM = WM // TM                     # lanes down a warp tile
    LN = WN // TN                     # lanes across it
    WARPS_N = BN // WN
    NT = tiles.threads                # threads per block: (BM/TM) x (BN/TN)
    KQ = BK // 4                      # float4s across a row of the A tile
    NQ = BN // 4                      # float4s across a row of the B tile
    PAD = 4                           # sA rows padded by 4 words: conflict-free transposed stores
    SA = (2 * BK, BM + PAD)           # two buffers: rows 0..BK-1 and BK..2BK-1
    SB = (2 * BK, BN)
    ACC = (TM, TN)
    RA = (2, TM)                      # register fragments, two sets (k even, k odd)
    RB = (2, TN)
    # float4s of each tile per thread; tile rows the block loads per float4 step
    A_LOADS, B_LOADS, A_ROWS, B_ROWS = tiles.loads(vec=4)
    GA = (A_LOADS, 4)                 # the next tile, on its way from global memory
    GB = (B_LOADS, 4)
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
        k = 0
        while k < BK:             # (a while loop: numba's range() adds bookkeeping here)
            load_fragments(sA, sB, buf + k, am, bn, rA, rB, 0)
            outer_product(rA, rB, 0, acc)
            load_fragments(sA, sB, buf + k + 1, am, bn, rA, rB, 1)
            outer_product(rA, rB, 1, acc)
            k += 2                # two k per trip, by hand: numba has no "#pragma unroll"

    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))
    def double_buffer(A, B, C, vec_c):
        sA = cuda.shared.array(SA, float32, alignment=SMEM_ALIGN)   # (k, m): A transposed
        sB = cuda.shared.array(SB, float32, alignment=SMEM_ALIGN)   # (k, n)
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
        while k0 < K:             # two tiles per trip: buffers 0 and BK, both constants
            tile(A, B, sA, sB, 0, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc)
            if k0 + BK < K:
                tile(A, B, sA, sB, BK, k0 + BK, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc)
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

    double_buffer.threads = NT
    double_buffer.launch_bounds = (NT, MIN_BLOCKS)
    return double_buffer


def double_buffer(a, b, c, **cfg):
    """C = A @ B, two shared buffers. Operands as ``k04_vectorized``."""
    cfg = cfg or config("k04_double_buffer")
    kernel = make_double_buffer(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)
