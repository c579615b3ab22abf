"""The process Nsight Compute profiles for lesson 04's steps: lesson 02's kernel and each
lesson-04 step launched once on one fp32 size, after a check and a warm-up, between
``cudaProfilerStart`` and ``cudaProfilerStop``, so that ``ncu --profile-from-start off``
sees those launches only, in the order of ``STEPS``.

Run it under ncu through ``tools/record_ncu.sh k04``, which writes
``gemm_lessons/results/recorded/ncu_k04_steps.txt`` (instructions issued by the load/store
pipe, shared-load instructions and wavefronts, bank conflicts, achieved occupancy, issue
and FMA-pipe use, and the stall reasons per issued instruction of each kernel):

    ncu --profile-from-start off --metrics <the list in tools/record_ncu.sh> \\
        python tools/ncu_k04_steps.py --size 4096
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness  # noqa: E402

STEPS = ["k02_smem_tiling", "k04_1d_tiling", "k04_2d_tiling", "k04_vectorized",
         "k04_warp_tiling", "k04_thread_tile", "k04_prefetch", "k04_double_buffer",
         "k04_register_tiling"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="M = N = K (default 4096)")
    args = p.parse_args(argv)
    if gl.backend() != "cuda":
        print("profiling lesson 04's kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    n = args.size
    a, b = harness.make_operands(n, n, n, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = torch.mm(a, b)
    out = torch.empty(n, n, device=a.device)
    for name in STEPS:                 # compile, check, warm up before profiling
        out.fill_(float("nan"))
        gl.matmul(a, b, name, out=out)
        err = ((out - ref).norm() / ref.norm()).item()
        if not err < 1e-5:
            print(f"{name} disagrees with cuBLAS at {n}^3: relative error {err:.1e}",
                  file=sys.stderr)
            return 1
        gl.matmul(a, b, name, out=out)
    torch.cuda.synchronize()
    print(f"fp32 {n}x{n}x{n}; launches profiled, in this order: {', '.join(STEPS)}")
    torch.cuda.cudart().cudaProfilerStart()
    for name in STEPS:
        gl.matmul(a, b, name, out=out)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
