#!/bin/sh
# FlashInfer's kernels: JIT-compiled on first use (default), or downloaded now.
#   flashinfer-cubins.sh jit|download
# download fetches FlashInfer's precompiled cubins from NVIDIA's artifact
# server into $FLASHINFER_CUBIN_DIR, as vLLM's own image does; hosts that
# cannot reach that server keep the default and JIT with /opt/cuda's nvcc.
set -eu
case $1 in
    jit)
        echo "flashinfer-cubins: none shipped; FlashInfer JIT-compiles with $(command -v nvcc) on first use"
        ;;
    download)
        mkdir -p "$FLASHINFER_CUBIN_DIR"
        flashinfer download-kernels
        chmod -R a+rX "$FLASHINFER_CUBIN_DIR"
        ;;
    *)
        echo "flashinfer-cubins: FLASHINFER_CUBINS=$1: use jit or download" >&2
        exit 2
        ;;
esac
