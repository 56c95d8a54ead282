#!/usr/bin/env bash
# The whole GPU check (issue 13), in one script: on a machine with a CUDA device it runs every
# `cuda`-marked test and the engine benchmark (fast and bitwise engines, HF generate, bare loops)
# on the GPU, in under 10 minutes. On a machine without one it says so and exits 1.
#
#     benchmarks/gpu_check.sh            # uses .venv/bin/python; PYTHON=... to use another
#
# The CPU venv that `make env` builds has a CPU-only torch: on the GPU machine install a CUDA build
# of the same torch version first (pip install torch==<version> --index-url .../cu12x).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    build=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "no torch")
    echo "gpu_check: no CUDA device visible to torch ($build, via $PY); run it on a machine with a GPU" \
         "and a CUDA build of torch" >&2
    exit 1
fi
"$PY" -c 'import torch; print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, "
                              f"{torch.cuda.get_device_name(0)}")'

status=0
# -m cuda: only the GPU tests; -rs lists any that skipped, with the reason
timeout 420 "$PY" -m pytest -q -m cuda -rs -p no:cacheprovider tests
rc=$?
if [ $rc -eq 5 ]; then
    echo "gpu_check: no cuda-marked tests were collected" >&2
fi
[ $rc -ne 0 ] && status=1

# the engine benchmark on the GPU (wall seconds after a sync): both modes, HF generate, bare loops
timeout 150 "$PY" benchmarks/engine.py --device cuda --requests 256 --repeats 2 || status=1

if [ $status -eq 0 ]; then echo "gpu_check: passed"; else echo "gpu_check: FAILED (see above)" >&2; fi
exit $status
