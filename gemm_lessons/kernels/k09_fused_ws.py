"""Lesson 09, warp specialization: ``k09_fused_tma_splitk``'s tiles, slices of K and epilogue,
with its K loop split between a producer warp and consumer warps (Hopper; Gluon).

    out = act(alpha * A @ B + beta * C + bias)       bias: one value per column, (N,)

In ``k09_fused_tma_splitk`` every warp of a program does everything in turn: it issues the
next TMA copies, waits for a tile, multiplies it, and Triton's compiler decides how far
ahead the copies run. Here the program's warps are given roles, as ``k06_producer_consumer``
gives them in lesson 06:

- the **producer**, one extra warp with few registers, only issues TMA copies into a ring
  of ``NUM_STAGES`` shared-memory slots, each slot waiting for its ``empty`` barrier before
  it is refilled, each copy completing on the slot's ``ready`` barrier;
- the **consumers**, the program's ``num_warps`` warps (one or two warpgroups), only wait on
  ``ready``, issue ``wgmma`` on the slot, and arrive on ``empty`` once the tensor cores have
  read it.

The consumers never compute an address and the producer waits only for a free slot, so
while the consumers multiply one slot the producer is filling the next ones. Triton's
``tl`` language does not let a kernel say which warp does what; **Gluon**
(``triton.experimental.gluon``, Triton's lower-level language, experimental) does: the
kernel names its layouts, shared-memory buffers, barriers and partitions itself
(``gl.warp_specialize``). Gluon compiles for the GPU only: Triton's interpreter cannot run
it, so off a Hopper GPU the API refuses this kernel and names ``k09_fused_tma_splitk``
(the same tiles, slices and epilogue, every warp doing every part) to run there instead.

After the loop, the consumers hold the fp32 tile: split-K's ticketed reduction and lesson
09's epilogue (``k09_epilogue``) are ``k09_fused_tma_splitk``'s, called from Gluon; the tile
leaves by one TMA store from shared memory where the output is row-major and aligned
(``store_tile``), else by the epilogue's masked pointer store. Where TMA cannot address an
operand in place, for fp32 operands, ``alpha == 0``, an output written over C and fewer than
:data:`MIN_M` rows, :func:`fused_gemm` runs ``k09_fused_tma_splitk`` (which passes some of
them on to ``k09_fused_splitk``). 2-D operands; B may be ``W.t()`` of an ``nn.Linear`` weight.
"""
from __future__ import annotations

import torch
import triton

from .. import engines
from ..common import sm_count
from . import FP16_BF16, Kernel
from . import k08_triton_splitk as k08s
from . import k09_fused_splitk as fsk
from . import k09_fused_tma_splitk as tsk
from .k07_triton_swizzle import check_offsets, grouped_pid
from .k09_epilogue import ACTIVATION_CODES, epilogue, epilogue_values
from .k09_fused_epilogue import blas_reads
from .k09_fused_tma import as_descriptor

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["fused_ws_kernel", "producer", "consumers", "store_tile", "ws_config", "set_layouts",
           "WS_CONFIGS", "MIN_M", "fused_ws_autotuned", "uses_ws", "fused_gemm", "gemm",
           "launch", "asm_job", "chosen_config"]

# Triton 3.7 renamed these Gluon builtins; the kernel calls them by these names on either
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def producer(a_desc, b_desc, a_ring, b_ring, ready, empty, off_m, off_n, k_first, k_last,
             BLOCK_SIZE_K: gl.constexpr, NUM_STAGES: gl.constexpr,
             A_TRANS: gl.constexpr, B_TRANS: gl.constexpr):
    """One warp: the slice's A and B tiles, K-tile by K-tile, into the ring's slots."""
    for i in range(k_last - k_first):
        s = i % NUM_STAGES
        # wait until the consumers have released the slot (its previous use); the first
        # pass waits on the phase before the first, which counts as complete
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        # the slot's ready barrier completes when both copies' bytes have landed
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        k = (k_first + i) * BLOCK_SIZE_K
        tma_load(a_desc, [k, off_m] if A_TRANS else [off_m, k], ready.index(s), a_ring.index(s))
        tma_load(b_desc, [off_n, k] if B_TRANS else [k, off_n], ready.index(s), b_ring.index(s))


