#!/usr/bin/env bash
# Verify the course on a GPU machine, in parts that each fit a short session:
#   bash tools/verify_gpu.sh ladder    OUTDIR   # check + time every kernel vs cuBLAS; CSV + plot
#   bash tools/verify_gpu.sh notebooks OUTDIR [NOTEBOOK...]   # nbval: stored CPU outputs must hold
#   bash tools/verify_gpu.sh ncu       OUTDIR   # lesson 03's bank conflicts as ncu counts them
#   bash tools/verify_gpu.sh record    OUTDIR   # every recording the lessons quote, rewritten in
#                                               # gemm_lessons/results/: ncu outputs of lessons 01,
#                                               # 03, 05; lesson 09's headline; the shape suite;
#                                               # the fused bias + gelu over the shape suite
# Every part logs to OUTDIR and exits non-zero when something fails.
set -uo pipefail
part=${1:?part: ladder, notebooks, ncu or record}
out=${2:-.}
shift 2 || shift $#
mkdir -p "$out"
case "$part" in
  ladder)
    python3 -m gemm_lessons info | head -8
    python3 -m gemm_lessons ladder --quiet --csv "$out/h200_ladder.csv" --out "$out/h200_ladder.png" \
      2>&1 | tee "$out/ladder.log" ;;
  notebooks)
    nbs=("$@")
    [ ${#nbs[@]} -gt 0 ] || nbs=(notebooks/)
    python3 -m pytest -p no:cacheprovider -q "${nbs[@]}" 2>&1 | tee "$out/nbval.log" | tail -25 ;;
  ncu)
    ncu --clock-control none \
      --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,gpu__time_duration.sum \
      python3 tools/sweep_k04.py --ncu 2>&1 | tee "$out/ncu.log" | grep -E "conflicts|duration|Context|kernel names" ;;
  record)
    # tools/record_ncu.sh runs `python`: make sure it is this interpreter
    mkdir -p "$out/bin"; printf '#!/bin/sh\nexec python3 "$@"\n' > "$out/bin/python"
    chmod +x "$out/bin/python"; export PATH="$PWD/$out/bin:$PATH"
    bash tools/record_ncu.sh 2>&1 | tee "$out/record_ncu.log" &&
    python3 tools/record_epilogue.py 2>&1 | tee "$out/record_epilogue.log" &&
    python3 tools/shape_suite.py --csv gemm_lessons/results/h200_shapes.csv 2>&1 \
      | tee "$out/shapes.log" &&
    python3 tools/epilogue_suite.py --csv gemm_lessons/results/h200_epilogue_shapes.csv 2>&1 \
      | tee "$out/epilogue_shapes.log" ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
