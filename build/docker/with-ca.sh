#!/bin/sh
# Run a command with the optional build secret `ca` as pip's CA bundle.
#   docker build --secret id=ca,src=/path/to/ca-bundle.crt ...
# The Dockerfile mounts it at /run/secrets/ca for the steps that download;
# it is never written into a layer. Without it, pip uses its own bundle.
set -eu
ca=/run/secrets/ca
if [ -s "$ca" ]; then
    export PIP_CERT="$ca" SSL_CERT_FILE="$ca" REQUESTS_CA_BUNDLE="$ca"
    echo "with-ca: using the CA bundle from build secret 'ca'"
fi
exec "$@"
