"""Hopper's tensor-core instruction, ``wgmma``, from numba: inline-PTX intrinsics and their
emulation (the companion of :mod:`gemm_lessons.ptx`, which has WMMA and cp.async).

``wmma``/``mma.sync`` (lessons 05-06) are *warp* instructions whose operands are registers:
every k-step each warp first copies its fragments from shared memory into registers
(``ldmatrix``), and that traffic, and the registers, limit how fast they go on a Hopper GPU.
``wgmma.mma_async`` (compute capability 9.0, the ``sm_90a`` target) is issued by a
*warpgroup* (4 consecutive warps, 128 threads) and reads A and B **straight from shared
memory**, described by two 64-bit *matrix descriptors*; it runs asynchronously, like
``cp.async``: issue, ``commit_group``, later ``wait_group``. One instruction computes a
64 x N x 16 product (N = 8 ... 256); the fp32 accumulator tile lives in the registers of the
warpgroup's 128 threads, N / 2 floats each.

The shared-memory layouts wgmma reads are fixed by the hardware. This module uses the
**128-byte swizzle** for both operands (the layout TMA writes and CUTLASS uses for fp16):

* a *swizzle atom* is 8 rows of 128 bytes (64 fp16) = 1024 bytes, starting 1024-byte
  aligned; within it, the 16-byte chunk ``c`` of row ``r`` is stored at chunk ``c ^ r``
  (:func:`swizzle128` on byte offsets in a kernel, :func:`swizzled_offset` on the host).
  Eight rows that a tensor core reads together then fall in eight different groups of
  banks: no bank conflicts, no padding.
* **A**, ``64 x 16`` per instruction, *K-major* (a row of A is contiguous, as in a row-major
  matrix): row ``m`` of the tile is row ``m % 8`` of atom ``m // 8``; atoms 1024 bytes apart
  (a 64-deep tile's 64 rows are 8 atoms, one after the other). The k16 step ``s`` of a 64-deep
  tile starts ``32 * s`` bytes into the row.
* **B**, ``16 x N`` per instruction, *N-major* (a row of B is contiguous: a row-major
  matrix, ``imm-trans-b = 1``): k-row ``k`` is row ``k % 8`` of an atom that holds 64
  columns; the 8-row groups of k are 1024 bytes apart, atoms of the next 64 columns
  ``b_lbo`` bytes apart (the descriptor's *leading byte offset*).

In numba's CUDA simulator the same names are Python: :func:`wgmma_mma` decodes both
operands from the shared arrays with the same swizzle and adds this thread's share of the
product to its accumulators, in the fragment order of the PTX ISA (below); the fences and
waits do nothing there (the product is computed at issue).

Accumulator fragment (``m64nNk16``, fp32; thread ``t`` of the warpgroup, warp ``w = t // 32``,
lane ``l = t % 32``): element ``4 j + 2 h + e`` (``j < N / 8``; ``h, e`` in 0, 1) is
``D[16 w + l // 4 + 8 h, 8 j + 2 (l % 4) + e]`` - see :func:`acc_row_col`.
"""
from __future__ import annotations

import threading

import numpy as np

from . import _ptx_plumbing as pl
from ._ptx_plumbing import PTXUsageError, msg_literal, set_doc

__all__ = ["SIMULATED", "MIN_CC", "ATOM_BYTES", "SWIZZLE_SMEM_ALIGN", "SMEM_ALIGN",
           "INSTRUCTIONS", "swizzle128",
           "swizzled_offset",
           "acc_row_col", "wgmma_mma", "wgmma_store_d", "wgmma_store_d_swizzled",
           "wgmma_fence", "wgmma_commit_group",
           "wgmma_wait_group", "fence_proxy_async"]

SIMULATED = pl.SIMULATED

#: Minimum compute capability of each instruction family (as ``ptx.MIN_CC``): wgmma needs
#: 9.x (the arch-specific target sm_90a, which numba uses on a 9.x GPU); Blackwell (10.x)
#: replaced it with tcgen05.
MIN_CC = {"wgmma": (9, 0)}

#: Bytes in one 128-byte-swizzle atom (8 rows of 128 bytes).
ATOM_BYTES = 1024

