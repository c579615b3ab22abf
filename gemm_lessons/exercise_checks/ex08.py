"""The checks of lesson 08 (Triton autotuning): ``exercises/08_*.ipynb``."""
from __future__ import annotations

import torch

from .. import engines, harness
from .guards import ExerciseError, HINTS, run_answer
from .products import ceil_div, check_product, small_suite
from .refusal import no_package_calls


_CASES08 = ("square", "ragged", "K=1", "A transposed")


def _deepest08(K):
    """The deepest BLOCK_SIZE_K worth timing for K: K rounded up to a multiple of 16."""
    return ceil_div(K, 16) * 16


def _time_once08(fn, quantiles=None, **kwargs):
    """A do_bench for the check: one run, its wall-clock milliseconds (the check counts the
    configs timed; what the times are does not matter here)."""
    import time
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def ex08_tuned(tuned):
    """Lesson 08, exercise 1: configs, key, timer and a prune by K of the autotuner."""
    from ..kernels import k08_triton_autotune as k08
    from .refusal import in_package
    if any(tuned is getattr(k08, n, None) for n in ("matmul_autotuned",)):
        raise ExerciseError("my_tuned is the package's own autotuned kernel "
                            "(k08.matmul_autotuned): build yours with triton.autotune")
    if getattr(tuned, "made_by", None):
        raise ExerciseError(f"my_tuned is built by {tuned.made_by}, the package's own "
                            "function: the package's code is no answer; build yours with "
                            "triton.autotune (the key, the prune and the timer are the "
                            "exercise)")
    prune = getattr(tuned, "early_config_prune", None)
    code = getattr(prune, "__code__", None)
    if code is not None and in_package(code):
        raise ExerciseError(f"my_tuned prunes with the package's own {prune.__module__}."
                            f"{prune.__qualname__}: the package's code is no answer; give "
                            "prune_configs_by your own function (that is the exercise)")
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
    if prune is None:
        raise ExerciseError("no early_config_prune: every config is timed whatever K is. Give "
                            "triton.autotune prune_configs_by={'early_config_prune': ...}, a "
                            "function that keeps the configs whose BLOCK_SIZE_K is at most K "
                            "rounded up to a multiple of 16")
    timed = {}

    def own_prune(configs, named_args, **kwargs):
        with no_package_calls("my_tuned's prune"):
            return prune(configs, named_args, **kwargs)

    def run(a, b, c):
        tuned.cache.clear()               # every shape tuned afresh: its timings are its own
        tuned.configs_timings = None
        K = a.shape[1]
        tuned.early_config_prune = own_prune
        timer, tuned._do_bench = tuned._do_bench, _time_once08   # one run a config is enough
        try:
            k08.matmul(a, b, c, kernel=tuned)
        except Exception as e:            # noqa: BLE001  (Triton's AutotunerError)
            if "No valid autotuner configs" in str(e):
                raise ExerciseError(
                    f"K = {K}: the prune left no config to run: keep the configs whose "
                    f"BLOCK_SIZE_K <= K rounded up to a multiple of 16, here {_deepest08(K)} "
                    "(<=: a K-tile exactly that deep stays)") from None
            raise
        finally:
            tuned.early_config_prune = prune
            tuned._do_bench = timer
        timed[K] = n = len(tuned.configs_timings or {})
        want = sum(1 for t in tiles if t[2] <= _deepest08(K))
        want = want if want > 1 else 0          # a single config is run, not timed
        if n != want:
            raise ExerciseError(
                f"K = {K}: {n} configs were timed, not {want}: the prune keeps the configs "
                f"whose BLOCK_SIZE_K is at most K rounded up to a multiple of 16 "
                f"({_deepest08(K)}), and drops the deeper ones"
                + (" (is do_bench=k08.cpu_timer given?)" if n == 0 else ""))

    # K = 16 first: a prune that keeps too much, or too little, is seen at once
    report = check_product(run, "my_tuned", (torch.float16,),
                           [harness.Case("K=16", 24, 20, 16, hint="one K-tile of 16")]
                           + small_suite(_CASES08), seconds=120)
    return (f"{report}; the configs no deeper than K timed per new (M, N, K): "
            + ", ".join(f"K = {K}: {n}" for K, n in sorted(timed.items())))


