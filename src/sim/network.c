/* The machines the simulator prices a step on: JSON files, the named ones in
 * configs/network/ (here: fitted by bench/scale.sh; h100-ib, a100-ib: published
 * figures, every number a stated assumption), installed by `make install` in
 * PREFIX/share/rfsdp/network; any other by its path. docs/scale.md. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "sim/sim.h"

static int rf_sim_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* dir := the folder cand, without its ".." (realpath) when it resolves. */
static int rf_sim_take_dir(const char *cand, char *dir, size_t size) {
  char *real = realpath(cand, NULL);
  int len = snprintf(dir, size, "%s", real ? real : cand);
  free(real);
  RF_REQUIRE(len > 0 && (size_t)len < size, "the machine profiles' folder %.200s: the path is too long",
             cand);
  return 0;
}

/* The profiles' folder near the folder `base` (an executable's or a library's):
 * ../share/rfsdp/network, or configs/network in it or up to three folders above. */
static int rf_sim_dir_near(const char *base, char *dir, size_t size) {
  char cand[4200];
  snprintf(cand, sizeof cand, "%s/../share/rfsdp/network", base);
  if (rf_sim_is_dir(cand)) return rf_sim_take_dir(cand, dir, size);
  for (int up = 0; up <= 3; up++) {
    size_t len = (size_t)snprintf(cand, sizeof cand, "%s", base);
    for (int k = 0; k < up && len + 3 < sizeof cand; k++) len += (size_t)snprintf(cand + len, 4, "/..");
    snprintf(cand + len, sizeof cand - len, "/configs/network");
    if (rf_sim_is_dir(cand)) return rf_sim_take_dir(cand, dir, size);
  }
  return 1;
}

