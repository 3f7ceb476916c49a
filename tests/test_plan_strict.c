/* rf-test: timeout=120
 * `rfsdp plan --batch` is as strict as `rfsdp train` (one validation,
 * src/model/plan_check.c, include/rfsdp_plan.h): what train refuses (a batch below W at W = 2, --accum
 * beyond what the batch holds at W = 3, --seq above max_position_embeddings at
 * W = 1 and 2), plan refuses with train's message and train's exit code 2,
 * before it prints its banner; a network file with a field out of range
 * ("efficiency": 5, "overlap": 2) or a wrong "base" is refused with exit 2
 * naming the file (the base's name too), before the banner. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_plan_strict.XXXXXX";
static char train_out[1 << 14], plan_out[1 << 14];

/* The message after "plan_check.c:LINE: " up to the end of its line, into msg; 0 when absent. */
static int check_msg(const char *out, char *msg, size_t cap) {
  const char *p = strstr(out, "plan_check.c:");
  if (!p) return 0;
  p = strstr(p, ": ");
  if (!p) return 0;
  p += 2;
  size_t n = strcspn(p, "\n");
  snprintf(msg, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
  return 1;
}

/* train at `world` and plan --world `world` with the same options: both exit 2 with
 * the same message holding `want`, plan before its banner. */
static void check_same(const char *model, int world, const char *opts, const char *want) {
  int rt = rf_cli_run_mpi(train_out, sizeof train_out, world, 60,
                          "train --model %s --data %s/none --steps 1 --print-every 0 %s", model, dir, opts);
  int rp = rf_cli_run(plan_out, sizeof plan_out, "plan --model %s --world %d %s", model, world, opts);
  char mt[512] = "", mp[512] = "";
  int ht = check_msg(train_out, mt, sizeof mt), hp = check_msg(plan_out, mp, sizeof mp);
  RF_CHECK(rt == 2 && ht && strstr(mt, want), "train W=%d %s: rc %d, want 2 and '%s': '%.400s'", world, opts,
           rt, want, train_out);
  RF_CHECK(rp == 2 && hp && strcmp(mp, mt) == 0, "plan W=%d %s: rc %d, want 2 and train's '%s': '%.400s'",
           world, opts, rp, mt, plan_out);
  RF_CHECK(strstr(plan_out, "parameters") == NULL, "plan W=%d %s printed its banner: '%.400s'", world, opts,
           plan_out);
}

/* A network file: plan exits 2 naming the file and `names`, before the banner. */
static void check_network(const char *model, const char *text, const char *names) {
  char net[128];
  snprintf(net, sizeof net, "%s/net.json", dir);
  RF_ASSERT(rf_file_write_all(net, text, strlen(text)) == 0);
  int rc = rf_cli_run(plan_out, sizeof plan_out, "plan --model %s --world 2 --batch 8 --seq 8 --network %s",
                      model, net);
  RF_CHECK(rc == 2 && strstr(plan_out, net) && strstr(plan_out, names) && !strstr(plan_out, "parameters"),
           "%s: rc %d, want 2 naming %s and %s: '%.400s'", text, rc, net, names, plan_out);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir) != NULL);
  char model[128];
  snprintf(model, sizeof model, "%s/tiny.json", dir); /* max_position_embeddings 64 */
  rf_cli_write_tiny_model(model);
  check_same(model, 2, "--batch 1 --seq 8", "--batch 1 is not divisible into 2 ranks x 1 micro-batches");
  check_same(model, 3, "--batch 6 --seq 8 --accum 4",
             "--batch 6 is not divisible into 3 ranks x 4 micro-batches");
  check_same(model, 1, "--batch 2 --seq 65", "--seq 65 exceeds max_position_embeddings 64");
  check_same(model, 2, "--batch 2 --seq 100", "--seq 100 exceeds max_position_embeddings 64");
  /* the limits themselves are accepted by both (plan here; train's runs elsewhere) */
  int rc = rf_cli_run(plan_out, sizeof plan_out, "plan --model %s --world 2 --batch 2 --seq 64", model);
  RF_CHECK(rc == 0, "plan --batch 2 --seq 64 at W=2: rc %d '%.400s'", rc, plan_out);
  check_network(model, "{\"efficiency\": 5}", "\"efficiency\"");
  check_network(model, "{\"overlap\": 2}", "\"overlap\"");
  check_network(model, "{\"base\": \"nowhere\"}", "'nowhere'");
  rc = rf_cli_run(plan_out, sizeof plan_out, "plan --model %s --world 2 --batch 8 --network nowhere", model);
  RF_CHECK(rc == 2 && strstr(plan_out, "'nowhere'") && strstr(plan_out, "h100-ib"),
           "--network nowhere: rc %d '%.400s'", rc, plan_out);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_strict");
}