_KERNELS08 = {}


def _matmul_batched():
    """Lesson 07's kernel on a 3-D grid, for a batch of products: axis 0 counts the tiles
    along N, axis 1 those along M, axis 2 the matrices of the batch (built once, on first
    use, after the engine is chosen)."""
    if "3d" not in _KERNELS08:
        import triton
        import triton.language as tl
        globals()["tl"] = tl

        @triton.jit
        def matmul_batched(a_ptr, b_ptr, c_ptr, M, N, K,
                           stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                           stride_cb, stride_cm, stride_cn,
                           BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                           BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr):
            pid_n = tl.program_id(axis=0)             # axis 0: the tiles along N
            pid_m = tl.program_id(axis=1)             # axis 1: the tiles along M
            pid_b = tl.program_id(axis=2)             # axis 2: the matrices of the batch
            a_ptr += pid_b * stride_ab
            b_ptr += pid_b * stride_bb
            c_ptr += pid_b * stride_cb
            offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
            offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
            offs_k = tl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
            b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
                k_left = K - k * BLOCK_SIZE_K
                a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
                a_ptrs += BLOCK_SIZE_K * stride_ak
                b_ptrs += BLOCK_SIZE_K * stride_bk
            offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                     mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))

        _KERNELS08["3d"] = matmul_batched
    return _KERNELS08["3d"]


class _GridRecorder:
    """Stands for the kernel: records the grid a launcher passes to ``kernel[grid]``."""

    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.launch

    def launch(self, *args, **kwargs):
        pass


_TILES08 = ((16, 16, 16), (32, 16, 16), (16, 32, 32))


_BATCH08 = 3


def _fewest08(size, extent):
    """The fewest tiles ``size`` wide that together cover ``extent`` (found by counting)."""
    return next(k for k in range(1, extent + 1) if k * size >= extent)


