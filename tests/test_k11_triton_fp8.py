"""Lesson 11's FP8 kernels through gl.scaled_matmul: every granularity of scales, ragged
shapes, strided operands, NaN-poisoned outputs, against float64 of the dequantized operands;
and the errors bad arguments get. (gl.check of every kernel's plain a @ b: test_degenerate.)"""
import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import fp8
from gemm_lessons.kernels import k11_triton_fp8 as k11

GRAN = {"k11_fp8_tensorwise": ("tensor", "tensor"), "k11_fp8_rowwise": ("row", "col"),
        "k11_fp8_blockwise": ((1, 128), (128, 128)), "k11_fp8_rowwise_promoted": ("row", "col"),
        "k11_fp8_rowwise_tma": ("row", "col"), "k11_fp8_blockwise_tma": ((1, 128), (128, 128)),
        "k11_fp8_blockwise_ws": ((1, 128), (128, 128))}


def _block(g):
    return None if isinstance(g, str) else g


def _operands(M, N, K, kernel, dtype=torch.float8_e4m3fn, b_layout="row", seed=0):
    ga, gb = GRAN[kernel]
    x = fp8.activations(M, K, seed=seed, outlier_channels=2)
    w = fp8.weights(K, N, seed=seed + 1)
    which = "e4m3" if dtype == torch.float8_e4m3fn else "e5m2"
    qa, sa = fp8.quantize(x, ga, which)
    if b_layout == "transposed":          # B = W.t() of a row-major (N, K) weight
        qw, sw = fp8.quantize(w.t().contiguous(), (gb[1], gb[0]) if not isinstance(gb, str)
                              else {"col": "row", "tensor": "tensor"}[gb], which)
        qb, sb = qw.t(), sw.t()
    else:
        qb, sb = fp8.quantize(w, gb, which)
    ref = (fp8.dequantize(qa, sa, _block(ga)).double()
           @ fp8.dequantize(qb, sb, _block(gb)).double())
    dev = gl.device()
    return qa.to(dev), qb.to(dev), sa.to(dev), sb.to(dev), ref


# Triton's interpreter multiplies FP8 tiles exactly; a Hopper tensor core accumulates FP8
# products with about 14 significant bits (lesson 11), so on a GPU the bound is looser
TOL = 1e-5 if gl.engine().kind != "cuda" else 5e-3


@pytest.mark.parametrize("kernel", list(GRAN))
@pytest.mark.parametrize("shape", [(37, 45, 300), (1, 20, 129), (70, 1, 33)])
def test_scaled_product_matches_float64(kernel, shape):
    if not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    M, N, K = shape
    qa, qb, sa, sb, ref = _operands(M, N, K, kernel)
    dev = gl.device()
    out = torch.full((M, N), float("nan"), dtype=torch.float32, device=dev)
    got = gl.scaled_matmul(qa, qb, sa, sb, kernel=kernel, out=out)
    assert got is out and not torch.isnan(out).any(), "an element was never written"
    assert fp8.rel_error(out.cpu(), ref) < TOL


@pytest.mark.parametrize("kernel", ["k11_fp8_rowwise", "k11_fp8_blockwise", "k11_fp8_rowwise_tma",
                                    "k11_fp8_blockwise_tma", "k11_fp8_blockwise_ws"])
