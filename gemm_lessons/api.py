"""The public API: every argument is validated here, once; kernel launchers trust it."""
from __future__ import annotations

import inspect
import numbers

import torch

from . import engines as _backend
from . import choose as _choose
from . import fastpath as _fast
from . import harness as _harness
from . import registry as _registry
from .common import dtype_name as _dt
from .common import run_on_simulator

__all__ = ["kernels", "auto_kernel", "matmul", "scaled_matmul", "prepare", "Prepared", "gemm", "check", "check_anywhere", "runs_here", "bench", "show_source", "show_diff", "source_text", "ACTIVATIONS"]

ACTIVATIONS = (None, "relu", "gelu", "leaky_relu")


def kernels():
    """The registered kernels, in lesson order (name, lesson, language, dtypes, min_cc, summary)."""
    return _registry.entries()


class UnsupportedDevice(ValueError):
    """The GPU lacks an instruction the kernel needs (its compute capability is too low)."""


def _check_tensor(what, t, entry, ndims=(2,)):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in ndims:
        shape = " or ".join({2: "2-D", 3: "3-D (batch, rows, cols)"}[n] for n in ndims)
        raise ValueError(f"{what} must be {shape}; got shape {tuple(t.shape)}")
    if t.dtype not in entry.dtypes:
        kind = ("integer tensors are not supported (GEMM here is floating point)"
                if not (t.dtype.is_floating_point or t.dtype.is_complex) else
                f"{entry.name} takes {', '.join(entry.dtype_names)}")
        raise TypeError(f"{what} has dtype {_dt(t.dtype)}: {kind}")
    want = _backend.device().type
    if t.device.type != want:
        if want == "cpu":
            raise ValueError(f"{what} is on {t.device}, but this run uses numba's simulator "
                             "and Triton's interpreter, which take CPU tensors: call .cpu()")
        raise ValueError(f"{what} is on {t.device}, but kernels run on the GPU here: "
                         "call .cuda() (or create it with device=gl.device())")
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{what} has an empty dimension {tuple(t.shape)}: M, N, K must be >= 1")


def _gpu_only_message(entry):
    need = ".".join(map(str, entry.min_cc))
    if entry.cc_below is not None:
        need += " up to (not including) " + ".".join(map(str, entry.cc_below))
    instead = [k.name for k in _registry.entries()
               if k.lesson == entry.lesson and k.step == entry.step - 1]
    return (f"{entry.name} is written in Gluon, which compiles for a GPU only (Triton's "
            f"interpreter cannot run it): it needs a GPU of compute capability {need}"
            + (f"; {instead[0]} runs the same computation here" if instead else ""))


def _check_capability(entry):
    eng = _backend.engine()
    if not entry.simulator and (eng.kind != "cuda" or not entry.runs_on(eng.capability)):
        raise UnsupportedDevice(_gpu_only_message(entry))
    if eng.kind == "cuda" and not entry.runs_on(eng.capability):
        need = ".".join(map(str, entry.min_cc)) + " or newer"
        if entry.cc_below is not None:
            need = (".".join(map(str, entry.min_cc)) + " up to (not including) "
                    + ".".join(map(str, entry.cc_below)))
        have = ".".join(map(str, eng.capability))
        raise UnsupportedDevice(
            f"{entry.name} needs compute capability {need}; {eng.device_name} has "
            f"{have}. Run this lesson on the simulator: restart Python and call "
            f"gl.select_engine(simulator=True) first (gl.check_anywhere runs its check "
            f"there for you).")


def runs_here(kernel) -> bool:
    """Whether ``kernel`` runs on this engine: on the simulator unless it is GPU-only (a
    Gluon kernel); on a GPU when it has the kernel's instructions (``k06_wgmma``'s wgmma
    exists on compute capability 9.x only)."""
    entry = _registry.get(kernel)
    eng = _backend.engine()
    return entry.simulator if eng.kind != "cuda" else entry.runs_on(eng.capability)


