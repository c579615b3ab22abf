"""The checks of lesson 08 (Triton autotuning): ``exercises/08_*.ipynb``."""
from __future__ import annotations

import contextlib

import torch

from .. import engines, harness
from .guards import ExerciseError, HINTS, run_answer
from .products import check_product, small_suite


_CASES08 = ("square", "ragged", "K=1", "A transposed")


def ex08_tuned(tuned):
    """Lesson 08, exercise 1: configs, key and timer of the autotuner."""
    from ..kernels import k08_triton_autotune as k08
    keys = sorted(getattr(tuned, "keys", []) or [])
    if keys != ["K", "M", "N"]:
        raise ExerciseError(f"the key is {keys}: re-tune when M, N or K changes "
                            "(key=['M', 'N', 'K'])")
    configs = list(getattr(tuned, "configs", []))
    tiles = sorted((c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"])
                   for c in configs)
    if tiles != [(16, 16, 16), (16, 32, 32), (32, 16, 16)]:
        raise ExerciseError(f"{len(configs)} configs with tiles {tiles}: give the three configs "
                            "asked for, 16 x 16 x 16, 32 x 16 x 16 and 16 x 32 x 32")
    if getattr(tuned, "_do_bench", "unknown") is None:
        raise ExerciseError("no do_bench given: Triton's own benchmark times configs on a GPU "
                            "driver, which Triton's interpreter does not have; give "
                            "do_bench=k08.cpu_timer")
    report = check_product(lambda a, b, c: k08.matmul(a, b, c, kernel=tuned), "my_tuned",
                           (torch.float16,), small_suite(_CASES08), seconds=120)
    timed = len(getattr(tuned, "configs_timings", None) or {})
    if timed != 3:
        raise ExerciseError(f"{timed} configs were timed on the last new shape, not 3: is "
                            "do_bench=k08.cpu_timer given?")
    return f"{report}; three configs timed per new (M, N, K)"


def ex08_grid(launcher):
    """Lesson 08, exercise 2: a grid that follows the chosen config. The launcher is run with
    kernels tuned over a single config each, so a fixed grid fails for one of them."""
    import triton
    from ..kernels import k07_triton_swizzle as k07
    from ..kernels import k08_triton_autotune as k08
    report = None
    for bm, bn, bk in ((16, 16, 16), (32, 16, 16), (16, 32, 32)):
        cfg = triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                             "GROUP_SIZE_M": 4}, num_warps=1, num_stages=1)
        tuned = triton.autotune(configs=[cfg], key=["M", "N", "K"],
                                do_bench=k08.cpu_timer)(k07.matmul_kernel)
        try:
            report = check_product(lambda a, b, c: launcher(tuned, a, b, c), "my_launcher",
                                   (torch.float16,), small_suite(_CASES08))
        except ExerciseError as e:
            raise ExerciseError(f"with the config {bm} x {bn} x {bk}: {e}\n(the {HINTS['grid']} "
                                "for this config? compute it from meta['BLOCK_SIZE_M'] and "
                                "meta['BLOCK_SIZE_N'])") from None
    return f"{report}; every tile written, whichever config won"


# The most shared memory one program may use, by compute capability (bytes; the CUDA C++
# Programming Guide's "maximum amount of shared memory per thread block").
_SMEM_LIMIT08 = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 9): 99 * 1024, (9, 0): 227 * 1024}


def _stage_buffers08(num_stages, capability):
    """Buffers (one tile of A and one of B each) Triton allocates for ``num_stages`` >= 2
    when tl.dot runs on the tensor cores (fp16, bf16, fp32 as TF32): one per stage on Hopper,
    where wgmma reads shared memory while the next copies are issued; one fewer on Ampere and
    Ada, where mma.sync reads registers (lesson 07 reads both from the compiler's IR; Triton
    3.9's compiler gives the same counts for fp32 as TF32, and num_stages - 1 on sm_90 too
    for fp32 with input_precision="ieee", which runs on the FMA units)."""
    return num_stages if tuple(capability) >= (9, 0) else num_stages - 1


@contextlib.contextmanager
def _own_count08(k08):
    """Inside the block, lesson 08's own buffer count refuses to be called: the exercise is
    to count the buffers and bytes, not to ask the package."""
    def refused(name):
        def call(*args, **kwargs):
            raise ExerciseError(f"my_prune calls k08.{name}: count the stage buffers and their "
                                "bytes in your own code (that count is the exercise)")
        return call
    names = ("stage_buffers", "smem_bytes", "smem_limit")
    saved = {n: getattr(k08, n) for n in names}
    try:
        for n in names:
            setattr(k08, n, refused(n))
        yield
    finally:
        for n, f in saved.items():
            setattr(k08, n, f)


