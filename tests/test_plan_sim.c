/* rf-test: timeout=300
 * `rfsdp plan --batch` simulates what `rfsdp train` runs: for a small LLaMA
 * trained at W = 1, 2, 4 (mpirun), the simulator's memory of rank 0 (the
 * master and gradient slab, the gathered buffers' arena, the optimizer's state,
 * the activation workspace) equals what the run allocated (the log's "memory"
 * line: rf_fsdp_get_stats, rf_optim_get_stats, the model workspace), and its
 * bytes per step equal the runtime's counters of a whole step (the log's
 * gather_bytes, reduce_bytes, intra_bytes and inter_bytes of step 2, counted by src/comm): equal shards
 * with AdamW, ragged shards with 8-bit AdamW (its block scales), bf16
 * parameters and reductions (the staging buffer), two micro-batches, no
 * resharding, the fsdp2 and flat layouts, HSDP on a 2x2 mesh (--replicate 2: the
 * log's intra_bytes and inter_bytes, inside and across the shard groups), and a
 * small Mixtral (fused experts, its load-balancing statistics all-reduced) and a
 * small qwen3_moe at W = 2 (its experts laid out as the runtime lays them out);
 * without OMP_NUM_THREADS the workspace sized for the threads a rank runs.
 * The simulator's FLOPs per token are the trainer's (its start line). A
 * --network FILE.json replaces the profile's fields (time-sharing, links: on
 * a node whose ranks outnumber its cores, groups that fit the cores take
 * `shared_small`, larger ones `shared`; old files without it still load);
 * --replicate node and auto choose the mesh as rfsdp train does; a profile with
 * more ranks per node than cores, across nodes, is flagged (a warning, JSON
 * "oversubscribed"). The
 * timing is not checked here (the
 * machine is shared): `make bench` prints predicted against measured step times
 * (bench/scale.sh). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_plan_sim.XXXXXX";
static char out[1 << 16];

/* The trainer's "... and X GFLOP per token" from its start line; -1 when absent. */
static double train_gflop_per_token(const char *text) {
  const char *p = strstr(text, " GFLOP per token");
  if (!p) return -1;
  while (p > text && p[-1] != ' ') p--;
  return atof(p);
}

static void check_one(const char *model, const char *data, int world, const char *opts) {
  char log[256];
  snprintf(log, sizeof log, "%s/run-%d.jsonl", dir, world);
  remove(log);
  const char *common = "--batch 8 --seq 8";
  int rc =
      rf_cli_run_mpi(out, sizeof out, world, 120,
                     "train --model %s --data %s %s %s --steps 2 --peak-gflops 50 --print-every 0 --log %s",
                     model, data, common, opts, log);
  RF_CHECK(rc == 0, "train %s W=%d: rc %d '%.400s'", opts, world, rc, out);
  if (rc != 0) return;
  double gflop = train_gflop_per_token(out);
  RF_CHECK(gflop > 0, "train %s W=%d: no 'GFLOP per token' in '%.400s'", opts, world, out);
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
        {"master bytes", 4 * slab, rf_cli_json_num(parts, "params")},
        {"gradient bytes", 4 * slab, rf_cli_json_num(parts, "grads")},
        {"arena bytes", rf_cli_json_num(mem, "arena_bytes"), rf_cli_json_num(parts, "gathered")},
        {"optimizer state bytes", rf_cli_json_num(mem, "optim_state_bytes"), rf_cli_json_num(parts, "optim")},
        {"activation bytes", rf_cli_json_num(mem, "activation_bytes"), rf_cli_json_num(parts, "activations")},
        {"all-gather bytes per step", rf_cli_json_num(step2, "gather_bytes"),
         rf_cli_json_num(p, "gather_bytes_per_step")},
        {"reduction bytes per step", rf_cli_json_num(step2, "reduce_bytes"),
         rf_cli_json_num(p, "reduce_bytes_per_step")},
        {"bytes per step inside groups", rf_cli_json_num(step2, "intra_bytes"),
         rf_cli_json_num(p, "bytes_per_step_intra")},
        {"bytes per step across groups", rf_cli_json_num(step2, "inter_bytes"),
         rf_cli_json_num(p, "bytes_per_step_inter")},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
      RF_CHECK(pairs[k].run == pairs[k].sim && pairs[k].run >= 0,
               "%s W=%d: %s: the run has %.17g, rfsdp plan simulates %.17g", opts, world, pairs[k].what,
               pairs[k].run, pairs[k].sim);
    int hsdp = strstr(opts, "--replicate") != NULL;
    RF_CHECK((rf_cli_json_num(p, "bytes_per_step_inter") > 0) == hsdp, "%s W=%d: %g bytes across groups",
             opts, world, rf_cli_json_num(p, "bytes_per_step_inter"));
    RF_CHECK(world == 1 || rf_cli_json_num(step2, "gather_bytes") > 0, "%s W=%d: nothing gathered", opts,
             world);
    RF_CHECK(rf_cli_json_num(p, "predicted_step_ms") > 0, "%s W=%d: no predicted step time", opts, world);
    double flops = rf_cli_json_num(p, "flops_per_token") * 1e-9;
    RF_CHECK(fabs(flops - gflop) <= 5e-4 * gflop,
             "%s W=%d: %.6g GFLOP per token simulated, the trainer counts %.4g", opts, world, flops, gflop);
  }
  cJSON_Delete(p);
  cJSON_Delete(first);
  cJSON_Delete(step2);
}

