/* rf-test: timeout=60
 * The simulator's machine profiles are JSON files (src/sim/network.c): the
 * named ones (the JSON files of configs/network) load with the numbers the built-in
 * table of src/plan/network.c held before they moved (h100-ib, a100-ib: the
 * GPU peaks halved for f32 matmuls), a file over a "base" replaces only the
 * fields it gives, and every bad file is refused naming the file and the
 * field: a value out of range ("efficiency": 5, "overlap": 2, ...), an unknown
 * field, a wrong or cyclic "base" (named as the file that gave it), an
 * incomplete named profile ($RFSDP_NETWORK_DIR), a name with no file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_test.h"
#include "sim/sim.h"

static char dir[64] = "/tmp/rf_test_sim_network.XXXXXX";

static void put(const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  RF_ASSERT(rf_file_write_all(path, text, strlen(text)) == 0);
}

static int link_is(const struct rf_sim_link *l, double alpha, double bw) {
  return l->alpha_us == alpha && l->busbw_gbs == bw;
}

/* The GPU profiles as src/plan/network.c's table held them (aee854c). */
static void check_named(void) {
  static const struct {
    const char *name;
    double intra, inter, peak, mem;
  } gpu[] = {{"h100-ib", 360, 45, 989e3, 2500}, {"a100-ib", 230, 23, 312e3, 1600}};
  for (int i = 0; i < 2; i++) {
    struct rf_sim_network n;
    int rc = rf_sim_network_load(gpu[i].name, &n);
    RF_CHECK(rc == 0, "%s: %s", gpu[i].name, rf_error_msg());
    if (rc) continue;
    int links = 1;
    for (int k = 0; k < RF_SIM_COLL_COUNT; k++)
      links = links && link_is(&n.intra[k], 10, gpu[i].intra) && link_is(&n.shared[k], 10, gpu[i].intra) &&
              link_is(&n.shared_small[k], 10, gpu[i].intra) && link_is(&n.inter[k], 20, gpu[i].inter);
    RF_CHECK(links && n.cores_per_node == 8 && n.ranks_per_node == 8 && n.peak_gflops == gpu[i].peak &&
                 n.peak_gflops_f32 == gpu[i].peak / 2 && n.efficiency == 0.5 && n.mem_gbs == gpu[i].mem &&
                 n.overlap == 1 && strcmp(n.name, gpu[i].name) == 0 && n.source[0],
             "%s: not the profile it was", gpu[i].name);
  }
  struct rf_sim_network here;
  RF_CHECK(rf_sim_network_load("here", &here) == 0 && here.cores_per_node == 2 && here.ranks_per_node == 0 &&
               here.peak_gflops == here.peak_gflops_f32 && here.overlap == 0,
           "here: %s", rf_error_msg());
  const char *names = rf_sim_network_names();
  RF_CHECK(strstr(names, "a100-ib, h100-ib, here") != NULL, "names: %s", names);
  RF_CHECK(rf_sim_network_load("h100", &here) != 0 && strstr(rf_error_msg(), "'h100'") &&
               strstr(rf_error_msg(), "h100-ib"),
           "an unknown name: %s", rf_error_msg());
}

/* A file over a base: its fields replace the base's, the rest inherited. */
static void check_base(void) {
  char path[256];
  put("over.json",
      "{\"base\": \"h100-ib\", \"efficiency\": 0.25, \"inter\": {\"allreduce\": [5, 12.5]}, \"source\": "
      "\"s\"}");
  snprintf(path, sizeof path, "%s/over.json", dir);
  struct rf_sim_network n;
  int rc = rf_sim_network_load(path, &n);
  RF_CHECK(rc == 0, "%s: %s", path, rf_error_msg());
  RF_CHECK(rc || (n.efficiency == 0.25 && link_is(&n.inter[RF_SIM_COLL_ALLREDUCE], 5, 12.5) &&
                  link_is(&n.inter[RF_SIM_COLL_ALLGATHER], 20, 45) && n.peak_gflops == 989e3 &&
                  n.peak_gflops_f32 == 494.5e3 && strcmp(n.name, path) == 0 && strcmp(n.source, "s") == 0),
           "over.json: fields not replaced or not inherited");
  /* a file stating its peak states it for the compute dtype; a relative base is beside the file */
  put("peak.json", "{\"base\": \"over.json\", \"peak_gflops\": 1000}");
  snprintf(path, sizeof path, "%s/peak.json", dir);
  rc = rf_sim_network_load(path, &n);
  RF_CHECK(rc == 0 && n.peak_gflops == 1000 && n.peak_gflops_f32 == 1000 && n.efficiency == 0.25 &&
               strcmp(n.source, path) == 0,
           "peak.json: rc %d %s", rc, rf_error_msg());
  /* without a base: here's fields */
  put("nobase.json", "{\"overlap\": 0.5}");
  snprintf(path, sizeof path, "%s/nobase.json", dir);
  struct rf_sim_network here;
  RF_ASSERT(rf_sim_network_load("here", &here) == 0);
  rc = rf_sim_network_load(path, &n);
  RF_CHECK(rc == 0 && n.overlap == 0.5 && n.mem_gbs == here.mem_gbs &&
               link_is(&n.shared[0], here.shared[0].alpha_us, here.shared[0].busbw_gbs),
           "nobase.json: rc %d %s", rc, rf_error_msg());
}

