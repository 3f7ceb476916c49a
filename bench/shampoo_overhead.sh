#!/usr/bin/env bash
# Shampoo's step-time overhead over AdamW (issue 17, "Numbers"), run by `make bench`
# (scripts/run-bench) as   bench/shampoo_overhead.sh BUILD_DIR
#
# The 100M LLaMA (configs/llama-100m.json) trained on the KJV bytes with --optim adamw
# and --optim shampoo, at W=1 (2 threads) and W=2 (1 thread per rank), the two runs of
# a W one after the other (neighbouring runs see the same machine). 4 steps of 8 x 128
# tokens with --shampoo-every 3: steps 2 and 4 are ordinary steps (step 1 creates the
# GEMM primitives), step 3 refreshes every root. The time per step with refreshes every
# 20 steps, averaged over the steps, is the ordinary step plus 1/20 of the refresh
# step's extra time. Both wall-clock ms and CPU ms (per thread: the log's cpu_ms) are
# reported: on a shared machine the CPU time is the steadier measure of the work.
# RF_BENCH_SHAMPOO_BATCH, RF_BENCH_SHAMPOO_SEQ, RF_BENCH_SHAMPOO_BLOCK (--shampoo-block,
# 1024) override. Outputs in runs/bench-shampoo-bBLOCK-DATE/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init shampoo_overhead.sh "${1:-}"
batch=${RF_BENCH_SHAMPOO_BATCH:-8}
seq=${RF_BENCH_SHAMPOO_SEQ:-128}
block=${RF_BENCH_SHAMPOO_BLOCK:-1024}
cfg=configs/llama-100m.json
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
out=runs/bench-shampoo-b$block-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
bench_data
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
# "ordinary ms, refresh extra ms, amortized ms (every 20)" of field $2 of log $1
times() {
  grep -o "\"$2\":[-0-9.eE+]*" "$1" | sed 's/.*://' |
    awk '{x[NR] = $1} END {o = (x[2] + x[4]) / 2; e = x[3] - o; printf "%.0f %.0f %.0f\n", o, e, o + e / 20}'
}
for w in 1 2; do
  threads=$((2 / w))
  for opt in adamw shampoo; do
    log=$out/$opt-w$w.jsonl
    cmd=(scripts/rfmpirun -np "$w" "$rfsdp" train --model "$cfg" --data data/kjv --steps 4 --batch "$batch"
      --seq "$seq" --lr 1e-3 --seed 1 --peak-gflops 1 --print-every 1000 --optim "$opt" --shampoo-every 3
      --shampoo-block "$block" --log "$log")
    [ "$w$opt" = 1adamw ] && echo "command (OMP_NUM_THREADS=2/W): ${cmd[*]}"
    OMP_NUM_THREADS=$threads "${cmd[@]}" >"$out/$opt-w$w.out" 2>&1 || {
      echo "shampoo_overhead.sh: --optim $opt at W=$w failed; see $out/$opt-w$w.out:" >&2
      tail -5 "$out/$opt-w$w.out" >&2
      continue
    }
    for f in ms cpu_ms; do times "$log" "$f" >"$out/$opt-w$w.$f"; done
  done
  for f in ms cpu_ms; do
    read -r ao _ aa <"$out/adamw-w$w.$f" || continue
    read -r so se sa <"$out/shampoo-w$w.$f" || continue
    echo "W=$w x $threads threads, $batch x $seq tokens, blocks of $block, $f: adamw $ao per step; shampoo $so per" \
      "step, refresh step +$se, averaged with refreshes every 20: $sa; shampoo/adamw $(awk -v s="$sa" -v a="$aa" \
        'BEGIN {printf "%.3f (overhead %+.0f%%; goal <= +10%%)", s / a, 100 * (s / a - 1)}')"
  done
done
echo "finished: $(date -u '+%H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