def ex08_prune(prune):
    """Lesson 08, exercise 3: prune the configs whose stage buffers do not fit, for the GPU
    architecture given as ``capability`` (the buffer count and the limit both depend on it)."""
    from ..kernels import k08_triton_autotune as k08
    configs = [k08.make_config(128, 256, 64, 8, 3), k08.make_config(128, 256, 64, 8, 4),
               k08.make_config(128, 256, 64, 8, 5), k08.make_config(256, 256, 64, 8, 4),
               k08.make_config(128, 128, 128, 8, 3), k08.make_config(64, 64, 32, 4, 6),
               k08.make_config(128, 64, 32, 4, 2), k08.make_config(128, 128, 64, 4, 4)]

    def tile(c):
        kw = c.kwargs
        return (kw["BLOCK_SIZE_M"] + kw["BLOCK_SIZE_N"]) * kw["BLOCK_SIZE_K"]

    def kept(cc, size, buffers=_stage_buffers08, limit=None):
        limit = _SMEM_LIMIT08[cc] if limit is None else limit
        return [k08.label(c) for c in configs
                if buffers(c.num_stages, cc) * tile(c) * size <= limit]

    cases = [(cc, dtype) for cc in ((9, 0), (8, 0), (8, 6))
             for dtype in (torch.float16, torch.float32)]
    sizes = {dtype: torch.empty(0, dtype=dtype).element_size() for _, dtype in cases}
    got = {}
    for cc, dtype in cases:
        with run_answer("my_prune", seconds=10), _own_count08(k08):
            got[cc, dtype] = [k08.label(c) for c in prune(
                list(configs), {"a_ptr": torch.empty(1, dtype=dtype)}, capability=cc)]
    wrong = [(cc, dtype) for cc, dtype in cases if got[cc, dtype] != kept(cc, sizes[dtype])]
    if wrong:
        # which typical mistake explains every answer?
        models = [
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n),
             "on Ampere and Ada (sm_80, sm_86, sm_89) Triton allocates num_stages - 1 buffers "
             "(mma.sync takes its operands from registers, so the stage being computed needs "
             "no buffer of its own); num_stages buffers is Hopper's count"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n - 1),
             "on Hopper (sm_90) each of the num_stages stages has its own buffer: wgmma reads "
             "its operands from shared memory while the next copies are issued"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: 1),
             "num_stages: the stage buffers are counted as one"),
        ]
        models += [(lambda cc, size, s=s: kept(cc, s),
                    "the element size: bytes = elements x named_args['a_ptr'].dtype.itemsize")
                   for s in (1, 2, 4)]
        models += [(lambda cc, size, lim=lim: kept(cc, size, limit=lim),
                    "the limit: SMEM_LIMIT[capability] depends on the GPU, the limit of another "
                    "GPU was used") for lim in sorted(set(_SMEM_LIMIT08.values()))]
        cause = next((why for model, why in models
                      if all(got[k] == model(k[0], sizes[k[1]]) for k in cases)),
                     "buffers x (BLOCK_SIZE_M + BLOCK_SIZE_N) x BLOCK_SIZE_K x element size, at "
                     "most SMEM_LIMIT[capability] bytes (<=), with num_stages buffers on sm_90 and "
                     "num_stages - 1 on sm_80, sm_86, sm_89")
        cc, dtype = wrong[0]
        raise ExerciseError(f"sm_{cc[0]}{cc[1]}, {str(dtype).replace('torch.', '')}: kept "
                            f"{got[cc, dtype]}, expected {kept(cc, sizes[dtype])}. Likely cause: "
                            f"{cause}")
    with run_answer("my_prune", seconds=10), _own_count08(k08):
        fp16 = {"a_ptr": torch.empty(1, dtype=torch.float16)}
        got = [k08.label(c) for c in prune(list(configs), fp16)]
    if got != kept((9, 0), 2):
        raise ExerciseError(f"without a capability: kept {got}, expected {kept((9, 0), 2)} (the "
                            "default capability is (9, 0), an H100/H200)")
    return "my_prune: stage buffers counted for sm_90, sm_80 and sm_86, in fp16 and fp32 (TF32)"