@gluon.jit
def consumers(a_ring, b_ring, ready, empty, k_first, k_last,
              BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
              NUM_STAGES: gl.constexpr, A_TRANS: gl.constexpr, B_TRANS: gl.constexpr,
              ACC: gl.constexpr):
    """The program's warps: wgmma on each slot as it fills, the fp32 tile in registers."""
    acc = gl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), gl.float32, ACC)
    for i in range(k_last - k_first):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)        # the slot's tiles landed
        a = a_ring.index(s).permute((1, 0)) if A_TRANS else a_ring.index(s)
        b = b_ring.index(s).permute((1, 0)) if B_TRANS else b_ring.index(s)
        acc = warpgroup_mma(a, b, acc, is_async=True)
        # at most one wgmma in flight: the previous one has read its slot, release that
        # (one thread arrives, after a barrier of all the consumer warps that the compiler
        # puts before it: every warpgroup's wait has returned)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((i + NUM_STAGES - 1) % NUM_STAGES), pred=i > 0)
    return (warpgroup_mma_wait(num_outstanding=0, deps=(acc,)),)


@gluon.jit
def store_tile(acc, offs_m, offs_n, off_m, off_n, M, N, c_ptr, stride_cm, stride_cn,
               bias_ptr, stride_bias, out_ptr, o_desc, stride_om, stride_on, alpha, beta,
               HAS_C: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
               TMA_STORE: gl.constexpr):
    """Lesson 09's epilogue on the full fp32 tile, then one store: by TMA (the copy engine
    clips the tile at M and N) from a shared-memory tile where the output allows it, else
    ``k09_epilogue.epilogue``'s masked pointer store."""
    if TMA_STORE:
        # the tile's shared memory is the ring's: at the join of warp_specialize every copy
        # has landed and every wgmma has finished reading
        vals = epilogue_values(acc, offs_m, offs_n, 0, M, N, c_ptr, 0, stride_cm, stride_cn,
                               bias_ptr, stride_bias, alpha, beta, HAS_C, HAS_BIAS, ACTIVATION)
        o_smem = gl.allocate_shared_memory(o_desc.dtype, o_desc.block_type.shape, o_desc.layout)
        o_smem.store(vals.to(o_desc.dtype))
        fence_async_shared()           # the tile written before the copy engine reads it
        tma_store(o_desc, [off_m, off_n], o_smem)
        tma.store_wait(pendings=0)
    else:
        epilogue(acc, offs_m, offs_n, 0, M, N, c_ptr, 0, stride_cm, stride_cn, bias_ptr,
                 stride_bias, out_ptr, 0, stride_om, stride_on, alpha, beta,
                 HAS_C, HAS_BIAS, ACTIVATION)