def _validate_pair(a, b, entry):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype:
        raise TypeError(f"a and b differ in dtype ({_dt(a.dtype)} and {_dt(b.dtype)}): "
                        "convert one of them")
    _check_tensor("a", a, entry)
    _check_tensor("b", b, entry)
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}: put both on one device")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes do not match for a @ b: a is {tuple(a.shape)} (M, K), b is "
                         f"{tuple(b.shape)} (K, N); a.shape[1] must equal b.shape[0]")


# What the hot path of gl.matmul skips once a combination has been validated: the registry
# lookup by name and the checks that depend only on (kernel, dtypes, devices, engine). Shapes
# and ``out`` change from call to call and are checked every time.
_ENTRIES: dict = {}
_VALIDATED: dict = {}


def _entry(kernel):
    """``registry.get(kernel)``, remembered by name (a dict lookup instead of a scan)."""
    entry = _ENTRIES.get(kernel) if isinstance(kernel, str) else None
    if entry is None:
        entry = _registry.get(kernel)
        if isinstance(kernel, str):
            _ENTRIES[kernel] = entry
    return entry


def _validate(a, b, entry):
    """Every check of :func:`_validate_pair` and :func:`_check_capability`; the checks that
    depend only on (kernel, dtypes, devices) run once per combination, shapes every call."""
    key = None
    if type(a) is torch.Tensor and type(b) is torch.Tensor:   # subclasses: the full checks
        key = (id(entry), a.dtype, b.dtype, a.device, b.device, _backend.engine().kind)
        if (key in _VALIDATED and a.dim() == 2 and b.dim() == 2
                and a.shape[1] == b.shape[0] and a.numel() > 0 and b.numel() > 0):
            return
    _validate_pair(a, b, entry)
    _check_capability(entry)
    if key is not None:
        _VALIDATED[key] = entry           # keeps the entry alive: its id stays unique


def _check_out(out, a, M, N):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != (M, N) or out.dtype != a.dtype or out.device != a.device \
            or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous ({M}, {N}) {_dt(a.dtype)} tensor on "
                         f"{a.device}; got {tuple(out.shape)} {_dt(out.dtype)} on {out.device}")


_AUTO: dict = {}        # (operands' kinds, fused, batched) -> the kernel "auto" runs


def _auto(kernel, a, b, fused=False, batched=False):
    """``kernel``, or where it is "auto" the kernel :func:`gemm_lessons.choose.kernel_for`
    picks for these operands (remembered per kind of operands)."""
    if kernel != _choose.AUTO:
        return kernel
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dim() >= 2 and b.dim() >= 2):
        return _choose.kernel_for(torch.empty(1, 1), torch.empty(1, 1), fused=fused,
                                  batched=batched)     # the checks then say what is wrong
    key = (_fast.tensor_key(a), _fast.tensor_key(b), fused, batched)
    name = _AUTO.get(key)
    if name is None:
        if len(_AUTO) > _fast.Cache.LIMIT:
            _AUTO.clear()
        name = _AUTO[key] = _choose.kernel_for(a, b, fused=fused, batched=batched)
    return name


def auto_kernel(a, b, *, fused=False):
    """The kernel ``kernel="auto"`` runs for ``a @ b`` on this engine (``fused=True``: for
    ``gl.gemm`` with an epilogue): the rule of :mod:`gemm_lessons.choose`."""
    batched = fused and (a.dim() == 3 or b.dim() == 3)
    return _auto(_choose.AUTO, a, b, fused=fused, batched=batched)


def _checked_call(kernel, a, b, out):
    """The registry entry of ``kernel`` (``"auto"``: see :mod:`gemm_lessons.choose`) and the
    output of ``a @ b`` (a new tensor, or ``out`` checked), after every check of the
    operands."""
    entry = _entry(_auto(kernel, a, b))
    _validate(a, b, entry)
    M, N = a.shape[0], b.shape[1]
    if out is None:
        return entry, torch.empty(M, N, dtype=a.dtype, device=a.device)
    _check_out(out, a, M, N)
    return entry, out