int rf_sim_network_dir(char *dir, size_t size) {
  const char *env = getenv("RFSDP_NETWORK_DIR");
  if (env && *env) {
    RF_REQUIRE(rf_sim_is_dir(env), "RFSDP_NETWORK_DIR=%s: no such folder (the machine profiles' folder)",
               env);
    return rf_sim_take_dir(env, dir, size);
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    int rc = rf_sim_dir_near(exe, dir, size);
    if (rc <= 0) return rc;
  }
  /* the library's own folder: a program in another place (python/rfsdp over librfsdp.so) */
  Dl_info info;
  char lib[4096] = "";
  if (dladdr((void *)rf_sim_network_dir, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    char *real = realpath(info.dli_fname, NULL);
    snprintf(lib, sizeof lib, "%s", real ? real : info.dli_fname);
    free(real);
    char *slash = strrchr(lib, '/');
    if (slash) *slash = 0;
    int rc = rf_sim_dir_near(lib, dir, size);
    if (rc <= 0) return rc;
  }
  if (rf_sim_is_dir("configs/network")) return rf_sim_take_dir("configs/network", dir, size);
  RF_FAIL(
      "no folder of machine profiles: tried $RFSDP_NETWORK_DIR, ../share/rfsdp/network and configs/network "
      "beside the executable (%s) and the library (%s) and up to 3 folders above them, and ./configs/network "
      "(make install puts them in PREFIX/share/rfsdp/network)",
      n > 0 ? exe : "unknown", lib[0] ? lib : "unknown");
}

static int rf_sim_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *rf_sim_network_names(void) {
  static _Thread_local char names[1024];
  char dir[4096];
  snprintf(names, sizeof names, "(none)");
  if (rf_sim_network_dir(dir, sizeof dir) != 0) return names;
  DIR *d = opendir(dir);
  if (!d) return names;
  char *list[64] = {0};
  int n = 0;
  for (const struct dirent *e = readdir(d); e && n < 64; e = readdir(d)) {
    size_t len = strlen(e->d_name);
    if (len > 5 && e->d_name[0] != '.' && strcmp(e->d_name + len - 5, ".json") == 0) {
      list[n] = rf_xmalloc(len - 4);
      memcpy(list[n], e->d_name, len - 5);
      list[n++][len - 5] = 0;
    }
  }
  closedir(d);
  qsort(list, (size_t)n, sizeof list[0], rf_sim_cmp_str);
  size_t at = 0;
  names[0] = 0;
  for (int i = 0; i < n; i++) {
    if (at < sizeof names)
      at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", list[i]);
    free(list[i]);
  }
  if (n == 0) snprintf(names, sizeof names, "(none)");
  return names;
}

/* A spec names a file when it ends in ".json" or holds a '/'. */
static int rf_sim_is_path(const char *spec) {
  size_t len = strlen(spec);
  return strchr(spec, '/') || (len > 5 && strcmp(spec + len - 5, ".json") == 0);
}

/* The file of `spec` into path: a path as it is (relative to `rel`'s folder
 * when rel is a file and spec is relative), a name in the profiles' folder
 * (which must hold it). */
static int rf_sim_network_path(const char *spec, const char *rel, char *path, size_t size) {
  if (rf_sim_is_path(spec)) {
    const char *slash = rel ? strrchr(rel, '/') : NULL;
    int len = spec[0] != '/' && slash ? snprintf(path, size, "%.*s/%s", (int)(slash - rel), rel, spec)
                                      : snprintf(path, size, "%s", spec);
    RF_REQUIRE(len > 0 && (size_t)len < size, "network file %.200s: the path is too long", spec);
    return 0;
  }
  char dir[4096];
  RF_TRY(rf_sim_network_dir(dir, sizeof dir));
  int len = snprintf(path, size, "%s/%.*s.json", dir, 1000, spec);
  RF_REQUIRE(len > 0 && (size_t)len < size, "--network %.200s: the path is too long", spec);
  RF_REQUIRE(access(path, R_OK) == 0, "no machine profile '%s' in %s (known: %s; or give FILE.json)", spec,
             dir, rf_sim_network_names());
  return 0;
}

static const char *const rf_sim_kinds[RF_SIM_COLL_COUNT] = {"allgather", "reduce_scatter", "allreduce"};
static const char *const rf_sim_fields[] = {
    "base",       "source",  "cores_per_node", "ranks_per_node", "peak_gflops",  "peak_gflops_f32",
    "efficiency", "mem_gbs", "overlap",        "intra",          "shared_small", "shared",
    "inter"};
#define RF_SIM_N_FIELDS ((int)(sizeof rf_sim_fields / sizeof rf_sim_fields[0]))

/* A number field in [lo, hi] (lo excluded when open_lo; integer when whole);
 * kept when absent. Sets *have. */
static int rf_sim_net_number(const cJSON *root, const char *key, double lo, int open_lo, double hi, int whole,
                             const char *path, double *out, int *have) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!x) return 0;
  double v = cJSON_IsNumber(x) ? x->valuedouble : NAN;
  int ok = isfinite(v) && (open_lo ? v > lo : v >= lo) && v <= hi && (!whole || v == floor(v));
  if (!ok) {
    if (isinf(hi))
      RF_FAIL("network file %s: \"%s\" must be a%s number %s %g", path, key, whole ? " whole" : "",
              open_lo ? ">" : ">=", lo);
    RF_FAIL("network file %s: \"%s\" must be a number in %s%g, %g]", path, key, open_lo ? "(" : "[", lo, hi);
  }
  *out = v;
  *have = 1;
  return 0;
}

/* A links object {"allgather": [alpha_us, busbw_gbs], "reduce_scatter": [...],
 * "allreduce": [...]}; sets bit k of *have for each kind given. */
