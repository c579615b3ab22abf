"""Hopper's thread-block clusters from numba: the instructions by which the blocks of a
cluster (2 to 8 blocks that the GPU runs at once, on neighbouring SMs) find their place,
meet, signal each other's mbarriers, and receive one TMA copy together, and the host call
that launches a kernel in clusters.

A TMA load (:mod:`gemm_lessons.ptx_tma`) brings a box from global memory (through L2) into
one block's shared memory. Two blocks whose tiles share a row of A both load that row's
k-tiles: L2 serves the same bytes twice. In a cluster of two along N, one block can issue
the load of A's box once with ``.multicast::cluster``: the copy engine writes the box into
the same offset of *both* blocks' shared memory and completes its bytes on the mbarrier at
the same offset in each. Each block still loads its own B.

The instructions (one PTX instruction each, compute capability 9.0):

* :func:`cluster_ctarank` - this block's rank in its cluster (``%cluster_ctarank``, 0 to
  the cluster's size - 1);
* :func:`barrier_cluster_arrive` and :func:`barrier_cluster_wait` - a barrier of every
  thread of every block of the cluster (``barrier.cluster.arrive.release`` /
  ``barrier.cluster.wait.acquire``); between the two a thread may work. A kernel meets
  there after initializing its mbarriers (another block may signal them) and before it
  exits (another block may still be writing into its shared memory);
* :func:`mbarrier_arrive_cluster` - an arrival on the mbarrier at the same place in block
  ``cta``'s shared memory (``mapa.shared::cluster`` turns the local address into the other
  block's, then ``mbarrier.arrive.release.cta.shared::cluster``): a consumer releases a
  stage in the block that multicasts into it. Its release is at CTA scope, PTX's default
  and what CUTLASS's ``ClusterBarrier::arrive(cta_id)`` and Triton emit: a consumer that
  frees a stage publishes no data (its reads of the stage are complete once
  ``wgmma_wait_group`` returns), so it needs no fence;
* :func:`mbarrier_arrive_cluster_release` - the same arrival with a release at *cluster*
  scope (``mbarrier.arrive.release.cluster``): the thread's earlier memory operations are
  made visible to every block of the cluster first, which ptxas compiles to a
  ``MEMBAR.ALL.GPU`` before the arrival. Correct, and slow where every consumer thread
  arrives on every k-tile (lesson 06, step 10);
* :func:`tma_load_2d_multicast` - ``tma_load_2d`` into every block of ``mask`` (bit i: the
  block of rank i), each block's bytes completed on its own barrier
  (``cp.async.bulk.tensor...multicast::cluster``).

Host side: :func:`launch_cluster` launches a numba kernel with a cluster shape. numba-cuda
0.30's ``kernel[grid, block, stream, smem]`` has no place for one: its launch builds a
``cuda.core.LaunchConfig`` without ``cluster``. The launch here builds the same call with
``LaunchConfig(cluster=...)`` (the driver's ``cuLaunchKernelEx`` with
``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``), from the kernel numba compiled for the
arguments and the argument marshalling numba uses (numba-cuda's private
``_codelibrary``, ``_prepare_args`` and ``driver._to_core_stream``; numba-cuda is pinned
below 0.31).

The simulator runs the blocks of a grid one after another, so the blocks of a cluster
never run at once there: it emulates clusters of **one block** only, where these
instructions keep their meaning (rank 0; an arrival on block 0's barrier is an arrival
on one's own; a multicast to mask 1 is a plain TMA load; the cluster barrier is a barrier
of the block's threads with the PTX ISA's rules: a wait returns once every thread that has
not exited has arrived on the phase, so a thread that waits without its arrive is a
deadlock that the scheduler names, as it names an mbarrier's), and raises :class:`ClusterNotSimulated` for anything that needs a second block. What a
cluster of two adds (the other block's arrivals, a multicast that lands in two blocks, the
barrier before exit) is checked only on a GPU (``compute-sanitizer`` and the results).
"""
from __future__ import annotations

from . import _ptx_plumbing as pl
from . import ptx_mbarrier as mb
from . import ptx_tma
from ._ptx_plumbing import PTXUsageError, set_doc

__all__ = ["SIMULATED", "MIN_CC", "INSTRUCTIONS", "MAX_PORTABLE_CLUSTER",
           "ClusterNotSimulated", "cluster_ctarank", "barrier_cluster_arrive",
           "barrier_cluster_wait", "mbarrier_arrive_cluster", "mbarrier_arrive_cluster_release",
           "tma_load_2d_multicast",
           "launch_cluster"]