/* A --network FILE.json: its fields replace the base profile's. One core for
 * two ranks time-shares it (compute x 2) and puts the collectives on the
 * file's `shared` links: 1 ms per collective (busbw so high the bytes cost
 * nothing) for the 3U + 1 collectives of a step over U units (U gathers
 * forward, U - 1 backward, U reduce-scatters, the gradient norm and the
 * trainer's scalars). A bad field is refused with the file and the field named. */
static void check_network_file(const char *model) {
  char net[128];
  snprintf(net, sizeof net, "%s/net.json", dir);
  const char *text =
      "{\"base\": \"here\", \"cores_per_node\": 1, \"peak_gflops\": 10, \"efficiency\": 0.5, "
      "\"shared\": {\"allgather\": [1000, 1e12], \"reduce_scatter\": [1000, 1e12], \"allreduce\": [1000, "
      "1e12]}}";
  RF_ASSERT(rf_file_write_all(net, text, strlen(text)) == 0);
  int rc =
      rf_cli_run(out, sizeof out,
                 "plan --model %s --world 2 --batch 8 --seq 8 --optim adamw --network %s --json", model, net);
  cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
  RF_CHECK(p != NULL, "plan --network %s: rc %d '%.400s'", net, rc, out);
  if (p) {
    double u = rf_cli_json_num(p, "buffer_count"),
           want = rf_cli_json_num(p, "flops_per_token") * 8 * 8 / 2 / (10e9 * 0.5) * 1e3 * 2;
    RF_CHECK(rf_cli_json_num(p, "time_share") == 2, "time share %g, want 2 (2 ranks on 1 core)",
             rf_cli_json_num(p, "time_share"));
    RF_CHECK(fabs(rf_cli_json_num(p, "compute_ms") - want) <= 1e-9 * want, "compute %.17g ms, want %.17g",
             rf_cli_json_num(p, "compute_ms"), want);
    RF_CHECK(fabs(rf_cli_json_num(p, "comm_ms") - (3 * u + 1)) < 1e-6,
             "communication %.9g ms over %g units, want %g", rf_cli_json_num(p, "comm_ms"), u, 3 * u + 1);
  }
  cJSON_Delete(p);
  static const struct {
    const char *text, *names; /* a bad file, and what its error must name */
  } bad[] = {
      {"{\"intra\": {\"allgather\": [-1, 10]}}", "\"intra\".\"allgather\""},
      {"{\"shared_small\": {\"allreduce\": [1, 0]}}", "\"shared_small\".\"allreduce\""},
      {"{\"shared_smal\": {}}", "\"shared_smal\""},
      {"{\"shared_small\": {\"all_gather\": [1, 1]}}", "\"shared_small\".\"all_gather\""},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    RF_ASSERT(rf_file_write_all(net, bad[k].text, strlen(bad[k].text)) == 0);
    rc = rf_cli_run(out, sizeof out, "plan --model %s --world 2 --batch 8 --network %s", model, net);
    RF_CHECK(rc != 0 && strstr(out, net) && strstr(out, bad[k].names), "%s: rc %d '%.400s'", bad[k].text, rc,
             out);
  }
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 2 --batch 8 --network %s/none.json", model, dir);
  RF_CHECK(rc != 0 && strstr(out, "none.json"), "a missing file: rc %d '%.400s'", rc, out);
}

