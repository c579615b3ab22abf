"""Lesson 06: cp.async pipelines: copies that run while the tensor cores work.

Lesson 05 loads a tile, waits (``syncthreads``), computes, waits again: while the tile
travels from global memory nothing computes, and while the warps compute nothing travels.
``cp.async`` (compute capability 8.0) starts a copy from global straight to shared memory
(no registers in between) and lets the thread go on. With STAGES shared buffers the kernel
keeps STAGES - 1 tiles in flight while it computes on one:

* STAGES = 2 is *double buffering*: load tile t + 1 while computing tile t;
* STAGES = 3 or 4 hides latency better, at (STAGES x tile) bytes of shared memory.

Per k-tile t: ``cp_async_wait_group(STAGES - 2)`` (tile t has landed, for this thread),
``syncthreads`` (for every thread, and every warp has finished reading the buffer that the
next copy overwrites), issue the copies of tile t + STAGES - 1, ``cp_async_commit_group``,
then the tensor-core math of tile t (WMMA, as in lesson 05). One barrier per k-tile. (The
copies are issued just after the first fragments of tile t are requested from shared
memory, so that the tensor cores do not wait behind the copy instructions.)

Epilogue (BLAS): ``Out = alpha * A @ B + beta * C``; ``beta == 0`` never reads C, and
``alpha == 0`` never reads A or B (the K loop runs zero times).

Shapes and strides: the kernel predicates every copy with the zero-filling form of
cp.async (``cp_async16_zfill``: chunks past M or N read fewer or no bytes and write zeros).
K is walked from its ragged end: tile 0 starts at k = -(k_tiles * BK - K), so only the
first tile needs a K check and every later one is whole. A 16-byte copy needs
16-byte-aligned rows, so the launcher passes an operand as it is when it is row-major with
a row stride that is a multiple of 8 elements and an aligned start, and otherwise
(transposed, sliced, N not a multiple of 8) copies it into a zero-padded aligned buffer;
K not a multiple of 8 is zero-padded the same way (a copy of A and B).
"""
from functools import lru_cache

import numpy as np
import torch
from numba import cuda, float32, int16, int32, int64
from numba.types import float16

from .. import engines
from .. import ptx
from ..ptx import (FRAG_AB, FRAG_C, SMEM_ALIGN, cp_async16_zfill, cp_async_commit_group,
                   cp_async_wait_group, wmma_load_a, wmma_load_b, wmma_mma, wmma_store_d)
from . import FP16_BF16, Kernel

PAD = 8          # elements of padding per shared row: 16 bytes, keeps ldmatrix conflict-free
# the fastest of tools/sweep_k05_k06.py on an H200 (0.54x cuBLAS at 8192; BK=32 without
# PREFETCH: 0.43x): 8 warps of 64x64, four 16-deep slices per tile, 4 stages = 204 KiB
GPU_CONFIG = dict(BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=4, PREFETCH=True)
SIM_CONFIG = dict(BM=32, BN=32, BK=16, WM=16, WN=16, STAGES=3)
GROUP_M = 8      # blocks that share a band of B run together (L2 reuse)


