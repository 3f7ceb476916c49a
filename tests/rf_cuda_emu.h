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

#endif
