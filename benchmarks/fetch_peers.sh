#!/usr/bin/env bash
# Bring sglang's KDA packed-decode kernels (Helion and Triton) into DEST as benchmark peers for
# benchmarks/decode.py, without the rest of sglang: download the sglang wheel (no dependencies),
# unpack only the two kernel folders, and add the few empty packages and stand-ins they import.
# DEST is third-party code for side-by-side measurement only: keep it git-ignored, never commit it.
#   usage: benchmarks/fetch_peers.sh DEST [SGLANG_VERSION]        (default 0.5.23)
#   then:  PYTHONPATH=DEST:$PYTHONPATH python benchmarks/decode.py ...
# The Helion peer needs helion (1.4.0 with torch 2.11); both need triton.
set -euo pipefail
dest=${1:?usage: benchmarks/fetch_peers.sh DEST [SGLANG_VERSION]}
version=${2:-0.5.23}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps "sglang==$version" -d "$tmp"
mkdir -p "$dest"
(cd "$dest" && unzip -q -o "$tmp"/sglang-*.whl \
    'sglang/kernels/ops/attention/fla/*' 'sglang/kernels/ops/attention/helion/*')
for pkg in sglang sglang/kernels sglang/kernels/ops sglang/srt sglang/srt/utils; do
    mkdir -p "$dest/$pkg" && touch "$dest/$pkg/__init__.py"
done
# sglang's CUDA fast path for KDA decode is not unpacked: its probe answers "not covered".
printf '%s\n' 'import types' 'kda_packed_decode = types.SimpleNamespace(covered=lambda *a, **k: False)' \
    > "$dest/sglang/kernels/ops/attention/__init__.py"
printf '%s\n' 'import torch' \
    'torch_release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])' \
    > "$dest/sglang/srt/utils/common.py"
echo "sglang $version peers in $dest (keep it git-ignored)"
