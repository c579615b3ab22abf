"""The process Nsight Compute profiles for lesson 09's losing shape: each contender of one
fused bias + gelu product launched once, after warm-up, between ``cudaProfilerStart`` and
``cudaProfilerStop``, so that ``ncu --profile-from-start off`` sees those launches only.

Contenders, in this order: torch eager (``addmm`` with the bias, then ``gelu``: two
kernels), cuBLAS's ``mm`` alone, ``k09_fused_tma_splitk`` as its autotuner picks, and
``k09_fused_tma_splitk`` with each ``--config`` given as it is (no tuning). Each fused result
is checked against eager first. Needs a GPU that runs ``k09_fused_tma_splitk`` (sm_90). Run it under
ncu through ``tools/record_ncu.sh k09``, which writes
``gemm_lessons/results/recorded/ncu_k09_1024x1024x16384.txt``:

    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        python tools/profile_k09_shape.py --shape 1024x1024x16384 --config 128x64x64:k1:w4:s8:g1

A config is ``BMxBNxBK:kSPLIT:wWARPS:sSTAGES:gGROUP`` (``k08_triton_splitk.make_config``).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemm_lessons import api  # noqa: E402
from gemm_lessons.kernels import k08_triton_splitk as k08s  # noqa: E402
from gemm_lessons.kernels import k09_fused_tma_splitk as tsk  # noqa: E402
from gemm_lessons.labs.k09 import epilogue_operands  # noqa: E402
from gemm_lessons.shapes import shape_arg  # noqa: E402

CONFIG = re.compile(r"^(\d+)x(\d+)x(\d+):k(\d+):w(\d+):s(\d+):g(\d+)$")


def config_arg(text):
    """``'128x64x64:k1:w4:s8:g1'`` as a ``make_config``; anything else an argparse error."""
    m = CONFIG.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want BMxBNxBK:kSPLIT:wWARPS:sSTAGES:gGROUP, e.g. 128x64x64:k1:w4:s8:g1")
    BM, BN, BK, S, W, ST, G = (int(x) for x in m.groups())
    if min(BM, BN, BK, S, W, ST, G) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every number must be at least 1")
    return k08s.make_config(BM, BN, BK, W, ST, split_k=S, group_size_m=G)


def contenders(M, N, K, configs):
    """[(name, fn)] in launch order, each fn returning the product."""
    a, b, bias = epilogue_operands(M, N, K, torch.float16)
    out = {}

    def fused(cfg, key):
        out[key] = torch.empty(M, N, dtype=a.dtype, device=a.device)
        return lambda: tsk.fused_gemm(a, b, None, out[key], 1.0, 0.0, bias, "gelu", config=cfg)
    mm_out = torch.empty(M, N, dtype=a.dtype, device=a.device)
    runs = [("torch eager: gelu(addmm(bias, a, b))", lambda: F.gelu(torch.addmm(bias, a, b))),
            ("cuBLAS mm alone", lambda: torch.mm(a, b, out=mm_out)),
            ("k09_fused_tma_splitk, autotuned", fused(None, "tuned"))]
    runs += [(f"k09_fused_tma_splitk, {k08s.label(c)} g{c.kwargs['GROUP_SIZE_M']}",
              fused(c, i)) for i, c in enumerate(configs)]
    return runs, (a, b, bias)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=shape_arg, default=(1024, 1024, 16384))
    p.add_argument("--config", type=config_arg, action="append", default=[],
                   help="also run k09_fused_tma_splitk with this config (repeatable)")
    args = p.parse_args(argv)
    if gl.backend() != "cuda" or not api.runs_here("k09_fused_tma_splitk"):
        print("profiling k09_fused_tma_splitk needs a GPU of sm_90 or newer", file=sys.stderr)
        return 2
    M, N, K = args.shape
    runs, (a, b, bias) = contenders(M, N, K, args.config)
    ref = F.gelu(torch.addmm(bias, a, b)).float()
    for name, fn in runs:                      # check (and tune, compile) before profiling
        y = fn()
        if name != "cuBLAS mm alone":
            err = ((y.float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                print(f"{name} disagrees with torch eager: relative error {err:.1e}",
                      file=sys.stderr)
                return 1
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    print(f"fp16 {M}x{N}x{K}, bias + gelu; launches profiled, in this order:")
    for name, _ in runs:
        print(f"  {name}")
    print(f"  (the autotuner picked {tsk.chosen_config()})")
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in runs:
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
