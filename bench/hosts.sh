#!/usr/bin/env bash
# FSDP and HSDP across hosts on shaped links, measured and simulated (issue 27 items 3
# and 4; docs/scale.md, docs/hsdp.md): 2 hosts x 2 ranks made by scripts/hosts (network
# namespaces: shared memory inside a host, TCP across), every host's link shaped with
# tc tbf to each rate of RF_BENCH_RATES (default "1gbit 300mbit 100mbit"), one thread
# per rank. Per rate:
#  1. fit: bench_comm's collectives inside a step (RF_BENCH_PART=step, 16 KiB .. 4 MiB f32)
#     on the world of 4 (it spans both hosts: FSDP's groups) and on the strided groups of 2
#     (one rank per host: HSDP's replica groups), fitted together as the profile's `inter`
#     links (fit_links, bench/lib.bash); once, at the first rate, the consecutive groups of
#     2 (inside a host) as its `shared` links. The profile hosts-RATE.json: 2 ranks per node
#     on 1 core per node (the 4 ranks share this machine's 2 cores), the rest of
#     configs/network/here.json.
#  2. rfsdp train on configs/demo.json (3.0M parameters, AdamW, batch 8 x seq 128 in all):
#     FSDP over the 4 ranks (--replicate 1: every gather and reduce-scatter crosses the
#     links) and HSDP (--replicate node); the median step time of steps 2..N against
#     `rfsdp plan --batch` with that profile and the compute rate of one rank alone
#     (bench_model at 2 sequences, CPU time); what h0's link carried per step (--stats: the
#     whole run's bytes / steps, start-up included).
#  3. bench_hsdp (its own 2 x 2 mesh: a shard group per host, replicas across): the exposed
#     communication per step with each unit's replica all-reduce started at the end of the
#     backward ("end", as the blocking slab all-reduce was) and overlapped with the backward
#     ("overlap"), medians of 8 steps per mode, alternating.
# Needs root (network namespaces); says so and exits 0 elsewhere. Outputs (the profiles
# too) in runs/bench-hosts-DATE/. Usage: bench/hosts.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
source bench/lib.bash
bench_init hosts "${1:-build}"
if ! why=$(scripts/hosts --check 2>&1); then
  echo "$bench: not run: $why"
  exit 0