@gluon.jit
def fused_ws_kernel(
        # TMA descriptors of A and B (or of their transposes), pointers to C, the epilogue's
        # bias and output (and a descriptor of the output), then split-K's fp32 workspace and
        # per-tile counters
        a_desc, b_desc, c_ptr, bias_ptr, out_ptr, o_desc, ws_ptr, count_ptr,
        M, N, K, M_BUCKET,
        stride_cm, stride_cn, stride_bias, stride_om, stride_on,
        alpha, beta,
        HAS_C: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
        A_TRANS: gl.constexpr, B_TRANS: gl.constexpr, TMA_STORE: gl.constexpr,
        BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
        GROUP_SIZE_M: gl.constexpr, SPLIT_K: gl.constexpr, NUM_STAGES: gl.constexpr,
        num_warps: gl.constexpr):
    # 1. the tile and the slice of K, as in k09_fused_tma_splitk
    pid = gl.program_id(axis=0)
    pid_m, pid_n = grouped_pid(pid, gl.cdiv(M, BLOCK_SIZE_M), gl.cdiv(N, BLOCK_SIZE_N),
                               GROUP_SIZE_M)
    pid_k = gl.program_id(axis=1)
    k_tiles = gl.cdiv(K, BLOCK_SIZE_K)
    per_slice = gl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * per_slice
    k_last = gl.minimum(k_first + per_slice, k_tiles)
    off_m = pid_m * BLOCK_SIZE_M
    off_n = pid_n * BLOCK_SIZE_N

    # 2. what Triton's compiler chose by itself in tl: the accumulator's layout (wgmma's,
    #    the warps stacked along M), the ring of shared-memory slots and two barriers a slot
    ACC: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_SIZE_N, 16])
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()              # the barriers initialised before the copy engine uses them

    # 3. the roles: the consumers are the program's own warps (they return the tile); the
    #    producer is one more warp, given 24 registers a thread (the consumers may take more)
    acc, = gl.warp_specialize([
        (consumers, (a_ring, b_ring, ready, empty, k_first, k_last, BLOCK_SIZE_M,
                     BLOCK_SIZE_N, NUM_STAGES, A_TRANS, B_TRANS, ACC)),
        (producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, off_m, off_n, k_first,
                    k_last, BLOCK_SIZE_K, NUM_STAGES, A_TRANS, B_TRANS)),
    ], [1], [24])

    # 4. the epilogue, k09_fused_tma_splitk's: split-K's ticketed sum, then lesson 09's
    offs_m = off_m + gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(1, ACC))
    offs_n = off_n + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, ACC))
    if SPLIT_K == 1:
        store_tile(acc, offs_m, offs_n, off_m, off_n, M, N, c_ptr, stride_cm, stride_cn,
                   bias_ptr, stride_bias, out_ptr, o_desc, stride_om, stride_on, alpha, beta,
                   HAS_C, HAS_BIAS, ACTIVATION, TMA_STORE)
    else:
        tile = (gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(1, ACC))[:, None] * BLOCK_SIZE_N
                + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, ACC))[None, :])
        slots = ws_ptr + pid.to(gl.int64) * SPLIT_K * BLOCK_SIZE_M * BLOCK_SIZE_N
        gl.store(slots + pid_k * BLOCK_SIZE_M * BLOCK_SIZE_N + tile, acc)
        cta_barrier()                  # every consumer thread has stored its part
        ticket = gl.atomic_add(count_ptr + pid, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:      # the last slice to arrive adds them all up
            acc = gl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), gl.float32, ACC)
            for j in range(0, SPLIT_K):   # in a fixed order: the same bits on every run
                acc += gl.load(slots + j * BLOCK_SIZE_M * BLOCK_SIZE_N + tile,
                               cache_modifier=".cg")
            store_tile(acc, offs_m, offs_n, off_m, off_n, M, N, c_ptr, stride_cm, stride_cn,
                       bias_ptr, stride_bias, out_ptr, o_desc, stride_om, stride_on, alpha,
                       beta, HAS_C, HAS_BIAS, ACTIVATION, TMA_STORE)
            gl.store(count_ptr + pid, 0)   # zero again for the next launch
    for s in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


# ------------------------------------------------------------------ configurations
def ws_config(BM, BN, BK, num_warps, stages, split_k=1):
    """A config: the tile, the consumer warps (4: one warpgroup; 8: two, stacked along M),
    the ring's slots (``NUM_STAGES``, which Gluon reads as a kernel argument) and the split."""
    c = k08s.make_config(BM, BN, BK, num_warps, stages, split_k=split_k)
    return triton.Config({**c.kwargs, "NUM_STAGES": stages}, num_warps=num_warps,
                         num_stages=stages, pre_hook=set_layouts)