# The kinds of call gl.matmul and gl.gemm have seen on a GPU, and their launch plans
# (see gemm_lessons.fastpath): from the third call of a kind on, a call replays its launches.
_MATMULS = _fast.Cache()
_GEMMS = _fast.Cache()


def matmul(a, b, kernel="k01_coalesced", *, out=None):
    """``a @ b`` computed by ``kernel`` (a registered name, see :func:`kernels`, or
    ``"auto"``: the course's fastest kernel for these operands, by the rule of
    :mod:`gemm_lessons.choose`).

    ``a`` (M, K) and ``b`` (K, N): torch tensors of one dtype the kernel takes, CUDA tensors
    on a GPU and CPU tensors on the simulator, any strides. Returns a new contiguous (M, N)
    tensor of the same dtype, or writes into ``out`` (contiguous, (M, N), same dtype).

    On a GPU, the first call of a kind (kernel, and the operands' shapes, strides, dtypes,
    device and alignment) goes through the kernel's launcher; from the third on, a call
    checks its arguments and replays the launches the second one recorded, where the
    launcher made no copy that a replay would leave stale (:mod:`gemm_lessons.fastpath`).
    To repeat one product on fixed operands with the least Python, :func:`prepare`.
    """
    key = None
    if (_fast.ENABLED and type(a) is torch.Tensor and type(b) is torch.Tensor
            and type(kernel) is str and (out is None or type(out) is torch.Tensor)
            and _backend.on_gpu()):
        # the kind of call (see gemm_lessons.fastpath; one flat tuple: it is built on every
        # call): a kind recorded before was checked then, all of it but ``out``
        pa, pb = a.data_ptr(), b.data_ptr()
        key = (kernel, a.shape, a.stride(), a.dtype, a.device, pa % 16, b.shape, b.stride(),
               b.dtype, b.device, pb % 16, pa == pb,
               None if out is None else _fast.tensor_key(out))
        plan = _MATMULS.get(key)
        if plan.__class__ is _fast.Plan:      # the third call of a kind on: replay it
            if out is None:
                out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
            else:
                _check_out(out, a, a.shape[0], b.shape[1])
            plan(a, b, out)
            return out
    entry, out = _checked_call(kernel, a, b, out)
    M, N = out.shape
    if _backend.on_gpu():             # one launch: nothing to guard, no row slicing
        if key is None:
            entry.launch(a, b, out)
        else:
            _MATMULS.run(key, lambda: entry.launch(a, b, out), (a, b, out), out)
        return out
    from .guard import run as guarded   # on the simulator: a size warning, progress
    guarded(entry, "gl.matmul", 1, M, N, a.shape[1],     # (its warning names our caller)
            lambda _, rows: entry.launch(a[rows], b, out[rows]))
    return out


# ------------------------------------------------------------------- the prepared fast path
class Prepared:
    """``a @ b`` with one kernel on fixed operands, resolved once: made by :func:`prepare`.

    Calling it (``p()``) computes the product into ``p.out`` and returns ``p.out``. The
    operands are the tensors given to :func:`prepare` (their memory, not a copy): write new
    values into ``p.a`` and ``p.b`` in place (``p.a.copy_(x)``), or pass them,
    ``p(a=x)``, which copies ``x`` into ``p.a`` (same shape and dtype) before running.

    ``p.mode`` says what a call does:

    * ``"graph"``: replays a CUDA graph captured once (``graph=True``): one host call,
      however many launches and copies the launcher makes;
    * ``"replay"``: repeats the recorded kernel launch(es) with their bound arguments (the
      compiled kernel, grid, device pointers resolved once);
    * ``"launcher"``: calls the kernel's launcher with the arguments checked once (on the
      simulator, and for launchers that copy or re-arrange operands on each call).
    """

    def __init__(self, entry, a, b, out, mode, fn, graph=None):
        self.kernel, self.a, self.b, self.out = entry.name, a, b, out
        self.mode = mode
        self._fn = fn
        self._graph = graph         # keeps the captured graph (and its memory pool) alive

    def __call__(self, a=None, b=None):
        for what, new in (("a", a), ("b", b)):
            if new is None:
                continue
            have = getattr(self, what)
            if not isinstance(new, torch.Tensor):
                raise TypeError(f"{what} must be a torch.Tensor, got {type(new).__name__}")
            if new.dtype != have.dtype:
                raise TypeError(f"{what} has dtype {_dt(new.dtype)}; this product was prepared "
                                f"for {_dt(have.dtype)}: prepare another one")
            if tuple(new.shape) != tuple(have.shape) or new.device != have.device:
                raise ValueError(f"{what} is {tuple(new.shape)} on {new.device}; this product "
                                 f"was prepared for {tuple(have.shape)} on {have.device}: "
                                 "prepare another one")
            if new.data_ptr() != have.data_ptr():
                have.copy_(new)
        self._fn()
        return self.out

    def __repr__(self):
        (M, K), N = self.a.shape, self.b.shape[1]
        return (f"Prepared({self.kernel!r}, {M}x{N}x{K} {_dt(self.a.dtype)}, "
                f"mode={self.mode!r})")


