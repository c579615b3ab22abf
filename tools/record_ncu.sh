#!/usr/bin/env bash
# Record the Nsight Compute output that lessons 01, 03, 04, 05, 06, 07 and 09 show, on a GPU host,
# and the one lesson 11 asks you to record (k11).
#
#   bash tools/record_ncu.sh            # from the repository root, with the venv active
#   bash tools/record_ncu.sh k09        # only the recordings whose file name contains "k09"
#
# Each recording is one text file in gemm_lessons/results/recorded/: its first line is the
# command that produced it (prefixed "$ "), the rest is that command's output. Notebooks 01,
# 03 and 05 print these files as they are, notebooks 04, 07 and 09 read theirs with
# gemm_lessons.results.read_ncu; re-execute them afterwards so that their stored outputs hold
# the recordings.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=gemm_lessons/results/recorded
mkdir -p "$OUT"
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on the PATH" >&2; exit 1; }
only="${1:-}"

# Runs the registered kernels named on the command line once each, on seeded random n x n
# operands (n and the dtype first): the process ncu profiles. NAME@FIELD=VALUE runs kernel
# NAME's module with that change to its configuration (k06_cluster@RELEASE=cluster).
DRIVER='import importlib, sys, torch, gemm_lessons as gl
from gemm_lessons.compiled import variant
n, dt = int(sys.argv[1]), getattr(torch, sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(n, n, device="cuda", generator=g).to(dt)
b = torch.randn(n, n, device="cuda", generator=g).to(dt)
if dt.itemsize == 1:          # FP8: B K-major (W.t() of an nn.Linear weight), as FP8 wgmma reads it
    b = b.t().contiguous().t()
for name in sys.argv[3:]:
    name, change = variant(name)
    if change:
        out = torch.empty(n, n, device="cuda", dtype=dt)
        importlib.import_module(f"gemm_lessons.kernels.{name}").run(a, b, None, out,
                                                                    config=change)
    else:
        gl.matmul(a, b, kernel=name)
torch.cuda.synchronize()'

record() {   # record FILE COMMAND...: the command line, then its output, into $OUT/FILE
    local file="$OUT/$1"; shift
    case "$file" in *"$only"*) ;; *) return 0;; esac
    local shown="$*"
    shown="${shown//"$DRIVER"/<driver>}"
    { echo "\$ $shown"
      echo "# device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      case "$shown" in *"<driver>"*)
        echo "# <driver>: the python -c program in tools/record_ncu.sh (runs each named kernel once)";;
      esac
      "$@" 2>&1 | grep -v '^==PROF==' ; } > "$file.tmp"
    mv "$file.tmp" "$file"
    echo "wrote $file"
}

# Lesson 01: what the caches did for the naive and the coalesced kernel at 4096^3
# (L1 hit rate of global loads, L2 hit rate, sectors requested from L1, bytes read from DRAM)
record ncu_k01_caches.txt \
    ncu -k 'regex:naive_kernel|coalesced_kernel' --launch-count 2 \
        --metrics l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate.pct,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \
        python -c "$DRIVER" 4096 float32 k01_naive k01_coalesced

# Lesson 03: shared-memory bank conflicts of the two column-walk kernels at 1024^3
record ncu_k03_bank_conflicts.txt \
    ncu -k 'regex:column_walk' --launch-count 2 \
        --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum \
        python -c "$DRIVER" 1024 float32 k03_bank_conflicts k03_padded

# Lesson 04: what each step changed, per kernel at 4096^3 (lesson 02's kernel, then the eight
# steps, one launch each, in the order tools/ncu_k04_steps.py prints): instructions issued,
# those of the load/store pipe, shared-load instructions and the wavefronts (passes) they took,
# bank conflicts, achieved occupancy, issue slots and FMA pipe busy, and the stall reasons
# (warps stalled per issued instruction, by reason); base units (nanoseconds, bytes), so that
# results.read_ncu reads every value in one unit. About a minute on an H200.
record ncu_k04_steps.txt \
    ncu --profile-from-start off --print-units base \
        --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_op_shared_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_active_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio \
        python tools/ncu_k04_steps.py --size 4096

# Lesson 05: where the warps of the tensor-core kernel spend their time at 4096^3
# (stall reasons per issued instruction, achieved occupancy, tensor-pipe and memory use)
record ncu_k05_wmma_stalls.txt \
    ncu -k 'regex:wmma_gemm' --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        python -c "$DRIVER" 4096 float16 k05_wmma

# Lesson 06, step 10: what clusters with a multicast A cost, fp16 at 8192^3, one launch of
# step 8's kernel (k06_tma_store) and one of step 10's (k06_cluster, clusters of two along N)
# with each scope of its remote releases (cluster, then CTA): throughput, launch shape (cluster size),
# occupancy, warp stalls, the memory side (L2 hit rate, bytes read from DRAM)
record ncu_k06_cluster.txt \
    ncu -k 'regex:tma_store|cluster' --launch-count 3 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis \
        --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \
        python -c "$DRIVER" 8192 float16 k06_tma_store k06_cluster k06_cluster@RELEASE=cluster

# Lesson 11: the block-scaled FP8 kernel beside the per-row one on Hopper, e4m3 at 8192^3
# (unit scales, B K-major), one launch each of k11_fp8_rowwise and
# k11_fp8_blockwise_ws: throughput, warp stalls, shared memory and the pipes' use
record ncu_k11_block_ws.txt \
    ncu -k 'regex:rowwise|block_ws' --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --metrics gpu__time_duration.sum \
        python -c "$DRIVER" 8192 float8_e4m3fn k11_fp8_rowwise k11_fp8_blockwise_ws

# Lesson 07: the L2 side of the tile order, fp16, one launch of each order at 4096^3 and at
# 8192^3 (grouped, GROUP_SIZE_M=8, then row-major, at each size): L2 hit rate, bytes read
# from DRAM, kernel time (base units: bytes, nanoseconds)
record ncu_k07_tile_order.txt \
    ncu --kernel-name regex:matmul_kernel --print-units base \
        --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \
        python tools/sweep_k07_k08.py --profile

# Lesson 09: what cuBLAS runs for eager's addmm and for mm alone on 1024 x 1024 x 16384, the
# suite's shape where the fused kernel loses, beside k09_fused_tma_splitk as its autotuner
# picks and on the tile named in cuBLAS's addmm kernel ("128x64_64x8", read as a 128 x 64 tile,
# K-steps of 64, 8 stages; K not split)
record ncu_k09_1024x1024x16384.txt \
    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats \
        python tools/profile_k09_shape.py --shape 1024x1024x16384 --config 128x64x64:k1:w4:s8:g1
