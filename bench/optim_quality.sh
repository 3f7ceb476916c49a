#!/usr/bin/env bash
# Optimizer quality and cost (issue 6, "Numbers to reach"), run by `make bench`
# (scripts/run-bench) as   bench/optim_quality.sh BUILD_DIR
#
# The demo model (configs/demo.json) trained on the KJV bytes at W=2 (1 thread per
# rank) for the same steps, seed, batch and schedule with --optim adamw, adamw8bit
# and muon (the same --lr: Muon scales its matrix updates to AdamW's RMS). Prints
# the final validation loss of each (the same validation batches), adamw8bit's
# relative difference to adamw (target within 1%), the median time per step
# (first step excluded), the peak RSS per rank, and the optimizer-state bytes
# per rank. The trainer does not print the optimizer's own counters
# (rf_optim_get_stats), so the state is computed from the parameter count and the
# allocations in src/optim/optim.c (formula printed).
#
# Default: 400 steps of 8 x 128 tokens (about 4 minutes for the three runs on an idle 2-core
# machine). RF_BENCH_OPTIM_STEPS, RF_BENCH_OPTIM_BATCH, RF_BENCH_OPTIM_SEQ and
# RF_BENCH_OPTIM_LR override; RF_BENCH_LONG=1 runs 600 steps of 16 x 256 (make demo's
# sizes). Outputs in runs/bench-optim-DATE/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init optim_quality.sh "${1:-}"
if [ "${RF_BENCH_LONG:-0}" = 1 ]; then
  steps=600 batch=16 seq=256
else
  steps=400 batch=8 seq=128
fi
steps=${RF_BENCH_OPTIM_STEPS:-$steps}
batch=${RF_BENCH_OPTIM_BATCH:-$batch}
seq=${RF_BENCH_OPTIM_SEQ:-$seq}
lr=${RF_BENCH_OPTIM_LR:-3e-3}
warmup=$((steps / 10))
cfg=configs/demo.json
w=2

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} # as the rfsdp command sets it for itself
blas_note="GEMM: oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null), OMP_WAIT_POLICY=$OMP_WAIT_POLICY"

out=runs/bench-optim-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
bench_data

cmd=(scripts/rfmpirun -np "$w" "$rfsdp" train --model "$cfg" --data data/kjv --steps "$steps" --batch "$batch"
  --seq "$seq" --lr "$lr" --warmup "$warmup" --seed 1 --eval-every "$steps" --eval-batches 16
  --peak-gflops 1 --print-every 1000 --optim OPTIM --log "$out/OPTIM.jsonl")
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
echo "$blas_note"
echo "command (OMP_NUM_THREADS=1): ${cmd[*]}"

for opt in adamw adamw8bit muon; do
  run=("${cmd[@]/OPTIM/$opt}")
  # Each rank's peak RSS (kB) in $out/OPTIM.hwm.RANK.
  rf_peak_run "$out/$opt.hwm" "$w" 1 "${run[@]:3}" >"$out/$opt.out" 2>&1 || {
    echo "optim_quality.sh: --optim $opt failed; see $out/$opt.out:" >&2
    tail -5 "$out/$opt.out" >&2
  }
done
echo "finished: $(date -u '+%H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"

get() { grep -o "\"$2\" *: *[0-9]*" "$1" | grep -o '[0-9]*$'; }
h=$(get $cfg hidden_size) I=$(get $cfg intermediate_size) L=$(get $cfg num_hidden_layers)
H=$(get $cfg num_attention_heads) KV=$(get $cfg num_key_value_heads) V=$(get $cfg vocab_size)

echo
echo "demo model, W=$w x 1 thread, $steps steps of $batch x $seq tokens, lr $lr (warm-up $warmup, cosine to 0.1x), seed 1"
echo "| optimizer | final val loss | vs adamw | final train loss | step ms (median) | state MiB/rank (computed) | peak RSS MiB/rank |"
echo "|-----------|----------------|----------|------------------|------------------|---------------------------|-------------------|"
for opt in adamw adamw8bit muon; do
  f=$out/$opt.jsonl
  [ -s "$f" ] || continue
  val=$(json_num "$f" val_loss | tail -1)
  [ "$opt" = adamw ] && base=$val
  loss=$(json_num "$f" loss | tail -1)
  ms=$(json_num "$f" ms | tail -n +2 | median)
  rss=$(cat "$out/$opt".hwm.* 2>/dev/null | awk '{printf "%s%.0f", (NR>1?",":""), $1/1024}')
  awk -v opt="$opt" -v val="$val" -v base="${base:-nan}" -v loss="$loss" -v ms="$ms" -v rss="$rss" -v w=$w \
    -v h="$h" -v I="$I" -v L="$L" -v H="$H" -v KV="$KV" -v V="$V" -v out="$out" '
  BEGIN {
    d = h / H; q = H * d; k = KV * d
    M = L * (h * q + 2 * h * k + q * h + 3 * h * I)   # Muon matrices
    P = M + 2 * V * h + L * 2 * h + h
    # 8-bit blocks: 32x32 tiles of matrices, runs of 256 of vectors; one f32 scale for m and one for v each
    tiles = L * (2 * int((q + 31) / 32) * int((h + 31) / 32) + 2 * int((k + 31) / 32) * int((h + 31) / 32) + \
                 2 * int((I + 31) / 32) * int((h + 31) / 32) + int((h + 31) / 32) * int((I + 31) / 32)) + \
            2 * int((V + 31) / 32) * int((h + 31) / 32)
    vecs = L * 2 * int((h + 255) / 256) + int((h + 255) / 256)
    if (opt == "adamw") st = 8 * P
    else if (opt == "adamw8bit") st = 2 * P + 8 * (tiles + vecs)
    else st = 8 * P + 8 * M   # m and v over the whole shard + Muon send/recv staging (M/W each)
    rel = (base == "nan" || opt == "adamw") ? "" : sprintf("%+.2f%%", 100 * (val - base) / base)
    printf "| %s | %.4f | %s | %.4f | %.1f | %.2f | %s |\n", opt, val, rel, loss, ms, st / w / 1048576, rss
    printf "%s %.0f\n", opt, st / w >> (out "/state.txt")
  }'
done
awk '{s[$1] = $2} END {if (s["adamw8bit"] > 0) printf "optimizer state adamw over adamw8bit: %.2fx (target >= 3.5x); muon over adamw: %.2fx\n", s["adamw"] / s["adamw8bit"], s["muon"] / s["adamw"]}' "$out/state.txt"
cat <<'EOF'
state per rank = bytes below / W; P parameters, M of them in Muon matrices (q, k, v, o, gate, up, down):
  adamw      8 P              f32 m and v
  adamw8bit  2 P + 8 blocks   u8 codes of m and v; one f32 absmax each per 32x32 tile or run of 256
  muon       8 P + 8 M        src/optim allocates f32 m and v over the whole shard (v unused for the
                              Muon matrices) plus the all-to-all-v send and receive staging (M/W
                              floats each per rank); a momentum-only layout would need 4 M + 8 (P - M)
EOF
