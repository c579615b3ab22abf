"""Lesson 08, shapes that are not square: split-K, and an autotune key by shape.

Lesson 07's tile loop with one more grid axis: ``SPLIT_K`` slices of K, each (tile, slice)
pair its own program, for outputs whose tiles are too few for the SMs (M = 16, N = 4096 in
16 x 128 tiles: 32 programs for 132 SMs, each walking all of K alone).

The reduction is one launch and deterministic: every program stores its fp32 partial tile in
a workspace slot and takes a ticket on its tile's counter (``tl.atomic_add``, ``acq_rel``:
the release publishes its partial, the acquire lets the last one see the others'); the
program that draws the last ticket adds the partials in the fixed order s = 0, 1, ...
(the same bits on every run, unlike ``atomic_add`` on C), stores C once, and sets the
counter back to 0 for the next launch. Workspace and counters are cached per device and
grown when needed (:func:`buffers`; launches on one stream at a time). ``SPLIT_K = 1`` is
lesson 07's kernel: the reduction is not compiled in and no workspace is touched.

``@triton.autotune`` picks the tile and the split per shape *bucket* (``M_BUCKET``: M rounded
up to a power of two; N; K), timing configs from CUDA graphs (:func:`graph_timer`), after
the pruner (:func:`prune_for_gpu`, rules explained in lesson 08) keeps what can win.
Shapes and strides: as lesson 07; bf16 on the interpreter: see lesson 07's docstring.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from .. import engines, fastpath
from ..common import cdiv, sm_count
from . import Kernel
from .k07_triton_swizzle import DTYPES, aligned, check_offsets, grouped_pid, operands
from .k08_triton_autotune import (HOPPER, SMEM_LIMIT, cpu_timer, device_capability,
                                  smem_limit, stage_buffers)

__all__ = ["splitk_kernel", "make_config", "CONFIGS", "FP32_CONFIGS", "INTERPRETER_CONFIG",
           "MIN_K_TILES_PER_SPLIT", "SMEM_LIMIT", "m_bucket", "smem_bytes", "programs", "waves",
           "prune_for_gpu", "prune", "autotune", "splitk_autotuned", "workspace_elems",
           "config_needs", "needs", "buffers", "matmul", "asm_job", "label", "chosen_config", "cpu_timer",
           "graph_timer"]


# ------------------------------------------------------------------ the kernel
@triton.jit
def splitk_kernel(
        # pointers to the matrices, then split-K's fp32 workspace and per-tile counters
        a_ptr, b_ptr, c_ptr, ws_ptr, count_ptr,
        # dimensions: A is M x K, B is K x N, C is M x N (M_BUCKET: the autotune key's M)
        M, N, K, M_BUCKET,
        # strides: how far (in elements) to step to the next row / column of each matrix
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        # meta-parameters: compile-time constants, one compiled kernel per combination
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,      # 1: row-major tile order; 8: grouped
        SPLIT_K: tl.constexpr,           # slices of K, one program each; 1: no split
        INPUT_PRECISION: tl.constexpr,   # "ieee" for fp32 (no TF32); "tf32" (ignored) otherwise
        DIV: tl.constexpr = (1,) * 8,    # what K, N and the six strides are multiples of
):
    # 0. Triton proves an integer argument a multiple of 16 when it is one, and no less: a
    #    row of 8 * 315 halves is 16-byte aligned, but Triton cannot tell, and loads it 2
    #    bytes at a time. The launcher checked (``aligned``); rewriting each value as
    #    x // d * d (the same value) tells the compiler that d divides it.
    K, N = K // DIV[0] * DIV[0], N // DIV[1] * DIV[1]
    stride_am, stride_ak = stride_am // DIV[2] * DIV[2], stride_ak // DIV[3] * DIV[3]
    stride_bk, stride_bn = stride_bk // DIV[4] * DIV[4], stride_bn // DIV[5] * DIV[5]
    stride_cm, stride_cn = stride_cm // DIV[6] * DIV[6], stride_cn // DIV[7] * DIV[7]

    # 1. which tile of C this program computes (see grouped_pid)
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    #    and which slice of K (grid axis 1): whole K-tiles, the last slice shorter or empty
    pid_k = tl.program_id(axis=1)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_SIZE_K) * BLOCK_SIZE_K
    k_start = pid_k * k_per_split
    k_len = tl.maximum(tl.minimum(K - k_start, k_per_split), 0)

    # 2. pointers to the first K-tile of A (BLOCK_SIZE_M x BLOCK_SIZE_K) and of B (BK x BN).
    #    Rows of A and columns of B past the edge wrap around (% M, % N): in bounds, and
    #    their results land outside C, where the store mask drops them.
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    a_ptrs += k_start * stride_ak                      # this slice's first K-tile
    b_ptrs += k_start * stride_bk

    # 3. walk the slice: load, multiply-accumulate in fp32, advance the pointers by BLOCK_SIZE_K
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(k_len, BLOCK_SIZE_K)):
        k_left = k_len - k * BLOCK_SIZE_K              # the last K-tile may be partial:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)   # zeros past K
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)   # add nothing
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # 4. round to the output dtype once, after the loop, and store the part inside C
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        # 5. split-K: park this slice's fp32 partial tile in its workspace slot (tile, slice)
        tile = (tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N
                + tl.arange(0, BLOCK_SIZE_N)[None, :])                 # (BM, BN), row-major
        slots = ws_ptr + pid.to(tl.int64) * SPLIT_K * BLOCK_SIZE_M * BLOCK_SIZE_N
        tl.store(slots + pid_k * BLOCK_SIZE_M * BLOCK_SIZE_N + tile, acc)
        tl.debug_barrier()             # every thread of the program has stored its part
        # 6. a ticket on the tile's counter: release our partial, acquire the others'
        ticket = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:      # the last slice to arrive adds them all up
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in range(0, SPLIT_K):   # in a fixed order: the same bits on every run
                acc += tl.load(slots + s * BLOCK_SIZE_M * BLOCK_SIZE_N + tile,
                               cache_modifier=".cg")   # from L2, where other SMs wrote
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
            tl.store(count_ptr + pid, 0)   # zero again for the next launch


# ------------------------------------------------------------------ configurations
def make_config(BM, BN, BK, num_warps, num_stages, split_k=1, group_size_m=8):
    return triton.Config({"BLOCK_SIZE_M": BM, "BLOCK_SIZE_N": BN, "BLOCK_SIZE_K": BK,
                          "GROUP_SIZE_M": group_size_m, "SPLIT_K": split_k},
                         num_warps=num_warps, num_stages=num_stages)


# fp16 / bf16. Large outputs: lesson 08's widest tiles, no split. Small M: 16-, 32- and 64-row
# tiles (tl.dot pads a 16-row tile to the tensor cores' instruction shape), 128 deep where
# the tile is short (fewer loop steps for the same shared memory), each with a few splits.
# The families kept are those that were the fastest config, or within 3% of it, on some
# shape of gemm_lessons.shapes.SHAPES_LLM (tools/sweep_shapes.py times all of them); and
# 8 to 32 slices of 64 x 64 tiles, for outputs of a few tiles over a long K (104 x 88 x
# 17424 has 4 such tiles: split in 4 it runs 16 programs on 132 SMs).
CONFIGS = [
    make_config(128, 256, 64, 8, 3),
    make_config(128, 256, 64, 8, 4),
    make_config(128, 128, 64, 4, 4),
    make_config(128, 128, 64, 8, 4),
    make_config(64, 256, 64, 4, 4),
    *[make_config(64, 128, 64, 4, 4, split_k=s) for s in (1, 2, 4)],
    *[make_config(64, 64, 128, 4, 4, split_k=s) for s in (4, 8, 16, 32)],
    *[make_config(32, 64, 128, 4, 4, split_k=s) for s in (1, 2, 4)],
    *[make_config(16, 64, 128, 4, 4, split_k=s) for s in (1, 2, 4, 8)],
    *[make_config(16, 128, 128, 4, 4, split_k=s) for s in (1, 2, 4)],
]
# fp32 with IEEE products (FMA units): small tiles, 32 deep
FP32_CONFIGS = [
    make_config(128, 128, 32, 8, 3),
    make_config(64, 64, 32, 4, 4),
    make_config(32, 64, 32, 4, 4),
    *[make_config(32, 64, 32, 4, 4, split_k=s) for s in (2, 4)],
]
# Triton's interpreter: one small config that splits K in two, so the reduction runs on CPU
INTERPRETER_CONFIG = make_config(16, 16, 16, 1, 1, split_k=2, group_size_m=2)

MIN_K_TILES_PER_SPLIT = 4    # a slice walks at least 4 K steps (else the reduction dominates)
MAX_WAVES_SPLIT = 2          # splitting beyond two waves of programs only adds partials


def m_bucket(M):
    """M rounded up to a power of two (at least 16): the autotune key's M."""
    return max(16, 1 << (M - 1).bit_length())