def prepare(kernel, a, b, out=None, *, graph=False):
    """``a @ b`` with ``kernel``, made ready to repeat: returns a :class:`Prepared` callable.

    ``gl.matmul`` validates its arguments, allocates the output and goes through the
    kernel's launcher (Triton binds and specialises arguments, numba dispatches on their
    types) on every call: tens of microseconds of Python, longer than a small product takes
    on the GPU. ``prepare`` does all of it once, checks the result, and keeps the launch:

        p = gl.prepare("k07_triton_swizzle", a, b)
        c = p()                  # a @ b into p.out; p() again after a.copy_(new_values)

    ``graph=True`` (a CUDA GPU only) captures the call in a CUDA graph
    (``torch.cuda.CUDAGraph``), so a call is one ``replay()``. Operands keep their memory:
    write new values into ``a`` and ``b`` in place, never rebind them. ``out``: as in
    :func:`matmul`, or None for a new tensor.
    """
    entry, out = _checked_call(kernel, a, b, out)
    M, N = out.shape
    if not isinstance(graph, bool):
        raise TypeError(f"graph must be True or False, got {graph!r}")
    if graph and not _backend.on_gpu():
        raise ValueError("graph=True captures a CUDA graph, which needs a CUDA GPU; this run "
                         f"uses {_backend.engine()}: use graph=False (a call then re-runs "
                         "the launcher)")

    def launcher():
        if _backend.on_gpu():
            entry.launch(a, b, out)
            return
        from .guard import run as guarded
        guarded(entry, "gl.prepare", 1, M, N, a.shape[1],
                lambda _, rows: entry.launch(a[rows], b, out[rows]))

    if not _backend.on_gpu():
        launcher()
        return Prepared(entry, a, b, out, "launcher", launcher)
    if graph:
        return Prepared(entry, a, b, out, "graph", *_capture(entry, launcher))
    return Prepared(entry, a, b, out, *_record(entry, a, b, out, launcher))


def _record(entry, a, b, out, launcher):
    """(mode, function): a :class:`~gemm_lessons.fastpath.Plan` of the launcher's launches
    where one can be made (see :mod:`gemm_lessons.fastpath`), else the launcher."""
    launcher()                          # compiles, autotunes, fills the launchers' caches
    out.fill_(float("nan"))
    plan = _fast.record_plan(launcher, (a, b, out), out)
    if plan is None:
        return "launcher", launcher

    def replay():
        if plan.valid():
            plan(a, b, out)
        else:                           # a kept buffer it used was replaced: relaunch
            launcher()
    return "replay", replay


