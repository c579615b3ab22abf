"""gl.prepare: the product resolved once, re-run on the same operands; and gl.matmul's
cached checks still refuse bad input on every call."""
import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import api, fastpath, harness

DEV = gl.device()
KERNELS = [("k01_coalesced", torch.float32), ("k07_triton_swizzle", torch.float16)]


def operands(dtype, M=19, K=13, N=11, seed=0):
    return harness.make_operands(M, N, K, dtype, seed=seed)


def assert_product(c, a, b):
    ok, rel, _ = harness.compare(c, harness.reference(a, b), a, b, a.dtype)
    assert ok, f"relative error {rel:.1e}"


@pytest.mark.parametrize("kernel, dtype", KERNELS)
def test_prepared_call_gives_matmul_result_and_sees_new_values(kernel, dtype):
    a, b = operands(dtype)
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=dtype, device=DEV)
    p = gl.prepare(kernel, a, b, out=out)
    assert p.out is out and p.a is a and p.b is b
    out.fill_(float("nan"))                       # prepare ran it once: poison again
    c = p()
    assert c is out and torch.equal(c, gl.matmul(a, b, kernel))
    a2, b2 = operands(dtype, seed=1)
    a.copy_(a2)                                   # new values, same memory
    out.fill_(float("nan"))
    assert_product(p(), a2, b)
    out.fill_(float("nan"))
    assert_product(p(b=b2), a2, b2)               # passed: copied into p.b, then run
    assert torch.equal(b, b2)


def test_prepared_on_strided_operands():
    a = operands(torch.float32, M=13, K=19)[0].t()          # (19, 13), column-major
    b = torch.randn(17, 15, device=DEV)[2:15, 1:12]         # (13, 11), sliced
    p = gl.prepare("k01_coalesced", a, b)
    p.out.fill_(float("nan"))
    assert_product(p(), a, b)


def test_prepare_refuses_bad_operands():
    a, b = operands(torch.float32)
    with pytest.raises(ValueError, match="a.shape\\[1\\] must equal"):
        gl.prepare("k01_coalesced", a, b.t())
    with pytest.raises(TypeError, match="takes float32"):
        gl.prepare("k01_coalesced", a.double(), b.double())
    with pytest.raises(ValueError, match="out must be"):
        gl.prepare("k01_coalesced", a, b, out=torch.empty(3, 3, device=DEV))
    with pytest.raises(TypeError, match="graph must be True or False"):
        gl.prepare("k01_coalesced", a, b, graph="yes")


def test_prepared_call_refuses_mismatched_operands():
    a, b = operands(torch.float32)
    p = gl.prepare("k01_coalesced", a, b)
    with pytest.raises(ValueError, match=r"prepared for \(19, 13\)"):
        p(a=torch.randn(13, 19, device=DEV))
    with pytest.raises(TypeError, match="dtype float16; this product was prepared for float32"):
        p(b=b.half())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        p(a=[[1.0]])


