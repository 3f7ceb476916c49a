#!/usr/bin/env bash
# Training throughput and memory of `rfsdp train` against PyTorch (issue 5,
# "Numbers to reach"), run by `make bench` (scripts/run-bench) as
#   bench/train.sh BUILD_DIR
#
# Models: configs/demo.json (~3M) and configs/llama-100m.json (~101M), AdamW
# (betas 0.9/0.95, weight decay 0.1, clip 1.0), f32, byte-level KJV tokens.
#  1. rfsdp at W=1 (2 threads) and W=2 (1 thread per rank): median step time
#     of the timed steps (first step excluded), tokens/s, MFU against the oneDNN
#     f32 GEMM peak measured in this run (a private cache dir: the trainer
#     measures it once per dtype and thread count), peak RSS of every rank (VmHWM).
#  2. PyTorch (bench/torch_train.py, HF LlamaForCausalLM from the same config):
#     one process with 2 threads against rfsdp W=1; FSDP2 (fully_shard, CPU mesh,
#     gloo) and FSDP1 with 2 processes of 1 thread against rfsdp W=2. The
#     rfsdp-over-PyTorch ratios of step time and peak RSS.
#  3. rfsdp peak RSS per rank at W=1, 2, 4 next to a prediction (formula printed);
#     HSDP 2x2 (--replicate 2) against FSDP at W=4 on the 100M model: bytes inside
#     and across the groups per step, step time, peak RSS (docs/hsdp.md).
#  4. Compute dtype (issue 14), the 100M model at W=2, runs interleaved A/B:
#     rfsdp --compute-dtype bf16 --param-dtype bf16 against FSDP2 with
#     MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), rfsdp f32
#     against FSDP2 f32, rfsdp bf16 at W=1 (2 threads); MFU against the oneDNN bf16
#     GEMM peak, W=2 over W=1 tokens/s. RF_BENCH_PART=compute runs only this part
#     (RF_BENCH_COMPUTE="B T STEPS", default 4 128 6).
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
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init train.sh "${1:-}"

if [ "${RF_BENCH_LONG:-0}" = 1 ]; then
  demo_size="16 256 10" big_size="8 256 6"
else
  demo_size="8 128 6" big_size="4 128 4"
fi
read -r demo_b demo_t demo_s <<<"${RF_BENCH_DEMO:-$demo_size}"
read -r big_b big_t big_s <<<"${RF_BENCH_100M:-$big_size}"
demo_cfg=configs/demo.json big_cfg=configs/llama-100m.json

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} # as the rfsdp command sets it for itself
blas_note="GEMM: oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null), OMP_WAIT_POLICY=$OMP_WAIT_POLICY"

out=runs/bench-train-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out/cache"
# Fresh GEMM peaks, measured in this run (not one cached under another load).
export XDG_CACHE_HOME=$top/$out/cache

bench_data

echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
echo "$blas_note"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); outputs in $out"

# ---- the GEMM peaks of this run, and the runtime floors ---------------------------------

