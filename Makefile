# rfsdp: build, test, bench, demo. `make help` lists the targets.
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif
# The backend behind the device, gemm and comm tables: cpu (host memory, oneDNN, MPI), the
# default; cuda (cudaMalloc'd memory and kernels, cuBLASLt, NCCL; MPI and the host backend stay
# in it) builds into build-cuda/ with nvcc for src/*/*.cu and the C files that only it compiles
# (src/*/*_cuda.c, src/*/*_nccl.c), plus the GPU test programs tests/gpu/*.c (docs/gpu.md);
# cuda-emu builds the same files into build-cuda-emu/ on the CPU: the .cu files as C++ over
# tests/gpu/emu's headers, linked with its stand-in for the CUDA runtime, cuBLASLt and NCCL.
BACKEND ?= cpu
ifeq ($(BACKEND),cuda)
BUILD ?= build-cuda
else ifeq ($(BACKEND),cuda-emu)
BUILD ?= build-cuda-emu
else ifneq ($(BACKEND),cpu)
$(error BACKEND=$(BACKEND): no such backend; BACKEND=cpu (the default), cuda or cuda-emu)
endif
PREFIX ?= /usr/local
BUILD ?= build
PKGS := mpi libcjson libxxhash lapacke
# oneDNN (libdnnl-dev) ships no pkg-config file
LIBS_EXTRA := -ldnnl
OPT ?= -O2 -g
SAN ?=
ARCH ?= -march=native # valgrind knows no AVX-512: make BUILD=build-vg ARCH=-march=x86-64-v3
# -fPIC: the same objects make librfsdp.a and librfsdp.so (the Python module's); -fno-semantic-interposition
# keeps the library's calls to itself direct
CFLAGS_ALL = -std=c11 -D_GNU_SOURCE $(OPT) $(SAN) $(ARCH) -fPIC -fno-semantic-interposition -fopenmp \
  -fno-strict-aliasing -fno-math-errno \
  -Wall -Wextra -Werror -Wno-unknown-pragmas -Iinclude -Isrc \
  $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(CFLAGS)
LDLIBS_ALL = $(shell pkg-config --libs $(PKGS) 2>/dev/null) $(LIBS_EXTRA) $(BACKEND_LIBS) -lm -fopenmp $(SAN) $(LDFLAGS)

# C files that include CUDA, cuBLASLt or NCCL headers: built by BACKEND=cuda only
CUDA_C_SRC := $(sort $(wildcard src/*/*_cuda.c src/*/*_nccl.c))
LIB_SRC := $(filter-out $(CUDA_C_SRC),$(sort $(wildcard src/*/*.c)))
CU_SRC := $(sort $(wildcard src/*/*.cu))
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.c))
ifeq ($(BACKEND),cuda)
# The CUDA build compiles only what the backend adds (.cu, the CUDA-only C files, the GPU
# programs) and links the CPU build's objects for the rest (CPU_BUILD, made with the same
# flags when missing): nvcc and a second compile of every file on 2 cores would cost minutes.
CPU_BUILD ?= build
OBJ_DIR := $(CPU_BUILD)/obj
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v ccache >/dev/null 2>&1 && echo ccache) $(CUDA_HOME)/bin/nvcc
# sm_80 (A100) and sm_90 (H100, H200) machine code, and sm_90 PTX for newer GPUs to JIT
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
NVCC_FLAGS = -std=c++17 $(OPT) $(CUDA_ARCH) --Werror all-warnings \
  -Xcompiler -Wall,-Wextra,-Werror,-fno-strict-aliasing -Iinclude -Isrc $(NVCCFLAGS)
CUDA_CFLAGS := -DRF_BACKEND_CUDA -isystem $(CUDA_HOME)/include
# cudart static (as nvcc links it); cuBLASLt and NCCL from the machine (the GPU machine has its own)
# -u: every program gets backend_cuda.o (and through it the CUDA device, kernels, AdamW), whose
# rf_backend_cuda replaces the CPU build's "built without CUDA" entry of src/backend/backend.c
BACKEND_LIBS := -Wl,--undefined=rf_backend_cuda -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart_static -ldl -lrt \
  -lpthread -lstdc++