def _kw(config):
    kw = config.kwargs
    return (kw["BLOCK_SIZE_M"], kw["BLOCK_SIZE_N"], kw["BLOCK_SIZE_K"], kw["SPLIT_K"])


def smem_bytes(config, dtype, cc=HOPPER):
    """Shared memory of the pipeline on a GPU of capability ``cc``: its stage buffers
    (lesson 08's ``stage_buffers``), each an A and a B tile."""
    BM, BN, BK, _ = _kw(config)
    return stage_buffers(config.num_stages, dtype, cc) * (BM + BN) * BK * dtype.itemsize


def programs(config, M, N):
    """Programs a config launches for an M x N output: tiles x slices."""
    BM, BN, _, S = _kw(config)
    return cdiv(M, BM) * cdiv(N, BN) * S


def waves(config, M, N, sms=None):
    """Programs per SM (1.0: one full wave; 1.03: a full wave and a nearly empty one)."""
    return programs(config, M, N) / (sm_count() if sms is None else sms)


def prune_for_gpu(configs, dtype, M, N, K, sms=None, cc=HOPPER):
    """The configs worth timing for ``dtype`` operands and an M x N x K product (M: the
    bucket, see the module docstring) on a GPU of capability ``cc``."""
    sms = sm_count() if sms is None else sms
    fp32 = dtype == torch.float32                 # fp32 runs FP32_CONFIGS, the others the rest
    limit = smem_limit(cc)
    fit = [c for c in configs
           if (c in FP32_CONFIGS) == fp32 and smem_bytes(c, dtype, cc) <= limit]
    if not fit:
        raise ValueError(f"no {dtype} config of {len(configs)} fits in shared memory")
    # the shortest tiles there are, when none is as short as the output (fp32's 32 rows)
    shortest = min(_kw(c)[0] for c in fit)
    keep = []
    for c in fit:
        BM, BN, BK, S = _kw(c)
        tiles = cdiv(M, BM) * cdiv(N, BN)
        if BM > max(16, M, shortest) or BM < min(M, 64):
            continue                                  # taller than the output, or short
            #                                           tiles where 64-row ones fit
        if S > 1 and (tiles >= sms                    # the tiles alone fill the GPU
                      or cdiv(K, S) < MIN_K_TILES_PER_SPLIT * BK   # slices too thin
                      or tiles * S > MAX_WAVES_SPLIT * sms):       # more splits than SMs
            continue
        keep.append(c)
    keep = keep or fit
    busy = [c for c in keep if 2 * programs(c, M, N) >= sms]
    if busy:
        return busy
    most = max(programs(c, M, N) for c in keep)
    return [c for c in keep if programs(c, M, N) == most]


