#!/usr/bin/env bash
# The MoE planner comparison of issue 15 (the paper's Figure 11 setting), run by
# `make bench` (scripts/run-bench) as
#   bench/moe_plan.sh BUILD_DIR
# `rfsdp plan` on GPT-OSS-120B, DeepSeek-V3, Qwen3-235B-A22B and Mixtral-8x7B
# (configs/; a missing config is skipped with a note) at W = 64, 256, 1024,
# 8-bit AdamW's blocks (32-row strips whole: --optim adamw8bit), bf16
# parameters: rfsdp's padding and cut blocks (equal shards with up to 4
# buffers per unit, and ragged shards) against the layouts of FSDP2, FSDP1,
# DeepSpeed ZeRO-3 and Megatron-FSDP computed on the same tensors; the table,
# and docs/moe-planner.png (padding and cut blocks per model and W).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.bash
. bench/lib.bash
bench_init moe_plan.sh "${1:-}"
out=runs/bench-moe-plan-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); outputs in $out"
worlds=64,256,1024
opts=(--optim adamw8bit --param-dtype bf16 --world "$worlds" --json)
# num KEY: the number after "KEY": in the text on stdin (the first one)
num() { grep -o "\"$1\":[-0-9.eE+]*" | head -1 | sed 's/.*://'; }
echo "| model | W | rfsdp equal padding | rfsdp ragged padding | ragged largest shard / mean | FSDP2 | FSDP1 | ZeRO-3 | Megatron-FSDP | cut blocks: rfsdp | FSDP2 | FSDP1 | ZeRO-3 | Megatron-FSDP |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
: >"$out/moe.dat"
for model in gpt-oss-120b deepseek-v3 qwen3-235b-a22b mixtral-8x7b; do
  cfg=configs/$model.json
  if [ ! -f "$cfg" ]; then
    echo "| $model | - | (no $cfg) ||||||||||||"
    continue
  fi
  if ! "$rfsdp" plan --model "$cfg" "${opts[@]}" >"$out/$model-equal.jsonl" 2>"$out/$model.err" ||
    ! "$rfsdp" plan --model "$cfg" --shard ragged "${opts[@]}" >"$out/$model-ragged.jsonl" 2>>"$out/$model.err"; then
    echo "| $model | - | (plan failed: $(head -c 200 "$out/$model.err")) ||||||||||||"
    continue
  fi
  while IFS= read -r eq && IFS= read -r rg <&3; do
    w=$(num world <<<"$eq")
    row="$model $w $(num padding_ratio <<<"$eq") $(num padding_ratio <<<"$rg")"
    cut="$(num split_blocks <<<"$eq")"
    for peer in fsdp2 fsdp1 deepspeed megatron; do
      p=$(grep -o "\"$peer\":{[^}]*}" <<<"$eq")
      row="$row $(num padding_ratio <<<"$p")"
      cut="$cut $(num split_blocks <<<"$p")"
    done
    ratio=$(awk -v m="$(num max_shard_elems <<<"$rg")" -v e="$(num elems <<<"$rg")" -v w="$w" 'BEGIN {printf "%.4f", m * w / e}')
    echo "$row $cut $ratio" >>"$out/moe.dat"
  done <"$out/$model-equal.jsonl" 3<"$out/$model-ragged.jsonl"
done
awk '{printf "| %s | %d | %.3f%% | %.3f%% | %.2f |", $1, $2, 100 * $3, 100 * $4, $14
  for (i = 5; i <= 8; i++) printf " %.3f%% |", 100 * $i
  for (i = 9; i <= 13; i++) printf " %d |", $i
  printf "\n"}' "$out/moe.dat"
echo "(padding: elements stored over all ranks beyond the parameters, % of the parameters; cut blocks: 32-row"
echo " strips / 256-element vector runs (a whole expert where the description keeps experts whole) with a rank"
echo " boundary strictly inside; rfsdp's are 0 by construction; ragged: the fullest rank's shard over the mean)"
if command -v gnuplot >/dev/null && [ -s "$out/moe.dat" ]; then
  awk 'BEGIN {n["gpt-oss-120b"] = "GPT-OSS"; n["deepseek-v3"] = "DS-V3"; n["qwen3-235b-a22b"] = "Qwen3"; n["mixtral-8x7b"] = "Mixtral"}
    {print n[$1] ":" $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13}' "$out/moe.dat" >"$out/moe-chart.dat"
  gnuplot <<EOF 2>&1 | head -5
set terminal pngcairo size 1200,460 font 'sans,9'
set output 'docs/moe-planner.png'
set multiplot layout 1,2 title 'rfsdp plan: MoE models, 32-row blocks (8-bit AdamW; Qwen3 and Mixtral keep each expert whole), bf16, equal shards unless ragged'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set logscale y
set grid ytics
set xtics rotate by -30 font 'sans,8'
set key top left font 'sans,8'
f(x) = x > 1e-3 ? x : 1e-3
set title 'padding (% of parameters; 0 drawn at 0.001)'
set yrange [1e-3:50000]
plot '$out/moe-chart.dat' u (f(100*\$2)):xtic(1) t 'rfsdp equal', '' u (f(100*\$3)) t 'rfsdp ragged', \
     '' u (f(100*\$4)) t 'FSDP2', '' u (f(100*\$5)) t 'FSDP1', '' u (f(100*\$6)) t 'ZeRO-3', '' u (f(100*\$7)) t 'Megatron-FSDP'
set title 'blocks cut across ranks (0 drawn at 0.5)'
set yrange [0.5:*]
g(x) = x > 0.5 ? x : 0.5
plot '$out/moe-chart.dat' u (g(\$8)):xtic(1) t 'rfsdp', '' u (g(\$9)) t 'FSDP2', '' u (g(\$10)) t 'FSDP1', \
     '' u (g(\$11)) t 'ZeRO-3', '' u (g(\$12)) t 'Megatron-FSDP'
unset multiplot
EOF
  echo "chart: docs/moe-planner.png (data $out/moe.dat)"
else
  echo "chart: gnuplot not available (scripts/setup installs it)"
fi
