"""Labs: benchmarks, demonstrations and sweeps, one module per lesson (``labs/kNN.py``).

They sit above the public API and the harness (:mod:`gemm_lessons.api`,
:mod:`gemm_lessons.harness`) and use the kernels through them; nothing below imports a
lab. A kernel module holds kernels, their launchers and registry entries only, so what a
lesson measures about a kernel lives here.
"""