def _capture(entry, launcher):
    """(function, graph): ``launcher`` captured in a CUDA graph, after warm-up calls on a
    side stream (compilation, autotuning and first-call allocations stay out of it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            launcher()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            launcher()
    except Exception as exc:
        raise RuntimeError(f"{entry.name}'s launch could not be captured in a CUDA graph "
                           f"({type(exc).__name__}: {exc}); use graph=False") from exc
    g.replay()
    return g.replay, g


def gemm(a, b, c=None, *, alpha=1.0, beta=0.0, bias=None, activation=None,
         kernel="k09_fused_epilogue"):
    """BLAS-style ``activation(alpha * a @ b + beta * c + bias)`` with ``kernel`` (or
    ``"auto"``: the course's fastest fused kernel for these operands, see
    :mod:`gemm_lessons.choose`).

    * ``beta == 0`` never reads ``c`` (NaN in ``c`` does not leak); ``alpha == 0`` never
      reads ``a`` or ``b``.
    * ``bias``: shape (N,), added to every row; ``activation``: None, "relu", "gelu"
      (exact, as ``torch.nn.functional.gelu``) or "leaky_relu" (slope 0.01).
    * Batched: ``a`` (B, M, K) and/or ``b`` (B, K, N); a 2-D operand or a batch of 1 is
      broadcast with batch stride 0 (no copy). ``c`` is (M, N) or (B, M, N); a 3-D ``c``
      makes the result 3-D, with ``c``'s batch if ``a`` and ``b`` have none (as in torch).
    * Any strides, transposed views included, without hidden copies.
    Returns a new tensor, (M, N) or (B, M, N), in the inputs' dtype.
    """
    key = _gemm_key(kernel, a, b, c, alpha, beta, bias, activation)
    if key is not None:
        plan = _GEMMS.get(key)
        if plan.__class__ is _fast.Plan:      # a kind validated and recorded before
            B, M, N, batched = _GEMMS.notes[key]
            out = torch.empty(B, M, N, dtype=a.dtype, device=a.device)
            plan(a, b, c, bias, out)
            return out if batched else out[0]
    if kernel == _choose.AUTO:
        kernel = _auto(kernel, a, b, fused=True, batched=(
            any(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (a, b, c))))
    entry = _registry.get(kernel)
    if entry.gemm is None:
        gemms = [k.name for k in _registry.entries() if k.gemm is not None]
        raise ValueError(f"{entry.name} has no BLAS epilogue; kernels that do: "
                         f"{', '.join(gemms) or 'none yet'}")
    for what, t in (("a", a), ("b", b)):
        _check_tensor(what, t, entry, ndims=(2, 3))
    if a.dtype != b.dtype:
        raise TypeError(f"a and b differ in dtype ({_dt(a.dtype)} and {_dt(b.dtype)})")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"shapes do not match for a @ b: a is {tuple(a.shape)}, b is "
                         f"{tuple(b.shape)}; a's last dimension must equal b's second-to-last")
    for what, v in (("alpha", alpha), ("beta", beta)):
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise TypeError(f"{what} must be a real number, got {type(v).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of "
                         f"{', '.join(repr(x) for x in ACTIVATIONS)}")
    batched = a.dim() == 3 or b.dim() == 3
    Ba = a.shape[0] if a.dim() == 3 else 1
    Bb = b.shape[0] if b.dim() == 3 else 1
    if Ba != Bb and 1 not in (Ba, Bb):
        raise ValueError(f"batch sizes differ: a has {Ba}, b has {Bb} (one may be 1 or absent "
                         "to broadcast)")
    B = max(Ba, Bb)
    if isinstance(c, torch.Tensor) and c.dim() == 3:   # the result has c's batch, as in torch
        batched = True
        B = c.shape[0] if B == 1 else B
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    need = set()
    if alpha != 1.0 or beta != 0.0:
        need.add("alpha_beta")
    if bias is not None:
        need.add("bias")
    if activation is not None:
        need.add("activation")
    if batched:
        need.add("batched")
    missing = need - set(entry.features)
    if missing:
        raise ValueError(f"{entry.name} does not support {', '.join(sorted(missing))}; "
                         f"it supports {', '.join(sorted(entry.features)) or 'none of them'}")
    if beta != 0.0:
        if c is None:
            raise ValueError("beta is not 0, so c is read: pass c")
    if c is not None:
        _check_tensor("c", c, entry, ndims=(2, 3))
        if c.dtype != a.dtype:
            raise TypeError(f"c has dtype {_dt(c.dtype)}, a has {_dt(a.dtype)}")
        if tuple(c.shape[-2:]) != (M, N) or (c.dim() == 3 and c.shape[0] not in (1, B)):
            want = f"({M}, {N})" + (f" or ({B}, {M}, {N})" if batched else "")
            raise ValueError(f"c must have shape {want}; got {tuple(c.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},) (one value per column); "
                             f"got {tuple(bias.shape)}")
        if bias.dtype != a.dtype or bias.device != a.device:
            raise TypeError(f"bias must be a {_dt(a.dtype)} tensor on {a.device}; got "
                            f"{_dt(bias.dtype)} on {bias.device}")
    _check_capability(entry)
    a3 = (a if a.dim() == 3 else a.unsqueeze(0)).expand(B, M, K)
    b3 = (b if b.dim() == 3 else b.unsqueeze(0)).expand(B, K, N)
    c3 = None if c is None else (c if c.dim() == 3 else c.unsqueeze(0)).expand(B, M, N)
    out = torch.empty(B, M, N, dtype=a.dtype, device=a.device)
    from .guard import run as guarded   # on the simulator: a size warning, progress

    def launch():
        guarded(entry, "gl.gemm", B, M, N, K, lambda bs, rows: entry.gemm(
            a3[bs, rows], b3[bs], None if c3 is None else c3[bs, rows], out[bs, rows],
            float(alpha), float(beta), bias, activation))
    if key is None:
        launch()
    else:
        _GEMMS.run(key, launch, (a, b, c, bias, out), out)
        _GEMMS.notes[key] = (B, M, N, batched)
    return out if batched else out[0]


SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32,
                     torch.float8_e4m3fn, torch.float8_e5m2)


def _check_scale(what, s, want, a, why):
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"{what} has dtype {_dt(s.dtype)}: scales are float32")
    if s.device != a.device:
        raise ValueError(f"{what} is on {s.device} and a on {a.device}: put both on one device")
    ok = (s.numel() == 1) if want == () else tuple(s.shape) == want
    if not ok:
        raise ValueError(f"{what} has shape {tuple(s.shape)}; this kernel takes {why}")


def _validate_scales_given(*scales):
    for what, s in zip(("scale_a", "scale_b"), scales):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(s).__name__}")


def _is_2d(a, b):
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2
            and b.dim() == 2)


def _scale_shapes_message(a, b, scale_a, scale_b):
    """The error of kernel="auto" where the scales' shapes name no granularity."""
    if not _is_2d(a, b):
        return "scaled_matmul takes 2-D a (M, K) and b (K, N)"
    from .fp8 import SCALE_BLOCK
    M, K = a.shape
    N = b.shape[1]
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    return (f"scale_a {tuple(scale_a.shape)} and scale_b {tuple(scale_b.shape)} name no "
            f"granularity for a {M} x {K} @ {K} x {N} product: one number each (per tensor), "
            f"({M}, 1) and (1, {N}) (per row and column), or ({M}, {kb}) and ({kb}, {nb}) "
            f"(per 1 x {SCALE_BLOCK} block of A and {SCALE_BLOCK} x {SCALE_BLOCK} block of B)")


