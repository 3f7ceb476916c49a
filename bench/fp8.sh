#!/usr/bin/env bash
# FP8 block-wise training (issue 16, "Numbers"), run by `make bench` (scripts/run-bench)
# as   bench/fp8.sh BUILD_DIR
#
# The demo model (configs/demo.json) on the KJV bytes at W=2 (1 thread per rank):
#  1. bytes and time: three short runs of the same steps, seed and batch:
#     f32     --param-dtype f32  --compute-dtype f32
#     bf16    --param-dtype bf16 --compute-dtype bf16
#     fp8     --fp8 block --param-dtype bf16 --compute-dtype bf16 (the linear weights
#             gathered as e4m3 codes + one f32 scale per 128x128 tile, the other
#             tensors in bf16)
#     gather bytes per rank per step as the runtime counts them (the log's
#     gather_bytes, median over the steps), fp8 over f32 and over bf16 (targets
#     <= 0.27 and <= 0.53), and the median step time (wall and CPU, first step
#     excluded) of fp8 over bf16. Then the same three modes on the MoE demo model
#     (configs/demo-moe.json: 8 experts of 688 x 256 and 256 x 344, the experts
#     quantized each on its own tiles, the routers in bf16): its gather bytes
#     (RF_BENCH_FP8_MOE="B T STEPS", default 4 128 4: the bytes of a step do not
#     depend on the batch).
#  2. quality: the demo's run (make demo: 16 x 128 tokens, lr 3e-3, warm-up 30, cosine
#     to 0.1x, weight decay 0.1, clip 1.0, seed 1, validation every 100 steps on 16
#     batches) for RF_BENCH_FP8_STEPS steps (default 1000) in bf16 and in fp8: the
#     validation losses side by side, fp8's relative difference at the end (target
#     within 2%), the two curves in one chart (scripts/loss-chart: against the step
#     and against CPU seconds; $out/fp8-demo.png, copied to docs/fp8-demo.png when
#     the run is the documented 1000 steps). The losses are
#     deterministic (the same on any machine and load); the time is not.
#
# Time on an idle 2-core machine: part 1 about 1 minute, part 2 about 2 x 3-5 minutes.
# RF_BENCH_PART=bytes runs only part 1, RF_BENCH_PART=demo only part 2.
# RF_BENCH_FP8_SHORT="B T STEPS" sets part 1's sizes (default 16 128 12), RF_BENCH_FP8_MOE
# those of its MoE runs (default 4 128 4).
# Needs `rfsdp train --fp8 block` (skipped with a note when the binary has none).
# Outputs in runs/bench-fp8-DATE/ (logs, the chart's data).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init fp8.sh "${1:-}"
# (the help read whole: grep -q would stop reading, and under pipefail rfsdp's SIGPIPE
# would count as no --fp8)
if ! grep -q -- '--fp8' <<<"$("$rfsdp" train --help 2>&1)"; then
  echo "fp8.sh: this rfsdp has no 'train --fp8 block' (issue 16): skipped"
  exit 0
fi
part=${RF_BENCH_PART:-all}
read -r sb st ss <<<"${RF_BENCH_FP8_SHORT:-16 128 12}"
read -r moe_b moe_t moe_s <<<"${RF_BENCH_FP8_MOE:-4 128 4}"
steps=${RF_BENCH_FP8_STEPS:-1000}
cfg=configs/demo.json
moe_cfg=configs/demo-moe.json
w=2

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} # as the rfsdp command sets it for itself
out=runs/bench-fp8-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
bench_data
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
echo "GEMM: oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null), OMP_WAIT_POLICY=$OMP_WAIT_POLICY"

mode_args() {
  case $1 in
    f32) echo "--param-dtype f32 --compute-dtype f32" ;;
    bf16) echo "--param-dtype bf16 --compute-dtype bf16" ;;
    fp8) echo "--fp8 block --param-dtype bf16 --compute-dtype bf16" ;;
  esac
}
# run NAME MODE ARGS...: one training run at W=2 of $model (default the demo), its log in
# $out/NAME.jsonl
run() {
  local name=$1 mode=$2
  shift 2
  local margs cmd
  read -ra margs <<<"$(mode_args "$mode")"
  cmd=(scripts/rfmpirun -np "$w" "$rfsdp" train --model "${model:-$cfg}" --data data/kjv "${margs[@]}" "$@"
    --seed 1 --peak-gflops 1 --log "$out/$name.jsonl")
  echo "  $name (OMP_NUM_THREADS=1): ${cmd[*]}" >>"$out/commands.txt"
  local t0=$SECONDS
  OMP_NUM_THREADS=1 "${cmd[@]}" >"$out/$name.out" 2>&1 || {
    echo "fp8.sh: run $name failed; see $out/$name.out:" >&2
    tail -5 "$out/$name.out" >&2
    return 1
  }
  echo "$name $((SECONDS - t0))" >>"$out/seconds.txt"
}