SIMULATED = pl.SIMULATED
MIN_CC = {"cluster": (9, 0)}
#: blocks per cluster that every Hopper GPU runs (16 with a non-portable opt-in)
MAX_PORTABLE_CLUSTER = 8

INSTRUCTIONS = {
    "cluster_ctarank": ("mov.u32 r, %cluster_ctarank", (9, 0), "S2UR SR_CgaCtaId"),
    "barrier_cluster_arrive": ("barrier.cluster.arrive.release.aligned", (9, 0),
                               "UCGABAR_ARV"),
    "barrier_cluster_wait": ("barrier.cluster.wait.acquire.aligned", (9, 0), "UCGABAR_WAIT"),
    "mbarrier_arrive_cluster": ("mapa.shared::cluster.u32 r, [bar], cta; "
                                "mbarrier.arrive.release.cta.shared::cluster.b64 _, [r]",
                                (9, 0), "SYNCS.ARRIVE.TRANS64.RED.A1T0"),
    "mbarrier_arrive_cluster_release": (
        "mapa.shared::cluster.u32 r, [bar], cta; "
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]", (9, 0),
        "MEMBAR.ALL.GPU; SYNCS.ARRIVE.TRANS64.RED.A1T0"),
    "tma_load_2d_multicast": ("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                              ".mbarrier::complete_tx::bytes.multicast::cluster "
                              "[dst], [map, {col, row}], [bar], mask", (9, 0),
                              "UTMALDG.2D.MULTICAST"),
}


class ClusterNotSimulated(NotImplementedError):
    """A cluster instruction that needs a second block of the cluster, on the simulator
    (which runs blocks one after another)."""


def _not_simulated(fn, what):
    return ClusterNotSimulated(
        f"{fn}: {what}. The simulator runs the blocks of a grid one after another, so it "
        "emulates clusters of one block only; a cluster of two runs on a GPU")