/* Without OMP_NUM_THREADS a rank runs cores / ranks-on-the-node threads (rfsdp
 * train), and its workspace holds per-thread attention scratch: plan sizes it
 * for the threads a rank of W = 2 runs, not its own (the run's activation bytes
 * at W = 2 on this machine, compared with plan's, both without the variable). */
static void check_threads(const char *model, const char *data) {
  char log[256], cmd[2048];
  snprintf(log, sizeof log, "%s/threads.jsonl", dir);
  remove(log);
  snprintf(cmd, sizeof cmd,
           "env -u OMP_NUM_THREADS timeout -k 5 120 scripts/rfmpirun -np 2 %s train --model %s --data %s "
           "--batch 8 "
           "--seq 8 --steps 1 --print-every 0 --log %s >/dev/null 2>&1",
           rf_cli_binary(), model, data, log);
  RF_CHECK(system(cmd) == 0, "train without OMP_NUM_THREADS at W=2 failed: %s", cmd);
  cJSON *first = rf_cli_json_line(log, 0);
  const cJSON *mem = cJSON_GetObjectItemCaseSensitive(first, "memory");
  snprintf(cmd, sizeof cmd,
           "env -u OMP_NUM_THREADS %s plan --model %s --world 2 --batch 8 --seq 8 --rank 0 --json 2>&1",
           rf_cli_binary(), model);
  FILE *f = popen(cmd, "r");
  RF_ASSERT(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  int rc = pclose(f);
  cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
  const cJSON *parts = cJSON_GetObjectItemCaseSensitive(p, "memory_parts");
  RF_CHECK(cJSON_IsObject(mem) && cJSON_IsObject(parts), "no memory line or plan: rc %d '%.400s'", rc, out);
  if (cJSON_IsObject(mem) && cJSON_IsObject(parts))
    RF_CHECK(rf_cli_json_num(mem, "activation_bytes") == rf_cli_json_num(parts, "activations"),
             "without OMP_NUM_THREADS at W=2: the run's activation bytes %.17g, plan's %.17g",
             rf_cli_json_num(mem, "activation_bytes"), rf_cli_json_num(parts, "activations"));
  cJSON_Delete(p);
  cJSON_Delete(first);
}

/* plan's communication (ms) at W = 4 with --replicate r on the profile `text`
 * (written to a file), and its buffer count in *units; -1 when plan fails. */
static double comm4(const char *model, const char *text, int r, double *units) {
  char net[128];
  snprintf(net, sizeof net, "%s/net4.json", dir);
  RF_ASSERT(rf_file_write_all(net, text, strlen(text)) == 0);
  int rc = rf_cli_run(out, sizeof out,
                      "plan --model %s --world 4 --replicate %d --batch 8 --seq 8 --network %s --json", model,
                      r, net);
  cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
  RF_CHECK(p != NULL, "plan --network %s --replicate %d: rc %d '%.400s'", text, r, rc, out);
  double ms = p ? rf_cli_json_num(p, "comm_ms") : -1;
  *units = p ? rf_cli_json_num(p, "buffer_count") : -1;
  cJSON_Delete(p);
  return ms;
}

/* The links of a group on a node whose ranks outnumber its cores (4 ranks on
 * 2): a group that fits the cores (HSDP 2x2's shard groups and replica pairs)
 * takes `shared_small`, a larger one (the world) `shared`; latencies only
 * (busbw so high the bytes cost nothing), alpha per doubling of the ranks. At
 * 2x2 over U buffers: U forward and U - 1 backward gathers and U reduce-scatters
 * on the shard groups at 0.1 ms, the gradient norm (shard group) and the
 * replicas' U all-reduces (one per unit, as src/fsdp/schedule.c starts them) at
 * 0.01 ms, the trainer's scalars on the world of 4 at 2 x 1 ms; flat W = 4: all
 * 3U + 1 on the world at 2 x 1 ms. A file with only "shared" (written before
 * shared_small existed) prices the pairs on it, as it did: 3U - 1 + U + 1 at
 * 1 ms, the scalars at 2 ms. */
static void check_shared_links(const char *model) {
  const char *both =
      "{\"cores_per_node\": 2, \"shared\": {\"allgather\": [1000, 1e12], \"reduce_scatter\": [1000, 1e12], "
      "\"allreduce\": [1000, 1e12]}, \"shared_small\": {\"allgather\": [100, 1e12], \"reduce_scatter\": "
      "[100, "
      "1e12], \"allreduce\": [10, 1e12]}}";
  const char *old =
      "{\"cores_per_node\": 2, \"shared\": {\"allgather\": [1000, 1e12], \"reduce_scatter\": "
      "[1000, 1e12], \"allreduce\": [1000, 1e12]}}";
  double u = 0, ms = comm4(model, both, 2, &u);
  RF_CHECK(fabs(ms - (0.1 * (3 * u - 1) + 0.01 * (u + 1) + 2)) < 1e-6,
           "2x2 on shared_small: %.9g ms over %g buffers, want %.9g", ms, u,
           0.1 * (3 * u - 1) + 0.01 * (u + 1) + 2);
  ms = comm4(model, both, 1, &u);
  RF_CHECK(fabs(ms - 2 * (3 * u + 1)) < 1e-6, "W=4 on shared: %.9g ms over %g buffers, want %g", ms, u,
           2 * (3 * u + 1));
  ms = comm4(model, old, 2, &u);
  RF_CHECK(fabs(ms - (4 * u + 2)) < 1e-6,
           "2x2, a file without shared_small: %.9g ms over %g buffers, want %g", ms, u, 4 * u + 2);
}

/* A profile with more ranks per node than cores, on a run across nodes (2 hosts x 2 ranks on
 * 1 core each: bench/hosts.sh's 2x2), is flagged: a warning line under the step time and
 * "oversubscribed" in the JSON; not with a core per rank, nor on `here` (one node). */
static void check_oversubscribed(const char *model) {
  static const struct {
    const char *text;
    int world, want;
  } nets[] = {{"{\"ranks_per_node\": 2, \"cores_per_node\": 1}", 4, 1},
              {"{\"ranks_per_node\": 2, \"cores_per_node\": 2}", 4, 0},
              {"{\"ranks_per_node\": 2, \"cores_per_node\": 1}", 2, 0},
              {"{\"ranks_per_node\": 0}", 4, 0}};
  char net[128];
  snprintf(net, sizeof net, "%s/over.json", dir);
  for (int i = 0; i < 4; i++) {
    RF_ASSERT(rf_file_write_all(net, nets[i].text, strlen(nets[i].text)) == 0);
    int rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d --batch 8 --seq 8 --network %s", model,
                        nets[i].world, net);
    int warned = strstr(out, "warning ") && strstr(out, "ranks per node on");
    RF_CHECK(rc == 0 && warned == nets[i].want, "%s at W=%d: warned %d, want %d: '%.600s'", nets[i].text,
             nets[i].world, warned, nets[i].want, out);
    rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d --batch 8 --seq 8 --network %s --json",
                    model, nets[i].world, net);
    cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
    const cJSON *o = p ? cJSON_GetObjectItemCaseSensitive(p, "oversubscribed") : NULL;
    RF_CHECK(cJSON_IsBool(o) && cJSON_IsTrue(o) == nets[i].want,
             "%s at W=%d: JSON 'oversubscribed': '%.300s'", nets[i].text, nets[i].world, out);
    cJSON_Delete(p);
  }
}

