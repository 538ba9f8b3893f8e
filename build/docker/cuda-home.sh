#!/bin/sh
# A CUDA_HOME made of what the pip CUDA wheels in the venv already bring
# (nvcc, ptxas, nvvm, headers, libraries under site-packages/nvidia/cu<major>),
# so DeepGEMM's and FlashInfer's JIT find a toolkit without NVIDIA's apt repository.
#   cuda-home.sh VENV DEST      (DEST becomes the CUDA_HOME, e.g. /opt/cuda)
set -eu
venv=$1
dest=$2
python=$venv/bin/python
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
major=$("$python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')
[ -n "$major" ] || { echo "cuda-home: torch in $venv has no CUDA" >&2; exit 1; }
root=$site/nvidia/cu$major
if [ ! -x "$root/bin/nvcc" ] || [ ! -x "$root/bin/ptxas" ] || [ ! -f "$root/include/cuda_runtime.h" ]; then
    echo "cuda-home: $root lacks bin/nvcc, bin/ptxas or include/cuda_runtime.h; it holds:" >&2
    ls "$root" "$root/bin" >&2 || true
    exit 1
fi
mkdir -p "$dest"
for entry in "$root"/*; do
    ln -sfn "$entry" "$dest/$(basename "$entry")"
done
# Toolkits keep their libraries in lib64; the wheels in lib.
[ -e "$dest/lib64" ] || ln -s lib "$dest/lib64"
"$dest/bin/nvcc" --version | tail -2
echo "cuda-home: $dest -> $root"