# =============================================================================== the GPU
if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import types

    from ._ptx_plumbing import I32, I64, intrinsic, intrinsic_literal

    @intrinsic_literal
    def cluster_ctarank(typingctx):
        def codegen(context, builder, sig, args):
            return pl.asm_call(builder, "mov.u32 $0, %cluster_ctarank;", "=r", result=I32,
                               side_effect=False)
        return types.int32(), codegen

    barrier_cluster_arrive = pl.barrier_op("barrier_cluster_arrive",
                                           "barrier.cluster.arrive.release.aligned;")
    barrier_cluster_wait = pl.barrier_op("barrier_cluster_wait",
                                         "barrier.cluster.wait.acquire.aligned;")

    def _check_bar(fn, bars, idx):
        pl.check_index(fn, bars, idx, "the barrier array")
        if bars.dtype not in (types.int64, types.uint64):
            raise PTXUsageError(f"{fn}: barriers live in a shared int64 (or uint64) array, "
                                f"got {bars.dtype}")

    def _remote_arrive(fn, scope):
        """An intrinsic ``fn(bars, idx, cta)``: an arrival, released at ``scope``, on the
        mbarrier ``bars[idx]`` of the cluster's block ``cta``."""
        def typer(typingctx, bars, idx, cta):
            _check_bar(fn, bars, idx)
            if not pl.is_int(cta):
                raise PTXUsageError(f"{fn}: cta must be an integer (a rank in the cluster), "
                                    f"got {cta}")

            def codegen(context, builder, sig, args):
                bty, ity, cty = sig.args
                addr = pl.smem_u32(builder, pl.elem_ptr(context, builder, bty, args[0], ity,
                                                        args[1]))
                pl.asm_call(builder, "{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $0, $1; "
                            f"mbarrier.arrive.release.{scope}.shared::cluster.b64 _, [ra]; }}",
                            "r,r,~{memory}", [addr, pl.as_i32(builder, args[2], cty)],
                            [I32, I32])
            return types.void(bars, idx, cta), codegen
        typer.__name__ = fn
        return intrinsic(typer)

    mbarrier_arrive_cluster = _remote_arrive("mbarrier_arrive_cluster", "cta")
    mbarrier_arrive_cluster_release = _remote_arrive("mbarrier_arrive_cluster_release",
                                                     "cluster")

    @intrinsic
    def tma_load_2d_multicast(typingctx, dst, di, tmap, col, row, bars, bi, mask):
        fn = "tma_load_2d_multicast"
        pl.check_index(fn, dst, di, "the shared destination")
        pl.half_kind(fn, dst.dtype, "the shared destination")
        if not (isinstance(tmap, types.Array) and tmap.ndim == 1
                and tmap.dtype in (types.int64, types.uint64)):
            raise PTXUsageError(f"{fn}: tmap must be a tensor map's array (16 int64 words, "
                                f"TensorMap.array), got {tmap}")
        _check_bar(fn, bars, bi)
        if not (pl.is_int(col) and pl.is_int(row) and pl.is_int(mask)):
            raise PTXUsageError(f"{fn}: col, row and mask must be integers, got {col}, "
                                f"{row}, {mask}")

        def codegen(context, builder, sig, args):
            dty, dity, mty, cty, rty, bty, bity, kty = sig.args
            d, dix, m, c, r, b, bix, k = args
            ary = context.make_array(mty)(context, builder, value=m)
            mask16 = builder.trunc(pl.as_i32(builder, k, kty), ir.IntType(16))
            pl.asm_call(
                builder, "cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                ".mbarrier::complete_tx::bytes.multicast::cluster "
                "[$0], [$1, {$2, $3}], [$4], $5;",
                "r,l,r,r,r,h,~{memory}",
                [pl.smem_u32(builder, pl.elem_ptr(context, builder, dty, d, dity, dix)),
                 builder.ptrtoint(ary.data, I64), pl.as_i32(builder, c, cty),
                 pl.as_i32(builder, r, rty),
                 pl.smem_u32(builder, pl.elem_ptr(context, builder, bty, b, bity, bix)),
                 mask16],
                [I32, I64, I32, I32, I32, ir.IntType(16)])
        return types.void(dst, di, tmap, col, row, bars, bi, mask), codegen

    def launch_cluster(kernel, grid, cluster, block, stream, smem, *args):
        """Launch the numba kernel ``kernel`` (a ``cuda.jit`` dispatcher) on ``grid`` blocks
        in clusters of ``cluster`` blocks (ints, or tuples of up to 3), ``block`` threads,
        ``smem`` bytes of dynamic shared memory, on ``stream`` (a numba stream), with
        ``args``: what ``kernel[grid, block, stream, smem](*args)`` does, plus the cluster
        shape. ``grid`` counts blocks and must be a multiple of ``cluster`` in each
        dimension."""
        from cuda.core import LaunchConfig

        def dims(x):
            x = (x,) if isinstance(x, int) else tuple(x)
            return x + (1,) * (3 - len(x))
        g, c = dims(grid), dims(cluster)
        if any(gi % ci for gi, ci in zip(g, c)):
            raise ValueError(f"launch_cluster: the grid {g} must be a multiple of the "
                             f"cluster {c} in every dimension")
        if c[0] * c[1] * c[2] > MAX_PORTABLE_CLUSTER:
            raise ValueError(f"launch_cluster: at most {MAX_PORTABLE_CLUSTER} blocks per "
                             f"cluster, got {c}")
        from numba.cuda.cudadrv import driver
        compiled = _compiled_for(kernel, args)
        kargs, retr = [], []
        for ty, val in zip(compiled.argument_types, args):
            compiled._prepare_args(ty, val, driver._to_core_stream(stream), retr, kargs)
        config = LaunchConfig(grid=tuple(gi // ci for gi, ci in zip(g, c)), cluster=c,
                              block=dims(block), shmem_size=smem)
        core_launch(stream, config, compiled._codelibrary.get_cufunc().kernel, *kargs)
        for wb in retr:
            wb()

    def core_launch(stream, config, kernel, *kernelargs):
        """``cuda.core.launch`` of ``kernel`` with its final arguments on the numba stream
        ``stream``: the call numba's own launch makes, with the cluster in ``config``. A
        module attribute, looked up at each launch, so that :mod:`gemm_lessons.fastpath`
        can record it as it records numba's launches and replay it with new addresses."""
        from cuda.core import launch
        from numba.cuda.cudadrv import driver
        launch(driver._to_core_stream(stream), config, kernel, *kernelargs)

    def _compiled_for(kernel, args):
        """numba's compiled kernel of ``kernel`` for the types of ``args`` (compiled now if
        it is not yet)."""
        from numba.cuda.typing.typeof import Purpose, typeof
        sig = tuple(typeof(a, Purpose.argument) for a in args)
        if sig not in kernel.overloads:
            kernel.compile(sig)
        return kernel.overloads[sig]


# ========================================================================= the simulator
else:
    def cluster_ctarank():
        return 0

    import threading

    from . import sim_scheduler

    _lock = threading.Condition()
    _cluster = {}       # this block's cluster barrier: "bar" and "arrived" (thread -> the
                        # phase it arrived on, until its wait returns)

    class _ClusterBarrier:
        """The cluster barrier's phase and pending arrivals (one arrival per thread of the
        block), read by the scheduler's deadlock report as an mbarrier's are."""
        def __init__(self, count):
            self.count = self.pending = count
            self.phase = 0

        def where(self):
            return "the cluster barrier (barrier.cluster)"

        def lacks(self):
            return f"{self.pending} of {self.count} arrivals pending"

        def complete(self):
            self.phase += 1
            self.pending = self.count
            _lock.notify_all()

    def _block_started():
        with _lock:
            _cluster.clear()

    def _cluster_barrier():
        """The block's cluster barrier (made at its first use; ``_lock`` is held)."""
        if "bar" not in _cluster:
            count = 1
            for d in threading.current_thread()._manager._block_dim:
                count *= int(d)
            _cluster["bar"], _cluster["arrived"] = _ClusterBarrier(count), {}
        return _cluster["bar"], _cluster["arrived"]

    def barrier_cluster_arrive():
        th = threading.current_thread()
        with _lock:
            b, arrived = _cluster_barrier()
            if th in arrived:
                raise PTXUsageError(
                    "barrier_cluster_arrive: this thread arrived on the cluster barrier's "
                    f"phase {arrived[th]} and has not waited since (arrive, wait, arrive)")
            arrived[th] = b.phase
            b.pending -= 1
            if b.pending == 0:
                b.complete()

    def barrier_cluster_wait():
        # the phase this thread arrived on; without an arrive, the current phase, which
        # then waits for this thread too and never completes: every thread ends up waiting,
        # and the scheduler reports the deadlock (ptx_mbarrier's report names this barrier)
        th = threading.current_thread()
        with _lock:
            b, arrived = _cluster_barrier()
            phase = arrived.get(th, b.phase)
            while b.phase <= phase:
                if getattr(th, "abort", False):
                    raise RuntimeError("abort flag set while waiting on the cluster barrier")
                err = getattr(th, "gl_mbarrier_error", None)
                if err is not None:
                    raise err
                th.gl_mbarrier_wait = (b, phase & 1)     # the scheduler sees a waiter
                _lock.wait(0.05)
            th.gl_mbarrier_wait = None
            arrived.pop(th, None)

    def _exits_release(final):
        """A thread that exits counts as arrived (PTX's ``exit``): once every thread still
        alive has arrived on the current phase, it completes."""
        if not final:
            return False
        with _lock:
            b = _cluster.get("bar")
            if b is None:
                return False
            arrived = _cluster["arrived"]
            managers = {getattr(t, "_manager", None) for t in arrived}
            live = [t for t in threading.enumerate()
                    if getattr(t, "_manager", None) in managers and t.is_alive()]
            if not live or any(arrived.get(t) != b.phase for t in live):
                return False
            b.complete()
            return True

    sim_scheduler.add_hooks(_block_started, lambda live: None)
    mb.add_stall_hook(_exits_release)

    def _remote_arrive(fn):
        """The emulation of ``fn(bars, idx, cta)`` at either scope (the simulator's memory
        is always visible): an arrival on one's own block's barrier."""
        def arrive(bars, idx, cta):
            if cta != 0:
                raise _not_simulated(fn, f"an arrival on block {cta}'s barrier")
            mb.mbarrier_arrive(bars, idx)
        arrive.__name__ = fn
        return arrive

    mbarrier_arrive_cluster = _remote_arrive("mbarrier_arrive_cluster")
    mbarrier_arrive_cluster_release = _remote_arrive("mbarrier_arrive_cluster_release")

    def tma_load_2d_multicast(dst, di, tmap, col, row, bars, bi, mask):
        if mask != 1:
            raise _not_simulated("tma_load_2d_multicast",
                                 f"a copy into the blocks of mask {mask:#x}")
        ptx_tma.tma_load_2d(dst, di, tmap, col, row, bars, bi)

    def launch_cluster(kernel, grid, cluster, block, stream, smem, *args):
        c = (cluster,) if isinstance(cluster, int) else tuple(cluster)
        size = 1
        for x in c:
            size *= x
        if size != 1:
            raise _not_simulated("launch_cluster", f"clusters of {c} blocks")
        kernel[grid, block, stream, smem](*args)


for _name in ("cluster_ctarank", "barrier_cluster_arrive", "barrier_cluster_wait",
              "mbarrier_arrive_cluster", "mbarrier_arrive_cluster_release",
              "tma_load_2d_multicast"):
    _instr, _cc, _sass = INSTRUCTIONS[_name]
    set_doc(globals()[_name], f"PTX ``{_instr}`` (compute capability {_cc[0]}.{_cc[1]}); "
                              f"see the module's docstring for its emulation.")