def scaled_matmul(a, b, scale_a, scale_b, kernel="auto", *,
                  out_dtype=torch.bfloat16, out=None):
    """``(a * scale_a) @ (b * scale_b)`` with an FP8 kernel of lesson 11, in ``out_dtype``.

    ``a`` (M, K) and ``b`` (K, N): ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` (the same
    for both), any strides. The scales are float32, their shape set by the kernel's
    granularity (``gl.kernels()``: ``scales``):

    * "tensor" (``k11_fp8_tensorwise``): one number each (shape () or one element);
    * "row" (``k11_fp8_rowwise``, ``k11_fp8_rowwise_promoted``): ``scale_a`` (M, 1), one per
      row of A; ``scale_b`` (1, N), one per column of B (as ``torch._scaled_mm``);
    * "block" (``k11_fp8_blockwise``, ``k11_fp8_blockwise_tma``, ``k11_fp8_blockwise_ws``):
      ``scale_a`` (M, ceil(K / 128)), one per 1 x 128 block of A; ``scale_b``
      (ceil(K / 128), ceil(N / 128)), one per 128 x 128 block of B.

    ``kernel="auto"`` (the default) reads the granularity off the scales' shapes and runs
    lesson 11's kernel for it on this engine (:func:`gemm_lessons.choose.scaled_kernel_for`).

    ``gemm_lessons.fp8.quantize`` makes operands and scales of every granularity. Returns a
    new contiguous (M, N) tensor of ``out_dtype`` (bf16, fp16, fp32 or an FP8 dtype), or
    writes into ``out``.
    """
    if kernel == _choose.AUTO:
        _validate_scales_given(scale_a, scale_b)
        kernel = _choose.scaled_kernel_for(a, b, scale_a, scale_b) if _is_2d(a, b) else None
        if kernel is None:
            raise ValueError(_scale_shapes_message(a, b, scale_a, scale_b))
    entry = _entry(kernel)
    if entry.scaled is None:
        scaled = [k.name for k in _registry.entries() if k.scaled is not None]
        raise ValueError(f"{entry.name} takes no scales; kernels that do: {', '.join(scaled)}")
    _validate(a, b, entry)
    M, K = a.shape
    N = b.shape[1]
    from .fp8 import SCALE_BLOCK
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    want = {"tensor": ((), (), "one float32 scale per operand (shape () or (1,))"),
            "row": ((M, 1), (1, N), f"scale_a (M, 1) = ({M}, 1), one per row of A, and "
                                    f"scale_b (1, N) = (1, {N}), one per column of B"),
            "block": ((M, kb), (kb, nb), f"scale_a (M, ceil(K / {SCALE_BLOCK})) = ({M}, {kb}), "
                                         f"one per 1 x {SCALE_BLOCK} block of A, and scale_b "
                                         f"(ceil(K / {SCALE_BLOCK}), ceil(N / {SCALE_BLOCK})) = "
                                         f"({kb}, {nb}), one per {SCALE_BLOCK} x {SCALE_BLOCK} "
                                         "block of B")}[entry.scales]
    _check_scale("scale_a", scale_a, want[0], a, want[2])
    _check_scale("scale_b", scale_b, want[1], a, want[2])
    if out is None:
        if out_dtype not in SCALED_OUT_DTYPES:
            raise TypeError(f"out_dtype {out_dtype}: choose one of "
                            f"{', '.join(_dt(d) for d in SCALED_OUT_DTYPES)}")
        out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    elif not isinstance(out, torch.Tensor) or out.dtype not in SCALED_OUT_DTYPES \
            or tuple(out.shape) != (M, N) or out.device != a.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous ({M}, {N}) tensor on {a.device} of "
                         f"{', '.join(_dt(d) for d in SCALED_OUT_DTYPES)}")
    if entry.scales == "tensor":
        scale_a, scale_b = scale_a.reshape(()), scale_b.reshape(())
    from .guard import run as guarded   # on the simulator: a size warning, progress
    per_row = entry.scales != "tensor"
    guarded(entry, "gl.scaled_matmul", 1, M, N, K, lambda _, rows: entry.scaled(
        a[rows], b, scale_a[rows] if per_row else scale_a, scale_b, out[rows]))
    return out


