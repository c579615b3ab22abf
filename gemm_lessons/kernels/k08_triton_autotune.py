"""Lesson 08: let Triton choose the tile configuration: ``@triton.autotune``.

The kernel is lesson 07's ``matmul_kernel``, unchanged. ``triton.autotune`` wraps it with a
list of ``triton.Config``s (meta-parameters plus ``num_warps`` and ``num_stages``); the first
call for each new value of the key (M, N, K, and the operands' dtypes) compiles and times
every config that survives pruning, and later calls with that key run the fastest one.

Design note: why these configs (fp16/bf16, for Hopper; an H200 has 132 SMs, 227 KB of
shared memory and 64K registers per SM):

* Tile shape. A wgmma instruction is issued by a warpgroup (4 warps) on a 64-row slab, up to
  256 columns wide. 128 x 256 with 8 warps (two warpgroups, each 64 x 256) is the largest
  tile whose fp32 accumulator (128 registers a thread) still fits: the most FLOPs per byte
  loaded. 256 x 128 is the same tile transposed (it favours a different grid shape).
  128 x 128 (4 or 8 warps), 64 x 256, 128 x 64 and 64 x 128 give small outputs more
  programs: at M = N = 1024 a 128 x 256 tile makes only 32 programs for 132 SMs.
* BLOCK_SIZE_K = 64: 64 fp16 are 128 bytes, one swizzled shared-memory row. 128 halves the
  loop's overhead per FLOP but doubles the shared memory per stage.
* num_stages: the depth of the cp.async pipeline (lesson 06 wrote two by hand). Shared
  memory per stage is (BM + BN) x BK x 2 bytes: 48 KB for 128 x 256 x 64, so on Hopper 3
  stages use 144 KB and 4 use 192 KB (on Ampere Triton allocates one buffer fewer,
  :func:`stage_buffers`); the pruner drops any config over the GPU's limit (227 KB on an
  H100/H200).
* Pruning: every config is compiled and timed once per new key, so the pruner skips what
  cannot win: configs over the shared-memory limit, and configs that leave more than half
  of the 132 SMs without a program (on outputs so small that every config does, all but
  the config(s) with the most programs).
* GROUP_SIZE_M = 8 everywhere: lesson 07's grouped order. It is a parameter, so a config
  could tune it too; at these sizes it matters less than the tile.

fp32 (IEEE products on the FMA units, no tensor cores) gets its own smaller configs: its
tiles cost twice the shared memory and registers. The pruner picks the list that matches the
operands' dtype, so an fp16 call never compiles the fp32 configs.

Engines: on a GPU, Triton times each config with CUDA events. Triton's interpreter has no
GPU to time; there the pruner keeps one small config (:data:`INTERPRETER_CONFIG`), so the
autotuner skips timing and the lesson still runs end to end (:func:`cpu_timer` shows the
timing step on CPU instead). bf16 on the interpreter: see lesson 07's docstring.
"""
from __future__ import annotations

import statistics
import time

import torch
import triton

from .. import engines
from ..common import cdiv, sm_count, smem_optin
from . import Kernel
from .k07_triton_swizzle import DTYPES, matmul_kernel, operands, TileConfig, check_offsets

__all__ = ["CONFIGS", "FP32_CONFIGS", "INTERPRETER_CONFIG", "make_config", "autotune",
           "matmul_autotuned", "prune", "prune_for_gpu", "programs", "cpu_timer",
           "smem_bytes", "stage_buffers", "smem_limit", "device_capability", "SMEM_LIMIT",
           "SMEM_LIMITS", "HOPPER", "matmul", "chosen_config", "tile_config", "label"]


def make_config(BM, BN, BK, num_warps, num_stages, group_size_m=8):
    return triton.Config({"BLOCK_SIZE_M": BM, "BLOCK_SIZE_N": BN, "BLOCK_SIZE_K": BK,
                          "GROUP_SIZE_M": group_size_m},
                         num_warps=num_warps, num_stages=num_stages)