#: ``alignment=`` for the shared array that holds swizzled tiles: the swizzle is a function
#: of the address, so every atom must start 1024-byte aligned.
SWIZZLE_SMEM_ALIGN = None if SIMULATED else ATOM_BYTES
#: The name lesson 06 imports (the same value as :data:`SWIZZLE_SMEM_ALIGN`).
SMEM_ALIGN = SWIZZLE_SMEM_ALIGN

#: name: (PTX, minimum compute capability, SASS)
INSTRUCTIONS = {
    "wgmma_mma": ("wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{f16|bf16}.{f16|bf16}",
                  (9, 0), "HGMMA.64x{N}x16.F32 (B N-major: .tnspB)"),
    "wgmma_store_d": ("st.f32 (one per accumulator, at constant offsets)", (9, 0), "STS / STG"),
    "wgmma_store_d_swizzled": ("cvt.rn.{f16|bf16}x2.f32 + st.shared.b32 (two outputs per "
                               "store, in the 128-byte swizzle)", (9, 0),
                               "F2FP.F16.F32.PACK_AB + STS"),
    "wgmma_fence": ("wgmma.fence.sync.aligned", (9, 0), "WARPGROUP.ARRIVE"),
    "wgmma_commit_group": ("wgmma.commit_group.sync.aligned", (9, 0),
                           "(none: the group's last HGMMA carries gsb0)"),
    "wgmma_wait_group": ("wgmma.wait_group.sync.aligned N", (9, 0),
                         "WARPGROUP.DEPBAR.LE gsb0, N"),
    "fence_proxy_async": ("fence.proxy.async.shared::cta", (9, 0), "FENCE.VIEW.ASYNC.S"),
}

_A_SBO = 1024            # bytes between the 8-row groups of A (one atom)
_B_SBO = 1024            # bytes between the 8-row groups of k in B


def _check_n(fn, N):
    if N % 64 or not 64 <= N <= 256:
        raise PTXUsageError(f"{fn}: N (columns of the product) must be 64, 128, 192 or 256 "
                            f"with B in 64-column swizzle atoms, got {N}")


def _check_lbo(fn, lbo):
    if lbo % 16 or not 0 < lbo < (1 << 18):
        raise PTXUsageError(f"{fn}: b_lbo (bytes between B's 64-column atoms) must be a "
                            f"positive multiple of 16 below 2**18, got {lbo}")


def swizzled_offset(off):
    """Where the 128-byte swizzle stores byte ``off`` of a 1024-byte-aligned region: the
    16-byte chunk index (bits 4-6) XOR the row in the 8-row atom (bits 7-9). Plain Python
    (for the host); kernels call :func:`swizzle128`, the same on the device."""
    return off ^ (((off >> 7) & 7) << 4)


def acc_row_col(t, i):
    """(row, column) in the 64 x N tile of accumulator element ``i`` of warpgroup thread
    ``t`` (0..127): the fragment layout of ``wgmma ... m64nNk16`` with fp32 accumulation."""
    w, lane = t // 32, t % 32
    j, h, e = i // 4, (i // 2) % 2, i % 2
    return 16 * w + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e