tiny=$out/tiny.json
cat >"$tiny" <<'EOF'
{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
EOF
# The peaks are measured by the first run of each dtype and thread count; the
# floors are the peak RSS of a 32-wide one-layer model (binary, MPI, oneDNN, token files).
part=${RF_BENCH_PART:-all}
if [ "$part" = all ]; then
  rf_run floor-w1 "$tiny" 1 2 4 16 2 || exit 1
  rf_run floor-w2 "$tiny" 2 1 4 16 2 || exit 1
  rf_run floor-w4 "$tiny" 4 1 4 16 2 || exit 1
fi
rf_run floor-w1t1 "$tiny" 1 1 4 16 2 || exit 1
rf_run floor-bf16-w1 "$tiny" 1 2 4 16 2 --compute-dtype bf16 || exit 1
rf_run floor-bf16-w1t1 "$tiny" 1 1 4 16 2 --compute-dtype bf16 || exit 1
peak_of() { cat "$out"/cache/rfsdp/onednn-"$1"-peak-*-"$2" 2>/dev/null || echo "(not run)"; }
echo "oneDNN GEMM peaks measured now (2048^3, CPU time): f32 $(peak_of f32 2) GFLOP/s with 2 threads," \
  "$(peak_of f32 1) with 1; bf16 $(peak_of bf16 2) with 2 threads, $(peak_of bf16 1) with 1" \
  "(MFU at W=1: against the 2-thread peak; at W=2: against 2 x the 1-thread peak)"

# ---- PyTorch ------------------------------------------------------------------------------

torch_setup
[ -n "$torch_note" ] && echo "$torch_note"

# the runs of torch_run when none are given: both models in one set of processes
torch_default_runs=(--run "$demo_cfg:$demo_b:$demo_t:$demo_s" --run "$big_cfg:$big_b:$big_t:$big_s")

# ---- compute dtype (issue 14): the 100M model, A/B interleaved ------------------------------

compute_part() {
  local b t s bf16="--compute-dtype bf16 --param-dtype bf16"
  read -r b t s <<<"${RF_BENCH_COMPUTE:-4 128 6}"
  load() { bench_load; }
  echo
  echo "compute dtype: $big_cfg, global batch $b x $t, $s steps (first excluded), AdamW; load (1/5/15 min) before: $(load)"
  # shellcheck disable=SC2086
  rf_run c-bf16-w2 $big_cfg 2 1 "$b" "$t" "$s" $bf16
  echo "  after rfsdp bf16 W=2: $(load)"
  torch_run fsdp2 1 c-fsdp2-bf16 --param-dtype bf16 --run "$big_cfg:$b:$t:$s"
  echo "  after FSDP2 bf16: $(load)"
  rf_run c-f32-w2 $big_cfg 2 1 "$b" "$t" "$s"
  echo "  after rfsdp f32 W=2: $(load)"
  torch_run fsdp2 1 c-fsdp2-f32 --run "$big_cfg:$b:$t:$s"
  echo "  after FSDP2 f32: $(load)"
  # shellcheck disable=SC2086
  rf_run c-bf16-w1 $big_cfg 1 2 "$b" "$t" "$s" $bf16
  echo "  after rfsdp bf16 W=1: $(load)"
  local rb rf r1 tb tf cb cf c1
  rb=$(rf_stats c-bf16-w2) rf=$(rf_stats c-f32-w2) r1=$(rf_stats c-bf16-w1)
  cb=$(json_num "$out/c-bf16-w2.jsonl" cpu_ms | tail -n +2 | median)
  cf=$(json_num "$out/c-f32-w2.jsonl" cpu_ms | tail -n +2 | median)
  c1=$(json_num "$out/c-bf16-w1.jsonl" cpu_ms | tail -n +2 | median)
  tb=$(torch_stats c-fsdp2-bf16 "$big_cfg") tf=$(torch_stats c-fsdp2-f32 "$big_cfg")
  awk -v tok=$((b * t)) -v rb="$rb" -v rf="$rf" -v r1="$r1" -v tb="$tb" -v tf="$tf" -v cb="$cb" -v cf="$cf" \
    -v c1="$c1" '
  function row(name, wt, ms, cpu, mfu, hw, per, rms, rcpu, rhw) {
    printf "| %-31s | %-5s | %8.1f | %8.1f | %6.1f | %-10s | %-11s |", name, wt, ms, cpu, tok / (ms / 1000), mfu, per
    if (rms > 0) printf " %5.2f | %5.2f | %5.2f |\n", rms / ms, rcpu / cpu, rhw / hw; else printf " %5s | %5s | %5s |\n", "", "", ""
  }
  BEGIN {
    split(rb, a); split(rf, f); split(r1, o)
    print "| run                             | W x t | step ms  | CPU ms   | tok/s  | MFU (wall) | RSS/rank MiB | time ratio | CPU ratio | mem ratio |"
    print "|---------------------------------|-------|----------|----------|--------|------------|-------------|-------|-------|-------|"
    row("rfsdp bf16 compute+params", "2 x 1", a[1], cb, sprintf("%.1f%% bf16", 100 * a[2]), a[3], a[4], 0, 0, 0)
    if (tb != "") { split(tb, s); row("FSDP2 MixedPrecisionPolicy bf16", "2 x 1", s[1], s[6], "", s[2], s[3], a[1], cb, a[3]) }
    row("rfsdp f32", "2 x 1", f[1], cf, sprintf("%.1f%% f32", 100 * f[2]), f[3], f[4], 0, 0, 0)
    if (tf != "") { split(tf, s); row("FSDP2 f32", "2 x 1", s[1], s[6], "", s[2], s[3], f[1], cf, f[3]) }
    row("rfsdp bf16 compute+params", "1 x 2", o[1], c1, sprintf("%.1f%% bf16", 100 * o[2]), o[3], o[4], 0, 0, 0)
    printf "rfsdp bf16: W=2 over W=1 tokens/s %.3f wall, %.3f CPU time (target >= 0.95); bf16 over f32 step time at W=2 %.3f wall, %.3f CPU\n", o[1] / a[1], c1 / cb, a[1] / f[1], cb / cf
    printf "MFU by CPU time (the step as on an idle machine): bf16 W=2 %.1f%%, W=1 %.1f%%, f32 W=2 %.1f%%\n", 100 * a[2] * a[1] / cb, 100 * o[2] * o[1] / c1, 100 * f[2] * f[1] / cf
  }'
  echo "ratios are rfsdp / PyTorch (wall-clock step, per-thread CPU time of rank 0, peak RSS of the fullest rank);"
  echo "targets: time <= 0.6 and mem <= 0.6 (bf16), time <= 0.5 (f32); MFU >= 60% of the bf16 peak"
}
if [ "$part" = compute ]; then
  compute_part
  echo "finished: $(date -u '+%H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//')"
  exit 0
fi

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
rf_run big-w4-hsdp $big_cfg 4 1 "$big_b" "$big_t" 2 --replicate 2
compute_part
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
echo "  floor = peak RSS of a 32-wide one-layer model at the same W and threads (binary, MPI, oneDNN)"
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

# ---- HSDP 2x2 against FSDP at W=4, the 100M model (issue 18) --------------------------------

echo
echo "HSDP (--replicate 2: 2 groups of 2 ranks) against 1-D FSDP at W=4, 100M model, AdamW f32,"
echo "batch $big_b x $big_t; per rank per step from the log (rank 0, last step); 2 cores, oversubscribed, 1 timed step"
echo "| run | mesh R x S | step ms (median, steps 2..) | intra-group MB/step | across-group MB/step | gathered MB | reduced MB | peak RSS/rank MiB |"
echo "|-----|------------|-----------------------------|---------------------|----------------------|-------------|------------|-------------------|"
hsdp_row() { # LABEL TAG MESH
  local st last
  st=$(rf_stats "$2")
  last=$(grep '"loss"' "$out/$2.jsonl" | tail -1)
  awk -v label="$1" -v mesh="$3" -v st="$st" -v rec="$last" '
  function field(k,   i) { i = index(rec, "\"" k "\":"); return i ? substr(rec, i + length(k) + 3) + 0 : -1 }
  BEGIN {
    split(st, s)
    printf "| %s | %s | %.0f | %.1f | %.1f | %.1f | %.1f | %s (%s) |\n", label, mesh, s[1], field("intra_bytes") / 1e6,
      field("inter_bytes") / 1e6, field("gather_bytes") / 1e6, field("reduce_bytes") / 1e6, s[3], s[4]
  }'
}
hsdp_row "FSDP" big-w4 "1 x 4"
hsdp_row "HSDP" big-w4-hsdp "2 x 2"
echo "(across-group bytes: the f32 gradient shard all-reduced over the 2 replicas, + 12 B of scalars;"
echo " on one machine the 'groups' share the same memory bus: the step time here shows the cost of the"
echo " smaller groups' larger shards and the extra all-reduce, not a slow link between nodes)"
