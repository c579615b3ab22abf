"""The checks of the exercises (``exercises/NN_*.ipynb``): one function per exercise, one
module per lesson (``ex01`` ... ``ex09``), beside the shared instruments: :mod:`.guards` (the hint
words, :class:`ExerciseError`, the time limit), :mod:`.audits` (the simulator's barrier and
cp.async audits) and :mod:`.products` (:func:`check_product`). Every check is re-exported
here, so that a notebook calls ``checks.ex06_pipeline(...)``.

Each check

* runs the learner's answer on small shapes, within a time limit, so that a wrong answer
  is answered as quickly as a right one;
* tests what the lesson is about, not only the product: coalesced requests (01), loads per
  element (02), conflict-free banks (03), loads per multiply-add (04), tensor-core calls
  (05), copies in flight while the tensor cores compute (06), the order of the tiles (07),
  the epilogue's BLAS rules (09);
* on failure raises :class:`ExerciseError` (an ``AssertionError``, so nbgrader counts the
  test cell as failed) whose message names the likely cause: the grid, a mask, a missing
  barrier, a wait count, the accumulator type, the tile order, an unfinished TODO.

Instruments used on the simulator:

* :func:`barrier_audit`: every shared-memory access of a numba kernel is recorded with its
  thread and the number of ``cuda.syncthreads()`` that thread has passed. Two threads that
  touch the same element between the same two barriers (one of them writing) race: a
  missing barrier, reported even when the simulator's scheduling happened to give the
  right numbers.
* :func:`pipeline_audit`: every ``cp.async`` copy into a stage of a shared buffer, every
  ``wait_group``, every barrier and every tensor-core read of a stage: a stage read while
  this thread's copy into it is still in flight (a wait count), read before another
  thread's copy has landed and a barrier has passed (a missing barrier), overwritten while
  another thread may still read it (a missing barrier before the next issue), and whether
  any copy was in flight while the tensor cores computed (the overlap the pipeline is for).
* :mod:`gemm_lessons.interp_poison` for Triton: masked-off lanes of a load without
  ``other=`` come back NaN, and which program stored which tile.

The mutants of ``tests/exercise_mutants.yaml`` (typical mistakes, applied to the solutions)
must each be caught by these checks with the hint the table names.
"""
from __future__ import annotations

from .guards import HINTS, ExerciseError, time_limit
from .audits import barrier_audit, pipeline_audit
from .products import check_product
from .ex01 import ex01_kernel, ex01_grid, ex01_sectors, ex01_traffic
from .ex02 import ex02_tile_loop, ex02_launch, ex02_loads, ex02_reuse
from .ex03 import ex03_ways, ex03_swizzle, ex03_bank, ex03_xor_swizzle
from .ex04 import (k04_store_strided, k04_outer_step, ex04_outer, ex04_store, ex04_reg_budget,
    ex04_warp_owner, k04_double_helpers, ex04_double)
from .ex05 import (ex05_warp_tile, ex05_pad, ex05_ldmatrix, k05_load_tiles, k05_mma_step,
    ex05_tiles, ex05_tile_work)
from .ex06 import (ex06_pipeline, ex06_budget, ex06_multistage, ex06_swizzle, ex06_descriptor,
    k06_fill_ring, k06_drain_ring, k06_add_row, ex06_ring_consumer, ex06_ring_producer)
from .ex07 import ex07_order, ex07_kernel, ex07_wave, ex07_program_of
from .ex08 import ex08_tuned, ex08_grid, ex08_prune, ex08_tma
from .ex09 import ex09_epilogue, ex09_batch, ex09_splitk, ex09_splitk_partial
from .ex11 import ex11_pow2_scales, ex11_round_e4m3, ex11_promotion, ex11_scale_offsets, make_mma

__all__ = ["ExerciseError", "time_limit", "barrier_audit", "pipeline_audit", "check_product",
           "HINTS", "ex01_kernel", "ex01_grid", "ex01_sectors", "ex01_traffic",
           "ex02_tile_loop", "ex02_launch", "ex02_loads", "ex02_reuse", "ex03_ways",
           "ex03_swizzle", "ex03_bank", "ex03_xor_swizzle", "k04_store_strided",
           "k04_outer_step", "ex04_outer", "ex04_store", "ex04_reg_budget", "ex04_warp_owner",
           "k04_double_helpers", "ex04_double", "ex05_warp_tile", "ex05_pad", "ex05_ldmatrix",
           "k05_load_tiles", "k05_mma_step", "ex05_tiles", "ex05_tile_work", "ex06_pipeline",
           "ex06_budget", "ex06_multistage",
           "ex06_swizzle", "ex06_descriptor", "k06_fill_ring", "k06_drain_ring", "k06_add_row",
           "ex06_ring_consumer", "ex06_ring_producer", "ex07_order", "ex07_kernel",
           "ex07_wave", "ex07_program_of", "ex08_tuned", "ex08_grid", "ex08_prune", "ex08_tma",
           "ex09_epilogue", "ex09_batch", "ex09_splitk", "ex09_splitk_partial",
           "ex11_pow2_scales", "ex11_round_e4m3", "ex11_promotion", "ex11_scale_offsets",
           "make_mma"]
