# Sourced by the HIL scripts on the GPU machine (hil-run.sh, hil-prefill.sh, hil-decode.sh)
# once they have set `h` (the staged folder) and `res` (the results folder): unpacks the
# binaries scripts/hil.sh staged compressed, finds cuBLAS (hil-cublas.sh), records the GPU in
# $res/gpu.txt, and defines `gguf_py`, which makes the synth script's gguf package importable
# (from the carried wheel where pip has none).
for b in leanstream cuda-tests cuda-no-alloc; do
  [ -f "$h/$b.xz" ] && { xz -dc "$h/$b.xz" > "$h/$b" && chmod +x "$h/$b"; }
  [ -f "$h/$b.gz" ] && { gunzip -c "$h/$b.gz" > "$h/$b" && chmod +x "$h/$b"; }
done
. "$(dirname "${BASH_SOURCE[0]}")/hil-cublas.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/gpu.txt"
gguf_py() {
  # The wheel is in .whl/ beside the scripts' checkout, or in the staged folder's own copy.
  python3 -c 'import gguf' 2>/dev/null \
    || { python3 -m pip install -q --no-index --no-deps --target /tmp/site $(ls .whl/gguf-*.whl "$h"/.whl/gguf-*.whl 2>/dev/null | head -1) && export PYTHONPATH=/tmp/site; }
}