def prune(configs, named_args, **kwargs):
    """``early_config_prune``: one config on the interpreter, else :func:`prune_for_gpu`."""
    if not engines.on_gpu():
        return [INTERPRETER_CONFIG]
    a = named_args["a_ptr"] if "a_ptr" in named_args else named_args["a_desc"].base
    return prune_for_gpu(configs, a.dtype, named_args["M_BUCKET"],
                         named_args["N"], named_args["K"], cc=device_capability())


def graph_timer(fn, quantiles=None):
    """The autotuner's timer on a GPU: ``fn`` replayed from a CUDA graph
    (``triton.testing.do_bench_cudagraph``). A product of a few microseconds takes less time
    on the GPU than its launch takes on the host, and timed call after call every config
    would measure the same host; replayed, they are told apart by their GPU time."""
    from triton.testing import do_bench_cudagraph
    return do_bench_cudagraph(fn, quantiles=quantiles)


def autotune(kernel=splitk_kernel, configs=None, do_bench=graph_timer, prune_configs=prune,
             extra_key=()):
    """``kernel`` under ``triton.autotune``, keyed on the shape bucket (M_BUCKET, N, K) and
    the arguments named in ``extra_key``, its configs timed by ``do_bench`` (:func:`graph_timer`)."""
    return triton.autotune(
        configs=CONFIGS + FP32_CONFIGS if configs is None else configs,
        key=["M_BUCKET", "N", "K", *extra_key],   # (and the operands' dtypes, which Triton adds)
        prune_configs_by=None if prune_configs is None else {"early_config_prune": prune_configs},
        do_bench=do_bench,
    )(kernel)