def _gemm_key(kernel, a, b, c, alpha, beta, bias, activation):
    """The kind of a gl.gemm call on a GPU (everything its checks and launcher decide on),
    or None where the call takes the full path every time (not on a GPU, arguments of other
    types: their errors are raised there)."""
    T = torch.Tensor
    if not (_fast.ENABLED and _backend.on_gpu() and isinstance(kernel, str) and type(a) is T and type(b) is T
            and (c is None or type(c) is T) and (bias is None or type(bias) is T)
            and type(alpha) in (float, int) and type(beta) in (float, int)
            and (activation is None or type(activation) is str)):
        return None
    pa, pb = a.data_ptr(), b.data_ptr()
    key = (kernel, a.shape, a.stride(), a.dtype, a.device, pa % 16, b.shape, b.stride(),
           b.dtype, b.device, pb % 16, pa == pb, type(alpha), alpha, type(beta), beta,
           activation)
    if c is not None or bias is not None:
        tk = _fast.tensor_key
        key += (tk(c), tk(bias), _fast.aliasing(a, b, c, bias))
    return key


def _runner(entry):
    _check_capability(entry)
    return lambda a, b, out: matmul(a, b, entry.name, out=out)


def check(kernel, *, cases=None, dtypes=None, seed=0, raise_on_fail=True, progress=None):
    """Check ``kernel`` on the shape suite (see :mod:`gemm_lessons.harness`)."""
    entry = _registry.get(kernel)
    return _harness.check(_runner(entry), entry.name, dtypes or entry.dtypes, cases,
                          seed=seed, raise_on_fail=raise_on_fail, progress=progress)