/* plan's JSON at W = 4 for the tiny model with `opts`; NULL when plan fails (its output in `out`). */
static cJSON *plan4(const char *model, const char *opts) {
  int rc = rf_cli_run(out, sizeof out, "plan --model %s --world 4 --batch 8 --seq 8 --json %s", model, opts);
  return rc == 0 ? cJSON_Parse(out) : NULL;
}

/* --replicate node and auto in plan: node = the network's ranks per node; auto
 * by memory = the smallest group whose simulated memory fits (the memories of
 * the explicit meshes), by padding = the planner's largest group; bad meshes
 * refused naming --replicate. */
static void check_mesh(const char *model) {
  char net[128], opts[256];
  snprintf(net, sizeof net, "%s/node2.json", dir);
  const char *text = "{\"base\": \"h100-ib\", \"ranks_per_node\": 2, \"cores_per_node\": 2}";
  RF_ASSERT(rf_file_write_all(net, text, strlen(text)) == 0);
  snprintf(opts, sizeof opts, "--replicate node --network %s", net);
  cJSON *p = plan4(model, opts);
  RF_CHECK(p && rf_cli_json_num(p, "replicate") == 2 && rf_cli_json_num(p, "shard_world") == 2,
           "--replicate node, 2 per node: '%.300s'", out);
  cJSON_Delete(p);
  p = plan4(model, "--replicate node");
  RF_CHECK(p && rf_cli_json_num(p, "replicate") == 1 && rf_cli_json_num(p, "shard_world") == 4,
           "--replicate node here: '%.300s'", out);
  cJSON_Delete(p);
  double mem[3];
  for (int k = 0; k < 3; k++) { /* groups of 1, 2, 4 */
    snprintf(opts, sizeof opts, "--replicate %d", 4 >> k);
    p = plan4(model, opts);
    mem[k] = p ? rf_cli_json_num(p, "memory_per_rank_bytes") : -1;
    cJSON_Delete(p);
  }
  RF_CHECK(mem[0] > mem[1] && mem[1] > mem[2] && mem[2] > 0, "memory per rank %g, %g, %g", mem[0], mem[1],
           mem[2]);
  snprintf(opts, sizeof opts, "--replicate auto --memory-per-rank %.9g", (mem[0] + mem[1]) / 2 / 1e9);
  p = plan4(model, opts);
  RF_CHECK(
      p && rf_cli_json_num(p, "shard_world") == 2 && rf_cli_json_num(p, "memory_per_rank_bytes") == mem[1],
      "--replicate auto by memory: '%.300s'", out);
  cJSON_Delete(p);
  snprintf(opts, sizeof opts, "--replicate auto --memory-per-rank %.9g", mem[2] / 2 / 1e9);
  p = plan4(model, opts);
  RF_CHECK(!p && strstr(out, "fits --memory-per-rank"), "a memory no group fits: '%.300s'", out);
  cJSON_Delete(p);
  p = plan4(model, "--replicate auto --max-padding 100");
  RF_CHECK(p && rf_cli_json_num(p, "shard_world") == 4, "--replicate auto --max-padding 100: '%.300s'", out);
  cJSON_Delete(p);
  static const char *const bad[] = {"--replicate 3", "--replicate auto", "--replicate x",
                                    "--replicate 2 --memory-per-rank 1"};
  for (int k = 0; k < 4; k++) {
    p = plan4(model, bad[k]);
    RF_CHECK(!p && strstr(out, "--replicate"), "%s: '%.300s'", bad[k], out);
    cJSON_Delete(p);
  }
}

