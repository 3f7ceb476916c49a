/* The machine's GEMM peak for MFU (include/rfsdp_model.h, rf_gemm_peak_gflops): a
 * measured oneDNN product, cached per dtype, instruction set and thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "rfsdp_model.h"

/* The side of the measured product: large enough for oneDNN's best kernels. */
#define RF_GEMM_PEAK_N 2048

double rf_gemm_peak_gflops(enum rf_dtype dtype, int threads) {
  char dir[2048], path[2200];
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (xdg && *xdg)
    snprintf(dir, sizeof dir, "%s/rfsdp", xdg);
  else
    snprintf(dir, sizeof dir, "%s/.cache/rfsdp", home ? home : "/tmp");
  snprintf(path, sizeof path, "%s/onednn-%s-peak-%s-%d", dir, rf_dtype_name(dtype), rf_gemm_cpu_name(),
           threads);
  FILE *f = fopen(path, "r");
  double peak = 0.0;
  if (f) {
    if (fscanf(f, "%lf", &peak) != 1) peak = 0.0;
    fclose(f);
    if (peak > 0.0) return peak;
  }
  peak = rf_gemm_measure_gflops(dtype, RF_GEMM_PEAK_N, 5);
  char parent[2100];
  snprintf(parent, sizeof parent, "%s/.cache", home ? home : "/tmp");
  mkdir(parent, 0755);
  mkdir(dir, 0755);
  f = fopen(path, "w");
  if (f) {
    fprintf(f, "%.1f\n", peak);
    fclose(f);
  }
  return peak;
}