CUDA_OBJ := $(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
else ifeq ($(BACKEND),cuda-emu)
# The CUDA build's own files on the CPU (tests/gpu/emu; docs/gpu.md): the CUDA-only C files
# against the stand-in's headers, each .cu rewritten by cu2cpp and compiled as C++ without
# FMA contraction (the kernels' _rn arithmetic), the stand-in's library (emu/*.cpp) linked in.
CPU_BUILD ?= build
OBJ_DIR := $(CPU_BUILD)/obj
EMU := tests/gpu/emu
CUDA_CFLAGS := -DRF_BACKEND_CUDA -DRF_CUDA_EMU -I$(EMU)/include
# -fPIC: the stand-in's thread-locals (blockIdx, threadIdx) through the general TLS model, which ld
# relaxes in a program: g++ 12 at -O2 -march=znver4 emits an initial-exec access as a `lea` of the GOT
# slot that ld cannot relax ("TLS transition from R_X86_64_GOTTPOFF ... failed", kernels_cuda.cu.o)
EMU_CXXFLAGS = -std=c++17 $(OPT) $(ARCH) -fPIC -ffp-contract=off -fno-strict-aliasing -fno-math-errno -pthread \
  -Wall -Wextra -Werror -Wno-unknown-pragmas -I$(EMU)/include -I$(EMU) -Iinclude -Isrc \
  $(shell pkg-config --cflags mpi 2>/dev/null)
EMU_OBJ := $(patsubst %.cpp,$(BUILD)/obj/%.o,$(sort $(wildcard $(EMU)/*.cpp)))
BACKEND_LIBS := -Wl,--undefined=rf_backend_cuda -lstdc++ -lpthread
CUDA_OBJ := $(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o) $(EMU_OBJ)
else
OBJ_DIR := $(BUILD)/obj
CUDA_OBJ :=
endif
LIB_OBJ := $(LIB_SRC:%.c=$(OBJ_DIR)/%.o) $(CUDA_OBJ)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_OBJ := $(TOOL_SRC:%.c=$(OBJ_DIR)/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
HEADERS := $(wildcard include/*.h src/*/*.h tools/*.h tests/*.h tests/gpu/*.h)
# what format and lint cover: every folder holding C (fuzz/ and docs/example/ are built by their own rules)
C_DIRS := $(wildcard src tools tests bench fuzz docs/example)
EXTRA_SRC := $(sort $(wildcard fuzz/*.c docs/example/*.c))
ALL_C := $(sort $(wildcard include/*.h src/*/*.[ch] src/*/*.cu tools/*.[ch] tests/*.[ch] tests/gpu/*.[ch] \
  bench/*.[ch] fuzz/*.[ch] docs/example/*.[ch]))
PUBLIC_HEADERS := $(wildcard include/*.h)

.PHONY: all setup test test-asan mutate fuzz bench demo demo-moe install clean format lint help
.DEFAULT_GOAL := all

GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)

ifeq ($(BACKEND),cuda)
# the library, the command and the GPU programs: the CPU tests and benches are the CPU build's
all: $(BUILD)/librfsdp.a $(BUILD)/rfsdp $(GPU_TEST_BIN)
else ifeq ($(BACKEND),cuda-emu)
# the same, and the stand-in's own test (tests/gpu/emu/selftest.cu)
all: $(BUILD)/librfsdp.a $(BUILD)/rfsdp $(GPU_TEST_BIN) $(BUILD)/tests/gpu/emu_selftest
else
all: $(BUILD)/librfsdp.a $(BUILD)/librfsdp.so $(BUILD)/rfsdp $(BUILD)/rfsdp-release $(TEST_BIN) $(BENCH_BIN)
endif

help:
	@echo "make            build librfsdp.a, the rfsdp command, tests and benchmarks"
	@echo "make test       set up what is missing, build, run every test"
	@echo "make test-asan  every test (multi-rank ones under mpirun) under address + undefined sanitizers"
	@echo "make mutate     plants each bug of scripts/mutations in a scratch copy; each must fail a test"
	@echo "make fuzz       each parser's libFuzzer target for FUZZ_SECONDS (clang; fuzz/)"
	@echo "make demo       set up, prepare the KJV data, train the default model on 2 ranks"
	@echo "make demo-moe   the same with a Mixtral-style model (8 experts, top-2, the demo's active parameters)"
	@echo "make bench      the benchmarks (numbers printed, nothing asserted)"
	@echo "make install PREFIX=/usr/local"
	@echo "make BACKEND=cpu the host backend (the default)"
	@echo "make BACKEND=cuda  the CUDA backend into build-cuda/ (nvcc, cuBLASLt, NCCL; docs/gpu.md)"
	@echo "make BACKEND=cuda-emu  the CUDA backend's files on the CPU stand-in, into build-cuda-emu/"
	@echo "make format | lint   (scripts/setup --dev installs clang, clang-format, clang-tidy, cppcheck)"

setup:
	@scripts/setup

# each object depends on the headers it includes (-MMD -MP writes them into a .d beside it) and
# on this Makefile (its flags); tests and benches, compiled and linked in one command, depend on
# every header
$(OBJ_DIR)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

ifeq ($(BACKEND),cuda)
$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS_ALL) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

# nvcc: host code under the same warnings as gcc's, device code's warnings errors too
$(BUILD)/obj/%.cu.o: %.cu Makefile
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@
endif

ifeq ($(BACKEND),cuda-emu)
$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS_ALL) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.cpp: %.cu $(EMU)/cu2cpp
	@mkdir -p $(dir $@)
	@$(EMU)/cu2cpp $< $@

$(BUILD)/obj/%.cu.o: $(BUILD)/obj/%.cu.cpp Makefile
	@echo "  CXX     $*.cu (cuda-emu)"
	@$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/$(EMU)/%.o: $(EMU)/%.cpp Makefile
	@mkdir -p $(dir $@)
	@echo "  CXX     $<"
	@$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/tests/gpu/emu_selftest: $(BUILD)/obj/$(EMU)/selftest.cu.o $(BUILD)/librfsdp.a
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CXX) $^ $(LDLIBS_ALL) -o $@

.PRECIOUS: $(BUILD)/obj/%.cu.cpp
endif

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d)

$(BUILD)/librfsdp.a: $(LIB_OBJ)
	@rm -f $@
	@echo "  AR      $@"
	@ar rcs $@ $^

# the shared library (python/rfsdp loads it with ctypes): the same objects, the same libraries
$(BUILD)/librfsdp.so: $(LIB_OBJ)
	@echo "  LD      $@"
	@$(CC) -shared -Wl,-soname,librfsdp.so $^ $(LDLIBS_ALL) -o $@

$(BUILD)/rfsdp: $(TOOL_OBJ) $(BUILD)/librfsdp.a
	@echo "  LD      $@"
	@$(CC) $(TOOL_OBJ) $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

# Test hooks (docs/architecture.md): build/rfsdp, the command the tests run, is linked with
# tools/test_hooks.c compiled with -DRF_TEST_HOOKS (it reads the RF_TEST_* variables);
# build/rfsdp-release, what `make install` installs, with the same file compiled without it
# (it reads none: tests/test_boundary.c looks for the names in it)
$(OBJ_DIR)/tools/test_hooks.o: CFLAGS_ALL += -DRF_TEST_HOOKS
RELEASE_TOOL_OBJ := $(filter-out $(OBJ_DIR)/tools/test_hooks.o,$(TOOL_OBJ)) $(OBJ_DIR)/tools/test_hooks.release.o
$(OBJ_DIR)/tools/test_hooks.release.o: tools/test_hooks.c Makefile
	@mkdir -p $(dir $@)
	@echo "  CC      $< (release: no test hooks)"
	@$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@
-include $(OBJ_DIR)/tools/test_hooks.release.d

$(BUILD)/rfsdp-release: $(RELEASE_TOOL_OBJ) $(BUILD)/librfsdp.a
	@echo "  LD      $@"
	@$(CC) $(RELEASE_TOOL_OBJ) $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(BUILD)/librfsdp.a $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	@$(CC) $(CFLAGS_ALL) -Itests $< $(TEST_EXTRA) $(TEST_SUPPORT) $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

# programs run on a GPU by scripts/gpu-check (BACKEND=cuda), on the CPU stand-in (BACKEND=cuda-emu)
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(TEST_SUPPORT) $(BUILD)/librfsdp.a $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	@$(CC) $(CFLAGS_ALL) $(CUDA_CFLAGS) -Itests $< $(TEST_SUPPORT) $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

# the Python module's test loads the shared library
$(BUILD)/tests/test_python: $(BUILD)/librfsdp.so

# the fuzz entry points, fed the committed inputs without libFuzzer
$(BUILD)/tests/test_fuzz_regress: fuzz/rf_fuzz.c fuzz/rf_fuzz.h
$(BUILD)/tests/test_fuzz_regress: TEST_EXTRA = -Ifuzz fuzz/rf_fuzz.c

# libFuzzer drivers: one binary per target (make fuzz builds them with clang)
FUZZ_TARGETS ?= hf_config units token_file tokenizer safetensors ckpt_open ckpt_index
FUZZ_SECONDS ?= 60
$(BUILD)/fuzz/fuzz_%: fuzz/fuzz_main.c fuzz/rf_fuzz.c fuzz/rf_fuzz.h $(BUILD)/librfsdp.a $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	@$(CC) $(CFLAGS_ALL) -Ifuzz -DRF_FUZZ_TARGET='"$*"' -fsanitize=fuzzer fuzz/fuzz_main.c fuzz/rf_fuzz.c \
	  $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

# every bench is linked with what the benches share (bench/support.c)
$(BUILD)/bench/%: bench/%.c bench/support.c bench/support.h $(BUILD)/librfsdp.a $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	@$(CC) $(CFLAGS_ALL) -Ibench $< bench/support.c $(BUILD)/librfsdp.a $(LDLIBS_ALL) -o $@

test: setup
	@$(MAKE) --no-print-directory all
	@scripts/run-tests $(BUILD) $(TESTS)

test-asan: setup
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -g" \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 RF_TEST_TIME_SCALE=4 \
	  scripts/run-tests build-asan $(TESTS)

mutate: setup
	@$(MAKE) --no-print-directory all
	@scripts/mutate

fuzz: setup
	@$(MAKE) --no-print-directory CC=clang BUILD=build-fuzz OPT="-O1 -g" CFLAGS=-Wno-pass-failed \
	  SAN="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  $(FUZZ_TARGETS:%=build-fuzz/fuzz/fuzz_%)
	@scripts/run-fuzz build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

bench: setup
	@$(MAKE) --no-print-directory all
	@scripts/run-bench $(BUILD)

demo: setup
	@$(MAKE) --no-print-directory all
	@scripts/demo $(BUILD)

demo-moe: setup
	@$(MAKE) --no-print-directory all
	@DEMO_MODEL=configs/demo-moe.json DEMO_OUT=$${DEMO_OUT:-runs/demo-moe} scripts/demo $(BUILD)

install: $(BUILD)/librfsdp.a $(BUILD)/librfsdp.so $(BUILD)/rfsdp-release
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/librfsdp.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/librfsdp.so $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/rfsdp-release $(DESTDIR)$(PREFIX)/bin/rfsdp
	install -d $(DESTDIR)$(PREFIX)/share/rfsdp/network
	install -m 644 configs/network/*.json $(DESTDIR)$(PREFIX)/share/rfsdp/network/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@REQUIRES@|$(PKGS)|' rfsdp.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/rfsdp.pc

format:
	@scripts/setup --dev
	clang-format -i $(ALL_C)

lint:
	@scripts/setup --dev
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --suppress=missingIncludeSystem -Iinclude -Isrc $(C_DIRS)
	clang-tidy --quiet $(LIB_SRC) $(TOOL_SRC) $(EXTRA_SRC) -- -std=c11 -D_GNU_SOURCE -fopenmp -Iinclude -Isrc \
	  -DRF_FUZZ_TARGET='"lint"' \
	  $(patsubst -I%,-isystem %,$(shell pkg-config --cflags $(PKGS)))

clean:
	rm -rf build build-asan build-clang build-fuzz build-cuda build-cuda-emu