/* plan's mistakes (issue 37): exit 2 with one message naming the option, before
 * the banner or any table is printed. */
static void check_usage_errors(const char *model) {
  static const struct {
    const char *opts, *names;
  } bad[] = {
      {"--world 4 --replicate 3", "--replicate 3 does not divide"},
      {"--world 4 --replicate 0", "--replicate 0"},
      {"--world 4 --replicate -2", "--replicate -2"},
      {"--world 4 --replicate 8", "--replicate 8 does not divide"},
      {"--world 4 --replicate two", "--replicate 'two'"},
      {"--world 4,8 --replicate 8", "--replicate 8 does not divide the 4"}, /* any world of the list */
      {"--world 4 --batch 8 --rank 7", "--rank 7"},
      {"--world 4 --batch 8 --replicate 2 --rank 2", "--rank 2"}, /* inside the shard group of 2 */
      {"--world 4 --rank 1", "give --batch"},                     /* not silently ignored */
      {"--world 4 --batch 8 --memory-per-rank 1", "--memory-per-rank"},
      {"--world 4 --replicate auto --memory-per-rank 1", "give --batch"},
      {"--world 4 --replicate auto", "--max-padding"},
      {"--world 4 --batch 4 --seq 1000000000000", "--seq"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    int rc = rf_cli_run(out, sizeof out, "plan --model %s %s", model, bad[k].opts);
    RF_CHECK(rc == 2 && strstr(out, bad[k].names) && rf_cli_count_lines(out, "rfsdp plan:") == 1 &&
                 !strstr(out, "parameters,") && !strstr(out, "world 4,"),
             "%s: rc %d, one message with '%s' and no banner: '%.400s'", bad[k].opts, rc, bad[k].names, out);
  }
  /* the limits themselves: the last rank of the group is simulated */
  int rc = rf_cli_run(out, sizeof out,
                      "plan --model %s --world 4 --batch 8 --seq 8 --replicate 2 --rank 1 --json", model);
  cJSON *p = rc == 0 ? cJSON_Parse(out) : NULL;
  RF_CHECK(p && rf_cli_json_num(p, "memory_rank") == 1, "--rank 1 of a group of 2: rc %d '%.300s'", rc, out);
  cJSON_Delete(p);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], data[200], model[256], moe[256], qwen[256];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (int i = 0; n + 100 < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%d: %s\n", i % 97, i % 3 ? "a line of the text" : "and another");
  RF_ASSERT(rf_file_write_all(text, buf, n) == 0);
  free(buf);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);
  snprintf(moe, sizeof moe, "%s/moe.json", dir);
  const char *moe_text =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"intermediate_size\": 24, \"num_hidden_layers\": "
      "2, "
      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, "
      "\"max_position_embeddings\": "
      "64, \"rms_norm_eps\": 1e-5, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
      "\"output_router_logits\": true, \"router_aux_loss_coef\": 0.02}";
  RF_ASSERT(rf_file_write_all(moe, moe_text, strlen(moe_text)) == 0);
  snprintf(qwen, sizeof qwen, "%s/qwen.json", dir);
  const char *qwen_text =
      "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 48, "
      "\"moe_intermediate_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
      "\"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
      "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"norm_topk_prob\": true}";
  RF_ASSERT(rf_file_write_all(qwen, qwen_text, strlen(qwen_text)) == 0);

  check_usage_errors(model);
  static const int worlds[] = {1, 2, 4};
  for (int i = 0; i < 3; i++) {
    check_one(model, data, worlds[i], "--optim adamw");
    check_one(model, data, worlds[i], "--shard ragged --optim adamw8bit");
  }
  check_one(model, data, 2, "--param-dtype bf16 --reduce-dtype bf16 --accum 2");
  check_one(model, data, 4, "--optim adamw8bit --no-reshard --prefetch 2");
  check_one(model, data, 4, "--layout fsdp2 --optim adamw8bit");
  check_one(model, data, 2, "--layout flat --reduce-dtype bf16");
  check_one(model, data, 4, "--replicate 2 --optim adamw");
  check_one(model, data, 4, "--replicate 2 --shard ragged --optim adamw8bit --accum 2");
  check_one(moe, data, 1, "--optim adamw");
  check_one(moe, data, 4, "--shard ragged --optim adamw8bit");
  /* qwen3_moe (q/k norms, fused experts placed an expert at a time, each tensor one run) as train lays
   * it out at W = 2 (the runtime used to plan its experts as one item: 54,144 elements per rank) */
  check_one(qwen, data, 2, "--optim adamw");
  check_threads(model, data);
  check_network_file(model);
  check_shared_links(model);
  check_oversubscribed(model);
  check_mesh(model);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_sim");
}
