#!/usr/bin/env bash
# The step simulator of `rfsdp plan --batch` (issue 18), run by `make bench`
# (scripts/run-bench) as
#   bench/scale.sh BUILD_DIR
#  1. fit (about 1 minute on a quiet machine): bench_comm's part 3 (RF_BENCH_PART=step)
#     at W = 2 and 4, and at W = 4 on two groups of 2 ranks at once (RF_BENCH_GROUP=2,
#     consecutive and strided: HSDP 2x2's shard and replica groups): each collective
#     as a step meets it, started before a chunk
#     of 4 ms of gemms, polled between them and waited on (all-gather,
#     reduce-scatter) or after the chunk (all-reduce), 16 KiB .. 16 MiB f32; its
#     cost = the chunk with it - the chunk alone. Fitted per kind to
#     t = alpha ceil(log2 g) + f (g-1)/g B / busbw over groups of g ranks (f = 2 for the
#     all-reduce) by least squares on the relative error (costs under 0.05 ms counted
#     as 0.05 ms: the chunk's own noise); the median and largest error. W = 2 on 2
#     cores gives the `intra` links; at W = 4 (4 ranks time-sharing 2 cores) the
#     groups of 2 (they fit the cores) the `shared_small` links and the world the
#     `shared` links of the profile $out/here.json (configs/network/here.json with
#     the fitted links, cores = nproc, every rank on this node); the named profile
#     `here` (configs/network/here.json) holds the numbers of one such run.
#  2. validation (about 1 minute): the compute rate of one rank alone at each run's micro-batch
#     (bench_model configs/demo.json B/W 128: its CPU-time GFLOP/s, forward and
#     backward, f32), then rfsdp train on configs/demo.json (byte-level KJV) at W = 1,
#     2, 4 and 2x2 (--replicate 2), one thread per rank; the median step time of
#     steps 2..N against `rfsdp plan --batch ... --network $out/here.json
#     --peak-gflops RATE` (from the fit: without it, the named `here`, configs/network/here.json). The runtime's own
#     allocation (the log's memory line) and rank 0's RSS next to the predicted
#     memory per rank.
#  The fit's and the validation's tables replace those between the markers
#  <!-- scale:fit --> and <!-- scale:validation --> of docs/scale.md
#  (RF_BENCH_DOCS=0: printed only).
#  3. chart: docs/scale.png, LLaMA-3-70B and GPT-OSS-120B from 64 to 10,000
#     ranks on the h100-ib profile: weak and strong scaling efficiency, FSDP
#     against HSDP (8-rank groups, one node), and the planned layout against the
#     fsdp2 and flat layouts (their padding and copies).
# RF_BENCH_HERE=1 also copies the fitted profile to configs/network/here.json (its
# intra, shared_small and shared links and the date and load of its source); never C source.
# RF_BENCH_PART=fit|validate|chart runs one part (validate alone uses the named
# `here`, or RF_BENCH_NETWORK=FILE.json). Outputs in runs/bench-scale-DATE/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init scale.sh "${1:-}"
part=${RF_BENCH_PART:-all}
out=runs/bench-scale-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cores=$(nproc)
network=${RF_BENCH_NETWORK:-here}
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   load:$(uptime | sed 's/.*load average//'); outputs in $out"

# replaces the lines between <!-- scale:NAME --> and <!-- /scale:NAME --> of docs/scale.md with FILE
doc_put() { # NAME FILE
  [ "${RF_BENCH_DOCS:-1}" = 1 ] || return 0
  grep -q "<!-- scale:$1 -->" docs/scale.md || { echo "scale.sh: no <!-- scale:$1 --> in docs/scale.md"; return 0; }
  awk -v name="$1" -v file="$2" '
    $0 == "<!-- scale:" name " -->" { print; while ((getline l < file) > 0) print l; skip = 1; next }
    $0 == "<!-- /scale:" name " -->" { skip = 0 }
    !skip' docs/scale.md >"$out/scale.md.new" && mv "$out/scale.md.new" docs/scale.md
  echo "(docs/scale.md: the $1 table replaced)"
}