@pytest.mark.skipif(gl.backend() == "cuda", reason="off the GPU only")
def test_graph_needs_a_gpu():
    a, b = operands(torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA GPU.*use graph=False"):
        gl.prepare("k01_coalesced", a, b, graph=True)
    assert gl.prepare("k01_coalesced", a, b).mode == "launcher"


@pytest.mark.skipif(gl.backend() != "cuda", reason="needs a GPU")
@pytest.mark.parametrize("kernel, dtype", KERNELS + [("k06_wgmma", torch.float16)])
@pytest.mark.parametrize("graph", [False, True])
def test_prepared_on_the_gpu(kernel, dtype, graph):
    if not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this GPU")
    a, b = operands(dtype, M=300, K=200, N=260)
    p = gl.prepare(kernel, a, b, graph=graph)
    assert p.mode in (("graph",) if graph else ("replay", "launcher"))
    a2, _ = operands(dtype, M=300, K=200, N=260, seed=3)
    a.copy_(a2)
    p.out.fill_(float("nan"))
    c = p()
    torch.cuda.synchronize()
    assert_product(c, a2, b)


@pytest.mark.skipif(gl.backend() != "cuda", reason="needs a GPU")
@pytest.mark.parametrize("graph", [False, True])
def test_a_launcher_that_copies_is_not_replayed(graph):
    # k06_wgmma pads K = 203 to 208 in a zeroed copy of A and B: a replay of the recorded
    # launch would read the copy made at prepare time, so the prepared call re-runs the
    # launcher (or, as a graph, replays the copy too)
    if not gl.runs_here("k06_wgmma"):
        pytest.skip("k06_wgmma does not run on this GPU")
    a, b = operands(torch.float16, M=130, K=203, N=120)
    p = gl.prepare("k06_wgmma", a, b, graph=graph)
    assert p.mode == ("graph" if graph else "launcher")
    a2, b2 = operands(torch.float16, M=130, K=203, N=120, seed=4)
    a.copy_(a2)
    b.copy_(b2)
    p.out.fill_(float("nan"))
    c = p()
    torch.cuda.synchronize()
    assert_product(c, a2, b2)


def test_matmul_checks_every_call_after_the_first():
    a, b = operands(torch.float32)
    gl.matmul(a, b, "k01_coalesced")              # validated once: the fast path from here
    with pytest.raises(ValueError, match="a.shape\\[1\\] must equal"):
        gl.matmul(a, a, "k01_coalesced")
    with pytest.raises(ValueError, match="must be 2-D"):
        gl.matmul(a[None], b, "k01_coalesced")
    with pytest.raises(ValueError, match="empty"):
        gl.matmul(a[:0], b, "k01_coalesced")
    with pytest.raises(TypeError, match="differ in dtype"):
        gl.matmul(a, b.half(), "k01_coalesced")
    with pytest.raises(TypeError, match="takes float32"):
        gl.matmul(a.half(), b.half(), "k01_coalesced")


def test_replay_is_refused_when_a_launch_reads_a_copy():
    a, b = operands(torch.float32)
    out = torch.empty(a.shape[0], b.shape[1], device=DEV)
    launch = lambda *args: [("triton", None, (0, 1, 1, 0, "fn", "meta", None, None, None), args)]
    safe = lambda *args: fastpath.build(launch(*args), (a, b, out)) is not None
    assert safe(a, b, out, 19, 11, 13, "ieee", None)
    assert safe(a[3:], b.t(), out[:, 2:], 1.5)               # views of the operands
    assert not safe(a.contiguous().clone(), b, out)          # a copy: a replay reads stale data
    assert not safe(a, b, torch.empty_like(out))             # a workspace
    assert not safe(a, b, out, type("Mem", (), {"data_ptr": lambda s: 0})())   # memory
    assert not safe(a, b, out, 2 ** 40)                      # a raw address it cannot place
    assert fastpath.build([], (a, b, out)) is None           # nothing recorded


def test_a_kept_buffer_may_be_replayed_until_it_is_replaced():
    a, b = operands(torch.float32)
    out = torch.empty(a.shape[0], b.shape[1], device=DEV)
    ws = torch.empty(64, device=DEV)
    head = (0, 1, 1, 0, "fn", "meta", None, None, None)
    assert fastpath.build([("triton", None, head, (a, b, out, ws))], (a, b, out)) is None
    fastpath.keep(ws)
    plan = fastpath.build([("triton", None, head, (a, b, out, ws[8:]))], (a, b, out))
    assert plan is not None and plan.valid()
    fastpath.forget(ws)                   # its launcher grew it: the plan must not run
    assert not plan.valid()


def test_a_descriptor_made_from_an_operand_is_rebuilt_for_the_new_operand(monkeypatch):
    # a numba launch taking a device buffer made from a's address (a TMA map): the plan
    # passes the buffer made for the new call's a (a view of it, as the launcher made it),
    # and refuses a buffer nobody declared
    from gemm_lessons import engines
    monkeypatch.setattr(fastpath, "cuda_stream", lambda device=None: 0)
    monkeypatch.setattr(engines, "numba_stream", lambda: "stream")
    made = {}

    def rebuild(view):                     # the launcher's cache: one buffer per address
        key = (view.data_ptr(), tuple(view.shape), view.stride())
        if key not in made:
            made[key] = torch.full((16,), float(len(made)), device=DEV)
        return made[key]
    a, b = operands(torch.float32)
    out = torch.empty(a.shape[0], b.shape[1], device=DEV)
    view = a[2:, :5]
    first = fastpath.derived(rebuild(view), view, rebuild)
    launched = []
    fake = lambda stream, config, kernel, *args: launched.append(args)
    rec = [("numba", fake, None, "cfg", "kern", (first.data_ptr() + 8, b.data_ptr(), 7))]
    plan = fastpath.build(rec, (a, b, out))
    assert plan is not None
    a2, b2 = a.clone(), b.clone()
    plan(a2, b2, out)
    want = made[(a2[2:, :5].data_ptr(), (a.shape[0] - 2, 5), a.stride())]
    assert launched[-1] == (want.data_ptr() + 8, b2.data_ptr(), 7) and want is not first
    plan(a2, b2, out)                      # the same address again: no new buffer
    assert len(made) == 2 and launched[-1] == launched[-2]
    other = torch.empty(16, device=DEV)     # made from no role
    fastpath.derived(other, torch.empty(3, device=DEV), rebuild)
    assert fastpath.build([("numba", fake, None, "cfg", "kern", (other.data_ptr(),))],
                          (a, b, out)) is None


def test_a_changed_stride_dtype_alignment_or_alias_is_another_kind_of_call():
    a, b = operands(torch.float16, M=32, K=32, N=32)
    key = fastpath.tensor_key
    assert key(a) == key(a.clone())                          # same kind: a plan serves both
    assert key(a) != key(a.t())                              # strides
    assert key(a) != key(a.float())                          # dtype
    assert key(a[:, 1:].contiguous()) != key(a[:, 1:])       # strides and alignment
    assert key(a) != key(torch.empty_like(a, device="meta"))  # device
    flat = torch.empty(32 * 32 + 1, dtype=torch.float16, device=DEV)
    assert key(flat[:1024].view(32, 32)) != key(flat[1:].view(32, 32))   # 2-byte offset
    assert fastpath.aliasing(a, b, None) == (0, 1, 2)
    assert fastpath.aliasing(a, a, None) == (0, 0, 2)        # a @ a: not a @ b's plan


def test_the_cache_runs_records_then_replays_with_new_tensors(monkeypatch):
    # Triton's launcher object, faked: what the recording sees of a launch and what a
    # replay passes back (the new tensors, the stream of the moment, no metadata or hooks)
    from triton.runtime import driver
    calls = []

    class FakeLauncher:
        def __call__(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
            calls.append((g0, g1, g2, stream, function, packed, meta, enter, exit_))
            a, b, out, desc = (live[x] if isinstance(x, int) else x for x in args[:4])
            out.copy_(a @ desc.base)         # a replay passes addresses: the tensors there

    class Desc:                           # a host-side TMA descriptor: its tensor is .base
        def __init__(self, base):
            self.base = base

    monkeypatch.setattr(type(driver), "active",
                        property(lambda self: type("Fake", (), {"launcher_cls": FakeLauncher})))
    monkeypatch.setattr(fastpath, "cuda_stream", lambda device=None: 222)
    launcher, real_call = FakeLauncher(), FakeLauncher.__call__
    launcher_calls = []

    def launch(a, b, out):
        launcher_calls.append(1)
        launcher(4, 1, 1, 111, "fn", "meta", "launch meta", "enter", "exit", a, b, out, Desc(b),
                 19, "tf32")

    cache, live = fastpath.Cache(), {}
    for i in range(4):
        a, b = operands(torch.float32, seed=i)
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device)
        live.update({t.data_ptr(): t for t in (a, b, out)})
        key = ("fake", fastpath.tensor_key(a), fastpath.tensor_key(b))
        plan = cache.get(key)
        if isinstance(plan, fastpath.Plan):
            plan(a, b, out)
        else:
            cache.run(key, lambda: launch(a, b, out), (a, b, out), out)
        assert torch.equal(out, a @ b), f"call {i}"
    assert FakeLauncher.__call__ is real_call                 # the hook is removed on exit
    assert len(launcher_calls) == 2                           # first and recorded call
    assert calls[-1] == (4, 1, 1, 222, "fn", "meta", None, None, None)


def test_a_numba_launch_replays_with_the_new_addresses(monkeypatch):
    from gemm_lessons import engines
    a, b = operands(torch.float32)
    out = torch.empty(a.shape[0], b.shape[1], device=DEV)
    seen = []
    fake_launch = lambda stream, config, kernel, *args: seen.append((stream, args))
    monkeypatch.setattr(engines, "numba_stream", lambda: "stream")
    monkeypatch.setattr(fastpath, "cuda_stream", lambda device=None: 7)
    big = 2 ** 33
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    args = (0, 0, a.numel(), 4, a_ptr, *a.shape, 13 * 4, 4, 0, 0, b.numel(), 4, b_ptr + 8, 7)
    plan = fastpath.build([("numba", fake_launch, "s", "cfg", "kern", args)], (a, b, out))
    a2, b2 = operands(torch.float32, seed=3)
    plan(a2, b2, out)
    stream, got = seen[-1]
    assert stream == "stream" and got[4] == a2.data_ptr() and got[13] == b2.data_ptr() + 8
    assert got[:4] == args[:4] and got[-1] == 7
    assert fastpath.build([("numba", fake_launch, "s", "cfg", "kern", args + (big,))],
                          (a, b, out)) is None                  # an address of no role


def test_a_cluster_launch_is_recorded_and_replayed_through_core_launch(monkeypatch):
    # lesson 06's cluster kernel launches through ptx_cluster.core_launch (cuda.core, not
    # numba's launch): the recording sees it like a numba launch, puts the hook back on
    # exit, and its plan replays through the real core_launch with the new addresses
    from gemm_lessons import engines, ptx_cluster
    seen = []

    def real_core(stream, config, kernel, *args):
        seen.append((stream, config, kernel, args))
    monkeypatch.setattr(ptx_cluster, "core_launch", real_core, raising=False)
    monkeypatch.setattr(engines, "numba_stream", lambda: "stream")
    monkeypatch.setattr(fastpath, "cuda_stream", lambda device=None: 7)
    a, b = operands(torch.float32)
    out = torch.empty(a.shape[0], b.shape[1], device=DEV)
    with fastpath.recording() as rec:
        ptx_cluster.core_launch("s", "cluster cfg", "kern", a.data_ptr(), b.data_ptr(), 5)
    assert ptx_cluster.core_launch is real_core
    assert rec.ok and rec.launches == [("numba", real_core, "s", "cluster cfg", "kern",
                                        (a.data_ptr(), b.data_ptr(), 5))]
    plan = fastpath.build(rec.launches, (a, b, out))
    a2, b2 = operands(torch.float32, seed=4)
    plan(a2, b2, out)
    assert seen[-1] == ("stream", "cluster cfg", "kern", (a2.data_ptr(), b2.data_ptr(), 5))


def test_the_tools_parse_sizes_and_launch_cost_needs_a_gpu(tool):
    from gemm_lessons.shapes import shape_arg
    tool = tool("launch_cost")
    assert shape_arg("64") == (64, 64, 64)
    assert shape_arg("16x4096x1024") == (16, 4096, 1024)
    import argparse
    for bad in ("0", "3x4", "a"):
        with pytest.raises(argparse.ArgumentTypeError, match="MxNxK"):
            shape_arg(bad)
    if gl.backend() != "cuda":
        with pytest.raises(SystemExit, match="need a CUDA GPU"):
            tool.main(["--size", "64"])