def set_layouts(nargs):
    """A config's ``pre_hook``: the descriptors' blocks become its tiles (the output's too,
    where it is stored by TMA), with the shared layout (swizzle) Gluon asks for each block."""
    BM, BN, BK = nargs["BLOCK_SIZE_M"], nargs["BLOCK_SIZE_N"], nargs["BLOCK_SIZE_K"]
    for name, block in (("a_desc", [BK, BM] if nargs["A_TRANS"] else [BM, BK]),
                        ("b_desc", [BN, BK] if nargs["B_TRANS"] else [BK, BN])):
        d = nargs[name]
        d.block_shape = block
        d.layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPE[d.base.dtype])
    if nargs["TMA_STORE"]:
        d = nargs["o_desc"]
        d.block_shape = [BM, BN]
        d.layout = gl.NVMMASharedLayout.get_default_for([BM, BN], _GL_DTYPE[d.base.dtype])


_GL_DTYPE = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}

# fp16 / bf16, ring depths filling most of the 227 KB of shared memory: 128 x 256 tiles for
# large outputs, 128 x 128 for mid ones, 128 x 64 where 128 x 128 tiles are too few for
# the GPU's 132 SMs (one consumer warpgroup or two), and 64-row tiles, split or not, for
# small M (lesson 08's pruner keeps the tiles that fit the shape)
WS_CONFIGS = [
    ws_config(128, 256, 64, 8, 4),
    ws_config(128, 128, 64, 8, 5),
    ws_config(128, 64, 64, 4, 8),
    ws_config(128, 64, 64, 8, 8),
    *[ws_config(64, 128, 64, 4, 8, split_k=s) for s in (1, 2, 4)],
    *[ws_config(64, 64, 64, 4, 8, split_k=s) for s in (2, 4)],
]

fused_ws_autotuned = k08s.autotune(fused_ws_kernel, configs=WS_CONFIGS,
                                   extra_key=("A_TRANS", "B_TRANS"))


# ------------------------------------------------------------------ the launcher
# every wgmma has 64 rows (m64): on 16 rows of A three quarters of its work would multiply the
# zeros TMA fills in, where k09_fused_tma_splitk's 16-row tiles (mma.sync, m16) waste none
MIN_M = 64


def _gluon_descriptor(t, rows, cols):
    """(Gluon descriptor, trans) of a 2-D operand read in (rows, cols) tiles, or None where
    TMA cannot address it in place (``k09_fused_tma.as_descriptor`` decides)."""
    found = as_descriptor(t.unsqueeze(0), rows, cols, 1)
    if found is None:
        return None
    d, _, trans = found
    layout = gl.NVMMASharedLayout.get_default_for(list(d.block_shape), _GL_DTYPE[t.dtype])
    return TensorDescriptor(d.base, list(d.shape), list(d.strides), list(d.block_shape),
                            layout), trans