# ====================================================================== the GPU: intrinsics
if not SIMULATED:
    from llvmlite import ir
    from numba import cuda
    from numba.cuda import cgutils, types

    from ._ptx_plumbing import F32, I32, I64, intrinsic_literal

    swizzle128 = cuda.jit(device=True, inline="always")(swizzled_offset)

    def _check_acc(fn, acc):
        if not (isinstance(acc, types.Array) and acc.ndim == 1 and acc.layout == "C"
                and acc.dtype == types.float32):
            raise PTXUsageError(f"{fn}: acc must be a 1-D float32 local array "
                                f"(cuda.local.array(N // 2, float32)), got {acc}")

    def _desc(builder, ptr, lbo, sbo):
        """The 64-bit matrix descriptor: start address >> 4 (bits 0-13), leading byte
        offset >> 4 (16-29), stride byte offset >> 4 (32-45), swizzle mode 1 = 128 bytes
        (bits 62-63)."""
        addr = builder.lshr(builder.and_(pl.smem_u32(builder, ptr), ir.Constant(I32, 0x3FFFF)),
                            ir.Constant(I32, 4))
        const = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)
        return builder.or_(builder.zext(addr, I64), ir.Constant(I64, const))

    def _acc_values(context, builder, acc_ty, acc, n):
        ary = context.make_array(acc_ty)(context, builder, value=acc)
        ptrs = [builder.gep(ary.data, [ir.Constant(I32, i)]) for i in range(n)]
        return ptrs, [builder.load(p) for p in ptrs]

    @intrinsic_literal
    def _wgmma_mma(typingctx, acc, sA, a_idx, sB, b_idx, N, b_lbo):
        fn = "wgmma_mma"
        _check_acc(fn, acc)
        pl.check_index(fn, sA, a_idx, "sA")
        pl.check_index(fn, sB, b_idx, "sB")
        kind = pl.half_kind(fn, sA.dtype, "sA")
        if pl.half_kind(fn, sB.dtype, "sB") != kind:
            raise PTXUsageError(f"{fn}: sA and sB differ in dtype ({sA.dtype}, {sB.dtype})")
        n, lbo = pl.literal_int(fn, "N", N), pl.literal_int(fn, "b_lbo", b_lbo)
        _check_n(fn, n)
        _check_lbo(fn, lbo)
        na = n // 2
        sig = types.void(acc, sA, a_idx, sB, b_idx, N, b_lbo)

        def codegen(context, builder, sig, args):
            acc_ty, aty, aity, bty, bity = sig.args[:5]
            c, a, ai, b, bi = args[:5]
            da = _desc(builder, pl.elem_ptr(context, builder, aty, a, aity, ai), 16, _A_SBO)
            db = _desc(builder, pl.elem_ptr(context, builder, bty, b, bity, bi), lbo, _B_SBO)
            ptrs, vals = _acc_values(context, builder, acc_ty, c, na)
            regs = ", ".join(f"${i}" for i in range(na))
            # scale-d = 1 (accumulate), scales 1, A K-major (0), B N-major (1); the
            # accumulators are tied in/out operands, so they stay in their registers
            text = ("{ .reg .pred p; setp.ne.b32 p, $" + str(na + 2) + ", 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
                    f"{{{regs}}}, ${na}, ${na + 1}, p, 1, 1, 0, 1; }}")
            cons = ",".join(["=f"] * na + ["l", "l", "r"] + [str(i) for i in range(na)])
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([F32] * na),
                                               [I64, I64, I32] + [F32] * na),
                               text, cons + ",~{memory}", side_effect=True)
            res = builder.call(asm, [da, db, ir.Constant(I32, 1)] + vals)
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
        return sig, codegen

    _wgmma_fence = pl.barrier_op("wgmma_fence", "wgmma.fence.sync.aligned;")
    _wgmma_commit_group = pl.barrier_op("wgmma_commit_group", "wgmma.commit_group.sync.aligned;")
    _fence_proxy_async = pl.barrier_op("fence_proxy_async", "fence.proxy.async.shared::cta;")

    @intrinsic_literal
    def _wgmma_wait_group(typingctx, n, acc, nacc):
        fn = "wgmma_wait_group"
        N = pl.literal_int(fn, "N", n)
        if N < 0:
            raise PTXUsageError(f"{fn}: N must be >= 0, got {N}")
        _check_acc(fn, acc)
        na = pl.literal_int(fn, "nacc", nacc)
        sig = types.void(n, acc, nacc)

        def codegen(context, builder, sig, args):
            ptrs, vals = _acc_values(context, builder, sig.args[1], args[1], na)
            # the accumulators pass through the wait (tied operands the text never names):
            # every later use of them depends on it, so nothing reads them before the
            # tensor cores have written them
            cons = ",".join(["=f"] * na + [str(i) for i in range(na)])
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([F32] * na),
                                               [F32] * na),
                               f"wgmma.wait_group.sync.aligned {N};", cons + ",~{memory}",
                               side_effect=True)
            res = builder.call(asm, vals)
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
        return sig, codegen

    @intrinsic_literal
    def _wgmma_store_d(typingctx, arr, idx, ldm, acc, N):
        fn = "wgmma_store_d"
        pl.check_index(fn, arr, idx, "the destination")
        if arr.dtype != types.float32:
            raise PTXUsageError(f"{fn}: the destination must hold float32, got {arr.dtype}")
        _check_acc(fn, acc)
        n, ld = pl.literal_int(fn, "N", N), pl.literal_int(fn, "ldm", ldm)
        if n % 8 or not 8 <= n <= 256 or ld < n:
            raise PTXUsageError(f"{fn}: N must be a multiple of 8 up to 256 and ldm >= N, "
                                f"got N={n}, ldm={ld}")
        sig = types.void(arr, idx, ldm, acc, N)

        def codegen(context, builder, sig, args):
            aty, ity, _, acc_ty, _ = sig.args
            a, i, _, c, _ = args
            base = builder.bitcast(pl.elem_ptr(context, builder, aty, a, ity, i),
                                   F32.as_pointer())
            tid = builder.call(cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(I32, []), "llvm.nvvm.read.ptx.sreg.tid.x"),
                [])
            lane = builder.and_(tid, ir.Constant(I32, 31))
            warp = builder.and_(builder.lshr(tid, ir.Constant(I32, 5)), ir.Constant(I32, 3))
            row = builder.add(builder.mul(warp, ir.Constant(I32, 16)),
                              builder.lshr(lane, ir.Constant(I32, 2)))
            col = builder.shl(builder.and_(lane, ir.Constant(I32, 3)), ir.Constant(I32, 1))
            first = builder.add(builder.mul(row, ir.Constant(I32, ld)), col)
            p0 = builder.gep(base, [builder.sext(first, I64)])
            _, vals = _acc_values(context, builder, acc_ty, c, n // 2)
            for k, v in enumerate(vals):      # element k: row + 8 h, column 8 j + e
                j, h, e = k // 4, (k // 2) % 2, k % 2
                builder.store(v, builder.gep(p0, [ir.Constant(I64, 8 * h * ld + 8 * j + e)]))
        return sig, codegen

    @intrinsic_literal
    def _wgmma_store_d_swizzled(typingctx, arr, idx, acc, N, alpha):
        fn = "wgmma_store_d_swizzled"
        pl.check_index(fn, arr, idx, "the destination")
        kind = pl.half_kind(fn, arr.dtype, "the destination")
        _check_acc(fn, acc)
        n = pl.literal_int(fn, "N", N)
        _check_n(fn, n)
        if not isinstance(alpha, types.Float):
            raise PTXUsageError(f"{fn}: alpha must be a float, got {alpha}")
        sig = types.void(arr, idx, acc, N, alpha)

        def codegen(context, builder, sig, args):
            aty, ity, acc_ty, _, alty = sig.args
            a, i, c, _, al = args
            scale = context.cast(builder, al, alty, types.float32)
            base = builder.addrspacecast(pl.elem_ptr(context, builder, aty, a, ity, i),
                                         ir.IntType(8).as_pointer(3))
            tid = builder.call(cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(I32, []), "llvm.nvvm.read.ptx.sreg.tid.x"),
                [])
            lane = builder.and_(tid, ir.Constant(I32, 31))
            warp = builder.and_(builder.lshr(tid, ir.Constant(I32, 5)), ir.Constant(I32, 3))
            q = builder.lshr(lane, ir.Constant(I32, 2))        # row in the 8-row atom
            # byte of this thread's first pair: row 16 w + q, 4 bytes per lane of a quad
            first = builder.add(builder.add(builder.mul(warp, ir.Constant(I32, 2048)),
                                            builder.mul(q, ir.Constant(I32, 128))),
                                builder.shl(builder.and_(lane, ir.Constant(I32, 3)),
                                            ir.Constant(I32, 2)))
            chunk = [builder.shl(builder.xor(q, ir.Constant(I32, jj)), ir.Constant(I32, 4))
                     for jj in range(8)]                    # chunk jj of row q, swizzled
            _, vals = _acc_values(context, builder, acc_ty, c, n // 2)
            cvt = ir.InlineAsm(ir.FunctionType(I32, [F32, F32]),
                               f"cvt.rn.{kind}x2.f32 $0, $1, $2;", "=r,f,f")
            for k in range(0, n // 2, 2):     # elements k, k + 1: row q + 8 h, column 8 j + e
                j, h = k // 4, (k // 2) % 2
                lo = builder.fmul(vals[k], scale)
                hi = builder.fmul(vals[k + 1], scale)
                pair = builder.call(cvt, [hi, lo])            # the first operand: upper half
                off = builder.add(builder.add(first, chunk[j % 8]),
                                  ir.Constant(I32, (j // 8) * 8192 + h * 1024))
                p = builder.gep(base, [builder.zext(off, I64)])
                builder.store(pair, builder.bitcast(p, I32.as_pointer(3)))
        return sig, codegen

    wgmma_mma = _wgmma_mma
    wgmma_store_d = _wgmma_store_d
    wgmma_store_d_swizzled = _wgmma_store_d_swizzled
    wgmma_fence = _wgmma_fence
    wgmma_commit_group = _wgmma_commit_group
    wgmma_wait_group = _wgmma_wait_group
    fence_proxy_async = _fence_proxy_async


# ================================================================ the simulator: emulation
else:

    swizzle128 = swizzled_offset

    def _thread():
        th = threading.current_thread()
        return int(getattr(th, "thread_id", 0))

    def _gather(arr, byte_off, fn, what):
        """Elements of 1-D shared ``arr`` at the (unswizzled) byte offsets ``byte_off``."""
        phys = swizzle128(byte_off)
        if phys.min() < 0 or phys.max() + 2 > arr.nbytes:
            raise IndexError(f"{fn}: the {what} tile reaches outside its shared array "
                             f"({arr.nbytes} bytes)")
        return arr.view(np.uint8)[(phys[..., None] + np.arange(2)).reshape(-1)] \
            .view(arr.dtype).reshape(phys.shape)

    def wgmma_mma(acc, sA, a_idx, sB, b_idx, N, b_lbo):
        fn = "wgmma_mma"
        if not (pl.is_int(N) and pl.is_int(b_lbo)):
            raise PTXUsageError(msg_literal(fn, "N and b_lbo", (N, b_lbo)))
        _check_n(fn, N)
        _check_lbo(fn, b_lbo)
        a, b = pl.as_numpy(sA, fn, "sA"), pl.as_numpy(sB, fn, "sB")
        c = pl.as_numpy(acc, fn, "acc")
        if a.ndim != 1 or b.ndim != 1:
            raise PTXUsageError(f"{fn}: sA and sB must be 1-D shared arrays")
        if a.dtype not in (np.float16, np.int16, np.uint16) or a.dtype != b.dtype:
            raise PTXUsageError(f"{fn}: sA and sB hold float16 (or int16 bf16 bits) alike, "
                                f"got {a.dtype}, {b.dtype}")
        if c.dtype != np.float32 or c.size < N // 2:
            raise PTXUsageError(f"{fn}: acc must be a float32 local array of N // 2 = "
                                f"{N // 2} elements")
        sa, sb = pl.byte_offset(a, a_idx, fn, "sA"), pl.byte_offset(b, b_idx, fn, "sB")
        if sa % 16 or sb % 16:
            raise PTXUsageError(f"{fn}: operand tiles must start 16-byte aligned")
        m, k = np.arange(64)[:, None], np.arange(16)[None, :]
        a_off = sa + (m // 8) * _A_SBO + (m % 8) * 128 + 2 * k
        k, n = np.arange(16)[:, None], np.arange(N)[None, :]
        b_off = sb + (k // 8) * _B_SBO + (k % 8) * 128 + (n // 64) * b_lbo + 2 * (n % 64)
        prod = (pl.halves_to_f32(_gather(a, a_off, fn, "A"))
                @ pl.halves_to_f32(_gather(b, b_off, fn, "B")))
        t = _thread() % 128
        i = np.arange(N // 2)
        r, col = acc_row_col(t, i)
        c[:N // 2] += prod[r, col].astype(np.float32)

    def wgmma_store_d(arr, idx, ldm, acc, N):
        fn = "wgmma_store_d"
        if not (pl.is_int(N) and pl.is_int(ldm)) or N % 8 or not 8 <= N <= 256 or ldm < N:
            raise PTXUsageError(f"{fn}: N (a multiple of 8 up to 256) and ldm >= N are "
                                f"constants, got N={N}, ldm={ldm}")
        d, c = pl.as_numpy(arr, fn, "the destination"), pl.as_numpy(acc, fn, "acc")
        if d.dtype != np.float32 or d.ndim != 1:
            raise PTXUsageError(f"{fn}: the destination must be a 1-D float32 array")
        start = pl.byte_offset(d, idx, fn, "the destination") // 4
        r, col = acc_row_col(_thread() % 128, np.arange(N // 2))
        flat = start + r * ldm + col
        if flat.max() >= d.size:
            raise IndexError(f"{fn}: the 64 x {N} tile reaches outside the destination")
        d[flat] = c[:N // 2]

    def wgmma_store_d_swizzled(arr, idx, acc, N, alpha):
        fn = "wgmma_store_d_swizzled"
        if not pl.is_int(N):
            raise PTXUsageError(msg_literal(fn, "N", repr(N)))
        _check_n(fn, N)
        d, c = pl.as_numpy(arr, fn, "the destination"), pl.as_numpy(acc, fn, "acc")
        kind = pl.half_kind(fn, d.dtype, "the destination")
        if d.ndim != 1 or pl.is_global(arr):
            raise PTXUsageError(f"{fn}: the destination must be a 1-D shared array")
        start = pl.byte_offset(d, idx, fn, "the destination")
        if start % 1024:
            raise PTXUsageError(f"{fn}: the boxes must start 1024-byte aligned (the swizzle "
                                f"is a function of the address), got byte {start}")
        if start + 64 * 2 * N > d.nbytes:
            raise IndexError(f"{fn}: the 64 x {N} tile reaches outside the destination")
        r, col = acc_row_col(_thread() % 128, np.arange(N // 2))
        v = c[:N // 2].astype(np.float32) * np.float32(alpha)
        if kind == "f16":
            with np.errstate(over="ignore"):
                v = v.astype(np.float16)
        else:
            from .ptx import f32_to_bf16
            v = np.array([f32_to_bf16(x) for x in v], np.int16)
        byte = start + (col // 64) * 8192 + swizzled_offset(r * 128 + 2 * (col % 64))
        d[byte // 2] = v.view(d.dtype)

    def wgmma_fence():
        pass

    def wgmma_commit_group():
        pass

    def fence_proxy_async():
        pass

    def wgmma_wait_group(n, acc, nacc):
        if not (pl.is_int(n) and pl.is_int(nacc)):
            raise PTXUsageError(msg_literal("wgmma_wait_group", "N and nacc", (n, nacc)))
        if n < 0:
            raise PTXUsageError(f"wgmma_wait_group: N must be >= 0, got {n}")


_DOCS = {
    "wgmma_mma": """wgmma_mma(acc, sA, a_idx, sB, b_idx, N, b_lbo): start ``D += A @ B`` on a
    64 x N x 16 tile, warpgroup-wide (all 128 threads call it with the same operands).
    ``sA[a_idx]`` starts the 64 x 16 A tile (K-major, 128-byte swizzle), ``sB[b_idx]`` the
    16 x N B tile (N-major, 128-byte swizzle, 64-column atoms ``b_lbo`` bytes apart); both
    1-D shared arrays of float16 (or int16 holding bf16). ``acc`` is this thread's
    ``cuda.local.array(N // 2, float32)`` (see :func:`acc_row_col`); ``N`` (64, 128, 192,
    256) and ``b_lbo`` are constants.

    PTX: ``wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{f16|bf16}.{f16|bf16}`` with two
    matrix descriptors (SASS ``HGMMA``); compute capability 9.0 (sm_90a). Asynchronous:
    ``wgmma_fence()`` before the first of a batch, ``wgmma_commit_group()`` after it, and
    ``wgmma_wait_group(N, acc, nacc)`` before the accumulators or the shared tiles are
    touched again.""",
    "wgmma_store_d": """wgmma_store_d(arr, idx, ldm, acc, N): store this thread's share of
    the 64 x N float32 accumulator tile (``acc``, N // 2 floats) to ``arr[idx]`` onwards, row
    by row, ``ldm`` (a constant) elements between rows: warpgroup-wide, like
    ``wmma_store_d``. The thread's place in its warpgroup is ``threadIdx.x % 128`` (1-D
    blocks). Every accumulator index is a constant, so they stay in registers.""",
    "wgmma_store_d_swizzled": """wgmma_store_d_swizzled(arr, idx, acc, N, alpha): store
    this thread's share of the 64 x N float32 accumulator tile, times ``alpha`` and rounded
    to the 16-bit type ``arr`` holds (float16; int16 for bf16 bits), to shared ``arr[idx]``
    onwards (1024-byte aligned) as N / 64 boxes of 64 x 64, one after the other (8192 bytes
    each), in the 128-byte swizzle: the layout a TMA store reads through a map with that
    swizzle (``ptx_tma.tma_store_2d``). Warpgroup-wide (the thread's place is
    ``threadIdx.x % 128``). Two neighbouring outputs go in one 4-byte store, and the
    swizzle puts the 8 rows a warp writes together in 8 different groups of banks: no bank
    conflicts. PTX: ``cvt.rn.f16x2.f32`` (``bf16x2``), ``st.shared.b32``.""",
    "wgmma_fence": """wgmma_fence(): order this warpgroup's earlier register and shared-memory
    accesses before the wgmma instructions that follow. PTX ``wgmma.fence.sync.aligned``.""",
    "wgmma_commit_group": """wgmma_commit_group(): close the wgmma instructions issued since
    the last commit into one group. PTX ``wgmma.commit_group.sync.aligned``.""",
    "wgmma_wait_group": """wgmma_wait_group(N, acc, nacc): wait until at most the ``N``
    newest wgmma groups of this warpgroup are in flight; ``acc`` (``nacc`` floats) is the
    accumulator they write, passed so that the compiler keeps every later use after the
    wait (pass all of them: ``nacc = N // 2`` of the wgmma). PTX
    ``wgmma.wait_group.sync.aligned N``.""",
    "fence_proxy_async": """fence_proxy_async(): make this thread's writes to shared memory
    (stores, cp.async) visible to the *async proxy* that wgmma reads through. PTX
    ``fence.proxy.async.shared::cta``; call it after the copies land, before the barrier.""",
}
for _name, _doc in _DOCS.items():
    set_doc(globals()[_name], _doc)
del _name, _doc


# ============================================ setmaxnreg: registers between warpgroups
INSTRUCTIONS["setmaxnreg_inc"] = ("setmaxnreg.inc.sync.aligned.u32 N", (9, 0),
                                  "USETMAXREG.TRY_ALLOC.CTAPOOL")
INSTRUCTIONS["setmaxnreg_dec"] = ("setmaxnreg.dec.sync.aligned.u32 N", (9, 0),
                                  "USETMAXREG.DEALLOC.CTAPOOL")


def _check_nreg(fn, n):
    if not 24 <= n <= 256 or n % 8:
        raise PTXUsageError(f"{fn}: the register count must be a multiple of 8 from 24 to "
                            f"256, got {n}")


if not SIMULATED:
    def _setmaxnreg(kind):
        fn = f"setmaxnreg_{kind}"

        @intrinsic_literal
        def op(typingctx, n):
            nreg = pl.literal_int(fn, "n", n)
            _check_nreg(fn, nreg)

            def codegen(context, builder, sig, args):
                pl.asm_call(builder, f"setmaxnreg.{kind}.sync.aligned.u32 {nreg};",
                            "~{memory}")
            return types.void(n), codegen
        op.__name__ = fn
        return op

    setmaxnreg_inc = _setmaxnreg("inc")
    setmaxnreg_dec = _setmaxnreg("dec")
else:
    def setmaxnreg_inc(n):
        if not pl.is_int(n):
            raise PTXUsageError(msg_literal("setmaxnreg_inc", "n", repr(n)))
        _check_nreg("setmaxnreg_inc", n)

    def setmaxnreg_dec(n):
        if not pl.is_int(n):
            raise PTXUsageError(msg_literal("setmaxnreg_dec", "n", repr(n)))
        _check_nreg("setmaxnreg_dec", n)

set_doc(setmaxnreg_inc, """setmaxnreg_inc(n): raise this warpgroup's per-thread register limit
    to ``n`` (a constant, a multiple of 8 from 24 to 256), taking registers that other
    warpgroups released with :func:`setmaxnreg_dec`; warpgroup-wide. PTX
    ``setmaxnreg.inc.sync.aligned.u32 n``; compute capability 9.0 (sm_90a). The simulator
    has no registers: there it only checks ``n``.""")
set_doc(setmaxnreg_dec, """setmaxnreg_dec(n): lower this warpgroup's per-thread register
    limit to ``n`` (a constant, a multiple of 8 from 24 to 256) and give the rest back to
    the block's pool, for another warpgroup's :func:`setmaxnreg_inc`. PTX
    ``setmaxnreg.dec.sync.aligned.u32 n``; compute capability 9.0 (sm_90a).""")
__all__ += ["setmaxnreg_inc", "setmaxnreg_dec"]