static int rf_sim_net_links(const cJSON *root, const char *key, const char *path, struct rf_sim_link *out,
                            int *have) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!o) return 0;
  RF_REQUIRE(cJSON_IsObject(o), "network file %s: \"%s\" must be an object of collectives", path, key);
  for (const cJSON *l = o->child; l; l = l->next)
    RF_REQUIRE(strcmp(l->string, rf_sim_kinds[0]) == 0 || strcmp(l->string, rf_sim_kinds[1]) == 0 ||
                   strcmp(l->string, rf_sim_kinds[2]) == 0,
               "network file %s: \"%s\".\"%s\": unknown collective (known: allgather, reduce_scatter, "
               "allreduce)",
               path, key, l->string);
  for (int k = 0; k < RF_SIM_COLL_COUNT; k++) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, rf_sim_kinds[k]);
    if (!l) continue;
    const cJSON *a = cJSON_GetArrayItem(l, 0), *b = cJSON_GetArrayItem(l, 1);
    RF_REQUIRE(
        cJSON_IsArray(l) && cJSON_GetArraySize(l) == 2 && cJSON_IsNumber(a) && cJSON_IsNumber(b) &&
            isfinite(a->valuedouble) && isfinite(b->valuedouble) && a->valuedouble >= 0 && b->valuedouble > 0,
        "network file %s: \"%s\".\"%s\" must be [alpha_us >= 0, busbw_gbs > 0]", path, key, rf_sim_kinds[k]);
    out[k] = (struct rf_sim_link){a->valuedouble, b->valuedouble};
    *have |= 1 << k;
  }
  return 0;
}

/* Refuses a field that is not a profile's (a misspelled one would otherwise
 * leave the base profile's value in silence). */
static int rf_sim_net_known(const cJSON *root, const char *path) {
  for (const cJSON *k = root->child; k; k = k->next) {
    int i = 0;
    while (i < RF_SIM_N_FIELDS && strcmp(k->string, rf_sim_fields[i]) != 0) i++;
    RF_REQUIRE(i < RF_SIM_N_FIELDS,
               "network file %s: unknown field \"%s\" (known: base, source, cores_per_node, ranks_per_node, "
               "peak_gflops, peak_gflops_f32, efficiency, mem_gbs, overlap, intra, shared_small, shared, "
               "inter)",
               path, k->string);
  }
  return 0;
}

/* The fields of root over *out (from its base, or zero); `complete`: every field
 * must be given. */
static int rf_sim_net_fields(const cJSON *root, const char *path, int complete, struct rf_sim_network *out) {
  double cores = out->cores_per_node, ranks = out->ranks_per_node;
  int have[12] = {0}, f32 = 0;
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
  RF_REQUIRE(!src || cJSON_IsString(src), "network file %s: \"source\" must be a string", path);
  if (src) snprintf(out->source, sizeof out->source, "%s", src->valuestring);
  /* a file with "shared" links and no "shared_small" (written before groups on a
   * shared node had their own links) prices every group on a shared node on its
   * "shared", as it did */
  if (cJSON_GetObjectItemCaseSensitive(root, "shared") &&
      !cJSON_GetObjectItemCaseSensitive(root, "shared_small")) {
    memcpy(out->shared_small, out->shared, sizeof out->shared);
    RF_TRY(rf_sim_net_links(root, "shared", path, out->shared_small, &have[7]));
  }
  RF_TRY(rf_sim_net_number(root, "cores_per_node", 1, 0, INFINITY, 1, path, &cores, &have[0]));
  RF_TRY(rf_sim_net_number(root, "ranks_per_node", 0, 0, INFINITY, 1, path, &ranks, &have[1]));
  RF_TRY(rf_sim_net_number(root, "peak_gflops", 0, 1, INFINITY, 0, path, &out->peak_gflops, &have[2]));
  RF_TRY(rf_sim_net_number(root, "peak_gflops_f32", 0, 1, INFINITY, 0, path, &out->peak_gflops_f32, &f32));
  RF_TRY(rf_sim_net_number(root, "efficiency", 0, 1, 1, 0, path, &out->efficiency, &have[3]));
  RF_TRY(rf_sim_net_number(root, "mem_gbs", 0, 1, INFINITY, 0, path, &out->mem_gbs, &have[4]));
  RF_TRY(rf_sim_net_number(root, "overlap", 0, 0, 1, 0, path, &out->overlap, &have[5]));
  RF_TRY(rf_sim_net_links(root, "intra", path, out->intra, &have[6]));
  RF_TRY(rf_sim_net_links(root, "shared", path, out->shared, &have[7]));
  RF_TRY(rf_sim_net_links(root, "shared_small", path, out->shared_small, &have[8]));
  RF_TRY(rf_sim_net_links(root, "inter", path, out->inter, &have[9]));
  RF_REQUIRE(cores <= 1 << 30 && ranks <= 1 << 30, "network file %s: %g cores and %g ranks per node", path,
             cores, ranks);
  /* a file states its peak in the compute dtype unless it gives both */
  if (have[2] && !f32) out->peak_gflops_f32 = out->peak_gflops;
  out->cores_per_node = (int)cores;
  out->ranks_per_node = (int)ranks;
  if (!complete) return 0;
  static const char *const need[] = {"cores_per_node", "ranks_per_node", "peak_gflops", "efficiency",
                                     "mem_gbs",        "overlap",        "intra",       "shared",
                                     "shared_small",   "inter"};
  for (int i = 0; i < 10; i++)
    RF_REQUIRE(have[i] == (i < 6 ? 1 : 7),
               "network file %s: \"%s\" missing%s (a profile without \"base\" gives every field and "
               "every collective of its links)",
               path, need[i], i < 6 ? "" : " or incomplete");
  return 0;
}

