"""Lessons 07-08 on a GPU: check, then time, the Triton kernels against cuBLAS.

    python tools/sweep_k07_k08.py                  # checks, wgmma grep, timings, table (~3 min)
    python tools/sweep_k07_k08.py --no-explore     # without the exploratory variants
    python tools/sweep_k07_k08.py --profile        # one launch per tile order, for ncu:
        ncu --kernel-name regex:matmul_kernel \\
            --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \\
            python tools/sweep_k07_k08.py --profile

What it does, in one process:
1. checks k07, k08 and k08_triton_tma on the shape suite in every dtype (row-major order:
   fp16), each k08 config on the ragged case in fp16 and bf16, each exploratory variant in
   fp16;
2. compiles the fp16/bf16 kernels as launched and greps their PTX for wgmma and their SASS
   for HGMMA;
3. at 4096 and 8192, fp16 and bf16: each result compared with a float64 reference, then timed with
   CUDA events against cuBLAS of the same dtype: k07 grouped and row-major, k08 autotuned
   (and the config it chose), k08_triton_tma (TMA descriptors, persistent grid), every k08
   config, and (unless --no-explore) extra k07 configs, a persistent variant without TMA
   and other tiles for k08_triton_tma, which are not part of the lessons;
4. prints the table last: TFLOP/s and the ratio to cuBLAS (> 1: faster).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gemm_lessons import harness  # noqa: E402
from gemm_lessons.common import dtype_name  # noqa: E402
from gemm_lessons.kernels import k07_triton_swizzle as k07  # noqa: E402
from gemm_lessons.kernels import k08_triton_autotune as k08  # noqa: E402
from gemm_lessons.kernels import k08_triton_tma as k08t  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16)
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


dt = dtype_name


def cfg_name(c):
    return f"{c.BM}x{c.BN}x{c.BK} w{c.num_warps} s{c.num_stages}"


# ---------------------------------------------------------------- exploratory variants
@triton.jit
def persistent_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                      BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                      NUM_SMS: tl.constexpr):
    # one program per SM, looping over tiles in grouped order (not part of the lessons)
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = k07.grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_tiles):
            offs_kk = k * BLOCK_SIZE_K + offs_k
            a = tl.load(a_ptr + offs_am[:, None] * stride_am + offs_kk[None, :] * stride_ak,
                        mask=offs_kk[None, :] < K, other=0.0)
            b = tl.load(b_ptr + offs_kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                        mask=offs_kk[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def persistent(cfg, group=8):
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def run(a, b, c):
        M, K = a.shape
        N = b.shape[1]
        tiles = triton.cdiv(M, cfg.BM) * triton.cdiv(N, cfg.BN)
        return persistent_kernel[(min(sms, tiles),)](
            a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
            BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=group,
            NUM_SMS=sms, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return run


def tma_persistent(cfg):
    """The registered k08_triton_tma kernel with another tile configuration."""
    return lambda a, b, c: k08t.matmul(a, b, c, config=cfg)


EXTRA = [k07.TileConfig(256, 128, 64, 8, 4), k07.TileConfig(128, 256, 32, 8, 5),
         k07.TileConfig(128, 128, 32, 4, 6), k07.TileConfig(64, 128, 64, 4, 5)]
PERSISTENT = [k07.TileConfig(128, 256, 64, 8, 3), k07.TileConfig(128, 128, 64, 8, 4)]
TMA = [k07.TileConfig(128, 128, 64, 8, 4), k07.TileConfig(128, 128, 64, 8, 5)]


# ---------------------------------------------------------------- helpers
def direct(cfg, group):
    """Launch lesson 07's kernel with one config; returns the compiled kernel."""
    def run(a, b, c):
        M, K = a.shape
        N = b.shape[1]
        a, b, precision = k07.operands(a, b)
        return k07.matmul_kernel[(triton.cdiv(M, cfg.BM) * triton.cdiv(N, cfg.BN),)](
            a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
            BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=group,
            INPUT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return run


def sass_of(compiled):
    cubin = compiled.asm.get("cubin")
    if not cubin:
        return ""
    from gemm_lessons.triton_asm import _sass
    return _sass(cubin)


def grep_report(label, compiled):
    ptx = compiled.asm.get("ptx", "")
    sass = sass_of(compiled)
    wg = sorted(set(re.findall(r"wgmma\.mma_async[\w.]*", ptx)))
    hg = sorted(set(re.findall(r"HGMMA\.[\w.]+", sass)))
    cp = len(re.findall(r"cp\.async\.cg\.shared\.global", ptx))
    tma = len(re.findall(r"cp\.async\.bulk\.tensor", ptx))
    shared = getattr(compiled.metadata, "shared", "?")
    log(f"{label}: PTX wgmma {wg or 'NONE'}; SASS {hg or ('(no nvdisasm)' if not sass else 'NONE')}; "
        f"cp.async.cg x{cp}, TMA x{tma}; shared {shared} B")
    return bool(wg)


def check_case(run, name, dtypes, names):
    cases = [c for c in harness.shape_suite() if c.name in names]
    return harness.check(run, name, dtypes, cases)


# ---------------------------------------------------------------- the sweep
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--no-explore", action="store_true")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if not gl.engine().kind == "cuda":
        sys.exit("this sweep needs a GPU (here: " + str(gl.engine()) + ")")

    if args.profile:
        for size in args.sizes:
            a, b = harness.make_operands(size, size, size, torch.float16)
            c = torch.empty(size, size, dtype=torch.float16, device=a.device)
            for order, g in (("grouped (GROUP_SIZE_M=8)", 8), ("row-major (GROUP_SIZE_M=1)", 1)):
                k07.matmul(a, b, c, group_size_m=g)
                torch.cuda.synchronize()
                print(f"launched matmul_kernel {size}^3 fp16 {order}", flush=True)
        return

    log(f"{gl.engine()}; torch {torch.__version__}, triton {triton.__version__}")

    # 1. checks
    for name in ("k07_triton_swizzle", "k08_triton_autotune"):
        log(str(gl.check(name)))
    try:   # new in lesson 08: a failure is reported, and the rest of the sweep still runs
        log(str(gl.check("k08_triton_tma")))
        tma_ok = True
    except Exception as e:
        log(f"k08_triton_tma FAILED: {type(e).__name__}: {str(e)[:1500]}")
        tma_ok = False
    log(str(gl.check("k07_triton_rowmajor", dtypes=[torch.float16])))   # same kernel, GROUP 1
    log(f"k08 chose on the last check shape: {k08.chosen_config()}")
    for c in k08.CONFIGS:
        cfg = k08.tile_config(c)
        rep = check_case(direct(cfg, c.kwargs["GROUP_SIZE_M"]), "k08 " + cfg_name(cfg), DTYPES,
                         ("ragged",))
        log(str(rep))
    explore = [] if args.no_explore else (
        [("k07 " + cfg_name(c), direct(c, 8)) for c in EXTRA]
        + [("persistent " + cfg_name(c), persistent(c)) for c in PERSISTENT]
        + ([("k08_triton_tma " + cfg_name(c), tma_persistent(c)) for c in TMA] if tma_ok else []))
    for label, run in list(explore):
        try:
            log(str(check_case(run, label, (torch.float16,), ("ragged",))))
        except Exception as e:   # an exploratory variant may not compile on this triton
            log(f"{label}: dropped ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            explore.remove((label, run))

    # 2. wgmma in what was launched
    size = args.sizes[0]
    for dtype in DTYPES:
        a, b = harness.make_operands(size, size, size, dtype)
        c = torch.empty(size, size, dtype=dtype, device=a.device)
        compiled = direct(k07.GPU_CONFIG[dtype], 8)(a, b, c)
        grep_report(f"k07 {dt(dtype)} {cfg_name(k07.GPU_CONFIG[dtype])}", compiled)

    # 3. check against cuBLAS at each size, then time
    rows = []
    for size in args.sizes:
        for dtype in DTYPES:
            a, b = harness.make_operands(size, size, size, dtype)
            ref = torch.empty(size, size, dtype=dtype, device=a.device)
            base_ms = harness.time_cuda(lambda: harness.cublas_matmul(a, b, ref))
            rows.append(("cuBLAS (torch.matmul)", dtype, size, base_ms, base_ms, ""))
            ref64 = harness.reference(a, b)
            variants = [("k07 grouped (GROUP_SIZE_M=8)", lambda a, b, c: k07.matmul(a, b, c)),
                        ("k07 row-major (GROUP_SIZE_M=1)", k07.rowmajor),
                        ("k08 autotuned", lambda a, b, c: gl.matmul(a, b, "k08_triton_autotune", out=c))]
            if tma_ok:
                variants += [("k08_triton_tma (TMA, persistent)",
                              lambda a, b, c: gl.matmul(a, b, "k08_triton_tma", out=c))]
            variants += [("k08 " + cfg_name(k08.tile_config(c)),
                          direct(k08.tile_config(c), c.kwargs["GROUP_SIZE_M"])) for c in k08.CONFIGS]
            variants += explore
            for label, run in variants:
                c = torch.full((size, size), float("nan"), dtype=dtype, device=a.device)
                run(a, b, c)
                torch.cuda.synchronize()
                ok, rel, _ = harness.compare(c, ref64, a, b, dtype)
                note = "" if ok else f"WRONG (rel {rel:.1e})"
                if label == "k08 autotuned":
                    note = "chose " + k08.chosen_config()
                ms = harness.time_cuda(lambda: run(a, b, c)) if ok else float("nan")
                rows.append((label, dtype, size, ms, base_ms, note))
            log(f"timed {size} {dt(dtype)}")
            del ref64

    # 4. the table
    print()
    print(f"{'kernel':40s} {'dtype':9s} {'size':>5s} {'ms':>8s} {'TFLOP/s':>8s} {'x cuBLAS':>8s}  note")
    for label, dtype, size, ms, base, note in rows:
        tf = harness.tflops(size, size, size, ms)
        print(f"{label:40s} {dt(dtype):9s} {size:5d} {ms:8.3f} {tf:8.1f} {base / ms:8.2f}  {note}")
    print(f"(GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
          f"triton {triton.__version__}; {time.time() - T0:.0f} s)")


if __name__ == "__main__":
    main()