def test_transposed_b_and_e5m2(kernel):
    if not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    qa, qb, sa, sb, ref = _operands(33, 140, 160, kernel, b_layout="transposed")
    assert qb.stride(0) == 1                                   # column-major B
    got = gl.scaled_matmul(qa, qb, sa, sb, kernel=kernel, out_dtype=torch.float32)
    assert fp8.rel_error(got.cpu(), ref) < TOL
    qa, qb, sa, sb, ref = _operands(20, 24, 70, kernel, dtype=torch.float8_e5m2)
    got = gl.scaled_matmul(qa, qb, sa, sb, kernel=kernel, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and fp8.rel_error(got.cpu(), ref) < 1e-2


def test_fp8_output_saturates():
    dev = gl.device()
    a = torch.full((16, 64), 448.0).to(torch.float8_e4m3fn).to(dev)
    b = torch.full((64, 16), 448.0).to(torch.float8_e4m3fn).to(dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    got = gl.scaled_matmul(a, b, one, one, kernel="k11_fp8_tensorwise",
                           out_dtype=torch.float8_e4m3fn)
    assert (got.float() == 448).all()


def test_bad_arguments_are_named():
    qa, qb, sa, sb, _ = _operands(20, 24, 70, "k11_fp8_rowwise")
    with pytest.raises(ValueError, match=r"scale_a \(M, 1\) = \(20, 1\)"):
        gl.scaled_matmul(qa, qb, sa.reshape(-1), sb, kernel="k11_fp8_rowwise")
    with pytest.raises(ValueError, match=r"one per 128 x 128 block of B"):
        gl.scaled_matmul(qa, qb, sa, sb, kernel="k11_fp8_blockwise")
    with pytest.raises(TypeError, match="scales are float32"):
        gl.scaled_matmul(qa, qb, sa.double(), sb, kernel="k11_fp8_rowwise")
    with pytest.raises(TypeError, match="takes float8_e4m3fn, float8_e5m2"):
        gl.scaled_matmul(qa.float(), qb.float(), sa, sb, kernel="k11_fp8_rowwise")
    with pytest.raises(TypeError, match="differ in dtype"):
        gl.scaled_matmul(qa, qb.to(torch.float8_e5m2), sa, sb, kernel="k11_fp8_rowwise")
    with pytest.raises(ValueError, match="shapes do not match"):
        gl.scaled_matmul(qa, qb[:-1], sa, sb, kernel="k11_fp8_rowwise")
    with pytest.raises(ValueError, match="takes no scales"):
        gl.scaled_matmul(qa, qb, sa, sb, kernel="k07_triton_swizzle")
    with pytest.raises(TypeError, match="out_dtype"):
        gl.scaled_matmul(qa, qb, sa, sb, kernel="k11_fp8_rowwise", out_dtype=torch.int32)
    with pytest.raises(ValueError, match="must divide the scale block"):
        dev = gl.device()
        block_a = fp8.quantize(fp8.activations(20, 70), (1, 128))[1].to(dev)
        k11.KERNELS[2].scaled(qa, qb, block_a, torch.ones(1, 1, device=dev),
                              torch.empty(20, 24, device=dev),
                              config=k11.TileConfig(16, 16, 48, 1, 1))


def test_block_tile_columns_share_one_scale_of_b():
    qa, qb, _, _, _ = _operands(20, 24, 70, "k11_fp8_rowwise")
    dev = gl.device()
    block_a = fp8.quantize(fp8.activations(20, 70), (1, 128))[1].to(dev)
    with pytest.raises(ValueError, match="BN=256 must divide the scale block"):
        k11.KERNELS[2].scaled(qa, qb, block_a, torch.ones(1, 1, device=dev),
                              torch.empty(20, 24, device=dev),
                              config=k11.TileConfig(16, 256, 32, 1, 1))


def test_promoting_kernels_compile_without_spills():
    """Compiled for sm_90 in their GPU configuration, the kernels that promote in the K loop
    keep both fp32 tiles (the sum, the K-step's partial) in registers, and the block kernel's
    promotion is one fused multiply-add per element of C a thread holds."""
    import re
    from gemm_lessons import triton_asm
    jobs = [k11.asm_job(k11.blockwise_kernel, "block"),
            k11.asm_job(k11.rowwise_promoted_kernel, "row")]
    block, promoted = triton_asm.compile_kernels(jobs)
    cfg = k11.PROMOTED_CONFIG
    per_thread = cfg.BM * cfg.BN // (32 * cfg.num_warps)
    assert len(re.findall(r"\bfma\.rn\.f32", block["ptx"])) == per_thread
    for asm in (block, promoted):
        if not asm["sass"]:
            pytest.skip("nvdisasm not found: no SASS to read")
        assert not re.search(r"\b(?:STL|LDL)\b", asm["sass"]), "registers spill to local memory"


def test_block_tma_kernel_promotes_every_k_step_without_spills():
    """sm_90: the TMA form of the block kernel compiles, in its GPU configuration and in the
    two-programs-a-multiprocessor one, to TMA loads, a wgmma waited to zero before the
    promotion's multiply-adds (one per element a thread holds), and no spills; and the
    launcher counts two such programs a multiprocessor where both fit."""
    import re
    from gemm_lessons import triton_asm
    small = k11.gpu_config(k11.blockwise_tma_kernel)
    assert small == k11.BLOCK_TMA_CONFIG
    jobs = [k11.asm_job(k11.blockwise_tma_kernel, "block", config=k11.PROMOTED_CONFIG),
            k11.asm_job(k11.blockwise_tma_kernel, "block")]
    for cfg, asm in zip((k11.PROMOTED_CONFIG, small), triton_asm.compile_kernels(jobs)):
        ptx = asm["ptx"]
        assert "cp.async.bulk.tensor" in ptx
        first_fma = ptx.index("fma.rn.f32")
        assert re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx[:first_fma])[-1] == "0"
        assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == cfg.BM * cfg.BN // (32 * cfg.num_warps)
        if asm["sass"]:
            assert not re.search(r"\b(?:STL|LDL)\b", asm["sass"]), "registers spill"
        fit = k11.resident_programs(cfg)
        assert fit * (asm["shared"] + 1024) <= 228 * 1024, "more programs than shared memory holds"
    assert (k11.resident_programs(k11.PROMOTED_CONFIG), k11.resident_programs(small)) == (1, 2)


def test_gluon_block_kernel_has_two_consumers_out_of_step():
    """sm_90: the Gluon kernel's two consumer warpgroups each promote 64 rows (64 x 128 over
    128 threads: 64 multiply-adds a thread each), each after its own ``wgmma.wait_group 0``,
    and each releases a slot by one predicated arrive after a barrier of its own 128 threads
    (named barriers, never the whole program's), so neither waits for the other."""
    import re
    from gemm_lessons import triton_asm
    from gemm_lessons.kernels import k11_gluon_fp8 as ws
    asm = triton_asm.compile_kernels([ws.asm_job()])[0]
    ptx = asm["ptx"]
    assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == 2 * 64 * 128 // 128
    assert re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx) == ["0", "0"]
    releases = re.findall(r"bar\.sync\s+(\d+), (\d+);\s*(?://.*\s*)*@%p\d+ mbarrier\.arrive\.shared",
                          ptx)
    releases = [(i, n) for i, n in releases if n != "32"]    # not the producer's (one warp)
    assert len(releases) == 2 and {n for _, n in releases} == {"128"}
    assert len({i for i, _ in releases}) == 2, "the two consumers share a barrier"
    assert asm["shared"] >= ws.WS_CONFIG.num_stages * 2 * 128 * 128
    if asm["sass"]:
        assert not re.search(r"\b(?:STL|LDL)\b", asm["sass"]), "registers spill"