def _grid_cause08(launcher):
    """Call the launcher with a recorder for a kernel, evaluate its grid for each config's
    meta-parameters, and name what is wrong with it (None if nothing). A count along an
    axis is right when its tiles cover the extent with no tile to spare."""
    M, N, K, batch = 37, 45, 29, _BATCH08
    a, b = torch.randn(batch, M, K).half(), torch.randn(batch, K, N).half()
    c = torch.empty(batch, M, N, dtype=torch.float16)
    rec = _GridRecorder()
    with run_answer("my_launcher", seconds=30), \
            no_package_calls("my_launcher", allowed=(rec.__getitem__, rec.launch)):
        launcher(rec, a, b, c)
    if not rec.grids:
        return ("my_launcher never launches the kernel it is given (kernel[grid](...)): launch "
                "that kernel, with a grid that follows its config")
    grid = rec.grids[-1]
    if not callable(grid):
        return (f"{HINTS['grid']} for some configs: the grid {grid} is fixed; the config the "
                "autotuner picks decides the tile, so give a function grid(meta) that "
                "computes it from meta['BLOCK_SIZE_M'] and meta['BLOCK_SIZE_N']")
    for bm, bn, bk in _TILES08:
        meta = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 4}
        with run_answer("my_launcher's grid(meta)", seconds=10), \
                no_package_calls("my_launcher's grid(meta)"):
            got = tuple(grid(dict(meta)))
        tiles_n, tiles_m = _fewest08(bn, N), _fewest08(bm, M)
        if got == (tiles_n, tiles_m, batch):
            continue
        where = (f"a batch of {batch} products, M = {M}, N = {N}, the config {bm} x {bn} x "
                 f"{bk}: grid {got}, expected ({tiles_n}, {tiles_m}, {batch})")
        if len(got) == 1:
            return (f"{where}: a 1-D grid (lesson 08's). This kernel reads tl.program_id(0) "
                    "for its column of tiles, tl.program_id(1) for its row and "
                    "tl.program_id(2) for its matrix of the batch: a 3-D grid")
        if len(got) == 2:
            return (f"{where}: {HINTS['grid']}: the batch has no axis, so only its first "
                    "matrix is computed: axis 2 counts the matrices of the batch (a.shape[0]), "
                    "one program per tile of each")
        if got[0] == batch and got[1:] == (tiles_n, tiles_m):
            return (f"{where}: the batch on axis 0: this kernel reads its matrix from "
                    "tl.program_id(2), its column of tiles from tl.program_id(0)")
        if got[:2] == (tiles_m, tiles_n) and tiles_m != tiles_n:
            return (f"{where}: the axes swapped: axis 0 counts the tiles along N "
                    "(tl.program_id(0) is pid_n), axis 1 the tiles along M")
        if got[2] != batch:
            return (f"{where}: axis 2 has {got[2]} programs for a batch of {batch} matrices: "
                    "one per matrix (a.shape[0])")
        if got[:2] in ((N // bn, M // bm), (max(N // bn, 1), max(M // bm, 1))):
            return (f"{where}: {HINTS['grid']}: integer division rounds down, and the partial "
                    "tiles at the edge are tiles too (triton.cdiv)")
        if got[0] == _fewest08(bm, N):
            return (f"{where}: {HINTS['grid']} for this config: the tiles along N are "
                    "meta['BLOCK_SIZE_N'] wide, not BLOCK_SIZE_M")
        return (f"{where}: {HINTS['grid']} for this config: compute it from "
                "meta['BLOCK_SIZE_M'] and meta['BLOCK_SIZE_N'] of the config the autotuner "
                "picks")
    return None


def ex08_grid(launcher):
    """Lesson 08, exercise 2: a 3-D grid that follows the chosen config, for a batch of
    products. The grid is read from a recorded launch for each config, then the launcher
    runs kernels tuned over a single config each, so a fixed grid fails for one of them."""
    import triton
    from ..kernels import k08_triton_autotune as k08
    cause = _grid_cause08(launcher)
    if cause:
        raise ExerciseError(cause)
    report = None
    for bm, bn, bk in _TILES08:
        cfg = triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                             "GROUP_SIZE_M": 4}, num_warps=1, num_stages=1)
        tuned = triton.autotune(configs=[cfg], key=["M", "N", "K"],
                                do_bench=k08.cpu_timer)(_matmul_batched())

        def run(a, b, c):
            # the case's product is the last of a batch; the others are other products
            a3 = torch.stack([a.flip(0)] * (_BATCH08 - 1) + [a])
            b3 = torch.stack([b.flip(1)] * (_BATCH08 - 1) + [b])
            c3 = torch.full((_BATCH08, *c.shape), float("nan"), dtype=c.dtype)
            launcher(tuned, a3, b3, c3)
            c.copy_(c3[-1])
            left = [i for i in range(_BATCH08 - 1) if c3[i].isnan().any()]
            if left:
                raise ExerciseError(f"matrices {left} of the batch hold NaN: not every "
                                    "(tile, matrix) pair has a program")
        try:
            report = check_product(run, "my_launcher", (torch.float16,), small_suite(_CASES08))
        except ExerciseError as e:
            raise ExerciseError(f"with the config {bm} x {bn} x {bk}: {e}\n(the {HINTS['grid']} "
                                "for this config? axis 0 from meta['BLOCK_SIZE_N'], axis 1 from "
                                "meta['BLOCK_SIZE_M'], axis 2 the batch)") from None
    return (f"{report}; every tile of every matrix of a batch written on a 3-D grid, whichever "
            "config won")


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