/* Bad files: refused naming the file and what is wrong. */
static void check_bad(void) {
  static const struct {
    const char *text, *names;
  } bad[] = {
      {"{\"efficiency\": 5}", "\"efficiency\""},
      {"{\"efficiency\": 0}", "\"efficiency\""},
      {"{\"overlap\": 2}", "\"overlap\""},
      {"{\"overlap\": -0.1}", "\"overlap\""},
      {"{\"mem_gbs\": 0}", "\"mem_gbs\""},
      {"{\"peak_gflops\": \"fast\"}", "\"peak_gflops\""},
      {"{\"cores_per_node\": 1.5}", "\"cores_per_node\""},
      {"{\"ranks_per_node\": -1}", "\"ranks_per_node\""},
      {"{\"efficency\": 0.5}", "\"efficency\""},
      {"{\"intra\": {\"allgather\": [1]}}", "\"intra\".\"allgather\""},
      {"{\"inter\": [1, 2]}", "\"inter\""},
      {"{\"base\": \"nowhere\"}", "nowhere"},
      {"{\"base\": \"gone.json\"}", "gone.json"},
      {"{\"base\": 3}", "\"base\""},
      {"[1, 2]", "not a JSON object"},
  };
  char path[256];
  snprintf(path, sizeof path, "%s/bad.json", dir);
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    put("bad.json", bad[k].text);
    struct rf_sim_network n;
    int rc = rf_sim_network_load(path, &n);
    RF_CHECK(rc != 0 && strstr(rf_error_msg(), "bad.json") && strstr(rf_error_msg(), bad[k].names),
             "%s: rc %d '%s'", bad[k].text, rc, rf_error_msg());
  }
  struct rf_sim_network n;
  put("cycle.json", "{\"base\": \"cycle.json\"}");
  snprintf(path, sizeof path, "%s/cycle.json", dir);
  RF_CHECK(rf_sim_network_load(path, &n) != 0 && strstr(rf_error_msg(), "cycle.json") &&
               strstr(rf_error_msg(), "a cycle"),
           "a cycle of bases: %s", rf_error_msg());
  snprintf(path, sizeof path, "%s/none.json", dir);
  RF_CHECK(rf_sim_network_load(path, &n) != 0 && strstr(rf_error_msg(), "none.json"), "a missing file: %s",
           rf_error_msg());
}

/* $RFSDP_NETWORK_DIR: the named profiles' folder; a named profile gives every field. */
static void check_dir(void) {
  char sub[128];
  snprintf(sub, sizeof sub, "%s/profiles", dir);
  RF_ASSERT(mkdir(sub, 0755) == 0);
  put("profiles/half.json", "{\"cores_per_node\": 4, \"ranks_per_node\": 4}");
  put("profiles/fitted.json", "{\"base\": \"half\", \"peak_gflops\": 5}");
  setenv("RFSDP_NETWORK_DIR", sub, 1);
  struct rf_sim_network n;
  int rc = rf_sim_network_load("half", &n);
  RF_CHECK(
      rc != 0 && strstr(rf_error_msg(), "profiles/half.json") && strstr(rf_error_msg(), "\"peak_gflops\""),
      "an incomplete named profile: rc %d '%s'", rc, rf_error_msg());
  rc = rf_sim_network_load("fitted", &n);
  RF_CHECK(rc != 0 && strstr(rf_error_msg(), "profiles/half.json"), "its user: rc %d '%s'", rc,
           rf_error_msg());
  const char *names = rf_sim_network_names();
  RF_CHECK(strcmp(names, "fitted, half") == 0, "names in %s: '%s'", sub, names);
  rc = rf_sim_network_load("here", &n);
  RF_CHECK(rc != 0 && strstr(rf_error_msg(), "'here'") && strstr(rf_error_msg(), "fitted, half"),
           "here outside the folder: rc %d '%s'", rc, rf_error_msg());
  setenv("RFSDP_NETWORK_DIR", "/nonexistent/rf", 1);
  rc = rf_sim_network_load("here", &n);
  RF_CHECK(rc != 0 && strstr(rf_error_msg(), "/nonexistent/rf"), "a missing folder: rc %d '%s'", rc,
           rf_error_msg());
  unsetenv("RFSDP_NETWORK_DIR");
}

int main(void) {
  RF_ASSERT(mkdtemp(dir) != NULL);
  check_named();
  check_base();
  check_bad();
  check_dir();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_sim_network");
}