fi
bench_data
out=${RF_BENCH_OUT:-runs/bench-hosts-$(date -u +%Y%m%dT%H%M%SZ)}
export out
mkdir -p "$out"
rates=${RF_BENCH_RATES:-1gbit 300mbit 100mbit}
steps=${RF_BENCH_STEPS:-6}
cfg=configs/demo.json
hosts() { # RATE [hosts flags] -- CMD...: 2 hosts x 2 ranks, one thread per rank
  local rate=$1
  shift
  scripts/hosts --hosts 2 --ranks-per-host 2 --rate "$rate" "$@"
}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(bench_load); outputs in $out"
OMP_NUM_THREADS=1 "$build/bench/bench_model" $cfg 2 128 5 >"$out/model.txt" 2>&1
gflops=$(grep -m1 'weights f32  compute f32' "$out/model.txt" | sed 's/.*CPU time: *[0-9.]* ms\/step *\([0-9.]*\) GFLOP.*/\1/')
echo "compute rate of one rank alone at 2 sequences (bench_model, CPU time): $gflops GFLOP/s"
{
  echo "| link | FSDP measured ms | predicted ms | error | HSDP measured ms | predicted ms | error | FSDP / HSDP measured | predicted | h0 link MB/step FSDP / HSDP | inter all-reduce fit: alpha us, busbw GB/s, median / largest error |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
} >"$out/table.md"
{
  echo "| link | exposed comm, end ms | overlapped ms | overlapped / end | grads_finish overlapped / end | step time overlapped / end |"
  echo "|---|---:|---:|---:|---:|---:|"
} >"$out/overlap.md"
comm_step() { # RATE NAME GROUP STRIDED
  hosts "$1" -- env OMP_NUM_THREADS=1 RF_BENCH_PART=step RF_BENCH_MIN_KIB=16 RF_BENCH_MAX_MIB=4 RF_BENCH_CHUNK_MS=4 \
    RF_BENCH_GROUP="$3" RF_BENCH_STRIDED="$4" "$top/$build/bench/bench_comm" >"$out/comm-$2.txt" 2>&1 ||
    echo "$bench: bench_comm $2 failed (exit $?, see $out/comm-$2.txt)" >&2
}
points() { # W G LINK FILE
  awk -v w="$1" -v g="$2" -v link="$3" '$2 ~ /^(KiB|MiB)$/ && $3 ~ /^step_/ {print w, g, link, $0}' "$4"
}
# profile RATE: the profile of that rate (JSON over the named `here`): the fitted inter links
# ($out/links-RATE.txt) and shared links ($out/links-shared.txt), 2 ranks on 1 core per node
profile() {
  local load
  load=$(grep -h -o 'load average [0-9.]*' "$out"/comm-*.txt | sed 's/.* //' | sort -g | sed -n '1p;$p' | paste -sd- -)
  awk -v rate="$1" -v when="$(date -u -r "$out/comm-world-$1.txt" '+%Y-%m-%d %H:%M UTC')" -v load="$load" -v cpu="$(lscpu | sed -n 's/^Model name: *//p')" '
    function links(file, name,   l, f, s) {
      s = ""
      while ((getline l < file) > 0) { split(l, f, " ")
        if (f[1] == name) s = s (s == "" ? "" : ", ") sprintf("\"%s\": [%.1f, %.4g]", f[2], f[3], f[4]) }
      return "{" s "}" }
    BEGIN {
      print "{"
      print "  \"base\": \"here\","
      printf "  \"source\": \"bench/hosts.sh, %s, load %s: 2 hosts x 2 ranks of scripts/hosts on this machine (%s), every host'"'"'s link shaped to %s each way (tc tbf); inter: bench_comm'"'"'s collectives inside a step on the world of 4 and on the strided pairs (one rank per host), fitted together; shared: the consecutive pairs inside a host; 2 ranks per node on 1 core per node (the 4 ranks share the 2 cores); the rest is here'"'"'s; give --peak-gflops (bench_model'"'"'s CPU-time GFLOP/s)\",\n", when, load, cpu, rate
      print "  \"cores_per_node\": 1,"
      print "  \"ranks_per_node\": 2,"
      print "  \"shared\": " links(ENVIRON["out"] "/links-shared.txt", "shared") ","
      print "  \"inter\": " links(ENVIRON["out"] "/links-" rate ".txt", "inter")
      print "}" }'
}
first=1
for rate in $rates; do
  # 1. the fit
  if [ $first = 1 ]; then
    comm_step "$rate" inside 2 0
    points 4 2 shared "$out/comm-inside.txt" | fit_links "$out/links-shared.txt" >"$out/fit-shared.md"
    first=0
  fi
  comm_step "$rate" "world-$rate" 4 0
  comm_step "$rate" "replicas-$rate" 2 1
  rm -f "$out/links-$rate.txt"
  { points 4 4 inter "$out/comm-world-$rate.txt"; points 4 2 inter "$out/comm-replicas-$rate.txt"; } |
    fit_links "$out/links-$rate.txt" >"$out/fit-$rate.md"
  profile "$rate" >"$out/hosts-$rate.json"
  [ "${RF_BENCH_SAVE:-0}" = 1 ] && cp "$out/hosts-$rate.json" "configs/network/hosts-$rate.json"
  # 2. FSDP and HSDP across the hosts, measured and predicted
  declare -A ms=() pred=() mb=()
  for mode in fsdp hsdp; do
    rep=1 r=1
    [ $mode = hsdp ] && rep=node r=2
    hosts "$rate" --stats "$out/links-$mode-$rate.txt" -- env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
      "$rfsdp" train --model $cfg --data data/kjv --steps "$steps" --batch 8 --seq 128 --lr 1e-3 --print-every 0 \
      --replicate $rep --log "$out/$mode-$rate.jsonl" >"$out/$mode-$rate.out" 2>&1 ||
      echo "$bench: the $mode run at $rate failed (exit $?, see $out/$mode-$rate.out)" >&2
    ms[$mode]=$(json_num "$out/$mode-$rate.jsonl" ms | tail -n +2 | median)
    OMP_NUM_THREADS=1 "$rfsdp" plan --model $cfg --world 4 --replicate $r --batch 8 --seq 128 \
      --network "$out/hosts-$rate.json" --peak-gflops "$gflops" --efficiency 1 --rank 0 --json >"$out/plan-$mode-$rate.json"
    pred[$mode]=$(json_num "$out/plan-$mode-$rate.json" predicted_step_ms)
    mb[$mode]=$(awk -v s="$steps" 'NR == 1 {printf "%.1f", ($2 + $3) / s / 1e6}' "$out/links-$mode-$rate.txt")
  done
  fit=$(awk -F'|' '$2 ~ /allreduce/ {gsub(/ /, "", $7); gsub(/ /, "", $8); gsub(/ /, "", $9); gsub(/ /, "", $10); print $7 ", " $8 ", " $9 " / " $10}' "$out/fit-$rate.md")
  awk -v rate="$rate" -v fm="${ms[fsdp]}" -v fp="${pred[fsdp]}" -v hm="${ms[hsdp]}" -v hp="${pred[hsdp]}" \
    -v fb="${mb[fsdp]}" -v hb="${mb[hsdp]}" -v fit="$fit" 'BEGIN {
    printf "| %s | %.0f | %.0f | %+.0f%% | %.0f | %.0f | %+.0f%% | %.2f | %.2f | %s / %s | %s |\n", rate, fm, fp,
      100 * (fp - fm) / fm, hm, hp, 100 * (hp - hm) / hm, fm / hm, fp / hp, fb, hb, fit }' >>"$out/table.md"
  # 3. the replica all-reduce at the end against overlapped
  hosts "$rate" -- env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$top/$build/bench/bench_hsdp" \
    >"$out/hsdp-$rate.txt" 2>&1 || echo "$bench: bench_hsdp at $rate failed (exit $?)" >&2
  awk -v rate="$rate" '$1 == "end" {e = $3} $1 == "overlap" {o = $3}
    /^overlap\/end/ {gsub(/,/, ""); f = $8; s = $11}
    END {printf "| %s | %.1f | %.1f | %.3f | %.3f | %.3f |\n", rate, e, o, o / e, f, s}' "$out/hsdp-$rate.txt" >>"$out/overlap.md"
  echo "$rate done: $(tail -1 "$out/table.md")"
done
echo
echo "the inter links fitted per rate, and the shared links inside a host:"
cat "$out"/fit-*.md
echo
echo "FSDP and HSDP across 2 hosts x 2 ranks ($cfg, batch 8 x 128, median of steps 2..$steps), measured and predicted:"
cat "$out/table.md"
echo
echo "bench_hsdp across the hosts: the replica all-reduce at the end against overlapped with the backward:"
cat "$out/overlap.md"