# ---- 1. the fit of the collectives inside a step ---------------------------------------------
if [ "$part" = all ] || [ "$part" = fit ]; then
  # runs: "W group strided name": the world at W = 2 and 4, and at W = 4 two groups of 2 at once, consecutive
  # (HSDP 2x2's shard groups) and strided (its replica groups)
  runs=("2 2 0 w2" "4 4 0 w4" "4 2 0 w4-g2" "4 2 1 w4-g2s")
  for r in "${runs[@]}"; do
    read -r w g st name <<<"$r"
    RF_BENCH_GROUP=$g RF_BENCH_STRIDED=$st RF_BENCH_MIN_KIB=16 RF_BENCH_MAX_MIB=16 RF_BENCH_PART=step \
      RF_BENCH_CHUNK_MS=4 OMP_NUM_THREADS=1 scripts/rfmpirun -np "$w" "$build/bench/bench_comm" >"$out/comm-step-$name.txt" 2>&1 ||
      echo "scale.sh: bench_comm at W=$w, groups of $g failed (see $out/comm-step-$name.txt)"
  done
  {
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), load average at the start of each run $(for r in "${runs[@]}"; do
      read -r w g st name <<<"$r"
      printf '%s (%s) ' "$(grep -m1 -o 'load average [0-9.]*' "$out/comm-step-$name.txt" | sed 's/.* //')" "$name"
    done | sed 's/ $//'),"
    echo "$cores cores, chunk: $(grep -m1 -o 'a chunk of [^;]*' "$out/comm-step-w2.txt" | sed 's/a chunk of //'):"
    echo
    echo "| collective | link | W | group | points | alpha us | busbw GB/s | median error | largest error |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } >"$out/fit.md"
  rm -f "$out/links.txt"
  # each point: W, group size, the link of that group here (intra: a core per rank; shared_small: more ranks
  # than cores, the group fits the cores; shared: the group does not), then bench_comm's line
  for r in "${runs[@]}"; do
    read -r w g st name <<<"$r"
    if [ "$w" -le "$cores" ]; then link=intra; elif [ "$g" -le "$cores" ]; then link=shared_small; else link=shared; fi
    awk -v w="$w" -v g="$g" -v link="$link" '$2 ~ /^(KiB|MiB)$/ && $3 ~ /^step_/ {print w, g, link, $0}' "$out/comm-step-$name.txt"
  done |
    fit_links "$out/links.txt" >>"$out/fit.md"
  # the profile: configs/network/here.json with the fitted links (cores = this machine's, every rank on it)
  # and the fit's date and load in its source; one field per line there, so each fitted field is one line
  fitload=$(grep -h -m1 -o 'load average [0-9.]*' "$out"/comm-step-*.txt | sed 's/.* //' | sort -g | tail -1)
  awk -v cores="$cores" -v links="$out/links.txt" -v fit="fit of $(date -u '+%Y-%m-%d %H:%M UTC'), load $fitload" '
    BEGIN { while ((getline l < links) > 0) { split(l, f, " "); if (!(f[1] in v)) v[f[1]] = ""
              v[f[1]] = v[f[1]] (v[f[1]] == "" ? "" : ", ") "\"" f[2] "\": [" f[3] ", " f[4] "]" } }
    match($0, /^  "(intra|shared_small|shared)": /) { k = substr($0, 4); sub(/".*/, "", k)
      if (k in v) { print "  \"" k "\": {" v[k] "}" (/,$/ ? "," : ""); next } }
    /^  "cores_per_node": / { print "  \"cores_per_node\": " cores ","; next }
    /^  "source": / { sub(/fit of [^,]* UTC, load [0-9.]*/, fit) }
    { print }' configs/network/here.json >"$out/here.json"
  network=$out/here.json
  echo "the collectives inside a step, fitted (profile $network):"
  cat "$out/fit.md"
  doc_put fit "$out/fit.md"
  # RF_BENCH_HERE=1: the fit becomes the named profile here (configs/network/here.json; no rebuild)
  if [ "${RF_BENCH_HERE:-0}" = 1 ] && [ "$(grep -c '^  "\(intra\|shared_small\|shared\)": ' "$out/here.json")" = 3 ] &&
    "$rfsdp" plan --model configs/demo.json --world 2 --batch 2 --network "$out/here.json" >/dev/null; then
    cp "$out/here.json" configs/network/here.json
    echo "(configs/network/here.json holds this fit)"
  fi
  echo
fi

# ---- 2. predicted against measured --------------------------------------------------------
if [ "$part" = all ] || [ "$part" = validate ]; then
  bench_data
  read -r B T S <<<"${RF_BENCH_SCALE:-8 128 10}"
  cfg=configs/demo.json
  opts=(--batch "$B" --seq "$T")
  # the compute rate of one rank alone at each micro-batch (B / W sequences): bench_model's CPU time
  for b in $B $((B / 2)) $((B / 4)); do
    OMP_NUM_THREADS=1 "$build/bench/bench_model" $cfg "$b" "$T" 5 >"$out/model-b$b.txt" 2>&1
    grep -m1 'weights f32  compute f32' "$out/model-b$b.txt" | sed 's/.*CPU time: *[0-9.]* ms\/step *\([0-9.]*\) GFLOP.*/\1/' >"$out/rate-b$b.txt"
  done
  rate() { cat "$out/rate-b$((B / $1)).txt"; }
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
  run r2x2 4 --replicate 2
  {
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'): $cfg, batch $B x $T, $S steps (median of steps 2..$S), one thread per rank,"
    echo "$cores cores, network $network; compute rate of one rank alone (bench_model, CPU time): $(rate 1) GFLOP/s at"
    echo "$B sequences, $(rate 2) at $((B / 2)), $(rate 4) at $((B / 4)):"
    echo
    echo "| run | load | measured ms | CPU ms | predicted ms | error | compute | time share | exposed comm | optimizer | predicted MiB/rank | runtime's MiB (rank 0) | rank 0 RSS MiB |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >"$out/validation.md"
  row() { # NAME W R
    local name=$1 w=$2 r=$3 p m
    [ -s "$out/$name.jsonl" ] || return 0
    p=$out/plan-$name.json
    OMP_NUM_THREADS=1 "$rfsdp" plan --model $cfg --world "$w" --replicate "$r" "${opts[@]}" --network "$network" \
      --peak-gflops "$(rate "$w")" --efficiency 1 --rank 0 --json >"$p"
    m=$(json_num "$out/$name.jsonl" ms | tail -n +2 | median)
    cpu=$(json_num "$out/$name.jsonl" cpu_ms | tail -n +2 | median)
    own=$(head -1 "$out/$name.jsonl" >"$out/$name.memory"
      awk -v s="$(json_num "$out/$name.memory" shard_elems)" -v a="$(json_num "$out/$name.memory" arena_bytes)" \
        -v o="$(json_num "$out/$name.memory" optim_state_bytes)" -v x="$(json_num "$out/$name.memory" activation_bytes)" \
        'BEGIN {printf "%.1f", (8 * s + a + o + x) / 1048576}')
    rss=$(json_num "$out/$name.jsonl" rss_mb | sort -g | tail -1)
    awk -v n="$([ "$r" = 1 ] && echo "W=$w" || echo "${r}x$((w / r))")" -v m="$m" -v p="$(json_num "$p" predicted_step_ms)" \
      -v c="$(json_num "$p" compute_ms)" -v ts="$(json_num "$p" time_share)" -v e="$(json_num "$p" exposed_comm_ms)" -v o="$(json_num "$p" optim_ms)" \
      -v mem="$(json_num "$p" memory_per_rank_bytes)" -v own="$own" -v rss="$rss" -v cpu="$cpu" -v load="$(cat "$out/$name.load")" 'BEGIN {
      printf "| %s | %s | %.1f | %.1f | %.1f | %+.0f%% | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.0f |\n", n, load, m, cpu, p, 100 * (p - m) / m, c, ts, e, o, mem / 1048576, own, rss }'
  }
  {
    row w1 1 1
    row w2 2 1
    row w4 4 1
    row r2x2 4 2
  } >>"$out/validation.md"
  cat "$out/validation.md"
  doc_put validation "$out/validation.md"
  echo "(load: the 1-minute load average when the run started; CPU ms: rank 0's CPU time per thread, median;"
  echo " compute: FLOPs / the rate x the time share; predicted MiB: the simulator's parts, activations = the model"
  echo " workspace; the runtime's MiB: the same parts as the run allocated them; RSS adds the binary, MPI, oneDNN)"
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