def ex08_prune(prune):
    """Lesson 08, exercise 3: prune the configs whose stage buffers do not fit, for the GPU
    architecture given as ``capability`` (the buffer count and the limit both depend on it)."""
    from ..kernels import k08_triton_autotune as k08
    configs = [k08.make_config(128, 256, 64, 8, 3), k08.make_config(128, 256, 64, 8, 4),
               k08.make_config(128, 256, 64, 8, 5), k08.make_config(256, 256, 64, 8, 4),
               k08.make_config(128, 128, 128, 8, 3), k08.make_config(64, 64, 32, 4, 6),
               k08.make_config(128, 64, 32, 4, 2), k08.make_config(128, 128, 64, 4, 4),
               # 11 buffers of (128 + 16) x 32 fp16 elements on sm_80-89: exactly 99 KiB
               k08.make_config(128, 16, 32, 4, 12)]

    def tile(c):
        kw = c.kwargs
        return (kw["BLOCK_SIZE_M"] + kw["BLOCK_SIZE_N"]) * kw["BLOCK_SIZE_K"]

    def kept(cc, size, buffers=_stage_buffers08, limit=None, strict=False):
        limit = _SMEM_LIMIT08[cc] if limit is None else limit
        return [k08.label(c) for c in configs
                if (buffers(c.num_stages, cc) * tile(c) * size < limit + (0 if strict else 1))]

    cases = [(cc, dtype) for cc in ((9, 0), (8, 0), (8, 6), (8, 9))
             for dtype in (torch.float16, torch.float32)]
    sizes = {dtype: torch.empty(0, dtype=dtype).element_size() for _, dtype in cases}
    got = {}
    for cc, dtype in cases:
        with run_answer("my_prune", seconds=10), no_package_calls("my_prune"):
            got[cc, dtype] = [k08.label(c) for c in prune(
                list(configs), {"a_ptr": torch.empty(1, dtype=dtype)}, capability=cc)]
    wrong = [(cc, dtype) for cc, dtype in cases if got[cc, dtype] != kept(cc, sizes[dtype])]
    if wrong:
        # which typical mistake explains every answer?
        models = [
            (lambda cc, size: kept(cc, size, strict=True),
             "the limit itself fits: a config whose buffers take exactly SMEM_LIMIT[capability] "
             "bytes runs, so keep it (<=, not <)"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n if c >= (8, 9) else n - 1),
             "sm_89 (Ada) counted as Hopper: Ada's tl.dot is mma.sync, from registers, like "
             "Ampere's, so Triton allocates num_stages - 1 buffers there; one buffer per stage "
             "is sm_90's (capability >= (9, 0))"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n if c >= (8, 6) else n - 1),
             "sm_86 and sm_89 counted as Hopper: their tl.dot is mma.sync, from registers, so "
             "Triton allocates num_stages - 1 buffers there; one buffer per stage is sm_90's "
             "(capability >= (9, 0))"),
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
    with run_answer("my_prune", seconds=10), no_package_calls("my_prune"):
        fp16 = {"a_ptr": torch.empty(1, dtype=torch.float16)}
        got = [k08.label(c) for c in prune(list(configs), fp16)]
    if got != kept((9, 0), 2):
        raise ExerciseError(f"without a capability: kept {got}, expected {kept((9, 0), 2)} (the "
                            "default capability is (9, 0), an H100/H200)")
    return ("my_prune: stage buffers counted for sm_90, sm_80, sm_86 and sm_89, in fp16 and fp32 "
            "(TF32), a config of exactly the limit kept")


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
        # batches of matrices (B, rows, cols): every stride but the last counts
        ("a contiguous fp16 batch 3 x 40 x 24 (rows of 48 bytes)", r(3, 40, 24), True),
        ("columns 0..22 of an fp16 batch 2 x 40 x 64 (rows 128 bytes apart)",
         r(2, 40, 64)[:, :, :23], True),
        ("a contiguous fp16 batch 3 x 40 x 23 (rows of 46 bytes)", r(3, 40, 23), False),
        ("the first 24 columns of an fp16 2 x 28, viewed as a batch 2 x 3 x 8 (rows 16 bytes "
         "apart, the matrices 56)", r(2, 28)[:, :24].view(2, 3, 8), False),
    ]