splitk_autotuned = autotune()


# ------------------------------------------------------------------ workspace
def workspace_elems(config, M, N):
    """fp32 elements of workspace a config needs (0 without a split): a BM x BN slot per
    (tile, slice)."""
    BM, BN, _, S = _kw(config)
    return 0 if S == 1 else cdiv(M, BM) * cdiv(N, BN) * S * BM * BN


def _tiles(config, M, N):
    BM, BN, _, _ = _kw(config)
    return cdiv(M, BM) * cdiv(N, BN)


_BUFFERS = {}   # device -> (fp32 workspace, int32 counters, all zero between launches)


def buffers(device, ws_elems, n_counters):
    """The device's workspace and counters, grown (never shrunk) to the sizes asked for; kept
    for good (:func:`gemm_lessons.fastpath.keep`), so a launch plan may take their addresses."""
    ws, counts = _BUFFERS.get(device, (None, None))
    if ws is None or ws.numel() < ws_elems:
        fastpath.forget(ws)      # launch plans that used the old one are dropped
        ws = fastpath.keep(torch.empty(max(ws_elems, 1), dtype=torch.float32, device=device))
    if counts is None or counts.numel() < n_counters:
        fastpath.forget(counts)
        counts = fastpath.keep(torch.zeros(max(n_counters, 1), dtype=torch.int32,
                                           device=device))
    _BUFFERS[device] = (ws, counts)
    return ws, counts


def config_needs(config, M, N):
    """(workspace elements, counters) one config needs for an M x N output (0, 0 unsplit)."""
    return workspace_elems(config, M, N), (_tiles(config, M, N) if _kw(config)[3] > 1 else 0)


@lru_cache(maxsize=4096)
def needs(kernel, dtype, M, N, K, sms):
    """(workspace elements, counters) enough for every config ``kernel`` (a kernel under
    :func:`autotune`) may run on this shape bucket: what its pruner keeps when that is
    :func:`prune`, else all of its configs."""
    if not engines.on_gpu():
        cands = [INTERPRETER_CONFIG] if kernel.early_config_prune is prune else kernel.configs
    elif kernel.early_config_prune is prune:
        cands = prune_for_gpu(kernel.configs, dtype, m_bucket(M), N, K, sms,
                              cc=device_capability())
    else:
        cands = kernel.configs
    split = [c for c in cands if _kw(c)[3] > 1]
    return (max((workspace_elems(c, M, N) for c in split), default=0),
            max((_tiles(c, M, N) for c in split), default=0))