# fp16 / bf16 (tensor cores): see the design note above
CONFIGS = [
    make_config(128, 256, 64, num_warps=8, num_stages=3),   # lesson 07's tile
    make_config(128, 256, 64, num_warps=8, num_stages=4),   # one more stage in flight
    make_config(256, 128, 64, num_warps=8, num_stages=3),   # the same tile, transposed
    make_config(128, 128, 64, num_warps=4, num_stages=4),   # one warpgroup, 4 stages
    make_config(128, 128, 64, num_warps=8, num_stages=4),   # two warpgroups of 64 x 128
    make_config(128, 128, 128, num_warps=8, num_stages=3),  # deeper K steps
    make_config(64, 256, 64, num_warps=4, num_stages=4),    # one warpgroup, one wide wgmma
    make_config(128, 64, 64, num_warps=4, num_stages=4),    # small tiles: more programs
    make_config(64, 128, 64, num_warps=4, num_stages=4),    #   for small outputs
]
# fp32 with IEEE products (FMA units): smaller tiles, 32 deep
FP32_CONFIGS = [
    make_config(128, 128, 32, num_warps=8, num_stages=3),
    make_config(128, 64, 32, num_warps=4, num_stages=3),
    make_config(64, 64, 32, num_warps=4, num_stages=4),
]
# Triton's interpreter: one small config (no GPU to time the others on)
INTERPRETER_CONFIG = make_config(32, 32, 16, num_warps=1, num_stages=1, group_size_m=2)

SMEM_LIMIT = 227 * 1024   # bytes of shared memory one program may use on an H100/H200
# the same limit by compute capability (CUDA C++ Programming Guide, "maximum amount of shared
# memory per thread block", opt-in)
SMEM_LIMITS = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 7): 163 * 1024,
               (8, 9): 99 * 1024, (9, 0): SMEM_LIMIT}
HOPPER = (9, 0)


def stage_buffers(num_stages, dtype, cc=HOPPER):
    """Buffers (a tile of A and one of B each) Triton allocates for a ``num_stages`` pipeline
    (lesson 07 reads the counts from the compiler): one per stage where ``tl.dot`` is Hopper's
    wgmma, which reads shared memory while the next copies land (fp16/bf16 on sm_90); one
    fewer where the products come from registers (mma.sync on sm_80-89; fp32 with IEEE
    products on the FMA units)."""
    if num_stages <= 1:
        return 1
    return num_stages if cc >= HOPPER and dtype != torch.float32 else num_stages - 1


def smem_limit(cc=HOPPER):
    """Bytes of shared memory one program may use on a GPU of capability ``cc``: read from
    the device when this engine's GPU has that capability, else :data:`SMEM_LIMITS` (the
    H100/H200's for a capability it does not list)."""
    eng = engines.engine()
    if eng.kind == "cuda" and tuple(eng.capability) == tuple(cc):
        return smem_optin(torch.cuda.current_device())
    return SMEM_LIMITS.get(tuple(cc), SMEM_LIMIT)


def device_capability():
    """The capability the pruners count buffers for: this GPU's, or Hopper's off the GPU."""
    eng = engines.engine()
    return tuple(eng.capability) if eng.kind == "cuda" else HOPPER


def smem_bytes(config, dtype, cc=HOPPER):
    """Shared memory a config's pipeline needs on a GPU of capability ``cc``: its stage
    buffers (:func:`stage_buffers`), each an A and a B tile."""
    kw = config.kwargs
    per_stage = (kw["BLOCK_SIZE_M"] + kw["BLOCK_SIZE_N"]) * kw["BLOCK_SIZE_K"] * dtype.itemsize
    return stage_buffers(config.num_stages, dtype, cc) * per_stage


def programs(config, M, N):
    """How many programs (tiles of C) a config launches for an M x N product."""
    kw = config.kwargs
    return cdiv(M, kw["BLOCK_SIZE_M"]) * cdiv(N, kw["BLOCK_SIZE_N"])


def prune_for_gpu(configs, dtype, M, N, sms=None, cc=HOPPER):
    """The configs worth timing for ``dtype`` operands and an M x N output on a GPU of
    capability ``cc``: the list for the dtype (tensor cores, or fp32), those that fit in
    shared memory, and of those the ones that keep at least half the multiprocessors busy,
    or else the one(s) with the most programs."""
    sms = sm_count() if sms is None else sms
    wanted = FP32_CONFIGS if dtype == torch.float32 else CONFIGS
    limit = smem_limit(cc)
    fit = [c for c in configs if c in wanted and smem_bytes(c, dtype, cc) <= limit]
    busy = [c for c in fit if 2 * programs(c, M, N) >= sms]
    if busy:
        return busy
    most = max(programs(c, M, N) for c in fit)
    return [c for c in fit if programs(c, M, N) == most]


