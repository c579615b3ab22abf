"""The finished kernels, one module per lesson (``kNN_topic.py``).

Each module ends with ``KERNELS = [Kernel(...), ...]``: the metadata the registry, the
tests, the CLI and the plots read. A module adds kernels to the project by listing them
there; nothing else needs editing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..common import dtype_name


@dataclass(frozen=True)
class Kernel:
    """One registered kernel.

    ``launch(a, b, c)`` computes ``c = a @ b``; the API validated the arguments already:
    2-D torch tensors on the engine's device, ``a.shape == (M, K)``, ``b.shape == (K, N)``,
    M, N, K >= 1, one dtype from ``dtypes``, any strides; ``c`` is a contiguous (M, N)
    tensor of the same dtype. Launchers do not re-validate.

    ``gemm(a, b, c, out, alpha, beta, bias, activation)``, where the kernel offers BLAS
    semantics (``out = activation(alpha * a @ b + beta * c + bias)``), with ``features``
    naming what it supports out of {"alpha_beta", "bias", "activation", "batched"}.

    ``ptx(cc)`` returns ``(python_function, signature)`` for ``numba.cuda.compile_ptx``:
    the configuration a GPU would run (numba kernels only).

    ``configs``: for a kernel whose launcher picks its configuration by engine, the
    configuration each engine runs: ``{"gpu": ..., "simulator": ...}``, the very objects the
    launcher uses (a dict of parameters, a dataclass, a namedtuple or a ``triton.Config``;
    for "gpu" also a list of them, or a dict from torch dtype to one, where the GPU picks
    among several). The simulator must run the loop the GPU runs, with smaller sizes only:
    ``tests/test_sim_path.py`` checks that both sides have the same parameter names, that
    every parameter that is not an integer (a flag, a layout name, None) is equal on both
    sides, and that integers (tile sizes, warps, stages) are positive. A parameter that
    switches structure must therefore not be an integer: make it a bool or a name, or
    better, make each structure its own kernel. ``None`` (the default): the kernel runs one
    configuration everywhere; a kernel module that defines ``GPU_CONFIG``-like names must
    declare them here.

    ``scaled(a, b, scale_a, scale_b, out)``, where the kernel takes FP8 operands with scales
    (lesson 11): ``out = (a * scale_a) @ (b * scale_b)``, the scales float32 in the shapes
    ``scales`` names ("tensor": (); "row": (M, 1) and (1, N); "block": (M, ceil(K / 128))
    and (ceil(K / 128), ceil(N / 128))), validated by ``gl.scaled_matmul``; ``out`` a
    contiguous (M, N) tensor of bf16, fp16, fp32 or an FP8 dtype. ``launch(a, b, c)`` is
    then the product with every scale 1, C in the operands' dtype.

    ``simulator=False``: the kernel runs on a GPU only (a Gluon kernel: Triton's interpreter
    cannot run Gluon), so there is no simulator configuration to declare; off a GPU the API
    refuses it with a message naming the kernel to run instead.
    """
    name: str
    lesson: int
    language: str                       # "numba" or "triton"
    dtypes: tuple                       # torch dtypes it takes
    summary: str                        # one line
    launch: Callable
    min_cc: tuple = (5, 0)
    cc_below: Optional[tuple] = None    # instructions only some generations have: wgmma, 9.x
    gemm: Optional[Callable] = None
    features: frozenset = field(default_factory=frozenset)
    ptx: Optional[Callable] = None
    source: object = None               # what gl.show_source prints (default: launch)
    in_ladder: bool = True
    configs: Optional[dict] = None      # {"gpu": ..., "simulator": ...}: see above
    step: int = 0                       # its place among the lesson's kernels (a climb's order)
    simulator: bool = True              # False: GPU only (Gluon: no interpreter runs it)
    scaled: Optional[Callable] = None   # FP8 with scales: scaled(a, b, scale_a, scale_b, out)
    scales: Optional[str] = None        # their granularity: "tensor", "row" or "block"

    def runs_on(self, cc) -> bool:
        """Whether a GPU of compute capability ``cc`` has every instruction the kernel uses."""
        cc = tuple(cc)
        return cc >= tuple(self.min_cc) and (self.cc_below is None or cc < tuple(self.cc_below))

    @property
    def dtype_names(self):
        return tuple(dtype_name(d) for d in self.dtypes)

    def __repr__(self):
        cc = ".".join(map(str, self.min_cc))
        return (f"Kernel({self.name!r}, lesson {self.lesson:02d}, {self.language}, "
                f"{'/'.join(self.dtype_names)}, sm_{cc.replace('.', '')}+: {self.summary})")


FP32 = (torch.float32,)
FP16_BF16 = (torch.float16, torch.bfloat16)
