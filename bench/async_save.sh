#!/usr/bin/env bash
# What a checkpoint costs training, synchronous against --async-save (issue 27
# item 6; docs/checkpoint.md): the demo model (configs/demo.json, AdamW) on W=2
# ranks of one thread each, a checkpoint every 3 steps for 12 steps, into a
# scratch folder; RF_BENCH_REPS runs of each mode (default 3), interleaved.
#   sync   the training thread's time in each save ("checkpoint: ... (N ms)")
#   async  the training thread's time per save: the save call (waiting for a save
#          still in flight, copying into staging: "checkpoint: ... (N ms to stage"),
#          the agreements at step boundaries while one is in flight, plus the
#          writer thread's CPU time (an upper bound on what it takes from training
#          when every core is busy, as here); the last save's end, awaited after
#          the last step, is left out (a synchronous run pays its last save inside
#          the loop: it is in the sync figure)
#   wall   the loop's time (sum of the steps' ms and the checkpoint calls) per mode
#          and the difference to a run without checkpoints per save: the same
#          comparison end to end, noisy on a shared machine
# Medians over the runs. RF_BENCH_EVERY (default 3) and RF_BENCH_STEPS (default 12) set the
# interval and the run's length. Usage: bench/async_save.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
source bench/lib.bash
bench_init async_save "${1:-build}"
bench_data
out=$(mktemp -d /tmp/rf_bench_async.XXXXXX)
trap 'rm -rf "$out"' EXIT
reps=${RF_BENCH_REPS:-3} steps=${RF_BENCH_STEPS:-12} every=${RF_BENCH_EVERY:-3}

run() { # run MODE REP: one training run; its output in $out/MODE-REP.out
  local mode=$1 rep=$2 extra=()
  [ "$mode" != none ] && extra=(--save-every "$every" --keep 2 --ckpt-dir "$out/ckpt-$mode-$rep")
  [ "$mode" = async ] && extra+=(--async-save)
  OMP_NUM_THREADS=1 scripts/rfmpirun -np 2 "$rfsdp" train --model configs/demo.json --data data/kjv \
    --steps "$steps" --batch 8 --seq 128 --lr 1e-3 --peak-gflops 50 --print-every 0 \
    --log "$out/$mode-$rep.jsonl" "${extra[@]}" >"$out/$mode-$rep.out" 2>&1 || {
    echo "$bench: the $mode run failed:" >&2
    tail -5 "$out/$mode-$rep.out" >&2
    exit 1
  }
  rm -rf "$out/ckpt-$mode-$rep"
}

# loop_ms MODE REP: the steps' ms plus the training thread's checkpoint calls
loop_ms() {
  local steps_ms ckpt_ms
  steps_ms=$(json_num "$out/$1-$2.jsonl" ms | awk '{s += $1} END {printf "%.1f", s}')
  ckpt_ms=$(grep -o '^checkpoint: .*(step [0-9]*, [0-9.]* ms' "$out/$1-$2.out" | sed 's/.* \([0-9.]*\) ms$/\1/' |
    awk '{s += $1} END {printf "%.1f", s}')
  echo "$steps_ms + $ckpt_ms" | bc -l
}

for rep in $(seq 1 "$reps"); do
  for mode in sync async none; do run $mode "$rep"; done
done

saves=$((steps / every))
sync_ms=$(cat "$out"/sync-*.out | grep -o '^checkpoint: .*(step [0-9]*, [0-9.]* ms' |
  sed 's/.* \([0-9.]*\) ms$/\1/' | median)
# per async run: (the "ms to stage" of its saves + the agreements while one was in
# flight + the writer thread's CPU) / saves; rank 0's lines
summary='s/^async save: \([0-9]*\) saves; .* and \([0-9.]*\) ms in agreements; its writer thread used \([0-9.]*\) ms CPU.*/\1 \2 \3/p'
per_run() { # per_run FILE: "saves stage_ms agreements_ms writer_ms"
  local stage
  stage=$(grep -o '^checkpoint: .*(step [0-9]*, [0-9.]* ms' "$1" | sed 's/.* \([0-9.]*\) ms$/\1/' |
    awk '{s += $1} END {printf "%.1f", s}')
  sed -n "$summary" "$1" | awk -v s="$stage" '{print $1, s, $2, $3}'
}
async_ms=$(for f in "$out"/async-*.out; do per_run "$f"; done | awk '{printf "%.2f\n", ($2 + $3 + $4) / $1}' | median)
parts=$(for f in "$out"/async-*.out; do per_run "$f"; done |
  awk '{c += $2 / $1; a += $3 / $1; p += $4 / $1; n++} END {if (n) printf "staging call %.1f, agreements %.1f, writer CPU %.1f ms (means)", c / n, a / n, p / n}')
staging=$(grep -o 'staging buffer of [0-9.]* MB' "$out/async-1.out" | grep -o '[0-9.]* MB')
wall() { for rep in $(seq 1 "$reps"); do loop_ms "$1" "$rep"; done | median; }
w_none=$(wall none) w_sync=$(wall sync) w_async=$(wall async)

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(bench_load)"
echo "configs/demo.json, W=2, AdamW, $steps steps, a checkpoint every $every ($saves saves), $reps runs per mode"
printf "staging buffer (--async-save's extra memory): %s per rank\n" "$staging"
printf "sync save: %.1f ms per save (median)\n" "$sync_ms"
printf "async save: %.1f ms per save lost by training (median; %s)\n" "$async_ms" "$parts"
printf "async / sync: %.3f\n" "$(echo "$async_ms / $sync_ms" | bc -l)"
printf "wall (loop ms, medians): none %.0f, sync %.0f, async %.0f; per save: sync %+.0f ms, async %+.0f ms\n" \
  "$w_none" "$w_sync" "$w_async" "$(echo "($w_sync - $w_none) / $saves" | bc -l)" \
  "$(echo "($w_async - $w_none) / $saves" | bc -l)"
