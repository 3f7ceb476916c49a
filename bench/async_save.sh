#!/usr/bin/env bash
# What a checkpoint costs training, synchronous against --async-save (issue 27
# item 6; docs/checkpoint.md quotes the lines this prints), in the two workloads
# users meet, each against a synchronous save of the same state in the same run
# of this script: the demo model (configs/demo.json, AdamW), a checkpoint every 6
# steps for 24 steps (RF_BENCH_EVERY, RF_BENCH_STEPS), into a scratch folder on
# the disk; RF_BENCH_REPS runs of each mode (default 3; sync, async, none),
# interleaved; medians.
#   (a) every core trains: W=2 ranks of one thread on 2 cores. The writer thread's
#       CPU is taken from training, so async's loss per save is the training
#       thread's save call (copying into staging, waiting for a save still in
#       flight: "checkpoint: ... (N ms to stage"), the agreements at step
#       boundaries while one is in flight, plus the writer's CPU time.
#   (b) a core left for the writer: W=1 rank of one thread (on a GPU node training
#       runs on the accelerator and CPU cores are free). Lost per save end to
#       end: the training loop's time (the steps' ms, the checkpoint calls and the
#       agreements) against the run without saves, over the saves before the last
#       step (the last save's write has no steps left to overlap); and the
#       training thread's own time in save calls and agreements.
# sync save: the training thread's time in each save ("checkpoint: ... (N ms)").
# A save's wall time: staged to complete ("checkpoint complete: ... (N ms after
# staging)"); at an interval shorter than that, the next save waits for it.
# Usage: bench/async_save.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
source bench/lib.bash
bench_init async_save "${1:-build}"
bench_data
out=$(mktemp -d "${RF_BENCH_TMP:-$top/$build}/rf_bench_async.XXXXXX") # a disk folder (not /tmp's tmpfs)
trap 'rm -rf "$out"' EXIT
reps=${RF_BENCH_REPS:-3} steps=${RF_BENCH_STEPS:-24} every=${RF_BENCH_EVERY:-6}

run() { # run NP MODE REP: one training run; its output in $out/wNP-MODE-REP.out
  local np=$1 mode=$2 rep=$3 name="w$1-$2-$3" extra=()
  [ "$mode" != none ] && extra=(--save-every "$every" --keep 2 --ckpt-dir "$out/ckpt-$name")
  [ "$mode" = async ] && extra+=(--async-save)
  OMP_NUM_THREADS=1 scripts/rfmpirun -np "$np" "$rfsdp" train --model configs/demo.json --data data/kjv \
    --steps "$steps" --batch 8 --seq 128 --lr 1e-3 --peak-gflops 50 --print-every 0 \
    --log "$out/$name.jsonl" "${extra[@]}" >"$out/$name.out" 2>&1 || {
    echo "$bench: the W=$np $mode run failed:" >&2
    tail -5 "$out/$name.out" >&2
    exit 1
  }
  rm -rf "$out/ckpt-$name"
}

for rep in $(seq 1 "$reps"); do
  for np in 2 1; do
    for mode in sync async none; do run "$np" "$mode" "$rep"; done
  done
done