if [ "$part" = all ] || [ "$part" = bytes ]; then
  echo
  echo "1. bytes and step time: demo model, W=$w x 1 thread, $ss steps of $sb x $st tokens"
  for mode in f32 bf16 fp8; do
    run "short-$mode" "$mode" --steps "$ss" --batch "$sb" --seq "$st" --lr 3e-3 --print-every 1000 || exit 1
  done
  for mode in f32 bf16 fp8; do
    f=$out/short-$mode.jsonl
    g=$(json_num "$f" gather_bytes | median)
    ms=$(json_num "$f" ms | tail -n +2 | median)
    cpu=$(json_num "$f" cpu_ms | tail -n +2 | median)
    echo "$mode $g $ms $cpu" >>"$out/short.txt"
  done
  awk '{g[$1] = $2; ms[$1] = $3; cpu[$1] = $4}
  END {
    print "| run | gather bytes / rank / step | vs f32 | vs bf16 | step ms (median) | CPU ms (median) |"
    print "|-----|----------------------------|--------|---------|------------------|-----------------|"
    n = split("f32 bf16 fp8", m, " ")
    for (i = 1; i <= n; i++)
      printf "| %s | %d | %.4f | %.4f | %.1f | %.1f |\n", m[i], g[m[i]], g[m[i]] / g["f32"], g[m[i]] / g["bf16"], ms[m[i]], cpu[m[i]]
    printf "fp8 gather over f32: %.4f (target <= 0.27), over bf16: %.4f (target <= 0.53)\n", g["fp8"] / g["f32"], g["fp8"] / g["bf16"]
    printf "fp8 step time over bf16 compute: %.3fx wall, %.3fx CPU\n", ms["fp8"] / ms["bf16"], cpu["fp8"] / cpu["bf16"]
  }' "$out/short.txt"
  echo
  echo "   MoE: $moe_cfg, W=$w x 1 thread, $moe_s steps of $moe_b x $moe_t tokens (bytes per step only)"
  for mode in f32 bf16 fp8; do
    model=$moe_cfg run "moe-$mode" "$mode" --steps "$moe_s" --batch "$moe_b" --seq "$moe_t" --lr 3e-3 --print-every 1000 ||
      exit 1
    echo "$mode $(json_num "$out/moe-$mode.jsonl" gather_bytes | median)" >>"$out/moe.txt"
  done
  awk '{g[$1] = $2}
  END {
    print "| MoE run | gather bytes / rank / step | vs f32 | vs bf16 |"
    print "|---------|----------------------------|--------|---------|"
    n = split("f32 bf16 fp8", m, " ")
    for (i = 1; i <= n; i++) printf "| %s | %d | %.4f | %.4f |\n", m[i], g[m[i]], g[m[i]] / g["f32"], g[m[i]] / g["bf16"]
    printf "MoE fp8 gather over f32: %.4f (target <= 0.27), over bf16: %.4f (target <= 0.53)\n", g["fp8"] / g["f32"], g["fp8"] / g["bf16"]
  }' "$out/moe.txt"
fi

if [ "$part" = all ] || [ "$part" = demo ]; then
  echo
  echo "2. quality: the demo's run for $steps steps, bf16 against fp8 (W=$w x 1 thread)"
  for mode in bf16 fp8; do
    run "demo-$mode" "$mode" --steps "$steps" --batch 16 --seq 128 --lr 3e-3 --warmup 30 --min-lr-ratio 0.1 \
      --weight-decay 0.1 --clip 1.0 --eval-every 100 --eval-batches 16 --print-every 1000 || exit 1
  done
  for mode in bf16 fp8; do
    grep val_loss "$out/demo-$mode.jsonl" | sed 's/.*"step":\([0-9]*\).*"val_loss":\([-0-9.eE+]*\).*/\1 \2/' \
      >"$out/demo-$mode.dat"
  done
  join "$out/demo-bf16.dat" "$out/demo-fp8.dat" >"$out/demo.dat"
  echo "| step | bf16 val loss | fp8 val loss | fp8 vs bf16 |"
  echo "|------|---------------|--------------|-------------|"
  awk '{printf "| %d | %.4f | %.4f | %+.2f%% |\n", $1, $2, $3, 100 * ($3 - $2) / $2}' "$out/demo.dat"
  tail -1 "$out/demo.dat" | awk '{d = 100 * ($3 - $2) / $2; printf "final validation loss: fp8 %.4f, bf16 %.4f: %+.2f%% (target within 2%%: %s)\n", $3, $2, d, (d <= 2 && d >= -2) ? "met" : "NOT met"}'
  awk '$1 ~ /^demo-/ {printf "%s: %d s wall\n", $1, $2}' "$out/seconds.txt"
  if scripts/loss-chart "$out/fp8-demo.png" \
    "demo model, W=$w, 16 x 128 tokens per step: bf16 compute against --fp8 block" \
    "bf16 (--param-dtype bf16 --compute-dtype bf16)=$out/demo-bf16.jsonl" \
    "fp8 (--fp8 block: e4m3 128x128 weights, 1x128 X and dY)=$out/demo-fp8.jsonl" >/dev/null; then
    if [ "$steps" = 1000 ]; then
      cp "$out/fp8-demo.png" docs/fp8-demo.png
      echo "chart: docs/fp8-demo.png (scripts/loss-chart; data in $out/demo-*.jsonl)"
    else
      echo "chart: $out/fp8-demo.png ($steps steps: docs/fp8-demo.png is the 1000-step run's)"
    fi
  fi
fi
echo "finished: $(date -u '+%H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//'); commands in $out/commands.txt"
