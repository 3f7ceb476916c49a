/* Running the rfsdp command from a test: the binary next to the test build
 * (BUILD/rfsdp for BUILD/tests/test_x), its exit code and its output. */
#ifndef RF_CLI_H
#define RF_CLI_H

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Runs `rfsdp ARGS` through the shell (stderr merged into stdout). Returns the
 * exit code; up to out_size-1 bytes of output go to `out`. */
int rf_cli_run(char *out, int out_size, const char *args_fmt, ...) __attribute__((format(printf, 3, 4)));

/* Runs `scripts/rfmpirun -np WORLD rfsdp ARGS` (WORLD 0: `rfsdp ARGS` alone) with one
 * BLAS/OpenMP thread per rank, killed after `limit_s` seconds (then the exit code is
 * 124). Returns the exit code; the output as rf_cli_run. */
int rf_cli_run_mpi(char *out, int out_size, int world, int limit_s, const char *args_fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Runs a shell command (not rfsdp: a script of the repository, from its root), stderr
 * merged into stdout. Returns the exit code; the output as rf_cli_run. */
int rf_cli_sh(char *out, int out_size, const char *cmd_fmt, ...) __attribute__((format(printf, 3, 4)));

/* Runs `scripts/hosts --hosts HOSTS --ranks-per-host PER HOSTS_FLAGS -- rfsdp ARGS`
 * (one BLAS/OpenMP thread per rank; the job across network namespaces, see
 * scripts/hosts), killed after `limit_s` seconds. Returns the exit code; the output
 * as rf_cli_run. */
int rf_cli_run_hosts(char *out, int out_size, int hosts, int per_host, const char *hosts_flags, int limit_s,
                     const char *args_fmt, ...) __attribute__((format(printf, 7, 8)));

/* Whether scripts/hosts can make network namespaces here: 1, or 0 with the reason
 * in `why` (the tests that need them then exit 77: reported as not run). */
int rf_cli_hosts_available(char *why, int why_size);

/* For a test that needs scripts/hosts: 1 (after saying why and that it did not run)
 * when namespaces cannot be made here, then the test returns 77; else 0. */
int rf_cli_hosts_unavailable(void);

/* The loss of each step 1..steps of a train log (JSONL), its last logged value (a step
 * redone after a restart is logged again; NAN when never logged); returns the count of
 * the log's step lines (at most 2 x steps are read). */
int rf_cli_log_last_losses(const char *path, double *loss, int steps);

/* The largest |got[i] - ref[i]| over the got that are not NAN; their count in *missing. */
double rf_cli_worst_absolute(const double *got, const double *ref, int n, int *missing);

/* Starts `sh -c 'exec CMD >OUT_PATH 2>&1'` in its own process group (a shell command
 * from the repository's root); returns its pid. */
int rf_cli_spawn(const char *out_path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Waits for `pid` (a child), at most limit_s seconds (then SIGKILLs its process
 * group); returns its exit code, 128 + the signal when one killed it, 124 on the time
 * limit. */
int rf_cli_reap(int pid, int limit_s);

/* The wall-clock seconds of the last rf_cli_run, rf_cli_run_mpi, rf_cli_sh or rf_cli_run_hosts. */
double rf_cli_last_seconds(void);

/* The path of the rfsdp binary (static storage). */
const char *rf_cli_binary(void);
/* The build folder of the running test (BUILD of BUILD/tests/NAME) as make spells it from the
 * repository root, the tests' working folder: "build", not "/repo/build/tests/..". A `make
 * BUILD=...` run by a test then writes the same dependency (.d) targets as `make all`, whose header
 * dependencies a spelling of its own would hide (an object left stale after a header change). */
void rf_cli_build_dir(char *out, size_t size);

/* Writes the tiny llama config the CLI tests train to `path` (26240 parameters: embedding
 * 256x32, 2 layers, final norm, head 256x32); aborts when it cannot. */
void rf_cli_write_tiny_model(const char *path);

/* Writes a text of about `bytes` bytes to `path` for `rfsdp prepare`: numbered verses
 * of four repeated sentences of Genesis 1 (a corpus with structure to learn); aborts
 * when it cannot. */
void rf_cli_write_verses(const char *path, size_t bytes);

/* The set-up the training tests share: in folder `dir`, writes about `text_bytes`
 * of verses (text.txt) and the tiny model (tiny.json), and prepares the data
 * (`rfsdp prepare --val-fraction 0.1` into dir/data). The paths of the data and
 * the model go to `data` and `model`; returns prepare's exit code (its output in
 * `out`). */
int rf_cli_setup_tiny(const char *dir, size_t text_bytes, char *data, int data_size, char *model,
                      int model_size, char *out, int out_size);

/* The largest |got - ref| / |ref| over n values (a NaN anywhere gives NaN). */
double rf_cli_worst_relative(const double *got, const double *ref, int n);

/* The value after `key` (e.g. "\"loss\":") on each step line of a train log (JSONL,
 * lines with a "step"), in order, at most `cap`; returns the count (0: no file). */
int rf_cli_log_field(const char *path, const char *key, double *v, int cap);

/* The JSON object on line `line` (0-based) of a file (a train log's memory line is
 * line 0, step s is line s); NULL when missing. The caller deletes it. */
cJSON *rf_cli_json_line(const char *path, int line);

/* The number `key` of object `o`; -1 when it is missing or not a number. */
double rf_cli_json_num(const cJSON *o, const char *key);

/* ---- the fault suites (docs/reliability.md) ---- */

/* Every regular file under a folder with a hash of its bytes. */
#define RF_CLI_SNAP_FILES 512
struct rf_cli_snapshot {
  int n;
  char path[RF_CLI_SNAP_FILES][200];
  uint64_t hash[RF_CLI_SNAP_FILES];
  int64_t size[RF_CLI_SNAP_FILES];
};
void rf_cli_snap_take(struct rf_cli_snapshot *s, const char *dir);
/* Checks that every file of `before` is unchanged in `after` and no temporary file is left. */
void rf_cli_snap_check(const struct rf_cli_snapshot *before, const struct rf_cli_snapshot *after,
                       const char *what);

/* Lines of out that start with `prefix` (a command's messages). */
int rf_cli_count_lines(const char *out, const char *prefix);

/* Runs `rfsdp ARGS` at `world` ranks (0: without mpirun) and checks that it is
 * refused: exit code want_rc, one message line starting with `prefix` holding every
 * '|'-separated part of `want` and not saying "another rank" (the rank that saw the
 * problem speaks), within limit_s, nothing changed on disk under `dir`. */
void rf_cli_refused(const char *dir, int limit_s, int world, int want_rc, const char *prefix,
                    const char *want, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
void rf_cli_vrefused(const char *dir, int limit_s, int world, int want_rc, const char *prefix,
                     const char *want, const char *fmt, va_list ap) __attribute__((format(printf, 7, 0)));

/* Runs `rfsdp ARGS` at `world` ranks and checks that it succeeds within
 * RF_CLI_WORKS_LIMIT_S seconds. */
#define RF_CLI_WORKS_LIMIT_S 30
void rf_cli_works(int world, char *out, int out_size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
