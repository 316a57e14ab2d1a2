#!/bin/sh
# make gpu-check: runs the CUDA store's checks and benchmark (gpu_check, from
# tests/gpu/gpu_check.c). It needs only the built tree: the binary links the
# CUDA runtime statically and nothing of tessera's Debian dependencies. When
# it is missing (a tree copied without build/) and nvcc is here, it is built
# first from the sources alone; that needs BLAKE3's C sources too (the CPU
# hash the device's is checked against: BLAKE3_DIR, else Debian's
# librust-blake3-dev), and without them it stops, saying so. Exits as
# gpu_check does: 0 when every check passed or no device is visible (it says
# so), 1 when a check failed or it could not be built.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
bin=$BUILD/gpu/gpu_check
if [ ! -x "$bin" ]; then
	nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
	if [ ! -x "$nvcc" ]; then
		echo "gpu-check: $bin is not built and there is no nvcc to build it: skipped"
		exit 0
	fi
	b3=${BLAKE3_DIR:-}
	if [ -z "$b3" ]; then # the last, as the Makefile picks it
		for d in /usr/share/cargo/registry/blake3-*/c; do
			[ -e "$d" ] && b3=$d
		done
	fi
	if [ -z "$b3" ] || [ ! -e "$b3/blake3.h" ]; then
		echo "gpu-check: $bin is not built, and building it needs BLAKE3's C sources" \
			"(the CPU hash the device's is checked against): none${b3:+ at $b3}:" \
			"install Debian's librust-blake3-dev or set BLAKE3_DIR" >&2
		exit 1
	fi
	cc=${CC:-cc}
	case $($cc -dumpmachine) in
	x86_64-*)
		b3srcs="blake3.c blake3_dispatch.c blake3_portable.c blake3_sse2_x86-64_unix.S"
		b3srcs="$b3srcs blake3_sse41_x86-64_unix.S blake3_avx2_x86-64_unix.S"
		b3srcs="$b3srcs blake3_avx512_x86-64_unix.S" b3defs= ;;
	aarch64-*)
		b3srcs="blake3.c blake3_dispatch.c blake3_portable.c blake3_neon.c"
		b3defs=-DBLAKE3_USE_NEON=1 ;;
	*)
		b3srcs="blake3.c blake3_dispatch.c blake3_portable.c"
		b3defs="-DBLAKE3_NO_SSE2 -DBLAKE3_NO_SSE41 -DBLAKE3_NO_AVX2 -DBLAKE3_NO_AVX512" ;;
	esac
	cuda=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
	lib=$cuda/lib64
	[ -e "$lib/libcudart_static.a" ] || lib=$cuda/targets/x86_64-linux/lib
	mkdir -p "$BUILD/gpu"
	objs=
	for cu in node/store/store_cuda*.cu; do
		o=$BUILD/gpu/$(basename "$cu" .cu).cu.o
		"$nvcc" -O2 -std=c++17 -I. -Xcompiler -Wall,-Wextra,-Werror \
			-gencode arch=compute_80,code=sm_80 \
			-gencode arch=compute_90,code='[sm_90,compute_90]' -c "$cu" -o "$o"
		objs="$objs $o"
	done
	# BLAKE3 with its own flags (third-party code: not under -Werror).
	mkdir -p "$BUILD/gpu/blake3"
	for f in $b3srcs; do
		o=$BUILD/gpu/blake3/$f.o
		# shellcheck disable=SC2086 # b3defs is a list of flags
		"$cc" -std=gnu11 -O3 $b3defs -c "$b3/$f" -o "$o"
		objs="$objs $o"
	done
	# shellcheck disable=SC2086 # objs is a list of paths without spaces
	"$cc" -std=gnu11 -O2 -g -pthread -D_GNU_SOURCE -I. -I"$b3" -Wall -Wextra -Werror \
		-I"$cuda/include" tests/gpu/gpu_check.c node/store/store_fold.c proto/wsum.c $objs \
		-L"$lib" -lcudart_static -ldl -lrt -lstdc++ -lm -o "$bin"
fi
exec "$bin"
