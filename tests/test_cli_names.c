/* rf-test: timeout=60
 * The name lists of `rfsdp plan --help` and `rfsdp train --help` come from the
 * tables, not from text written by hand: every optimizer of the kinds' table is in
 * both usage lines and in --optim's choices; every model family of the config
 * reader's table is in plan's --model help, and train's --model help names exactly
 * the trainable ones; every machine profile of configs/network is in plan's
 * --network help. A table entry missing from the help fails here. */
#include <dirent.h>
#include <string.h>

#include "model/model.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "rfsdp_optim.h"

static char plan_help[1 << 16], train_help[1 << 16];

/* The help line of option `name` (the line after "  --NAME ..."), copied into line. */
static int option_help(const char *help, const char *name, char *line, size_t size) {
  char key[64];
  snprintf(key, sizeof key, "\n  --%s ", name);
  const char *at = strstr(help, key);
  if (!at) return -1;
  at = strchr(at + 1, '\n');
  if (!at) return -1;
  at++;
  size_t n = strcspn(at, "\n");
  snprintf(line, size, "%.*s", (int)n, at);
  return 0;
}

/* The usage line: the first of the help. */
static void usage_line(const char *help, char *line, size_t size) {
  snprintf(line, size, "%.*s", (int)strcspn(help, "\n"), help);
}

/* 1 when `word` occurs in text as a whole name (not inside a longer one, e.g.
 * adamw inside adamw8bit). */
static int has_name(const char *text, const char *word) {
  size_t n = strlen(word);
  for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
    int before =
        p == text || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
    char c = p[n];
    int after = !(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'));
    if (before && after) return 1;
  }
  return 0;
}

int main(void) {
  int rc = rf_cli_run(plan_help, sizeof plan_help, "plan --help");
  RF_ASSERT(rc == 0);
  rc = rf_cli_run(train_help, sizeof train_help, "train --help");
  RF_ASSERT(rc == 0);
  char plan_usage[4096], train_usage[4096], plan_optim[512], train_optim[512], plan_model[512],
      train_model[512], network[2048];
  usage_line(plan_help, plan_usage, sizeof plan_usage);
  usage_line(train_help, train_usage, sizeof train_usage);
  RF_ASSERT(option_help(plan_help, "optim", plan_optim, sizeof plan_optim) == 0);
  RF_ASSERT(option_help(train_help, "optim", train_optim, sizeof train_optim) == 0);
  RF_ASSERT(option_help(plan_help, "model", plan_model, sizeof plan_model) == 0);
  RF_ASSERT(option_help(train_help, "model", train_model, sizeof train_model) == 0);
  RF_ASSERT(option_help(plan_help, "network", network, sizeof network) == 0);

  /* the check itself tells names apart */
  RF_CHECK(!has_name("adamw8bit|muon", "adamw") && has_name("adamw|muon", "adamw"), "whole names only");

  int kinds = 0;
  /* the kinds' table, read through its names: "?" past its end */
  for (int k = 0; strcmp(rf_optim_kind_name((enum rf_optim_kind)k), "?") != 0; k++, kinds++) {
    const char *name = rf_optim_kind_name((enum rf_optim_kind)k);
    RF_CHECK(has_name(plan_usage, name), "plan's usage lacks optimizer %s: %s", name, plan_usage);
    RF_CHECK(has_name(train_usage, name), "train's usage lacks optimizer %s: %s", name, train_usage);
    RF_CHECK(has_name(plan_optim, name), "plan's --optim lacks %s: %s", name, plan_optim);
    RF_CHECK(has_name(train_optim, name), "train's --optim lacks %s: %s", name, train_optim);
  }
  RF_CHECK(kinds >= 4 && strcmp(rf_optim_kind_name(RF_OPTIM_KIND_SHAMPOO), "shampoo") == 0,
           "%d optimizers in the table, shampoo among them", kinds);

  int trainable = 0;
  for (int f = 0; f < rf_model_family_count(); f++) {
    const char *name = rf_model_family_name(rf_model_family_at(f));
    RF_CHECK(has_name(plan_model, name), "plan's --model lacks family %s: %s", name, plan_model);
    int t = rf_model_family_trainable(rf_model_family_at(f));
    trainable += t;
    RF_CHECK(has_name(train_model, name) == t, "train's --model %s family %s (trainable %d): %s",
             t ? "lacks" : "names the planned-only", name, t, train_model);
  }
  RF_CHECK(trainable >= 4 && has_name(train_model, "qwen3_moe"),
           "%d trainable families, qwen3_moe among them", trainable);

  DIR *d = opendir("configs/network");
  RF_ASSERT(d);
  int profiles = 0;
  for (struct dirent *e = readdir(d); e; e = readdir(d)) {
    size_t n = strlen(e->d_name);
    if (n <= 5 || e->d_name[0] == '.' || strcmp(e->d_name + n - 5, ".json") != 0) continue;
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(n - 5), e->d_name);
    RF_CHECK(strstr(network, name) != NULL, "plan's --network lacks profile %s: %s", name, network);
    profiles++;
  }
  closedir(d);
  RF_CHECK(profiles >= 3, "%d profiles in configs/network", profiles);
  printf("%d optimizers, %d families (%d trainable), %d machine profiles: all in the help\n", kinds,
         rf_model_family_count(), trainable, profiles);
  return rf_test_finish("test_cli_names");
}
