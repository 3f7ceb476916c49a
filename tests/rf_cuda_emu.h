/* The CUDA build's programs on the CPU stand-in (make BACKEND=cuda-emu, tests/gpu/emu;
 * docs/gpu.md) from a test of the default build: building them, running them. */
#ifndef RF_CUDA_EMU_H
#define RF_CUDA_EMU_H

/* Runs make BACKEND=cuda-emu (build-cuda-emu/, over build/'s objects) and prints its
 * time. 0 when built (a failure is a failed check); 77 when this test is not the
 * default build's (build-asan, build-clang: build/ checks it) or g++ is missing, after
 * printing why. */
int rf_cuda_emu_build(void);

/* Runs build-cuda-emu/COMMAND (a program there and its arguments, e.g.
 * "tests/gpu/test_gemm_cuda" or "rfsdp train ..."; under scripts/rfmpirun -np WORLD when
 * WORLD > 0) with the environment assignments ENV (may be "") and one OpenMP thread, killed
 * after limit_s seconds (then 124); its output into out, its wall time printed with the
 * command and exit code. Returns the exit code. */
int rf_cuda_emu_run(char *out, int out_size, const char *env, int world, int limit_s, const char *command);

/* `train --model MODEL --data DATA --steps STEPS SHAPE ARGS --log ...` (SHAPE: "--batch B --seq T")
 * on --device cpu (build/rfsdp, WORLD ranks) and on --device cuda (build-cuda-emu/rfsdp under ENV):
 * both must succeed and log STEPS steps (at most 64), and the worst relative differences of the
 * losses and of the gradient norms be within loss_tol and norm_tol (checked, printed). The logs
 * go into dir; the cuda run's path into gpu_log (gpu_log_size bytes) for further checks.
 * Returns 0, or -1 when a run failed (a failed check). */
int rf_cuda_emu_same_run(const char *dir, const char *data, const char *model, int steps, const char *env,
                         int world, const char *shape, const char *args, double loss_tol, double norm_tol,
                         char *gpu_log, int gpu_log_size);

#endif
