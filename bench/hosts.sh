#!/usr/bin/env bash
# FSDP and HSDP across hosts on shaped links, measured and simulated (issue 27 items 3
# and 4; docs/scale.md, docs/hsdp.md): hosts made by scripts/hosts (network namespaces:
# shared memory inside a host, TCP across), every host's link shaped with tc tbf to each
# rate of RF_BENCH_RATES (default "1gbit 300mbit 100mbit"), one thread per rank, in the
# layouts of RF_BENCH_LAYOUTS (HOSTSxRANKS, default "2x1 2x2"):
#   2x1  2 hosts x 1 rank: a core per rank (the model's assumptions hold). FSDP = one
#        group of 2 across the hosts (--replicate 1), HSDP = shard groups of 1, the 2
#        replicas across (--replicate 2).
#   2x2  2 hosts x 2 ranks: 4 ranks on this machine's 2 cores (oversubscribed: ranks
#        waiting in MPI spin on the cores their peers need). FSDP over the 4 ranks, HSDP
#        with a shard group per host (--replicate node), replicas across.
#   3x1  3 hosts x 1 rank, FSDP only (3 ranks on 2 cores: oversubscribed again).
# Per layout and rate:
#  1. fit: bench_comm's collectives inside a step (RF_BENCH_PART=step, 16 KiB .. 4 MiB f32)
#     on the world (it spans the hosts: FSDP's group) and, with 2+ ranks per host, on the
#     strided groups (one rank per host: HSDP's replica groups), fitted together as the
#     profile's `inter` links (fit_links, bench/lib.bash); with 2+ ranks per host, once, the
#     consecutive groups (inside a host) as its `shared` links. The profile
#     hosts-LAYOUT-RATE.json: RANKS ranks per node on 1 core per node, the rest of
#     configs/network/here.json. The fitted inter all-reduce's bus bandwidth is printed
#     against the link's known rate (tc tbf: RATE / 8 bytes per second each way), the
#     outside reference of the fit.
#  2. rfsdp train on configs/demo.json (3.0M parameters, AdamW, batch 8 x seq 128 in all):
#     FSDP and HSDP as above; the median step time of steps 2..N against `rfsdp plan
#     --batch` with that profile and the compute rate of one rank alone at its share of
#     the batch (bench_model, CPU time); what h0's link carried per step (--stats: the
#     whole run's bytes / steps, start-up included) against the plan's bytes across hosts.
#  3. (2x2 only) bench_hsdp (its own 2 x 2 mesh: a shard group per host, replicas across):
#     the exposed communication per step with each unit's replica all-reduce started at
#     the end of the backward ("end", as the blocking slab all-reduce was) and overlapped
#     with the backward ("overlap"), medians of 8 steps per mode, alternating.
# Needs root (network namespaces); says so and exits 0 elsewhere. Outputs (the profiles
# too) in runs/bench-hosts-DATE/. RF_BENCH_FROM=DIR measures nothing: it fits and predicts
# again from the measurements of a finished run in DIR (a run from before the layouts is
# read as 2x2), e.g. after a change to the fit or the simulator. Usage: bench/hosts.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
source bench/lib.bash
bench_init hosts "${1:-build}"
from=${RF_BENCH_FROM:-}
if [ -n "$from" ]; then
  [ -d "$from" ] || {
    echo "$bench: RF_BENCH_FROM=$from: no such folder (a finished bench/hosts.sh run)" >&2
    exit 1
  }
elif ! why=$(scripts/hosts --check 2>&1); then
  echo "$bench: not run: $why"
  exit 0
else
  bench_data
fi
out=${RF_BENCH_OUT:-runs/bench-hosts-$(date -u +%Y%m%dT%H%M%SZ)}
export out
mkdir -p "$out"
if [ -n "$from" ]; then # the measurements of that run, under this script's names (a run before layouts: 2x2)
  cp -p "$from"/comm-*.txt "$from"/*.jsonl "$from"/links-*.txt "$from"/model*.txt "$out"/ 2>/dev/null
  cp -p "$from"/hsdp-*.txt "$out"/ 2>/dev/null
  for f in "$out"/comm-inside.txt "$out"/comm-world-*.txt "$out"/comm-replicas-*.txt; do
    [ -f "$f" ] && mv "$f" "$out/comm-2x2-${f##*/comm-}"
  done
  for f in "$out"/fsdp-*.jsonl "$out"/hsdp-*.jsonl; do [ -f "$f" ] && mv "$f" "$out/2x2-${f##*/}"; done
  for f in "$out"/links-fsdp-*.txt "$out"/links-hsdp-*.txt; do [ -f "$f" ] && mv "$f" "$out/links-2x2-${f##*/links-}"; done
  [ -f "$out/model.txt" ] && mv "$out/model.txt" "$out/model-2x2.txt"