def check_anywhere(kernel):
    """The line ``check(kernel)`` prints, on any machine: here when this engine can run the
    kernel; on a GPU without its instructions (wgmma or TMA kernels on an Ampere GPU), the same
    check in a child process on the simulator and Triton's interpreter, so that a lesson
    prints the same checkpoint everywhere (and says nothing it did not run)."""
    entry = _registry.get(kernel)
    if runs_here(entry.name):
        return str(check(entry.name))
    if not entry.simulator:
        raise UnsupportedDevice(_gpu_only_message(entry))
    return _check_in_child(entry.name)


def _check_line(name):
    return str(check(name))


def _check_in_child(name):
    """The line ``check(name)`` prints, on the simulator and Triton's interpreter (in a
    child process unless this one simulates)."""
    return run_on_simulator("gemm_lessons.api:_check_line", name)


def bench(kernel, M=4096, N=None, K=None, dtype=None, *, baseline=True, graph=False):
    """Time ``kernel`` against cuBLAS of the same precision, in one run, their batches
    interleaved. ``graph=True`` times the GPU alone (both replayed from CUDA graphs, so the
    host's cost per call drops out): the fair comparison on products that take less time
    on the GPU than a call takes on the host."""
    entry = _registry.get(kernel)
    if entry.scaled is not None:
        raise ValueError(f"{entry.name} is an FP8 kernel: its baseline is torch._scaled_mm, "
                         "not cuBLAS of the same dtype; time it with tools/sweep_fp8.py")
    return _harness.bench(_runner(entry), entry.name, M, N, K, dtype or entry.dtypes[0],
                          baseline=baseline, graph=graph)


def _source_of(obj):
    for attr in ("py_func", "fn"):         # numba dispatcher, Triton JITFunction / autotuner
        while hasattr(obj, attr) and callable(getattr(obj, attr)):
            obj = getattr(obj, attr)
    return inspect.getsource(obj)


def source_text(obj):
    """The source :func:`show_source` prints (a registered name, or a function or kernel)."""
    if isinstance(obj, str):
        entry = _registry.get(obj)
        obj = entry.source if entry.source is not None else entry.launch
    return _source_of(obj).rstrip()


def show_source(obj):
    """Print the source of a kernel (a registered name, or any function or kernel)."""
    print(source_text(obj))


def show_diff(old, new, context=3):
    """Print what the kernel ``new`` adds to (or changes in) ``old``, as a unified diff of
    their sources (registered names, or any functions or kernels): a step of a lesson shown
    as the lines it adds."""
    import difflib
    a, b = source_text(old).splitlines(), source_text(new).splitlines()
    name = lambda o: o if isinstance(o, str) else getattr(o, "__name__", str(o))
    diff = list(difflib.unified_diff(a, b, name(old), name(new), n=context, lineterm=""))
    print("\n".join(diff) if diff else f"{name(old)} and {name(new)}: the same source")
