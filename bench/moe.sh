#!/usr/bin/env bash
# Mixture-of-experts training numbers (issue 15, "Numbers"), run by `make bench`
# (scripts/run-bench) as   bench/moe.sh BUILD_DIR
#
#  1. Layouts in the runtime: configs/demo-moe.json (8 experts of 344, top-2, 9.4M
#     parameters, f32, AdamW) at W=3 and W=6 (1 thread per rank) in the planned layout
#     (equal and ragged shards) and the fsdp2 layout (every tensor's rows split
#     evenly, padded). From the train log (rank 0's counters of the last step): the
#     padding bytes moved by the collectives, the bytes copied outside them (staging,
#     copy-in/out), the bytes gathered and reduced, the median step time (first step
#     excluded); the plan's padding ratio (the log's first line).
#  2. rfsdp against PyTorch FSDP2 at W=2 (1 thread per rank), bf16 compute:
#     configs/mixtral-bench.json (hidden 512, 8 experts of 1024, top-2, 4 layers, 53.8M
#     parameters, 16.4M active per token), `rfsdp train --param-dtype bf16
#     --compute-dtype bf16` against transformers' MixtralForCausalLM under fully_shard
#     per decoder layer and the root, gloo, MixedPrecisionPolicy(param_dtype=bfloat16,
#     reduce_dtype=float32) (bench/torch_train.py); the same global batch, sequence,
#     AdamW (0.9/0.95, weight decay 0.1, clip 1.0) and load-balancing loss (coef 0.02).
#     Median step time (first step excluded; wall, and per-thread CPU time of rank 0),
#     peak RSS of every rank (VmHWM), the rfsdp-over-PyTorch ratios (targets <= 0.6).
#
# Sizes "B T STEPS": RF_BENCH_MOE_LAYOUT (default 12 64 4), RF_BENCH_MOE_TORCH
# (default 4 128 6). RF_BENCH_MOE_PART=layouts or torch runs only part 1 or 2. RF_BENCH_TORCH=0 skips PyTorch; the venv: $RF_VENV, else the
# repo's .venv (scripts/pyenv). About 2.5 minutes on an idle 2-core machine.
# Everything lands in runs/bench-moe-DATE/ (logs, per-rank peaks, JSON).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init moe.sh "${1:-}"
read -r lay_b lay_t lay_s <<<"${RF_BENCH_MOE_LAYOUT:-12 64 4}"
read -r tb tt ts <<<"${RF_BENCH_MOE_TORCH:-4 128 6}"
small_cfg=configs/demo-moe.json big_cfg=configs/mixtral-bench.json

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} # as the rfsdp command sets it for itself
out=runs/bench-moe-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out/cache"
export XDG_CACHE_HOME=$top/$out/cache # the bf16 GEMM peak (MFU) measured in this run
bench_data
start=$(date +%s)
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load: $(bench_load)"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); outputs in $out"

part=${RF_BENCH_MOE_PART:-all}
case $part in all | layouts | torch) ;; *)
  echo "moe.sh: RF_BENCH_MOE_PART=$part: expected all, layouts or torch" >&2
  exit 1
  ;;
esac

# ---- 1. planned (equal, ragged) against fsdp2 at W=3 and W=6 --------------------------------

layouts_part() {
  echo
  echo "1. layouts: $small_cfg, f32, AdamW, global batch $lay_b x $lay_t, $lay_s steps, 1 thread per rank"
  for w in 3 6; do
    rf_run "w$w-equal" $small_cfg $w 1 "$lay_b" "$lay_t" "$lay_s" --layout planned --shard equal
    rf_run "w$w-ragged" $small_cfg $w 1 "$lay_b" "$lay_t" "$lay_s" --layout planned --shard ragged
    rf_run "w$w-fsdp2" $small_cfg $w 1 "$lay_b" "$lay_t" "$lay_s" --layout fsdp2
  done
  echo "| W | layout | plan padding | padding B/step | copy B/step | gathered B/step | reduced B/step | step ms (median) | vs planned/ragged |"
  echo "|---|--------|--------------|----------------|-------------|-----------------|----------------|------------------|-------------------|"
  for w in 3 6; do
    base=$(json_num "$out/w$w-ragged.jsonl" ms | tail -n +2 | median)
    for layout in equal ragged fsdp2; do
      f=$out/w$w-$layout.jsonl
      [ -s "$f" ] || continue
      name=planned/$layout
      [ $layout = fsdp2 ] && name=fsdp2
      awk -v w=$w -v name=$name -v ratio="$(json_num "$f" padding_ratio | head -1)" \
        -v pad="$(json_num "$f" padding_bytes | tail -1)" -v copy="$(json_num "$f" copy_bytes | tail -1)" \
        -v gath="$(json_num "$f" gather_bytes | tail -1)" -v red="$(json_num "$f" reduce_bytes | tail -1)" \
        -v ms="$(json_num "$f" ms | tail -n +2 | median)" -v base="$base" \
        'BEGIN { printf "| %d | %s | %.4f%% | %d | %d | %d | %d | %.1f | %.2fx |\n", w, name, 100 * ratio, pad, copy, gath, red, ms, ms / base }'
    done
  done
  echo "(bytes: rank 0's counters of the last step; W ranks on $(nproc) cores: W=6 is oversubscribed, step times compare layouts only)"
}

