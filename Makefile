# tessera build. `make` builds everything, `make test` runs every cmocka test
# under ASan+UBSan, `make demo` runs the local cluster (`make demo-netns`: across
# namespaced hosts, as root), `make bench*` measure, `make check-deploy`
# validates deploy/ (systemd units, Kubernetes manifests, Containerfile, Slurm),
# `make check-page` looks at the status page in headless Chromium,
# `make install PREFIX=... [DESTDIR=...]` installs (deploy/install.mk).
#
# Layout: every library folder's non-entry .c files form one static library
# (proto <- fabric <- tracker/* <- node/*); files named main_*.c are programs.
# BUILD=dir lets several builds live side by side; T=name runs one test.

BUILD    ?= build
.DEFAULT_GOAL := all
CC       ?= cc
PKGS     := libfabric libsodium libzstd libevent libevent_pthreads libevent_openssl openssl jansson inih
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-unused-parameter \
            -Wmissing-prototypes -Wstrict-prototypes -Wvla \
            -Wno-format-truncation
BASEFLAGS = -std=gnu11 -g -pthread -D_GNU_SOURCE -I. -I$(BLAKE3_DIR) $(WARN) $(PKG_CFLAGS)
OPTFLAGS ?= -O2
SANFLAGS := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
            -fno-sanitize-recover=undefined

# CUDA: built when nvcc is on PATH, in the toolkit's standard place, or NVCC=.
# nvcc may be a link or a wrapper outside the toolkit (say in /usr/local/bin):
# the toolkit's root is the first of CUDA_HOME, the directory above the real
# nvcc, the root nvcc reports (asked only when those two fail) and
# /usr/local/cuda that holds libcudart. Without one the build goes on
# without CUDA and says so.
ifeq ($(origin NVCC),undefined)
NVCC := $(realpath $(firstword $(shell command -v nvcc 2>/dev/null) \
          $(wildcard /usr/local/cuda/bin/nvcc)))
endif
ifneq ($(NVCC),)
cuda_libdir = $(firstword $(foreach l,lib64 targets/x86_64-linux/lib targets/sbsa-linux/lib, \
                $(if $(wildcard $(1)/$(l)/libcudart.so),$(1)/$(l))))
cuda_first  = $(firstword $(foreach r,$(1),$(if $(call cuda_libdir,$(r)),$(r))))
CUDA_ROOTS := $(CUDA_HOME) $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_HOME  := $(call cuda_first,$(CUDA_ROOTS))
ifeq ($(CUDA_HOME),)
CUDA_ROOTS += $(realpath $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 \
                                 | sed -n 's/^\#\$$ TOP=//p')) /usr/local/cuda
CUDA_HOME  := $(call cuda_first,$(CUDA_ROOTS))
endif
ifeq ($(CUDA_HOME),)
$(warning nvcc at $(NVCC) has no libcudart.so beside it (looked in $(CUDA_ROOTS)); building without CUDA)
NO_CUDA_WHY := nvcc without libcudart
NVCC :=
else
CUDA_LIBDIR := $(call cuda_libdir,$(CUDA_HOME))
CUDA_DEFS   := -DTESSERA_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS   := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -lstdc++
CU_SRCS     := $(wildcard node/store/*.cu)
endif
endif
NO_CUDA_WHY ?= no nvcc
NVCCFLAGS ?= -O2 -std=c++17 -I. -Xcompiler -Wall,-Wextra,-Werror \
             -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=[sm_90,compute_90]

# BLAKE3, the chunk hash (proto/chunkhash.c): the C implementation Debian
# ships in librust-blake3-dev, compiled here from its installed sources
# (deploy/install-deps.sh installs them; nothing is copied into the tree).
# On x86-64 its SIMD kernels are the assembly files and the dispatcher picks
# the widest the CPU has at run time; on arm64 NEON; elsewhere portable C.
BLAKE3_DIR ?= $(lastword $(sort $(wildcard /usr/share/cargo/registry/blake3-*/c)))
ifeq ($(BLAKE3_DIR),)
# (Not an error here: `make test` installs the dependencies, then re-enters.)
BLAKE3_DIR := blake3-sources-missing
blake3-sources-missing/%:
	@echo "BLAKE3's C sources are missing: run deploy/install-deps.sh (Debian's librust-blake3-dev) or set BLAKE3_DIR" >&2
	@exit 1