/* path (a file) over its base; complete: a profile of the folder (no base of its own). */
static int rf_sim_net_read(const char *path, int complete, int depth, struct rf_sim_network *out) {
  RF_REQUIRE(depth < 8, "network file %s: \"base\" nested more than 8 deep (a cycle?)", path);
  char *text = NULL;
  size_t n = 0;
  RF_REQUIRE(rf_file_read_all(path, &text, &n) == 0, "network file %s: cannot read it", path);
  cJSON *root = cJSON_ParseWithLength(text, n);
  free(text);
  int rc = 0;
  if (!cJSON_IsObject(root))
    rc = rf_error_set(__FILE__, __LINE__, "network file %s: not a JSON object", path);
  if (rc == 0) rc = rf_sim_net_known(root, path);
  const cJSON *base = rc == 0 ? cJSON_GetObjectItemCaseSensitive(root, "base") : NULL;
  if (rc == 0 && base && !cJSON_IsString(base))
    rc = rf_error_set(__FILE__, __LINE__, "network file %s: \"base\" must be a profile's name or a file",
                      path);
  const char *b = base ? base->valuestring : complete ? NULL : "here";
  memset(out, 0, sizeof *out);
  if (rc == 0 && b) {
    char bpath[4096];
    rc = rf_sim_network_path(b, path, bpath, sizeof bpath);
    if (rc != 0) { /* name the file that gave the base */
      char why[1024];
      snprintf(why, sizeof why, "%s", rf_error_msg());
      const char *p = strstr(why, ": ");
      rc = rf_error_set(__FILE__, __LINE__, "network file %s: \"base\": %s", path, p ? p + 2 : why);
    } else if (access(bpath, R_OK) != 0) {
      rc = rf_error_set(__FILE__, __LINE__, "network file %s: \"base\" %s: no such file", path, bpath);
    } else {
      rc = rf_sim_net_read(bpath, !rf_sim_is_path(b), depth + 1, out);
    }
  }
  if (rc == 0 && depth == 0 && !complete) /* a file without "source" is its own */
    snprintf(out->source, sizeof out->source, "%.1000s", path);
  if (rc == 0) rc = rf_sim_net_fields(root, path, complete && !b, out);
  cJSON_Delete(root);
  return rc;
}

int rf_sim_network_load(const char *spec, struct rf_sim_network *out) {
  char path[4096];
  RF_TRY(rf_sim_network_path(spec, NULL, path, sizeof path));
  int named = !rf_sim_is_path(spec);
  RF_TRY(rf_sim_net_read(path, named, 0, out));
  snprintf(out->name, sizeof out->name, "%.250s", spec);
  return 0;
}

double rf_sim_link_ms(const struct rf_sim_link *link, enum rf_sim_coll kind, int n, double bytes) {
  if (n <= 1) return 0.0;
  double share = (double)(n - 1) / n * (kind == RF_SIM_COLL_ALLREDUCE ? 2.0 : 1.0);
  return link->alpha_us * 1e-3 * ceil(log2((double)n)) + share * bytes / (link->busbw_gbs * 1e9) * 1e3;
}