def _tma_cases08():
    """(what, tensor, can a descriptor read it in place) on the engine's device."""
    gen = torch.Generator().manual_seed(8)
    dev = engines.device()

    def r(*shape, dtype=torch.float16):
        return torch.randn(*shape, generator=gen).to(dtype).to(dev)
    f32 = torch.float32
    return [
        ("a contiguous fp16 40 x 64", r(40, 64), True),
        ("a contiguous fp16 40 x 24 (rows of 48 bytes)", r(40, 24), True),
        ("a contiguous fp32 40 x 4 (rows of 16 bytes)", r(40, 4, dtype=f32), True),
        ("columns 0..22 of an fp16 40 x 64 (23 columns, rows 128 bytes apart)",
         r(40, 64)[:, :23], True),
        ("rows 8.. of an fp32 48 x 20 (rows 80 bytes apart, the first at byte 640)",
         r(48, 20, dtype=f32)[8:], True),
        ("a contiguous fp16 40 x 23 (rows of 46 bytes)", r(40, 23), False),
        ("a contiguous fp32 40 x 5 (rows of 20 bytes)", r(40, 5, dtype=f32), False),
        ("a transposed fp16 view, 64 x 40 .t() (strides (1, 40))", r(64, 40).t(), False),
        ("every second column of an fp16 40 x 64 (strides (64, 2))", r(40, 64)[:, ::2], False),
        ("the slice [1:, 1:] of an fp16 41 x 72 (its first element 146 bytes past the "
         "buffer's aligned start)", r(41, 72)[1:, 1:], False),
    ]


def ex08_tma(tma_operand):
    """Lesson 08, exercise 4: an operand a TMA descriptor can read: in place when its last
    stride is 1 and its row stride and base are multiples of 16 bytes, else a copy with rows
    padded to 16 bytes, viewed with the true shape. Then the persistent TMA kernel runs on
    the answer's operands."""
    import triton
    from ..kernels import k08_triton_tma as k08t
    for what, t, ready in _tma_cases08():
        size = t.element_size()
        with run_answer("tma_operand", seconds=10):
            got = tma_operand(t)
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{what}: tma_operand returned {type(got).__name__}, not a tensor")
        if ready:
            if got.data_ptr() != t.data_ptr() or got.stride() != t.stride() or got.shape != t.shape:
                raise ExerciseError(
                    f"{what}: a descriptor can read it in place (last stride 1, rows "
                    f"{t.stride(0) * size} bytes apart, base 16-byte aligned), but tma_operand "
                    "copied it: use it in place, no copy (this is the case that is timed). Likely "
                    "cause: the test counts elements instead of bytes (stride(0) x "
                    "element_size()), or looks at the shape instead of the row stride")
            continue
        if tuple(got.shape) != tuple(t.shape):
            raise ExerciseError(f"{what}: returned shape {tuple(got.shape)}, not {tuple(t.shape)}: "
                                "return the padded buffer as a view with the true shape "
                                "(buf[:, :cols]): the descriptor keeps the true shape, so the "
                                "padding is never read")
        if got.dtype != t.dtype:
            raise ExerciseError(f"{what}: returned {got.dtype}, not {t.dtype}")
        if got.stride(1) != 1:
            raise ExerciseError(f"{what}: the result's last stride is {got.stride(1)}: a "
                                "descriptor needs the last stride 1 (a transposed view must be "
                                "copied)")
        if got.data_ptr() % 16:
            raise ExerciseError(f"{what}: the result's first element is at an address "
                                f"{got.data_ptr() % 16} bytes past a multiple of 16: a descriptor "
                                "needs a 16-byte-aligned base address (check t.data_ptr() % 16)")
        if got.stride(0) * size % 16:
            raise ExerciseError(f"{what}: the result's rows are {got.stride(0) * size} bytes "
                                "apart: a descriptor needs a multiple of 16 bytes; pad each row "
                                f"({16 // size} elements of {size} bytes are 16 bytes)")
        if not torch.equal(got, t):
            raise ExerciseError(f"{what}: the result holds other values: copy t into the padded "
                                "view (view.copy_(t))")
    # the persistent TMA kernel of the lesson on the answer's operands: ragged K, B transposed
    gen = torch.Generator().manual_seed(9)
    dev = engines.device()
    a = torch.randn(40, 23, generator=gen).half().to(dev)
    b = torch.randn(29, 23, generator=gen).half().to(dev).t()
    c = torch.full((40, 29), float("nan"), dtype=torch.float16, device=dev)
    cfg = k08t.SIM_CONFIG
    with run_answer("tma_operand"):
        a2, b2 = tma_operand(a), tma_operand(b)
        out = k08t.tma_view(c, copy=False)
        a_desc, b_desc, c_desc = k08t.descriptors(a2, b2, out, cfg)
        tiles = triton.cdiv(40, cfg.BM) * triton.cdiv(29, cfg.BN)
        k08t.tma_persistent_kernel[(min(k08t.SIM_SMS, tiles),)](
            a_desc, b_desc, c_desc, 40, 29, 23, BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN,
            BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=k08t.GROUP_SIZE_M, NUM_SMS=k08t.SIM_SMS,
            INPUT_PRECISION="tf32", num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        c.copy_(out)
    ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float16)
    if not ok:
        raise ExerciseError("the TMA kernel on your operands (A 40 x 23, B transposed) gives a "
                            "wrong product: the copies must hold t's values, viewed with t's shape")
    return ("tma_operand: 5 operands read in place, 5 copied into rows padded to 16 bytes; the "
            "persistent TMA kernel right on them")