@cuda.jit(device=True, inline="always")
def grouped_block(pid, M, N, BM, BN, GROUP):
    """(first row, first column) of block ``pid``'s tile when the blocks run in bands of
    GROUP block rows that walk across N together: the band's A rows and the current B
    columns stay in L2 (lesson 07 draws this order)."""
    n_m, n_n = (M + BM - 1) // BM, (N + BN - 1) // BN
    first_m = (pid // (GROUP * n_n)) * GROUP
    group_m = min(n_m - first_m, GROUP)
    return ((first_m + (pid % (GROUP * n_n)) % group_m) * BM,
            ((pid % (GROUP * n_n)) // group_m) * BN)


@lru_cache(maxsize=None)
def make_kernel(BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=4, bf16=False, wait=True,
                GROUP_M=GROUP_M, MAXREG=None, PREFETCH=False):
    """The pipelined WMMA kernel for one configuration. ``wait=False`` builds the broken
    variant that forgets ``cp_async_wait_group`` (lesson 06 shows what it computes);
    ``MAXREG`` caps the registers per thread (ptxas ``-maxrregcount``) on a GPU, to fit more
    blocks per SM; ``PREFETCH`` loads the next k-slice's fragments during the math (and
    moves the barrier to where no fragment load waits for it)."""
    dt = int16 if bf16 else float16                      # bf16 travels as its 16 bits
    to_f32 = ptx.bf16_to_f32 if bf16 else ptx.f16_to_f32
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    WARPS_M, WARPS_N = BM // WM, BN // WN
    NT = 32 * WARPS_M * WARPS_N                          # threads per block
    FM, FN = WM // 16, WN // 16                          # fragments per warp
    LDA, LDB = BK + PAD, BN + PAD                        # shared row strides (elements)
    A_STAGE, B_STAGE = BM * LDA, BK * LDB                # elements per stage
    B_BASE = STAGES * A_STAGE                            # sB follows the A stages
    A_CPR, B_CPR = BK // 8, BN // 8                      # 16-byte chunks per tile row
    A_ITERS = (BM * A_CPR + NT - 1) // NT                # chunks per thread per tile
    B_ITERS = (BK * B_CPR + NT - 1) // NT
    A_EXACT = BM * A_CPR % NT == 0                       # every thread has A_ITERS chunks
    B_EXACT = BK * B_CPR % NT == 0
    A_ROWS, B_ROWS = NT // A_CPR, NT // B_CPR            # tile rows between a thread's chunks
    WAIT = STAGES - 2                                    # groups left in flight
    LDC = WN + 4                                         # epilogue scratch row (floats)
    C_WARP = 16 * LDC                                    # scratch floats per warp
    OUT_ITERS = 16 * WN // 32                            # epilogue elements per lane
    SMEM_BYTES = max(2 * STAGES * (A_STAGE + B_STAGE), 4 * C_WARP * NT // 32)
    KSTEPS = BK // 16                                    # 16-deep k-slices per tile
    NPARTS = KSTEPS - 1 if PREFETCH else 1               # the copies of a tile, in parts
    assert STAGES >= 2 and BK % 16 == 0 and WM % 16 == 0 and WN % 16 == 0
    assert not PREFETCH or (KSTEPS % 2 == 0 and KSTEPS <= 8), \
        "PREFETCH needs BK = 32, 64, 96 or 128"
    assert BM % WM == 0 and BN % WN == 0
    assert NT % A_CPR == 0 and NT % B_CPR == 0, "a row of chunks wider than the block"

    @cuda.jit(**({"max_registers": MAXREG} if MAXREG and engines.on_gpu() else {}))
    def cp_async_gemm(A, B, C, Out, M, N, K, lda, ldb, alpha, beta):
        # A: (M, K) and B: (K, N) as flat arrays with row strides lda, ldb (16-byte rows);
        # C: read when beta != 0; Out: (M, N), written; alpha, beta: float32
        smem = cuda.shared.array(0, dt, alignment=SMEM_ALIGN)     # STAGES x (sA, sB)
        sC = cuda.shared.array(0, float32, alignment=SMEM_ALIGN)  # epilogue (same memory)
        rA = cuda.local.array((2, FM, FRAG_AB), dt)           # two slots (PREFETCH)
        rB = cuda.local.array((2, FN, FRAG_AB), dt)
        acc = cuda.local.array((FM, FN, FRAG_C), float32)

        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WARPS_N, warp % WARPS_N
        # -- block order: GROUP_M bands of blocks walk across N together (L2 reuse)
        bm, bn = grouped_block(cuda.blockIdx.x, M, N, BM, BN, GROUP_M)

        for i in range(FM):
            for j in range(FN):
                for r in range(FRAG_C):
                    acc[i, j, r] = 0.0
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0  # alpha == 0: no product
        shift = k_tiles * BK - K             # tile 0 starts at k = -shift: only it is ragged

        # -- the copy plan, computed once. A thread's 16-byte chunks of a tile lie in one
        #    column of chunks, A_ROWS (B_ROWS) rows apart: where the first goes in a stage
        #    and where it comes from (at k = 0); chunk `it` is `it` steps further. Chunks
        #    past M or N read no bytes (0 at the N edge: fewer than 16; the rest zero-filled)
        ar, ac = tid // A_CPR, (tid % A_CPR) * 8         # first chunk of A: row, column
        a_dst = ar * LDA + ac
        a_src = (bm + ar) * lda + ac                     # int64: A may pass 2**31 elements
        a_rows = M - bm - ar                             # rows of A left from the first
        a_step = A_ROWS * lda
        br, bc = tid // B_CPR, (tid % B_CPR) * 8         # first chunk of B: row, column
        b_dst = br * LDB + bc
        b_src = br * ldb + bn + bc
        b_nb = min(16, max(0, (N - bn - bc) * 2))        # the same for all of them
        b_step = B_ROWS * ldb

        def issue(t, ws, first, part):
            # start the copies of k-tile t (k from t * BK - shift) into stage ws; only the
            # first tile (first=True) has chunks before k = 0, copied as zeros. The copies
            # of a tile come in NPARTS parts (PREFETCH spreads them over the k-slices); the
            # last part closes the tile's group
            if t < k_tiles:
                k0 = t * BK - shift
                kb = k0 * ldb
                sa = ws * A_STAGE
                sb = B_BASE + ws * B_STAGE
                for it in range(A_ITERS):
                    if it * NPARTS // A_ITERS == part and (A_EXACT or ar + it * A_ROWS < BM):
                        nb = 16 if it * A_ROWS < a_rows else 0
                        if first and k0 + ac < 0:
                            nb = 0
                        cp_async16_zfill(smem, sa + a_dst + it * A_ROWS * LDA,
                                         A, a_src + it * a_step + k0, nb)
                for it in range(B_ITERS):
                    if it * NPARTS // B_ITERS == part and (B_EXACT or br + it * B_ROWS < BK):
                        nb = b_nb
                        if first and k0 + br + it * B_ROWS < 0:
                            nb = 0
                        cp_async16_zfill(smem, sb + b_dst + it * B_ROWS * LDB,
                                         B, b_src + it * b_step + kb, nb)
            if part == NPARTS - 1:
                cp_async_commit_group()      # one group per tile (empty past the end)

        def load_fragments(slot, rs, kk):
            # this warp's FM fragments of A and FN of B, k-slice kk of the tile in stage rs
            sa = rs * A_STAGE + wm * WM * LDA + kk * 16
            sb = B_BASE + rs * B_STAGE + kk * 16 * LDB + wn * WN
            for i in range(FM):
                wmma_load_a(rA[slot, i], smem, sa + i * 16 * LDA, LDA, "row")
            for j in range(FN):
                wmma_load_b(rB[slot, j], smem, sb + j * 16, LDB, "row")

        def tensor_cores(slot):
            for i in range(FM):
                for j in range(FN):
                    wmma_mma(acc[i, j], rA[slot, i], rB[slot, j], "row", "row")

        # -- prologue: STAGES - 1 tiles in flight (tile s in stage s)
        for s in range(STAGES - 1):
            for part in range(NPARTS):
                issue(s, int32(s), s == 0, part)
        # the stages roll: tile t is read from stage rs (= t % STAGES) and tile
        # t + STAGES - 1 written to stage ws (= (t - 1) % STAGES, the one tile t - 1 used);
        # counters, not %, because % on a signed 64-bit t costs a dozen instructions
        rs, ws = int32(0), int32(STAGES - 1)
        if not PREFETCH:
            # -- main loop
            for t in range(k_tiles):
                if wait:                     # (False only in the broken variant)
                    cp_async_wait_group(WAIT)    # tile t has landed (this thread's copies)
                cuda.syncthreads()           # ... everyone's; stage ws (tile t-1's) is free
                for kk in range(KSTEPS):
                    load_fragments(0, rs, kk)
                    if kk == 0:              # the first fragments are on their way: now
                        issue(t + STAGES - 1, ws, False, 0)  # start tile t + STAGES - 1
                    tensor_cores(0)
                ws, rs = rs, (rs + 1 if rs + 1 < STAGES else int32(0))
        else:
            # -- main loop with the fragments of the next k-slice loaded while the tensor
            #    cores work on this one (two sets of fragment registers, slots 0 and 1);
            #    the barrier moves to the last k-slice of a tile, whose fragments are
            #    already in registers, so the math does not stop for it. In each slice the
            #    fragment loads come first (the next math waits for them), then a part of
            #    the copies of tile t + STAGES - 1 (all of them before the last slice)
            def two_slices(t, rs, ws, nxt, kk):
                # k-slices kk (fragments in slot 0) and kk + 1 (slot 1) of tile t
                load_fragments(1, rs, kk + 1)
                issue(t + STAGES - 1, ws, False, kk)           # into tile t - 1's stage
                tensor_cores(0)
                if kk + 2 == KSTEPS:
                    cp_async_wait_group(WAIT)    # tile t + 1 has landed
                    cuda.syncthreads()
                    load_fragments(0, nxt, 0)    # (unused after the last tile)
                else:
                    load_fragments(0, rs, kk + 2)
                    issue(t + STAGES - 1, ws, False, kk + 1)
                tensor_cores(1)

            cp_async_wait_group(WAIT)
            cuda.syncthreads()
            load_fragments(0, rs, 0)
            for t in range(k_tiles):
                nxt = rs + 1 if rs + 1 < STAGES else int32(0)     # tile t + 1's stage
                # the pairs of slices written out (BK up to 128), so that every slice index
                # is a constant: numba leaves a loop over them rolled, and then the
                # fragment registers would have to live in local memory
                two_slices(t, rs, ws, nxt, 0)
                if KSTEPS > 2:
                    two_slices(t, rs, ws, nxt, 2)
                if KSTEPS > 4:
                    two_slices(t, rs, ws, nxt, 4)
                if KSTEPS > 6:
                    two_slices(t, rs, ws, nxt, 6)
                ws, rs = rs, nxt
        cp_async_wait_group(0)
        cuda.syncthreads()                   # the pipeline's memory becomes the scratch

        # -- epilogue: a 16-row strip of the warp tile at a time through shared memory
        cw = warp * C_WARP
        for i in range(FM):
            for j in range(FN):
                wmma_store_d(sC, cw + j * 16, LDC, acc[i, j], "row")
            cuda.syncthreads()
            for e in range(OUT_ITERS):
                r, c = (e * 32 + lane) // WN, (e * 32 + lane) % WN  # lanes along a row
                gr, gc = bm + wm * WM + i * 16 + r, bn + wn * WN + c
                if gr < M and gc < N:
                    v = alpha * sC[cw + r * LDC + c]
                    if beta != 0:
                        v += beta * to_f32(C[gr, gc])
                    Out[gr, gc] = to_out(v)
            cuda.syncthreads()

    cp_async_gemm.threads = NT
    cp_async_gemm.smem_bytes = SMEM_BYTES
    cp_async_gemm.config = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, STAGES=STAGES,
                                GROUP_M=GROUP_M, MAXREG=MAXREG, PREFETCH=PREFETCH)
    return cp_async_gemm


# ------------------------------------------------------------------------------ launchers
def _rows16(t, rows, cols):
    """(flat tensor, row stride) of a ``rows x cols`` operand whose rows start 16-byte
    aligned: ``t`` itself when it is laid out that way, else a zero-padded copy (rows and
    columns past ``t``'s own are zeros: that is how K is padded to a multiple of 8)."""
    R, C = t.shape
    aligned = (rows, cols) == (R, C) and (t.stride(1) == 1 or C == 1) and \
        t.data_ptr() % 16 == 0 and (R == 1 or (t.stride(0) % 8 == 0 and t.stride(0) >= C))
    if aligned:
        ld = t.stride(0) if R > 1 else (C + 7) // 8 * 8
    else:
        ld = (cols + 7) // 8 * 8
        padded = torch.zeros(rows, ld, dtype=t.dtype, device=t.device)
        padded[:R, :C] = t
        t = padded
    return t.as_strided(((rows - 1) * ld + cols,), (1,)), ld


_SMEM_SET = set()


def _arg_key(a):
    """What numba's type of a launch argument depends on, read without typing it."""
    if hasattr(a, "is_c_contiguous"):                  # a device array
        return (str(a.dtype), a.ndim, a.is_c_contiguous(), a.is_f_contiguous())
    return type(a)                                     # a scalar


def _allow_smem(kernel, args, nbytes):
    """Large pipelines need more than the 48 KiB of shared memory a kernel gets by default:
    raise the kernel's limit (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES), once per
    compiled version (the check costs no typing of the arguments after the first call)."""
    if nbytes <= 48 * 1024 or not engines.on_gpu():
        return
    key = (id(kernel), nbytes, tuple(_arg_key(a) for a in args))
    if key in _SMEM_SET:
        return
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    from numba.cuda.cudadrv.driver import binding, driver
    fn = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)
    _SMEM_SET.add(key)


def _check_bf16(dtype):
    eng = engines.engine()
    if dtype == torch.bfloat16 and eng.kind == "cuda" and eng.capability < (8, 0):
        raise ValueError(f"bf16 tensor cores need compute capability 8.0; {eng.device_name} "
                         "has " + ".".join(map(str, eng.capability)) + ": use float16")


def _config():
    return GPU_CONFIG if engines.on_gpu() else SIM_CONFIG


def kernel_for(config=None, bf16=False, wait=True):
    """The kernel object ``run`` launches for ``config`` (overrides of this engine's
    configuration): the same cached object, so its compiled overloads (registers, SASS) can
    be read after a launch."""
    return make_kernel(**dict(_config(), **(config or {})), bf16=bf16, wait=wait)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, wait=True):
    """``out = alpha * a @ b + beta * c`` with the cp.async pipeline; ``c`` may be None when
    ``beta == 0`` (never read then). ``config`` overrides the tile configuration."""
    _check_bf16(a.dtype)
    cfg = dict(_config(), **(config or {}))
    kernel = kernel_for(config, a.dtype == torch.bfloat16, wait)
    M, K = a.shape
    N = b.shape[1]
    K = (K + 7) // 8 * 8                 # the kernel's K: a multiple of 8 (zero-padded)
    A, lda = _rows16(a, M, K)
    B, ldb = _rows16(b, K, N)
    Cin = c if (c is not None and beta != 0) else out       # beta == 0: never read
    args = (engines.as_numba(A), engines.as_numba(B), engines.as_numba(Cin),
            engines.as_numba(out), M, N, K, lda, ldb, np.float32(alpha), np.float32(beta))
    grid = ((M + cfg["BM"] - 1) // cfg["BM"]) * ((N + cfg["BN"] - 1) // cfg["BN"])  # 1-D
    _allow_smem(kernel, args, kernel.smem_bytes)
    kernel[grid, kernel.threads, engines.numba_stream(), kernel.smem_bytes](*args)


def cp_async(a, b, c):
    """C = A @ B with a STAGES-deep cp.async pipeline feeding WMMA (fp16/bf16 in, fp32
    accumulation). Any shape: copies are predicated in the kernel (zero-fill); operands
    whose rows are not 16-byte aligned are copied by the launcher into a padded buffer."""
    run(a, b, None, c)


def cp_async_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


# ------------------------------------------------------ the missing wait, on the simulator
@cuda.jit
def copy_timeline(G, out):
    # one thread, one asynchronous copy: what does shared memory hold before the wait?
    s = cuda.shared.array(8, float16, alignment=SMEM_ALIGN)
    if cuda.threadIdx.x == 0:
        for i in range(8):
            s[i] = -1.0                      # what the buffer held before
        ptx.cp_async16(s, 0, G, 0)           # start copying G[0:8] into s[0:8]
        ptx.cp_async_commit_group()
        out[0] = s[0]                        # read too early
        ptx.cp_async_wait_group(0)
        out[1] = s[0]                        # read after the wait


def _missing_wait_here():
    g = torch.arange(1, 9, dtype=torch.float16)
    out = torch.zeros(2, dtype=torch.float16)
    copy_timeline[1, 32](engines.as_numba(g), engines.as_numba(out))
    from .. import harness
    cases = [c for c in harness.shape_suite(gpu=False) if c.name in ("square", "ragged")]
    reports = []
    for wait in (True, False):
        run = (lambda w: lambda a, b, o: run_sim(a, b, o, w))(wait)
        label = "k06" if wait else "k06 without cp_async_wait_group"
        reports.append(str(harness.check(run, label, (torch.float16,), cases,
                                         raise_on_fail=False)))
    return {"before": float(out[0]), "after": float(out[1]), "reports": reports}


def run_sim(a, b, c, wait):
    run(a, b, None, c, config=SIM_CONFIG, wait=wait)


def missing_wait_demo():
    """What a kernel that forgets ``cp_async_wait_group`` reads, in the simulator (whose
    cp.async lands copies at the latest moment PTX allows). On a GPU the same code is a
    race whose outcome varies; the demonstration then runs in a child process with the
    simulator switched on, so it prints the same everywhere."""
    if not engines.on_gpu():
        return _missing_wait_here()
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, GEMM_LESSONS_ENGINE="simulator")
    code = ("import json, gemm_lessons\n"
            "from gemm_lessons.kernels import k06_cp_async as k\n"
            "print(json.dumps(k._missing_wait_here()))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError("the simulated demonstration failed:\n" + proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ptx_hook(make, config):
    """The registry's ``ptx(cc)`` hook for a kernel built by ``make(**config, bf16=...)`` with
    this launcher's arguments (A, B flat; C; Out; M, N, K, lda, ldb; alpha, beta)."""
    def hook(cc, bf16=False):
        dt = "int16" if bf16 else "float16"
        return (make(**config, bf16=bf16).py_func,
                f"void({dt}[::1], {dt}[::1], {dt}[:, :], {dt}[:, ::1], int64, int64, int64, "
                f"int64, int64, float32, float32)")
    return hook


_ptx = ptx_hook(make_kernel, GPU_CONFIG)


KERNELS = [
    Kernel("k06_cp_async", 6, "numba", FP16_BF16,
           "WMMA fed by a multi-stage cp.async pipeline; alpha/beta epilogue",
           launch=cp_async, min_cc=(8, 0), ptx=_ptx, source=make_kernel,
           gemm=cp_async_gemm, features=frozenset({"alpha_beta"})),
]