# calls FILE: "step ms" of each checkpoint call of rank 0
calls() { sed -n 's/^checkpoint: .*(step \([0-9]*\), \([0-9.]*\) ms.*/\1 \2/p' "$1"; }
# agree_writer FILE: "saves agreements_ms writer_cpu_ms" from the async summary
agree_writer() {
  sed -n 's/^async save: \([0-9]*\) saves; .* and \([0-9.]*\) ms in agreements; its writer thread used \([0-9.]*\) ms CPU.*/\1 \2 \3/p' "$1"
}
# fence FILE: the ms the training thread waited at optimizer steps for the writer's copy
fence() { sed -n 's/^async save: .* waited \([0-9.]*\) ms at optimizer steps.*/\1/p' "$1"; }
# per_save FILE: "saves calls_ms agreements_ms writer_ms" per save of an async run (calls_ms: the
# save calls and the waits at optimizer steps for the writer's copy)
per_save() {
  local c
  c=$(calls "$1" | awk -v f="$(fence "$1")" '{s += $2} END {printf "%.3f", s + f}')
  agree_writer "$1" | awk -v c="$c" '{printf "%d %.3f %.3f %.3f\n", $1, c / $1, $2 / $1, $3 / $1}'
}
# loop NAME: the training loop's ms: the steps, the checkpoint calls before the
# last step and (async) the agreements
loop() {
  local f=$out/$1 s c a
  s=$(json_num "$f.jsonl" ms | awk '{s += $1} END {printf "%.3f", s}')
  c=$(calls "$f.out" | awk -v n="$steps" '$1 < n {s += $2} END {printf "%.3f", s}')
  a=$(agree_writer "$f.out" | awk '{print $2}')
  echo "${s} + ${c} + ${a:-0}" | bc -l
}
reps_of() { for rep in $(seq 1 "$reps"); do "$1" "$2-$rep"; done; }
sync_ms() { cat "$out"/w"$1"-sync-*.out | calls /dev/stdin | awk '{print $2}' | median; }
wall_ms() { cat "$out"/w"$1"-async-*.out | sed -n 's/^checkpoint complete: .* \([0-9.]*\) ms after staging.*/\1/p' | median; }
step_ms() { cat "$out"/w"$1"-none-*.jsonl | json_num /dev/stdin ms | median; }
staging() { grep -o 'staging buffer of [0-9.]* MB' "$out/w$1-async-1.out" | grep -o '[0-9.]*'; }
saves=$(calls "$out/w2-sync-1.out" | wc -l)
window=$(calls "$out/w1-sync-1.out" | awk -v n="$steps" '$1 < n' | wc -l)

# (a)
a_sync=$(sync_ms 2)
a_async=$(for f in "$out"/w2-async-*.out; do per_save "$f"; done | awk '{printf "%.3f\n", $2 + $3 + $4}' | median)
a_parts=$(for f in "$out"/w2-async-*.out; do per_save "$f"; done |
  awk '{c += $2; a += $3; p += $4; n++} END {if (n) printf "save calls and copy waits %.1f, agreements %.1f, writer CPU %.1f ms, means", c / n, a / n, p / n}')
# (b)
b_sync=$(sync_ms 1)
b_none=$(reps_of loop w1-none | median) b_syncl=$(reps_of loop w1-sync | median) b_asyncl=$(reps_of loop w1-async | median)
b_e2e=$(echo "($b_asyncl - $b_none) / $window" | bc -l)
b_e2e_sync=$(echo "($b_syncl - $b_none) / $window" | bc -l)
b_calls=$(for f in "$out"/w1-async-*.out; do per_save "$f"; done | awk '{printf "%.3f\n", $2 + $3}' | median)
b_writer=$(for f in "$out"/w1-async-*.out; do per_save "$f"; done | awk '{print $4}' | median)

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(bench_load)"
echo "configs/demo.json, AdamW, $steps steps, a checkpoint every $every ($saves saves), $reps runs per mode interleaved, medians"
printf "(a) every core trains, W=2 x 1 thread: sync save %.1f ms per save; async %.1f ms lost per save (%s); async / sync %.3f\n" \
  "$a_sync" "$a_async" "$a_parts" "$(echo "$a_async / $a_sync" | bc -l)"
printf "(a) a save's wall time, staged to complete: %.0f ms (steps of %.0f ms)\n" "$(wall_ms 2)" "$(step_ms 2)"
printf "(b) a core left for the writer, W=1 x 1 thread: sync save %.1f ms per save (end to end %+.1f ms); async end to end %+.1f ms lost per save (the loop's time against the run without saves, over %d saves); async / sync %.3f\n" \
  "$b_sync" "$b_e2e_sync" "$b_e2e" "$window" "$(echo "$b_e2e / $b_sync" | bc -l)"
printf "(b) the training thread in async save calls and agreements: %.1f ms per save; / sync %.3f; the writer thread's CPU %.1f ms per save\n" \
  "$b_calls" "$(echo "$b_calls / $b_sync" | bc -l)" "$b_writer"
printf "(b) a save's wall time, staged to complete: %.0f ms (steps of %.0f ms); the loops (ms): none %.0f, sync %.0f, async %.0f\n" \
  "$(wall_ms 1)" "$(step_ms 1)" "$b_none" "$b_syncl" "$b_asyncl"
printf "extra memory of --async-save (the staging copy of the shard and optimizer state, and the 4.2 MB write buffer; resident from the start): %s MB per rank at W=2, %s MB at W=1\n" \
  "$(staging 2)" "$(staging 1)"