def test_gluon_block_kernel_producer_brings_the_scales():
    """sm_90: with the scale ring (the default) the producer loads each K-step's scales (128
    rows over its 32 threads: four loads, and B's one), stores them in the slot and arrives on
    its ``ready`` barrier, which counts two arrivals; the consumers load nothing from global
    memory in their K loops, and read their rows' scales from shared memory between the
    ``ready`` wait and the wgmma. Without it each consumer loads its own scales (two rows and
    B's scale a thread) before its wait."""
    import re
    from gemm_lessons import triton_asm
    from gemm_lessons.kernels import k11_gluon_fp8 as ws
    assert ws.WS_CONFIG.scale_ring and ws.WS_CONFIG.persistent
    ring, loads = triton_asm.compile_kernels([
        ws.asm_job(), ws.asm_job(ws.WS_CONFIG._replace(scale_ring=False))])
    ptx = ring["ptx"]
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 2;", ptx)) == \
        2 * ws.WS_CONFIG.num_stages                       # ready and empty: two arrivals each
    # every global load is the producer's: its warp's four rows a thread, and B's scale
    # (the partitions' order in the PTX differs between Triton versions: counted whole)
    assert len(re.findall(r"ld\.global", ptx)) == 128 // 32 + 1
    copies = ptx.index("cp.async.bulk.tensor")
    consumers = ptx[:ptx.rindex("wgmma.wait_group", 0, copies)]
    # the producer's 32 threads store, synchronize, then one arrives
    assert re.search(r"st\.shared[^\n]*\n(?:.*\n){0,4}?\s*bar\.(?:warp\.)?sync[^\n]*\n"
                     r"(?:.*\n){0,3}?\s*@%p\d+ mbarrier\.arrive\.shared", ptx[copies:])
    for part in consumers.split("mbarrier.try_wait")[1:]:
        before_mma = part.split("wgmma.fence")[0]
        assert len(re.findall(r"ld\.shared\.b32", before_mma)) == 2     # its two rows' scales
    old = loads["ptx"]
    assert len(re.findall(r"ld\.global", old)) == 2 * 3      # each consumer: two rows, B's one
    assert 0 <= ring["shared"] - loads["shared"] - ws.WS_CONFIG.num_stages * 128 * 4 <= 128
    for asm in (ring, loads):
        if asm["sass"]:
            assert not re.search(r"\b(?:STL|LDL)\b", asm["sass"]), "registers spill"


