/* rf-test: timeout=240
 * `rfsdp plan --batch` simulates the optimizer as `rfsdp train` runs it: for the
 * tiny LLaMA trained 2 steps at W = 2 and 3 and on a 2x2 mesh (mpirun) with Muon and Shampoo (each
 * matrix whole on its owner rank: the all-to-all of the pieces out and back, the
 * owner's preconditioners), the simulator's numbers for rank 0 equal what the run
 * allocated and counted: the optimizer's state (the log's memory line:
 * rf_optim_stats.state_bytes, Shampoo's owned factors and roots included) and
 * workspace (workspace_bytes: the owners' staging, Newton-Schulz and
 * eigendecomposition scratch), the all-to-all bytes of step 2 (src/comm's
 * bytes_alltoall: the pieces each rank sends to the others, both trips) and the
 * bytes inside the group (intra_bytes, which holds them); 8-bit AdamW's workspace
 * too; and FP8 block (--fp8 block at W = 2 and 3, a tiny Mixtral's fused experts
 * too): the linears gathered as e4m3
 * codes with their tile scales, planned apart (rf_plan_split_make), the FP8
 * staging of the model workspace; under --layout fsdp2 (W = 2) and flat (W = 3,
 * bf16) the codes and scales every rank quantizes after the gather. The other parts (slab, arena,
 * activations, gathers, reductions) as tests/test_plan_sim.c checks them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_plan_sim_optim.XXXXXX";
static char out[1 << 16];

/* Trains 2 steps with `opts` at `world` and compares plan's rank 0 with the log;
 * `owners`: the optimizer moves matrices to owners (alltoall bytes > 0 at W > 1). */