def prune(configs, named_args, **kwargs):
    """``early_config_prune``: the configs worth timing for these arguments."""
    if not engines.on_gpu():
        return [INTERPRETER_CONFIG]
    return prune_for_gpu(configs, named_args["a_ptr"].dtype, named_args["M"], named_args["N"],
                         cc=device_capability())


def cpu_timer(fn, quantiles=None, reps=3):
    """A ``do_bench`` for the autotuner on CPU: wall-clock milliseconds of ``fn()``.

    Triton's own benchmark needs a GPU. This one times the interpreter, which says nothing
    about a GPU; it exists to show the autotuner's timing step without one.
    """
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    return med if quantiles is None else [med, min(times), max(times)]


def autotune(kernel=matmul_kernel, configs=None, do_bench=None, prune_configs=prune):
    """Wrap ``kernel`` (lesson 07's) in ``triton.autotune``, keyed on M, N and K. The result
    carries ``made_by`` (this function's name), which exercise 08-1's check reads."""
    tuned = triton.autotune(
        configs=CONFIGS + FP32_CONFIGS if configs is None else configs,
        key=["M", "N", "K"],              # re-tune when a dimension changes (dtypes too)
        prune_configs_by=None if prune_configs is None else {"early_config_prune": prune_configs},
        do_bench=do_bench,                # None: Triton's GPU timer
    )(kernel)
    tuned.made_by = f"{__name__}.autotune"
    return tuned


matmul_autotuned = autotune()


def matmul(a, b, c, *, kernel=None):
    """C = A @ B with the autotuned kernel (lesson 07's masks: every shape and stride)."""
    kernel = matmul_autotuned if kernel is None else kernel
    M, K = a.shape
    N = b.shape[1]
    check_offsets(a, b, c)
    a, b, precision = operands(a, b)

    def grid(meta):   # the grid depends on the config the autotuner picks
        return (cdiv(M, meta["BLOCK_SIZE_M"]) * cdiv(N, meta["BLOCK_SIZE_N"]),)

    kernel[grid](a, b, c, M, N, K,
                 a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 INPUT_PRECISION=precision)
    return c


def tile_config(config):
    """A ``triton.Config`` as lesson 07's TileConfig (to launch one config directly)."""
    kw = config.kwargs
    return TileConfig(kw["BLOCK_SIZE_M"], kw["BLOCK_SIZE_N"], kw["BLOCK_SIZE_K"],
                      config.num_warps, config.num_stages)


def chosen_config(kernel=None):
    """The config the autotuner ran last, as a short string."""
    kernel = matmul_autotuned if kernel is None else kernel
    cfg = getattr(kernel, "best_config", None)
    if cfg is None:
        return "none yet (call the kernel first)"
    kw = cfg.kwargs
    return (f"BLOCK_SIZE_M={kw['BLOCK_SIZE_M']}, BLOCK_SIZE_N={kw['BLOCK_SIZE_N']}, "
            f"BLOCK_SIZE_K={kw['BLOCK_SIZE_K']}, GROUP_SIZE_M={kw['GROUP_SIZE_M']}, "
            f"num_warps={cfg.num_warps}, num_stages={cfg.num_stages}")


def label(config):
    """A config in a few characters: BMxBNxBK, warps, stages."""
    kw = config.kwargs
    return (f"{kw['BLOCK_SIZE_M']}x{kw['BLOCK_SIZE_N']}x{kw['BLOCK_SIZE_K']} "
            f"w{config.num_warps} s{config.num_stages}")


KERNELS = [
    Kernel("k08_triton_autotune", 8, "triton", DTYPES,
           "lesson 07's kernel under @triton.autotune: 9 tile configs (3 for fp32) timed per shape",
           launch=matmul, source=autotune, min_cc=(8, 0),
           configs={"gpu": CONFIGS + FP32_CONFIGS, "simulator": INTERPRETER_CONFIG}),
]
