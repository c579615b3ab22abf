"""Lesson 04, step 8: the overlapped main loop - the finished SIMT kernel.

``k04_register_tiling`` is ``k04_double_buffer`` with the main loop CUTLASS's SIMT GEMM
uses. numba has no ``#pragma unroll`` and LLVM does not unroll a loop of TM x TN
multiply-adds per k by itself, so the BK steps of a tile are written out while the kernel is
built (``unrolled``): every register index and shared-memory offset is a constant. Each step
loads the *next* k's fragments into one register set while it multiplies the other set, so
no multiply-add waits for shared memory. Before the last step of a tile the next tile goes
from registers into the other buffer and the one barrier is taken: the last step's
multiply-adds hide the next tile's first fragment loads.

Shapes and strides: as ``k04_vectorized`` (float4-ready operands from the launcher; the
kernel masks the M, N and K edges).
"""
from functools import lru_cache

from numba import cuda, float32, int64

from ..ptx_simt import SMEM_ALIGN, launch_bounds, ld_global_v4, ld_shared_v4, st_global_v4, st_shared_v4
from .k04_tiles import Tiles, config, unrolled, vector_launch


@lru_cache(maxsize=None)
def make_register_tiling(BM, BN, BK, WM, WN, TM, TN):
    """Double-buffered thread tiles with the main loop of CUTLASS's SIMT GEMM: each tile's
    BK steps written out, each step loading the next k's fragments before it multiplies;
    the next tile stored, and the barrier taken, before the last step."""
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

    # A tile is BK - 1 calls of k_step(j), j a constant (see unrolled), then the last step,
    # in tile(). Every step loads the next k's fragments into one set of registers
    # while it multiplies the other set (set j % 2 holds step j's).
    @cuda.jit(device=True, inline="always")
    def k_step(j, frag):
        """Step j (< BK - 1) of the tile whose shared buffer starts at row ``buf``."""
        sA, sB, buf, am, bn, rA, rB, acc = frag
        load_fragments(sA, sB, buf + j + 1, am, bn, rA, rB, (j + 1) % 2)
        outer_product(rA, rB, j % 2, acc)

    first_steps = unrolled(k_step, BK - 1)

    @cuda.jit(device=True, inline="always")
    def tile(A, B, sA, sB, buf, k0, ix, rowsA, colB, am, bn, gA, gB, rA, rB, acc):
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

    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))
    def register_tiling(A, B, C, vec_c):
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
        # the first tile in buffer 0, the second on its way, the fragments of k = 0
        store_tile(sA, sB, 0, ix[0], ix[1], ix[2], ix[3], gA, gB)
        if 2 * BK <= K:
            load_tile(A, B, BK, rowsA, ix[1], ix[2], colB, gA, gB, False)
        elif BK < K:
            load_tile(A, B, BK, rowsA, ix[1], ix[2], colB, gA, gB, True)
        cuda.syncthreads()
        load_fragments(sA, sB, 0, am, bn, rA, rB, 0)
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

    register_tiling.threads = NT
    register_tiling.launch_bounds = (NT, MIN_BLOCKS)
    return register_tiling


def register_tiling(a, b, c, **cfg):
    """C = A @ B, the finished SIMT kernel. Copies A or B into a zero-padded buffer unless
    its rows are contiguous, 16-byte aligned and a multiple of 4 wide (float4 loads); masks
    the M, N, K edges in the kernel."""
    cfg = cfg or config("k04_register_tiling")
    kernel = make_register_tiling(**cfg)
    vector_launch(kernel, a, b, c, cfg["BM"], cfg["BN"], kernel.threads)


# ------------------------------------------------------------- lesson 04's registry entries
# (here, in the order a learner meets them; the step modules hold no entries of their own)
from . import FP32, Kernel  # noqa: E402
from .k04_double_buffer import double_buffer, make_double_buffer, make_prefetch, prefetch  # noqa: E402
from .k04_tiles import GPU_CONFIGS, SIM_CONFIGS, SIG, SIG_VEC  # noqa: E402,F401
from .k04_tiling import make_1d_tiling, make_2d_tiling, tiling_1d, tiling_2d  # noqa: E402
from .k04_vectorized import make_vectorized, vectorized  # noqa: E402
from .k04_warp_tiling import make_thread_tile, make_warp_tiling, thread_tile, warp_tiling  # noqa: E402


def _ptx(name, make, sig):
    """The ``ptx`` hook: the GPU configuration's Python function, signature and options."""
    def hook(cc):
        k = make(**GPU_CONFIGS[name])
        bounds = getattr(k, "launch_bounds", None)
        return (k.py_func, sig) + (({"launch_bounds": bounds},) if bounds else ())
    return hook


_STEPS = [
    ("k04_1d_tiling", "1-D register tiling: TM outputs per thread, one B value reused TM times",
     tiling_1d, make_1d_tiling, SIG),
    ("k04_2d_tiling", "2-D register tiling: TM x TN outputs per thread from register fragments",
     tiling_2d, make_2d_tiling, SIG),
    ("k04_vectorized", "2-D register tiling with float4 loads: A tile transposed in shared memory",
     vectorized, make_vectorized, SIG_VEC),
    ("k04_warp_tiling", "warp tiles: a warp's fragment loads read consecutive float4s",
     warp_tiling, make_warp_tiling, SIG_VEC),
    ("k04_thread_tile", "an 8 x 16 register tile per thread, two fragment sets, launch bounds",
     thread_tile, make_thread_tile, SIG_VEC),
    ("k04_prefetch", "the next tile loaded into registers while this one is multiplied",
     prefetch, make_prefetch, SIG_VEC),
    ("k04_double_buffer", "two shared buffers: one barrier per tile",
     double_buffer, make_double_buffer, SIG_VEC),
    ("k04_register_tiling", "the overlapped main loop: the finished SIMT GEMM",
     register_tiling, make_register_tiling, SIG_VEC),
]
KERNELS = [Kernel(name, 4, "numba", FP32, summary, launch=launch, source=make,
                  ptx=_ptx(name, make, sig),
                  configs={"gpu": GPU_CONFIGS[name], "simulator": SIM_CONFIGS[name]})
           for name, summary, launch, make, sig in _STEPS]