def uses_ws(a, b, c=None, out=None, alpha=1.0, beta=0.0):
    """Whether :func:`fused_gemm` runs the warp-specialized kernel on these operands: on a
    GPU of compute capability 9.x, at least :data:`MIN_M` rows, fp16/bf16 operands TMA can
    address, and the cases ``k09_fused_tma_splitk`` gives its TMA kernel (see the module
    docstring)."""
    cfg = WS_CONFIGS[0].kwargs
    return (engines.on_gpu() and engines.engine().capability[0] == 9
            and a.shape[0] >= MIN_M and tsk.uses_tma(a, b, c, out, alpha, beta)
            and _gluon_descriptor(a, cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_K"]) is not None
            and _gluon_descriptor(b, cfg["BLOCK_SIZE_K"], cfg["BLOCK_SIZE_N"]) is not None)


def fused_gemm(a, b, c, out, alpha=1.0, beta=0.0, bias=None, activation=None, *, config=None):
    """``out = activation(alpha * a @ b + beta * c + bias)`` for 2-D ``a`` (M, K), ``b``
    (K, N), ``c`` and ``out`` (M, N), ``bias`` (N,) or None: the warp-specialized kernel
    where :func:`uses_ws`, else ``k09_fused_tma_splitk``. ``config``: one of
    :data:`WS_CONFIGS` (or a :func:`ws_config`), run as it is (tests, sweeps)."""
    if not uses_ws(a, b, c, out, alpha, beta):
        return tsk.fused_gemm(a, b, c, out, alpha, beta, bias, activation)
    M, K = a.shape
    N = b.shape[1]
    fsk.check_epilogue_args(N, c, alpha, beta, bias, activation)
    _, reads_c = blas_reads(alpha, beta)
    check_offsets(out, *([c] if reads_c else []))
    cfg = (config or WS_CONFIGS[0]).kwargs
    (a_desc, a_trans), (b_desc, b_trans) = (
        _gluon_descriptor(a, cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_K"]),
        _gluon_descriptor(b, cfg["BLOCK_SIZE_K"], cfg["BLOCK_SIZE_N"]))
    # the output by TMA where a descriptor can address it as it is (row-major, aligned)
    o_found = _gluon_descriptor(out, cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"])
    tma_store = o_found is not None and not o_found[1]
    o_desc = o_found[0] if tma_store else a_desc           # (unused without a TMA store)
    if config is None:
        kernel, meta = fused_ws_autotuned, {}
        ws_elems, n_counters = k08s.needs(kernel, a.dtype, M, N, K, sm_count(out.device))
    else:
        set_layouts({**config.kwargs, "a_desc": a_desc, "b_desc": b_desc, "o_desc": o_desc,
                     "A_TRANS": a_trans, "B_TRANS": b_trans, "TMA_STORE": tma_store})
        kernel = fused_ws_kernel
        meta = dict(config.kwargs, num_warps=config.num_warps)
        ws_elems, n_counters = k08s.config_needs(config, M, N)
    ws, counts = (k08s.buffers(out.device, ws_elems, n_counters) if ws_elems else (out, out))
    c_args, bias_args = fsk.epilogue_args(c, bias, out, reads_c)
    grid = fsk.tiles_by_slices(M, N)
    kernel[grid](a_desc, b_desc, c_args[0], bias_args[0], out, o_desc, ws, counts, M, N, K,
                 k08s.m_bucket(M), *c_args[1:], bias_args[1], out.stride(0), out.stride(1),
                 float(alpha), float(beta), HAS_C=reads_c, HAS_BIAS=bias is not None,
                 ACTIVATION=ACTIVATION_CODES[activation], A_TRANS=a_trans, B_TRANS=b_trans,
                 TMA_STORE=tma_store, **meta)
    return out


gemm, launch = fsk.batch_hooks(fused_gemm)


def asm_job(config, dtype=torch.float16, M=1024, N=1024, K=16384, *, bias=True,
            activation="gelu", cc=(9, 0)):
    """The compilation of ``config`` with (``bias`` +) ``activation`` for ``cc``, on
    contiguous operands of this shape (for :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    job = tsk.asm_job(config, dtype, M, N, K, bias=bias, activation=activation, cc=cc)
    job["constants"].pop("INPUT_PRECISION")
    job["constants"].update(num_warps=config.num_warps, TMA_STORE=True)
    block = [config.kwargs["BLOCK_SIZE_M"], config.kwargs["BLOCK_SIZE_N"]]
    args = dict(job["args"], o_desc={"desc": job["args"]["out_ptr"], "block": block})
    return dict(job, fn=fused_ws_kernel, args=args)


def chosen_config():
    """The config the autotuner ran last (see ``k08_triton_splitk.label``)."""
    return k08s.chosen_config(fused_ws_autotuned)


KERNELS = [
    Kernel("k09_fused_ws", 9, "triton", FP16_BF16,
           "k09_fused_tma_splitk with a producer warp and consumer warpgroups (Hopper, Gluon)",
           launch=launch, gemm=gemm, source=fused_ws_kernel, min_cc=(9, 0), cc_below=(10, 0),
           simulator=False, features=frozenset({"alpha_beta", "bias", "activation"}),
           step=3, in_ladder=False),
]