endif
BLAKE3_ARCH := $(shell $(CC) -dumpmachine 2>/dev/null)
ifneq ($(filter x86_64-%,$(BLAKE3_ARCH)),)
BLAKE3_SRCS := blake3.c blake3_dispatch.c blake3_portable.c \
               $(foreach k,sse2 sse41 avx2 avx512,blake3_$(k)_x86-64_unix.S)
BLAKE3_DEFS :=
else ifneq ($(filter aarch64-%,$(BLAKE3_ARCH)),)
BLAKE3_SRCS := blake3.c blake3_dispatch.c blake3_portable.c blake3_neon.c
BLAKE3_DEFS := -DBLAKE3_USE_NEON=1
else
BLAKE3_SRCS := blake3.c blake3_dispatch.c blake3_portable.c
BLAKE3_DEFS := -DBLAKE3_NO_SSE2 -DBLAKE3_NO_SSE41 -DBLAKE3_NO_AVX2 -DBLAKE3_NO_AVX512
endif
BLAKE3_CFLAGS := -std=gnu11 -O3 -fPIC $(BLAKE3_DEFS)
BLAKE3_FILES := $(addprefix $(BLAKE3_DIR)/,$(BLAKE3_SRCS))

# The libraries, each a folder, lowest first: a library may call only those
# before it that LAYERS_<name> lists (tests/check-layers.sh checks every
# build, so a call against the layering fails it).
NODE_DIRS := base store serve fetch swarm rebuild agent publisher host cli
TRACKER_DIRS := wire client server
LIBDIRS  := proto fabric $(addprefix tracker/,$(TRACKER_DIRS)) $(addprefix node/,$(NODE_DIRS))
lib_name  = lib$(subst /,_,$(1)).a
lib_srcs  = $(filter-out $(1)/main_%.c,$(wildcard $(1)/*.c))
MAINS    := $(wildcard */main_*.c */*/main_*.c)
# node/cli/main_tessera.c -> tessera, node/host/main_node.c -> tessera-node, ...
bin_name  = $(if $(filter main_tessera,$(1)),tessera,tessera-$(patsubst main_%,%,$(1)))
BINS     := $(foreach m,$(MAINS),$(BUILD)/bin/$(call bin_name,$(basename $(notdir $(m)))))

TEST_SRCS  := $(wildcard tests/test_*.c)
BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)

# Link order: dependents first.
# What each library may call besides itself: a call against this is a
# build error (tests/check-layers.sh reads the built archives).
LAYERS_proto          :=
LAYERS_fabric         := proto
# The tracker's client (what nodes and publishers link) and its server
# share only tracker/wire; neither calls the other.
LAYERS_tracker/wire   := proto
LAYERS_tracker/client := tracker/wire proto
LAYERS_tracker/server := tracker/wire proto
TRACKER_CLIENT        := tracker/client tracker/wire
LAYERS_node/base      := fabric proto
LAYERS_node/store     := proto
LAYERS_node/serve     := node/store $(TRACKER_CLIENT) fabric proto
LAYERS_node/fetch     := node/serve node/store node/base $(TRACKER_CLIENT) fabric proto
LAYERS_node/swarm     := node/fetch node/serve node/store node/base $(TRACKER_CLIENT) fabric proto
LAYERS_node/rebuild   := node/fetch node/serve node/store node/base proto
LAYERS_node/agent     := node/swarm node/rebuild node/fetch node/serve node/store node/base \
                         $(TRACKER_CLIENT) fabric proto
LAYERS_node/publisher := node/serve node/base $(TRACKER_CLIENT) fabric proto
LAYERS_node/host      := node/agent node/serve node/store node/base $(TRACKER_CLIENT) fabric proto
# `tessera config check` checks a file for every program with each one's
# table of option parsers (node/host's, tracker/server's).
LAYERS_node/cli       := node/host node/publisher node/serve node/base tracker/server \
                         $(TRACKER_CLIENT) proto
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
LINK_ORDER := $(addprefix node/,$(call reverse,$(NODE_DIRS))) \
              $(addprefix tracker/,$(call reverse,$(TRACKER_DIRS))) fabric proto

# ---- object rules for the two flavours: rel (optimised) and asan ----------
define flavour
$(BUILD)/$(1)/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASEFLAGS) $(2) $$(CUDA_DEFS) -MMD -MP -c $$< -o $$@
$(BUILD)/$(1)/%.cu.o: %.cu
	@mkdir -p $$(dir $$@)
	$$(NVCC) $$(NVCCFLAGS) -c $$< -o $$@
$(foreach d,$(LIBDIRS),
$(BUILD)/$(1)/$(call lib_name,$(d)): $$(patsubst %.c,$(BUILD)/$(1)/%.o,$$(call lib_srcs,$(d))) \
        $(if $(filter node/store,$(d)),$$(patsubst %.cu,$(BUILD)/$(1)/%.cu.o,$$(CU_SRCS)))
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	ar rcs $$@ $$^
)
# BLAKE3 in both flavours with its own flags (third-party code: not under
# tessera's warnings, and not instrumented: its SIMD kernels are assembly).
$(BUILD)/$(1)/blake3/%.o: $(BLAKE3_DIR)/%
	@mkdir -p $$(dir $$@)
	$$(CC) $(BLAKE3_CFLAGS) -c $$< -o $$@
$(BUILD)/$(1)/libblake3.a: $(addprefix $(BUILD)/$(1)/blake3/,$(addsuffix .o,$(BLAKE3_SRCS)))
	@rm -f $$@
	ar rcs $$@ $$^
$(1)_LIBS := $(foreach d,$(LINK_ORDER),$(BUILD)/$(1)/$(call lib_name,$(d))) $(BUILD)/$(1)/libblake3.a
endef
$(eval $(call flavour,rel,$(OPTFLAGS)))
$(eval $(call flavour,asan,$(SANFLAGS)))

ALL_LIBS := $(PKG_LIBS) $(CUDA_LIBS) -lm

# libtessera-client (node/client/): what serving processes link, static and
# shared, libc only; tests link an ASan copy of it.
CLIENT_SRCS := $(wildcard node/client/*.c)
CLIENT_ABI  := 0
RELEASE     := $(shell sed -n 's/^\#define PROTO_RELEASE "\(.*\)"/\1/p' proto/cli.h)
CLIENT_LIBS := $(BUILD)/lib/libtessera-client.a $(BUILD)/lib/libtessera-client.so
CLIENT_PIC  := $(patsubst %.c,$(BUILD)/pic/%.o,$(CLIENT_SRCS))
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPTFLAGS) -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@
$(BUILD)/lib/libtessera-client.a: $(CLIENT_PIC)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/lib/libtessera-client.so: $(CLIENT_PIC)
	@mkdir -p $(dir $@)
	$(CC) -shared -pthread -Wl,-soname,libtessera-client.so.$(CLIENT_ABI) $^ -o $@
$(BUILD)/asan/libtessera-client.a: $(patsubst %.c,$(BUILD)/asan/%.o,$(CLIENT_SRCS))
	@rm -f $@
	ar rcs $@ $^

# make install, make uninstall, the tests' Python environment (make venv).
include deploy/install.mk

.PHONY: all test bench bench-delta bench-delta-net bench-steady bench-tracker bench-activate run-bench-activate demo demo-netns fuzz clean deps help \
        bench-anchor run-bench-anchor bench-fp8 run-bench-fp8 \
        check run-bench run-bench-delta run-bench-delta-net run-bench-steady run-demo run-demo-netns run-fuzz \
        check-deploy run-check-deploy run-bench-tracker check-page run-check-page \
        bench-fanout bench-elastic run-bench-fanout run-bench-elastic gpu-check \
        bench-sites run-bench-sites bench-etcd run-bench-etcd bench-sim run-bench-sim \
        install uninstall venv
# The last line of `make`: what it built.
all: $(BINS) $(CLIENT_LIBS) $(BUILD)/rel/layers.ok $(BUILD)/sim/tessera-sim
	@echo "built tessera $(RELEASE) in $(BUILD): $(words $(BINS)) programs ($(notdir $(BINS))), libtessera-client, \
	$(if $(NVCC),CUDA store (nvcc $$($(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')),without CUDA ($(NO_CUDA_WHY)))"

$(BUILD)/rel/layers.ok: $(rel_LIBS) tests/check-layers.sh
	@tests/check-layers.sh $(foreach d,$(LIBDIRS),"$(d)=$(BUILD)/rel/$(call lib_name,$(d)):$(LAYERS_$(d))")
	@touch $@

# The user-facing targets install missing dependencies first, then re-enter
# make so that pkg-config sees the freshly installed packages.
test bench bench-delta bench-delta-net bench-steady bench-tracker bench-activate bench-anchor demo demo-netns fuzz \
check-page bench-fanout bench-elastic bench-fp8 bench-sites bench-etcd bench-sim: deps
	@$(MAKE) --no-print-directory $(if $(filter test,$@),check,run-$@)

define program
$(BUILD)/bin/$(call bin_name,$(basename $(notdir $(1)))): $(BUILD)/rel/$(1:.c=.o) $$(rel_LIBS) \
		$(BUILD)/lib/libtessera-client.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASEFLAGS) $$(OPTFLAGS) $$< $$(rel_LIBS) $(BUILD)/lib/libtessera-client.a $$(ALL_LIBS) -o $$@
endef
$(foreach m,$(MAINS),$(eval $(call program,$(m))))

# tessera-node under ASan+UBSan too: the tests that run it as a process
# (TESSERA_ASAN_BIN) catch its memory errors, which a release build hides.
$(BUILD)/asan/bin/tessera-node: $(BUILD)/asan/node/host/main_node.o $(asan_LIBS) \
		$(BUILD)/asan/libtessera-client.a
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(SANFLAGS) $< $(asan_LIBS) $(BUILD)/asan/libtessera-client.a $(ALL_LIBS) -o $@

# ---- tests: each tests/test_X.c is one cmocka binary under ASan+UBSan -----
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/asan/tests/%,$(TEST_SRCS))
# tests/filter.c: TEST_FILTER=pattern for every binary. Objects reached only
# through this pattern rule are intermediate to make, which would delete
# them after every build and rebuild them the next time.
.SECONDARY: $(BUILD)/asan/tests/filter.o $(TEST_BINS:=.o)
$(BUILD)/asan/tests/%: $(BUILD)/asan/tests/%.o $(BUILD)/asan/tests/filter.o $(asan_LIBS) \
		$(BUILD)/asan/libtessera-client.a
	$(CC) $(BASEFLAGS) $(SANFLAGS) $< $(BUILD)/asan/tests/filter.o $(asan_LIBS) $(BUILD)/asan/libtessera-client.a \
	      $(ALL_LIBS) $(CMOCKA_LIBS) -o $@

# The fanout simulator (tests/sim/): node/fetch's fetchers on simulated time,
# links and CPUs. tessera-sim runs a scenario; test_sim links it too.
SIM_SRCS := tests/sim/sim.c tests/sim/sim_net.c
$(BUILD)/sim/tessera-sim: $(BUILD)/rel/tests/sim/tessera_sim.o $(SIM_SRCS:%.c=$(BUILD)/rel/%.o) \
		$(rel_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPTFLAGS) $(filter %.o,$^) $(rel_LIBS) $(ALL_LIBS) -o $@
$(BUILD)/asan/tests/test_sim: $(BUILD)/asan/tests/test_sim.o $(BUILD)/asan/tests/filter.o \
		$(SIM_SRCS:%.c=$(BUILD)/asan/%.o) $(asan_LIBS) $(BUILD)/asan/libtessera-client.a
	$(CC) $(BASEFLAGS) $(SANFLAGS) $(filter %.o,$^) $(asan_LIBS) $(BUILD)/asan/libtessera-client.a \
	      $(ALL_LIBS) $(CMOCKA_LIBS) -o $@

# tests/test_X.sh: a test that is a script (run from the tree).
TEST_SCRIPTS := $(wildcard tests/test_*.sh)
T ?=
RUN_TESTS := $(if $(T),$(filter %/test_$(T) %/test_$(T).sh,$(TEST_BINS) $(TEST_SCRIPTS)),\
                       $(TEST_BINS) $(TEST_SCRIPTS))
# CUDA's runtime maps memory where ASan's shadow gap would be.
TEST_ENV := ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0:abort_on_error=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            TESSERA_BIN=$(abspath $(BUILD)/bin) TESSERA_TEST_DATA=$(abspath tests/data) \
            TESSERA_PYTHON=$(abspath $(VENV)/bin/python3) \
            TESSERA_ROOT=$(abspath .) TESSERA_BUILD=$(BUILD) \
            TESSERA_ASAN_BIN=$(abspath $(BUILD)/asan/bin)

check: $(RUN_TESTS) $(BINS) $(CLIENT_LIBS) $(CLIENT_PC) $(VENV)/installed $(BUILD)/asan/bin/tessera-node \
       $(BUILD)/sim/tessera-sim
	@TEST_ENV='$(TEST_ENV)' tests/run.sh $(RUN_TESTS)

# ---- benchmarks and fuzzers -----------------------------------------------
BENCH_BINS := $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
$(BUILD)/bench/%: $(BUILD)/rel/tests/bench/%.o $(rel_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPTFLAGS) $< $(rel_LIBS) $(ALL_LIBS) -o $@

run-bench: $(BUILD)/bench/bench_fabric
	$(BUILD)/bench/bench_fabric

# Hosts in network namespaces with shaped links (root); NETNS_ARGS passes
# options such as --rate 300mbit to deploy/netns-cluster.sh.
run-demo-netns: $(BINS)
	BIN=$(BUILD)/bin deploy/netns-cluster.sh $(NETNS_ARGS)

# Namespaced hosts on 100 Mbit/s links (root): N = 8 and 16 TP1 replicas,
# fanout then star, then N = 8 fanout on 1 Gbit/s links
# (tests/bench/bench_fanout.sh; BENCH_FANOUT_RATE=100mbit|1gbit|all); a mixed
# fleet, then late replicas (tests/bench/bench_elastic.sh).
run-bench-fanout: $(BINS)
	BIN=$(BUILD)/bin tests/bench/bench_fanout.sh
run-bench-elastic: $(BINS)
	BIN=$(BUILD)/bin tests/bench/bench_elastic.sh
# Two sites (root): the trainer and 4 TP1 replicas in A, 8 in B, 1 Gbit/s
# links, 100 Mbit/s between the sites; copies across the wide-area link,
# the last replica of B and deltas across, sites named against unnamed
# (tests/bench/bench_sites.sh).
run-bench-sites: $(BINS)
	BIN=$(BUILD)/bin tests/bench/bench_sites.sh
# Trackers on a three-member etcd on loopback: a version's store cost
# against a state directory's, the takeover after the leader is killed
# (tests/bench/bench_etcd.sh).
run-bench-etcd: $(BINS)
	BIN=$(BUILD)/bin tests/bench/bench_etcd.sh

# The simulator's scenarios: calibration against the testbed, then N = 8
# to 1 000, churn, stragglers, mixed layouts; an SVG of T/(S/b) against N
# (tests/bench/bench_sim.sh; BENCH_SIM_NS lists the N, "... 10000" adds
# the largest).
run-bench-sim: $(BUILD)/sim/tessera-sim
	SIM=$(BUILD)/sim/tessera-sim OUT=$(BUILD)/bench-sim tests/bench/bench_sim.sh

# Replicas tp2 tp2 tp1, a 128 MiB model, a version every second for 60 s.
run-bench-steady: $(BUILD)/bench/bench_steady $(BINS)
	$(BUILD)/bench/bench_steady $(BUILD)/bin

# A real tracker under a simulated cluster on loopback (tests/bench/bench_tracker.c);
# BENCH_TRACKER_ARGS="NODES SECONDS [PER_CLIENT [SHARED]]" (default 10000 nodes, 30 s measured,
# the 10 ranks of a host on one tracker client with one heartbeat; SHARED 0: whole members lists).
BENCH_TRACKER_ARGS ?= 10000 30
run-bench-tracker: $(BUILD)/bench/bench_tracker $(BINS)
	TESSERA_BIN=$(abspath $(BUILD)/bin) $(BUILD)/bench/bench_tracker $(BENCH_TRACKER_ARGS)

# The pause a serving probe sees at activation (tests/bench/bench_activate.c);
# BENCH_ACTIVATE_ARGS="MODEL_MIB SWITCHES INPLACE_MIB" (default 128 MiB, 100
# switches, then in-place installs of a 1 % delta of a 1024 MiB model).
BENCH_ACTIVATE_ARGS ?= 128 100 1024
$(BUILD)/bench/bench_activate: $(BUILD)/rel/tests/bench/bench_activate.o $(rel_LIBS) \
		$(BUILD)/lib/libtessera-client.a
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(OPTFLAGS) $< $(rel_LIBS) $(BUILD)/lib/libtessera-client.a $(ALL_LIBS) -o $@
run-bench-activate: $(BUILD)/bench/bench_activate
	$(BUILD)/bench/bench_activate $(BENCH_ACTIVATE_ARGS)

# The 1 GiB synthetic model is generated once into $(BUILD)/bench-delta.
run-bench-delta: $(BUILD)/bench/bench_delta
	$(BUILD)/bench/bench_delta $(BUILD)/bench-delta

# Delta versions through the network: a 256 MiB synth model (generated once
# into $(BUILD)/bench-delta-net), replicas tp2 tp2 tp1, anchors every 10.
run-bench-delta-net: $(BUILD)/bench/bench_delta_net $(BINS)
	$(BUILD)/bench/bench_delta_net $(abspath $(BUILD)/bin) $(BUILD)/bench-delta-net

# FP8 serving against BF16 (tests/bench/bench_fp8.c): the quantizer's time
# per GiB against memcpy, the delta density in both domains, and the bytes
# of tp2, tp2:fp8 and an all-2-D FP8 replica per version of a 256 MiB synth
# model (generated once into $(BUILD)/bench-fp8).
run-bench-fp8: $(BUILD)/bench/bench_fp8 $(BINS)
	$(BUILD)/bench/bench_fp8 $(abspath $(BUILD)/bin) $(BUILD)/bench-fp8

# The second of two anchors of a 1 GiB synth model (generated once into
# $(BUILD)/bench-anchor) to one tp1 replica on loopback, three runs of fresh
# processes, against bench_fabric's read rate in the same run
# (tests/bench/bench_anchor.sh).
run-bench-anchor: $(BUILD)/bench/bench_fabric $(BINS)
	tests/bench/bench_anchor.sh $(BUILD)/bin $(BUILD)/bench-anchor $(BUILD)/bench/bench_fabric

FUZZ_CC    ?= clang
FUZZ_FLAGS = -std=gnu11 -g -O1 -pthread -D_GNU_SOURCE -I. -I$(BLAKE3_DIR) $(PKG_CFLAGS) \
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
              -fno-omit-frame-pointer
FUZZ_SECONDS ?= 60
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
# Fuzz targets link instrumented archives of every library (and of
# libtessera-client): the linker takes only what a target reaches, and each
# library is compiled once for all of them.
FUZZ_LIBDIRS := $(LIBDIRS) node/client
FUZZ_LIBS := $(foreach d,$(LINK_ORDER) node/client,$(BUILD)/fuzzlib/$(call lib_name,$(d)))
$(BUILD)/fuzzlib/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@
$(foreach d,$(FUZZ_LIBDIRS),$(eval $(BUILD)/fuzzlib/$(call lib_name,$(d)): \
	$(patsubst %.c,$(BUILD)/fuzzlib/obj/%.o,$(call lib_srcs,$(d)))))
$(BUILD)/fuzzlib/%.a:
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/fuzz/%: tests/fuzz/%.c $(wildcard tests/fuzz/*.h) $(FUZZ_LIBS) $(BUILD)/rel/libblake3.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_LIBS) $(BUILD)/rel/libblake3.a $(PKG_LIBS) -lm -o $@

# The CUDA store's checks and benchmark (tests/gpu/): one binary linking only
# the static CUDA runtime, built with everything when nvcc exists, so that a
# GPU machine without tessera's Debian libraries runs it from the built tree.
# It links the CPU's BLAKE3 (the objects built from $(BLAKE3_FILES) with
# $(BLAKE3_DEFS), as every program links them) to check the device's hashes.
GPU_CHECK_SRCS := tests/gpu/gpu_check.c node/store/store_fold.c proto/wsum.c
GPU_CHECK_CU   := $(wildcard node/store/store_cuda*.cu)
ifneq ($(NVCC),)
# The static runtime when the toolkit has it (then only libc is needed).
GPU_CUDART := $(if $(wildcard $(CUDA_LIBDIR)/libcudart_static.a),-L$(CUDA_LIBDIR) -lcudart_static,$(CUDA_LIBS))
all: $(BUILD)/gpu/gpu_check
$(BUILD)/gpu/%.cu.o: %.cu node/store/store_cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/gpu/gpu_check: $(GPU_CHECK_SRCS) $(patsubst %.cu,$(BUILD)/gpu/%.cu.o,$(GPU_CHECK_CU)) \
		$(BUILD)/rel/libblake3.a node/store/store_cuda.h proto/wsum.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -pthread -D_GNU_SOURCE -I. -I$(BLAKE3_DIR) $(WARN) -I$(CUDA_HOME)/include \
		$(GPU_CHECK_SRCS) $(patsubst %.cu,$(BUILD)/gpu/%.cu.o,$(GPU_CHECK_CU)) \
		$(BUILD)/rel/libblake3.a \
		$(GPU_CUDART) -ldl -lrt -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic -lm -o $@
endif
gpu-check:
	BUILD=$(BUILD) NVCC=$(NVCC) BLAKE3_DIR=$(BLAKE3_DIR) tests/gpu/gpu-check.sh

run-fuzz: $(FUZZ_BINS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_BINS)

# A small loopback cluster's status page in headless Chromium (installed when
# missing); the screenshot goes to $(TMPDIR) or PAGE_OUT, outside the tree.
run-check-page: $(BINS)
	BIN=$(BUILD)/bin tests/check-page.sh $(if $(PAGE_OUT),--out $(PAGE_OUT))

run-demo: $(BINS)
	$(BUILD)/bin/tessera cluster --report $(BUILD)/demo-report.json

deps:
	@deploy/install-deps.sh >/dev/null || deploy/install-deps.sh

# The validators of deploy/ (systemd-analyze, shellcheck, Node.js and the npm
# packages pinned in deploy/check) are installed by the target itself.
check-deploy:
	@deploy/install-deps.sh --deploy-check >/dev/null || deploy/install-deps.sh --deploy-check
	@$(MAKE) --no-print-directory run-check-deploy

run-check-deploy: $(BINS)
	BIN=$(BUILD)/bin deploy/check-deploy.sh

clean:
	rm -rf $(BUILD)

help:
	@sed -n '1,10p' Makefile

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