# ------------------------------------------------------------------ the launcher
def matmul(a, b, c, *, config=None, kernel=None):
    """C = A @ B: the autotuned split-K kernel (or ``kernel``, another :func:`autotune` of
    it), or one ``config`` (a ``make_config``) as it is, without tuning (tests, the sweep)."""
    M, K = a.shape
    N = b.shape[1]
    check_offsets(a, b, c)
    a, b, precision = operands(a, b)
    if config is None:
        kernel, meta = (splitk_autotuned if kernel is None else kernel), {}
        ws_elems, n_counters = needs(kernel, a.dtype, M, N, K, sm_count(c.device))
    else:
        BM, BN, BK, S = _kw(config)
        if min(BM, BN, BK, S) < 1 or not isinstance(S, int):
            raise ValueError(f"a config needs positive tile sizes and SPLIT_K, got {label(config)}")
        kernel = splitk_kernel
        meta = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
        ws_elems, n_counters = config_needs(config, M, N)
    if ws_elems:
        ws, counts = buffers(c.device, ws_elems, n_counters)
    else:
        ws, counts = c, c        # never read: no config here splits K

    def grid(meta):
        return (cdiv(M, meta["BLOCK_SIZE_M"]) * cdiv(N, meta["BLOCK_SIZE_N"]), meta["SPLIT_K"])

    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    kernel[grid](a, b, c, ws, counts, M, N, K, m_bucket(M), *strides,
                 INPUT_PRECISION=precision, DIV=aligned((K, N, *strides), a.element_size()),
                 **meta)
    return c


def asm_job(config, dtype=torch.float16, M=16, N=4096, K=4096, cc=(9, 0)):
    """The compilation of ``config`` for ``cc`` as a launch on contiguous operands of this
    shape would specialise it (for :func:`gemm_lessons.triton_asm.compile_kernels`).
    Without a split the launcher passes C in place of the workspace and the counters."""
    from ..common import dtype_name
    BM, BN, BK, S = _kw(config)
    name = dtype_name(dtype)
    args = {"a_ptr": name, "b_ptr": name, "c_ptr": name,
            "ws_ptr": "float32" if S > 1 else name, "count_ptr": "int32" if S > 1 else name,
            "M": M, "N": N, "K": K, "M_BUCKET": m_bucket(M),
            "stride_am": K, "stride_ak": 1, "stride_bk": N, "stride_bn": 1,
            "stride_cm": N, "stride_cn": 1}
    constants = dict(config.kwargs, INPUT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return dict(fn=splitk_kernel, args=args, constants=constants,
                num_warps=config.num_warps, num_stages=config.num_stages, cc=cc)


def label(config):
    """A config in a few characters: BMxBNxBK, split, warps, stages."""
    BM, BN, BK, S = _kw(config)
    return f"{BM}x{BN}x{BK} k{S} w{config.num_warps} s{config.num_stages}"


def chosen_config(kernel=None):
    """The config the autotuner ran last, as :func:`label` writes it."""
    cfg = getattr(splitk_autotuned if kernel is None else kernel, "best_config", None)
    return "none yet (call the kernel first)" if cfg is None else label(cfg)


KERNELS = [
    Kernel("k08_triton_splitk", 8, "triton", DTYPES,
           "lesson 07's kernel plus split-K (one launch, deterministic reduction), "
           "autotuned per shape bucket",
           launch=matmul, source=splitk_kernel, min_cc=(8, 0), step=1,
           configs={"gpu": CONFIGS + FP32_CONFIGS, "simulator": INTERPRETER_CONFIG}),
]