static void check_one(const char *model, const char *data, int world, const char *opts, int owners) {
  char log[256];
  snprintf(log, sizeof log, "%s/run-%d.jsonl", dir, world);
  remove(log);
  const char *common = "--batch 12 --seq 8";
  int rc =
      rf_cli_run_mpi(out, sizeof out, world, 120,
                     "train --model %s --data %s %s %s --steps 2 --peak-gflops 50 --print-every 0 --log %s",
                     model, data, common, opts, log);
  RF_CHECK(rc == 0, "train %s W=%d: rc %d '%.400s'", opts, world, rc, out);
  if (rc != 0) return;
  cJSON *first = rf_cli_json_line(log, 0), *step2 = rf_cli_json_line(log, 2);
  const cJSON *mem = cJSON_GetObjectItemCaseSensitive(first, "memory");
  RF_CHECK(cJSON_IsObject(mem) && step2, "train %s W=%d: no memory line or step 2 in %s", opts, world, log);
  rc = rf_cli_run_mpi(out, sizeof out, 0, 60, "plan --model %s --world %d %s %s --rank 0 --json", model,
                      world, common, opts);
  cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
  const cJSON *parts = cJSON_GetObjectItemCaseSensitive(p, "memory_parts");
  RF_CHECK(cJSON_IsObject(parts), "plan %s W=%d: rc %d '%.400s'", opts, world, rc, out);
  if (cJSON_IsObject(mem) && step2 && cJSON_IsObject(parts)) {
    double slab = rf_cli_json_num(mem, "shard_elems");
    struct {
      const char *what;
      double run, sim;
    } pairs[] = {
        {"shard elements", slab, rf_cli_json_num(p, "shard_elems")},
        {"arena bytes", rf_cli_json_num(mem, "arena_bytes"), rf_cli_json_num(parts, "gathered")},
        {"optimizer state bytes", rf_cli_json_num(mem, "optim_state_bytes"), rf_cli_json_num(parts, "optim")},
        {"optimizer workspace bytes", rf_cli_json_num(mem, "optim_workspace_bytes"),
         rf_cli_json_num(parts, "optim_workspace")},
        {"activation bytes", rf_cli_json_num(mem, "activation_bytes"), rf_cli_json_num(parts, "activations")},
        {"all-gather bytes per step", rf_cli_json_num(step2, "gather_bytes"),
         rf_cli_json_num(p, "gather_bytes_per_step")},
        {"reduction bytes per step", rf_cli_json_num(step2, "reduce_bytes"),
         rf_cli_json_num(p, "reduce_bytes_per_step")},
        {"all-to-all bytes per step", rf_cli_json_num(step2, "alltoall_bytes"),
         rf_cli_json_num(p, "alltoall_bytes_per_step")},
        {"bytes per step inside groups", rf_cli_json_num(step2, "intra_bytes"),
         rf_cli_json_num(p, "bytes_per_step_intra")},
        {"bytes per step across groups", rf_cli_json_num(step2, "inter_bytes"),
         rf_cli_json_num(p, "bytes_per_step_inter")},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
      RF_CHECK(pairs[k].run == pairs[k].sim && pairs[k].run >= 0,
               "%s W=%d: %s: the run has %.17g, rfsdp plan simulates %.17g", opts, world, pairs[k].what,
               pairs[k].run, pairs[k].sim);
    RF_CHECK((rf_cli_json_num(step2, "alltoall_bytes") > 0) == (owners && world > 1),
             "%s W=%d: %g all-to-all bytes", opts, world, rf_cli_json_num(step2, "alltoall_bytes"));
    RF_CHECK(rf_cli_json_num(mem, "optim_workspace_bytes") > 0, "%s W=%d: no optimizer workspace", opts,
             world);
    double sum = rf_cli_json_num(parts, "params") + rf_cli_json_num(parts, "grads") +
                 rf_cli_json_num(parts, "optim") + rf_cli_json_num(parts, "optim_workspace") +
                 rf_cli_json_num(parts, "gathered") + rf_cli_json_num(parts, "activations");
    RF_CHECK(rf_cli_json_num(p, "memory_per_rank_bytes") == sum,
             "%s W=%d: memory %.17g is not the sum of its parts %.17g", opts, world,
             rf_cli_json_num(p, "memory_per_rank_bytes"), sum);
  }
  cJSON_Delete(p);
  cJSON_Delete(first);
  cJSON_Delete(step2);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], data[200], model[256], moe[256];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  rf_cli_write_verses(text, 1 << 15);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);
  snprintf(moe, sizeof moe, "%s/moe.json", dir);
  const char *moe_text =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"intermediate_size\": 24, \"num_hidden_layers\": "
      "2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"num_local_experts\": 4, "
      "\"num_experts_per_tok\": 2, \"output_router_logits\": true, \"router_aux_loss_coef\": 0.02}";
  RF_ASSERT(rf_file_write_all(moe, moe_text, strlen(moe_text)) == 0);

  for (int world = 2; world <= 3; world++) {
    check_one(model, data, world, "--optim muon", 1);
    check_one(model, data, world, "--optim shampoo", 1);
  }
  check_one(model, data, 3, "--shard ragged --optim muon", 1);
  check_one(model, data, 4, "--replicate 2 --optim shampoo", 1); /* owners inside each shard group of 2 */
  check_one(model, data, 2, "--optim adamw8bit", 0);
  /* FP8 block: the linears gathered as e4m3 codes and tile scales, their buffers apart */
  check_one(model, data, 2, "--fp8 block --optim adamw8bit", 0);
  check_one(model, data, 3, "--fp8 block --param-dtype bf16 --compute-dtype bf16 --optim muon", 1);
  /* fused experts [4, 48, 32] and [4, 32, 24] in FP8 (each expert its own tile grid) with Shampoo */
  check_one(moe, data, 3, "--fp8 block --optim shampoo", 1);
  /* fsdp2 and flat under FP8 block: gathered in the param dtype, each FP8 tensor's codes and tile
   * scales quantized after the gather in the param slot (with bf16 parameters an f32 band scratch) */
  check_one(model, data, 2, "--fp8 block --layout fsdp2 --optim adamw8bit", 0);
  check_one(moe, data, 3, "--fp8 block --layout flat --param-dtype bf16 --optim adamw8bit", 0);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_sim_optim");
}