def test_gluon_block_launcher_grid_and_options(monkeypatch):
    """The launcher's grid: persistent (the default), one program a multiprocessor at most;
    else one program a tile. A TileConfig takes the options' defaults."""
    from gemm_lessons.kernels import k11_gluon_fp8 as ws
    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw["SCALE_RING"]))

    monkeypatch.setattr(ws, "persistent_programs", lambda device: 4)
    a = torch.zeros(300, 1500).to(torch.float8_e4m3fn)
    b = torch.zeros(260, 1500).to(torch.float8_e4m3fn).t()           # W.t()
    sa, sb, c = torch.ones(300, 12), torch.ones(12, 3), torch.empty(300, 260)
    for cfg in (None, ws.WsConfig(128, 128, 128, 4, 5, False, False),
                ws.WsConfig(128, 128, 128, 4, 5, True, False), k11.TileConfig(128, 64, 128, 4, 6)):
        ws._launch_ws(Kernel(), "block", a, b, sa, sb, c, cfg)
    assert launches == [((4,), True), ((9,), False), ((9,), True), ((4,), True)]


@pytest.mark.parametrize("cfg", [(64, 128, 128, 4, 4), (128, 4, 128, 4, 4), (128, 128, 64, 4, 4),
                                 (128, 128, 128, 4, 0)])
def test_gluon_block_kernel_refuses_tiles_it_cannot_split(cfg):
    from gemm_lessons.kernels import k11_gluon_fp8 as ws
    with pytest.raises(ValueError, match="two warpgroups of 64 rows"):
        ws._launch_ws(None, "block", None, None, None, None, None, k11.TileConfig(*cfg))


@pytest.mark.parametrize("kernel,config", [
    ("k11_fp8_blockwise_ws", None), ("k11_fp8_blockwise_ws", (128, 64, 128, 4, 6)),
    ("k11_fp8_blockwise_ws", (128, 128, 128, 4, 5, False, False)),
    ("k11_fp8_blockwise_ws", (128, 128, 128, 4, 5, False, True)),
    ("k11_fp8_blockwise_ws", (128, 128, 128, 4, 5, True, False)),
    ("k11_fp8_blockwise_tma", None), ("k11_fp8_blockwise_tma", (128, 128, 128, 8, 4))])
def test_block_kernels_wrap_their_rings(kernel, config, monkeypatch):
    """Twelve K-steps (two passes round a ring of five or six slots: the second-round
    parities), several tiles each way and ragged edges, in each configuration; the Gluon
    kernel's persistent grid cut to four programs, so that each walks two or three tiles, the
    ring's position running on from one to the next."""
    if not gl.runs_here(kernel) or gl.engine().kind != "cuda":
        pytest.skip(f"{kernel}: a GPU test (the interpreter has no ring)")
    from gemm_lessons.kernels import k11_gluon_fp8 as ws
    monkeypatch.setattr(ws, "persistent_programs", lambda device: 4)
    qa, qb, sa, sb, ref = _operands(300, 260, 1500, kernel, b_layout="transposed")
    out = torch.full((300, 260), float("nan"), dtype=torch.float32, device=gl.device())
    entry = next(k for k in gl.kernels() if k.name == kernel)
    cfg = None if config is None else (ws.WsConfig if len(config) == 7 else k11.TileConfig)(*config)
    entry.scaled(qa, qb, sa, sb, out, config=cfg)
    assert not torch.isnan(out).any(), "an element was never written"
    assert fp8.rel_error(out.cpu(), ref) < TOL


def test_plain_matmul_is_the_product_with_unit_scales():
    a = torch.randn(19, 40).to(torch.float8_e4m3fn)
    b = torch.randn(40, 21).to(torch.float8_e4m3fn)
    got = gl.matmul(a.to(gl.device()), b.to(gl.device()), kernel="k11_fp8_blockwise").cpu()
    assert got.dtype == torch.float8_e4m3fn
    want = (a.double() @ b.double()).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert (got.double() - want.double()).abs().max().item() <= 2 ** -4 * want.double().abs().max().item()
    assert torch.equal(k11.unit_scales("block", 19, 21, 300, "cpu")[1], torch.ones(3, 1))