fi
rates=${RF_BENCH_RATES:-1gbit 300mbit 100mbit}
layouts=${RF_BENCH_LAYOUTS:-2x1 2x2}
steps=${RF_BENCH_STEPS:-6}
absolute=1 # the fit on the absolute error (fit_links, bench/lib.bash); RF_BENCH_FIT=relative: as before
[ "${RF_BENCH_FIT:-absolute}" = relative ] && absolute=0
cfg=configs/demo.json
for lay in $layouts; do
  [[ "$lay" =~ ^[2-8]x[1-4]$ ]] || {
    echo "$bench: RF_BENCH_LAYOUTS: '$lay' is not HOSTSxRANKS (2x1, 2x2, 3x1)" >&2
    exit 1
  }
done
H=2 R=1
hosts() { # RATE [hosts flags] -- CMD...: H hosts x R ranks, one thread per rank
  local rate=$1
  shift
  scripts/hosts --hosts "$H" --ranks-per-host "$R" --rate "$rate" "$@"
}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(bench_load); outputs in $out"
{
  echo "| layout | link | FSDP measured ms | predicted ms | error | HSDP measured ms | predicted ms | error | FSDP / HSDP measured | predicted | h0 link MB/step FSDP / HSDP (plan) | inter all-reduce fit: alpha us, busbw GB/s (link rate / 8), median / largest error |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
} >"$out/table.md"
{
  echo "| link | exposed comm, end ms | overlapped ms | overlapped / end | grads_finish overlapped / end | step time overlapped / end |"
  echo "|---|---:|---:|---:|---:|---:|"
} >"$out/overlap.md"
comm_step() { # RATE NAME GROUP STRIDED
  [ -n "$from" ] && return 0
  hosts "$1" -- env OMP_NUM_THREADS=1 RF_BENCH_PART=step RF_BENCH_MIN_KIB=64 RF_BENCH_MAX_MIB=4 RF_BENCH_CHUNK_MS=4 \
    RF_BENCH_GROUP="$3" RF_BENCH_STRIDED="$4" "$top/$build/bench/bench_comm" >"$out/comm-$2.txt" 2>&1 ||
    echo "$bench: bench_comm $2 failed (exit $?, see $out/comm-$2.txt)" >&2
}
points() { # W G LINK FILE
  awk -v w="$1" -v g="$2" -v link="$3" '$2 ~ /^(KiB|MiB)$/ && $3 ~ /^step_/ {print w, g, link, $0}' "$4"
}
# profile LAYOUT RATE: the profile of that layout and rate (JSON over the named `here`): the
# fitted inter links ($out/links-LAYOUT-RATE.txt) and, with R > 1, the shared links
# ($out/links-LAYOUT-shared.txt), R ranks on 1 core per node
profile() {
  local load shared=""
  load=$(grep -h -o 'load average [0-9.]*' "$out"/comm-"$1"-*.txt | sed 's/.* //' | sort -g | sed -n '1p;$p' | paste -sd- -)
  [ "$R" -gt 1 ] && shared="$out/links-$1-shared.txt"
  awk -v lay="$1" -v rate="$2" -v h="$H" -v r="$R" -v sh="$shared" -v when="$(date -u -r "$out/comm-$1-world-$2.txt" '+%Y-%m-%d %H:%M UTC')" -v load="$load" -v cpu="$(lscpu | sed -n 's/^Model name: *//p')" '
    function links(file, name,   l, f, s) {
      s = ""
      while ((getline l < file) > 0) { split(l, f, " ")
        if (f[1] == name) s = s (s == "" ? "" : ", ") sprintf("\"%s\": [%.1f, %.4g]", f[2], f[3], f[4]) }
      return "{" s "}" }
    BEGIN {
      print "{"
      print "  \"base\": \"here\","
      printf "  \"source\": \"bench/hosts.sh, %s, load %s: %d hosts x %d rank%s of scripts/hosts on this machine (%s), every host'"'"'s link shaped to %s each way (tc tbf); inter: bench_comm'"'"'s collectives inside a step on the world%s, fitted together;%s %d rank%s per node on 1 core per node%s; the rest is here'"'"'s; give --peak-gflops (bench_model'"'"'s CPU-time GFLOP/s)\",\n", when, load, h, r, (r > 1 ? "s" : ""), cpu, rate, (r > 1 ? " and on the strided groups (one rank per host)" : ""), (r > 1 ? " shared: the consecutive groups inside a host;" : ""), r, (r > 1 ? "s" : ""), (h * r > 2 ? " (the ranks share this machine'"'"'s 2 cores: oversubscribed)" : "")
      print "  \"cores_per_node\": 1,"
      print "  \"ranks_per_node\": " r ","
      if (sh != "") print "  \"shared\": " links(sh, "shared") ","
      print "  \"inter\": " links(ENVIRON["out"] "/links-" lay "-" rate ".txt", "inter")
      print "}" }'
}
for lay in $layouts; do
  H=${lay%x*} R=${lay#*x}
  W=$((H * R))
  modes="fsdp hsdp"
  [ "$R" = 1 ] && [ "$H" -gt 2 ] && modes=fsdp # 3x1: HSDP would be 3 replicas of 1
  # the compute rate of one rank alone at its share of the batch (8 sequences over W ranks)
  [ -n "$from" ] || OMP_NUM_THREADS=1 "$build/bench/bench_model" $cfg $(((8 + W - 1) / W)) 128 5 >"$out/model-$lay.txt" 2>&1
  gflops=$(grep -m1 'weights f32  compute f32' "$out/model-$lay.txt" | sed 's/.*CPU time: *[0-9.]* ms\/step *\([0-9.]*\) GFLOP.*/\1/')
  echo "$lay: compute rate of one rank alone at $(((8 + W - 1) / W)) sequences (bench_model, CPU time): $gflops GFLOP/s"
  first=1
  for rate in $rates; do
    # 1. the fit
    if [ $first = 1 ] && [ "$R" -gt 1 ]; then
      comm_step "$rate" "$lay-inside" "$R" 0
      points "$W" "$R" shared "$out/comm-$lay-inside.txt" | fit_links "$out/links-$lay-shared.txt" $absolute >"$out/fit-$lay-shared.md"
    fi
    first=0
    comm_step "$rate" "$lay-world-$rate" "$W" 0
    [ "$R" -gt 1 ] && comm_step "$rate" "$lay-replicas-$rate" "$H" 1
    rm -f "$out/links-$lay-$rate.txt"
    {
      points "$W" "$W" inter "$out/comm-$lay-world-$rate.txt"
      [ "$R" -gt 1 ] && points "$W" "$H" inter "$out/comm-$lay-replicas-$rate.txt"
    } | fit_links "$out/links-$lay-$rate.txt" $absolute >"$out/fit-$lay-$rate.md"
    profile "$lay" "$rate" >"$out/hosts-$lay-$rate.json"
    [ "${RF_BENCH_SAVE:-0}" = 1 ] && cp "$out/hosts-$lay-$rate.json" "configs/network/hosts-$lay-$rate.json"
    # 2. FSDP and HSDP across the hosts, measured and predicted
    declare -A ms=() pred=() mb=() pmb=()
    ms[hsdp]=nan pred[hsdp]=nan mb[hsdp]=- pmb[hsdp]=-
    for mode in $modes; do
      rep=1
      [ "$mode" = hsdp ] && rep=$H
      [ -n "$from" ] || hosts "$rate" --stats "$out/links-$lay-$mode-$rate.txt" -- env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        "$rfsdp" train --model $cfg --data data/kjv --steps "$steps" --batch 8 --seq 128 --lr 1e-3 --print-every 0 \
        --replicate "$rep" --log "$out/$lay-$mode-$rate.jsonl" >"$out/$lay-$mode-$rate.out" 2>&1 ||
        echo "$bench: the $lay $mode run at $rate failed (exit $?, see $out/$lay-$mode-$rate.out)" >&2
      ms[$mode]=$(json_num "$out/$lay-$mode-$rate.jsonl" ms | tail -n +2 | median)
      OMP_NUM_THREADS=1 "$rfsdp" plan --model $cfg --world $W --replicate "$rep" --batch 8 --seq 128 \
        --network "$out/hosts-$lay-$rate.json" --peak-gflops "$gflops" --efficiency 1 --rank 0 --json \
        >"$out/plan-$lay-$mode-$rate.json"
      pred[$mode]=$(json_num "$out/plan-$lay-$mode-$rate.json" predicted_step_ms)
      mb[$mode]=$(awk -v s="$(grep -c '"step":' "$out/$lay-$mode-$rate.jsonl")" 'NR == 1 {printf "%.1f", ($2 + $3) / s / 1e6}' "$out/links-$lay-$mode-$rate.txt")
      # the plan's bytes across hosts of h0's ranks per step, each way: FSDP every byte of
      # the world's collectives (with 1 rank per host), HSDP the replicas' all-reduce
      pmb[$mode]=$(awk -v r="$R" -v m="$mode" -v i="$(json_num "$out/plan-$lay-$mode-$rate.json" bytes_per_step_inter)" \
        -v a="$(json_num "$out/plan-$lay-$mode-$rate.json" bytes_per_step_intra)" \
        'BEGIN {if (m == "fsdp" && r > 1) print "-"; else printf "%.1f", (m == "hsdp" ? i : a) * r * 2 / 1e6}')
    done
    fit=$(awk -F'|' -v rate="$rate" '$2 ~ /allreduce/ {gsub(/ /, "", $7); gsub(/ /, "", $8); gsub(/ /, "", $9); gsub(/ /, "", $10)
      n = rate + 0; u = substr(rate, length(n "") + 1); bw = n * (u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1) / 8e9
      print $7 ", " $8 " (" sprintf("%.4g", bw) "), " $9 " / " $10}' "$out/fit-$lay-$rate.md")
    awk -v lay="$lay" -v rate="$rate" -v fm="${ms[fsdp]}" -v fp="${pred[fsdp]}" -v hm="${ms[hsdp]}" -v hp="${pred[hsdp]}" \
      -v fb="${mb[fsdp]}" -v hb="${mb[hsdp]}" -v fpb="${pmb[fsdp]}" -v hpb="${pmb[hsdp]}" -v fit="$fit" 'BEGIN {
      h = hm != "nan" && hm > 0
      printf "| %s | %s | %.0f | %.0f | %+.0f%% | %s | %s | %s | %s | %s | %s (%s) / %s (%s) | %s |\n", lay, rate, fm, fp,
        100 * (fp - fm) / fm, h ? sprintf("%.0f", hm) : "-", h ? sprintf("%.0f", hp) : "-",
        h ? sprintf("%+.0f%%", 100 * (hp - hm) / hm) : "-", h ? sprintf("%.2f", fm / hm) : "-",
        h ? sprintf("%.2f", fp / hp) : "-", fb, fpb, hb, hpb, fit }' >>"$out/table.md"
    # 3. the replica all-reduce at the end against overlapped (bench_hsdp's own 2 x 2 mesh)
    if [ "$lay" = 2x2 ]; then
      [ -n "$from" ] || hosts "$rate" -- env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$top/$build/bench/bench_hsdp" \
        >"$out/hsdp-$rate.txt" 2>&1 || echo "$bench: bench_hsdp at $rate failed (exit $?)" >&2
      awk -v rate="$rate" '$1 == "end" {e = $3} $1 == "overlap" {o = $3}
        /^overlap\/end/ {gsub(/,/, ""); f = $8; s = $11}
        END {printf "| %s | %.1f | %.1f | %.3f | %.3f | %.3f |\n", rate, e, o, o / e, f, s}' "$out/hsdp-$rate.txt" >>"$out/overlap.md"
    fi
    echo "$lay $rate done (load $(bench_load)): $(tail -1 "$out/table.md")"
  done
done
echo
echo "the inter links fitted per layout and rate, and the shared links inside a host:"
for f in "$out"/fit-*.md; do
  echo "$(basename "$f" .md):"
  cat "$f"
done
echo
echo "FSDP and HSDP across hosts ($cfg, batch 8 x 128, median of steps 2..$steps), measured and predicted:"
cat "$out/table.md"
if [ "$(wc -l <"$out/overlap.md")" -gt 2 ]; then
  echo
  echo "bench_hsdp across 2 hosts x 2 ranks: the replica all-reduce at the end against overlapped with the backward:"
  cat "$out/overlap.md"
fi
echo "load at the end: $(bench_load)"