# ---- 2. rfsdp against PyTorch FSDP2, bf16, W=2 ---------------------------------------------

torch_part() {
  torch_setup
  echo
  echo "2. rfsdp against PyTorch FSDP2: $big_cfg, W=2 x 1 thread, global batch $tb x $tt, $ts steps (first excluded), bf16 compute, AdamW"
  [ -n "$torch_note" ] && echo "$torch_note"
  echo "   load before: $(bench_load)"
  rf_run bf16-w2 $big_cfg 2 1 "$tb" "$tt" "$ts" --param-dtype bf16 --compute-dtype bf16
  echo "   after rfsdp: $(bench_load)"
  torch_run fsdp2 1 fsdp2-bf16 --param-dtype bf16 --run "$big_cfg:$tb:$tt:$ts"
  echo "   after FSDP2: $(bench_load)"
  local r rc t
  r=$(rf_stats bf16-w2)
  rc=$(json_num "$out/bf16-w2.jsonl" cpu_ms | tail -n +2 | median)
  t=$(torch_stats fsdp2-bf16 "$big_cfg")
  local j=$out/torch-fsdp2-bf16.json impl=""
  [ -s "$j" ] && impl="torch $(grep -o '"torch": "[^"]*"' "$j" | sed 's/.*: //'), transformers $(grep -o '"transformers": "[^"]*"' "$j" | sed 's/.*: //'), experts implementation $(grep -o '"experts_implementation": "[a-z_]*"' "$j" | sed 's/.*: //')"
  awk -v tok=$((tb * tt)) -v r="$r" -v rc="$rc" -v t="$t" -v impl="$impl" '
  function row(name, ms, cpu, hw, per, rms, rcpu, rhw) {
    printf "| %-34s | %8.1f | %8.1f | %7.0f | %-12s |", name, ms, cpu, tok / (ms / 1000), per
    if (rms > 0) printf " %5.2f | %5.2f | %5.2f |\n", rms / ms, rcpu / cpu, rhw / hw; else printf " %5s | %5s | %5s |\n", "", "", ""
  }
  BEGIN {
    split(r, a)
    print "| run                                | step ms  | CPU ms   | tok/s   | RSS/rank MiB | time ratio | CPU ratio | mem ratio |"
    print "|------------------------------------|----------|----------|---------|--------------|-------|-------|-------|"
    row("rfsdp bf16 compute+params", a[1], rc, a[3], a[4], 0, 0, 0)
    if (t != "") {
      split(t, s)
      row("FSDP2 MixedPrecisionPolicy bf16", s[1], s[6], s[2], s[3], a[1], rc, a[3])
      opt = s[5]
      gsub("_", " ", opt)
      printf "PyTorch: %s, %s, RSS right after importing torch+transformers %s MiB per process\n", opt, impl, s[4]
    }
  }'
  echo "ratios are rfsdp / PyTorch (wall-clock step, per-thread CPU time of rank 0, peak RSS of the fullest rank);"
  echo "targets: time <= 0.6 and mem <= 0.6"
}

[ "$part" = torch ] || layouts_part
[ "$part" = layouts ] || torch_part
echo "finished: $(date -u '+%H:%M:%S UTC') ($(($(date +%s) - start)) s)   load: $(bench_load)"
