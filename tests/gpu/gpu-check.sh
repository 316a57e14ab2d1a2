#!/bin/sh
# make gpu-check: runs the CUDA store's checks and benchmark (gpu_check, from
# tests/gpu/gpu_check.c). It needs only the built tree: the binary links the
# CUDA runtime statically and nothing of tessera's Debian dependencies. When
# it is missing (a tree copied without build/) and nvcc is here, it is built
# first from the sources alone. Exits as gpu_check does: 0 when every check
# passed or no device is visible (it says so), 1 when a check failed.
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
	# shellcheck disable=SC2086 # objs is a list of paths without spaces
	${CC:-cc} -std=gnu11 -O2 -g -pthread -D_GNU_SOURCE -I. -Wall -Wextra -Werror \
		-I"$cuda/include" tests/gpu/gpu_check.c node/store/store_fold.c proto/wsum.c $objs \
		-L"$lib" -lcudart_static -ldl -lrt -lstdc++ -lm -o "$bin"
fi
exec "$bin"