def ex08_tma(tma_operand):
    """Lesson 08, exercise 4: an operand a TMA descriptor can read, a matrix or a batch of
    them: in place when its last stride is 1 and every other stride and its base are
    multiples of 16 bytes, else a copy with rows padded to 16 bytes, viewed with the true
    shape. Then the persistent TMA kernel runs on the answer's operands."""
    import triton
    from ..kernels import k08_triton_tma as k08t
    counts = [0, 0]
    for what, t, ready in _tma_cases08():
        size = t.element_size()
        counts[not ready] += 1
        try:
            with run_answer("tma_operand", seconds=10), no_package_calls("tma_operand"):
                got = tma_operand(t)
        except ExerciseError as e:
            if t.dim() == 3 and "package's own" not in str(e) and "TODO" not in str(e):
                raise ExerciseError(
                    f"{what}: {e}. Likely cause: an answer for matrices only: t may be a batch "
                    "of them (B, rows, cols); keep its leading sizes and pad only the last "
                    "(t.shape[:-1], buf[..., :cols]), and test every stride but the last") from None
            raise
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{what}: tma_operand returned {type(got).__name__}, not a tensor")
        outer = ", ".join(f"{x * size}" for x in t.stride()[:-1])
        if ready:
            if got.data_ptr() != t.data_ptr() or got.stride() != t.stride() or got.shape != t.shape:
                raise ExerciseError(
                    f"{what}: a descriptor can read it in place (last stride 1, the other "
                    f"strides {outer} bytes, base 16-byte aligned), but tma_operand copied it: "
                    "use it in place, no copy (this is the case that is timed). Likely cause: "
                    "the test counts elements instead of bytes (stride x element_size()), looks "
                    "at the shape instead of the strides, or takes stride(1) for the last "
                    "stride (a batch has three: the last is stride(-1))")
            continue
        if tuple(got.shape) != tuple(t.shape):
            raise ExerciseError(f"{what}: returned shape {tuple(got.shape)}, not {tuple(t.shape)}: "
                                "return the padded buffer as a view with the true shape "
                                "(buf[..., :cols]): the descriptor keeps the true shape, so the "
                                "padding is never read")
        if got.dtype != t.dtype:
            raise ExerciseError(f"{what}: returned {got.dtype}, not {t.dtype}")
        if got.stride(-1) != 1:
            raise ExerciseError(f"{what}: the result's last stride is {got.stride(-1)}: a "
                                "descriptor needs the last stride 1 (a transposed view must be "
                                "copied)")
        if got.data_ptr() % 16:
            raise ExerciseError(f"{what}: the result's first element is at an address "
                                f"{got.data_ptr() % 16} bytes past a multiple of 16: a descriptor "
                                "needs a 16-byte-aligned base address (check t.data_ptr() % 16)")
        if got.stride(-2) * size % 16:
            raise ExerciseError(f"{what}: the result's rows are {got.stride(-2) * size} bytes "
                                "apart: a descriptor needs a multiple of 16 bytes; pad each row "
                                f"({16 // size} elements of {size} bytes are 16 bytes)")
        if got.dim() == 3 and got.stride(0) * size % 16:
            raise ExerciseError(f"{what}: the result's matrices are {got.stride(0) * size} bytes "
                                "apart: a descriptor needs every stride but the last a multiple "
                                "of 16 bytes, the batch's too (test all of t.stride()[:-1])")
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
        with no_package_calls("tma_operand"):
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
    return (f"tma_operand: {counts[0]} operands read in place, {counts[1]} copied into rows "
            "padded to 16 bytes (matrices and batches); the persistent TMA kernel right on them")