@pytest.mark.parametrize("shape", [(37, 45, 300), (20, 24, 128), (1, 20, 129)])
def test_two_step_block_kernel_matches_float64(shape):
    """The unregistered two-step form of the block kernel (lesson 11 compiles it to show what
    ptxas does with it) computes the same product: an odd and an even number of K-steps."""
    if not gl.runs_here("k11_fp8_blockwise"):
        pytest.skip("k11_fp8_blockwise does not run on this engine")
    M, N, K = shape
    qa, qb, sa, sb, ref = _operands(M, N, K, "k11_fp8_blockwise")
    out = torch.full((M, N), float("nan"), dtype=torch.float32, device=gl.device())
    k11.scaled(k11.blockwise_two_step_kernel, "block")(qa, qb, sa, sb, out)
    assert not torch.isnan(out).any(), "an element was never written"
    assert fp8.rel_error(out.cpu(), ref) < TOL


def test_block_kernel_waits_for_the_tensor_core_before_promoting():
    """sm_90: the block kernel's promotion reads the K-step's product only after
    ``wgmma.wait_group 0`` (no wgmma left running); the two-step form leaves its second dot
    running in Triton's PTX, and ptxas then serializes the wgmma (C7514)."""
    import re
    from gemm_lessons import compiled, triton_asm
    block, two = triton_asm.compile_kernels([
        k11.asm_job(k11.blockwise_kernel, "block"),
        k11.asm_job(k11.blockwise_two_step_kernel, "block")])
    ptx = block["ptx"]
    first_fma = ptx.index("fma.rn.f32")
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx[:first_fma])
    assert waits and waits[-1] == "0"
    assert "wgmma.mma_async" in ptx[:first_fma]
    # the two-step form: a commit group with no wait before the next promotion
    body = two["ptx"]
    commits = [m.start() for m in re.finditer(r"wgmma\.commit_group", body)]
    assert len(commits) >= 2
    between = body[commits[1]:]
    assert "fma.rn.f32" in between.split("wgmma.wait_group")[0]
    rep = compiled.ptxas_report(body, (9, 0), warnings=True)
    if rep is None:
        pytest.skip("ptxas not found")
    assert any("C7514" in w for w in rep["warnings"]), rep["warnings"]
    assert not any("C7514" in w for w in compiled.ptxas_report(ptx, (9, 0), warnings=True)["warnings"])


@pytest.mark.parametrize("gran,want", [("tensor", "k11_fp8_tensorwise"), ("row", "k11_fp8_rowwise"),
                                       ("block", "k11_fp8_blockwise")])
def test_auto_reads_the_granularity_off_the_scales(gran, want):
    """kernel="auto" (scaled_matmul's default) runs the kernel of the scales' granularity
    (per row on Hopper: the TMA kernel) and computes what that kernel computes."""
    from gemm_lessons import choose
    kernel = {"tensor": "k11_fp8_tensorwise", "row": "k11_fp8_rowwise",
              "block": "k11_fp8_blockwise"}[gran]
    qa, qb, sa, sb, ref = _operands(37, 140, 160, kernel)      # two K blocks, two of N
    hopper = gl.engine().kind == "cuda" and gl.engine().capability[0] == 9
    if hopper and gran == "row":
        want = "k11_fp8_rowwise_tma"
    assert choose.scale_granularity(qa, qb, sa, sb) == gran
    assert choose.scaled_kernel_for(qa, qb, sa, sb) == want
    got = gl.scaled_matmul(qa, qb, sa, sb, out_dtype=torch.float32)
    assert fp8.rel_error(got.cpu(), ref) < TOL
    assert torch.equal(got, gl.scaled_matmul(qa, qb, sa, sb, kernel=want, out_dtype=torch.float32))


def test_auto_names_the_shapes_it_takes():
    qa, qb, sa, sb, _ = _operands(20, 24, 300, "k11_fp8_rowwise")
    with pytest.raises(ValueError, match=r"\(20, 1\) and \(1, 24\) \(per row and column\), or "
                                         r"\(20, 3\) and \(3, 1\)"):
        gl.scaled_matmul(qa, qb, sa.reshape(-1), sb)
    with pytest.raises(TypeError, match="scale_b must be a torch.Tensor"):
        gl.scaled_matmul(qa, qb, sa, 1.0)
    # one K block and one column: the block scales are the per-row ones, the same product
    from gemm_lessons import choose
    qa, qb, sa, sb, _ = _operands(20, 1, 100, "k11_fp8_rowwise")
    assert sb.shape == (1, 1) and choose.scale_granularity(qa, qb, sa, sb) == "row"
