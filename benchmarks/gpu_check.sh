#!/usr/bin/env bash
# The GPU acceptance check, one command on a machine with one NVIDIA GPU (docs/gpus.md):
#
#     benchmarks/gpu_check.sh            # uses .venv/bin/python; PYTHON=... to use another
#
# Steps (each with its own time limit; the whole is meant to fit in 10 minutes on one GPU):
#   cuda-tests       every `cuda`-marked test
#   colocated        the demo, colocated on the GPU, 20 steps from its warm start: must learn
#                    (mean reward of the last 5 steps above that of the first 5)
#   colocated-resume 5 more steps of it with --resume (optimizer state read back onto the GPU)
#   shared-gpu       three devices sharing the GPU (cluster.gpus_per_device=0.33, collectives
#                    over gloo): sync steps, a live resize 2+1 -> 1+2, checkpoints
#   shared-resume    2 more steps of it with --resume
#   bitwise-repeat   two colocated runs, the same bytes of weights and optimizer state
#   bitwise-split    the shared-GPU run with its resize ends with the colocated run's weights
#   sharded-bf16     the shared-GPU run in bfloat16 with cluster.shard=optimizer (two owners of the
#                    AdamW state and fp32 masters, a resize 2+1 -> 1+2 resharding them), against a
#                    colocated bfloat16 run: the same bytes of weights and optimizer state
#   full-bf16        the same with cluster.shard=full (weights sharded too: gathered module by module
#                    in lockstep rounds, gradients to their owners, the sync from every owner)
#   shared-sharded   two train devices sharing the GPU from the first update, in fp32: gloo's send and
#                    recv take CPU tensors only, so every point-to-point transfer (the bitwise gradient
#                    exchange, streamed checkpoints, a resize 1+2 -> 2+1 resharding the optimizer
#                    state) is staged through host memory (runtime/transport.py); the same bytes of
#                    weights and optimizer state as the colocated run
#   shared-full      the same with cluster.shard=full (gradients to their owners, the weight sync
#                    from every owner, point to point)
#   engine-bench     benchmarks/engine.py on the GPU (fast and bitwise engines, HF generate)
#   memory-bench     benchmarks/gpu_memory.py: a Qwen2.5-0.5B-shaped random model, engine in bf16
#                    and a train step, peak bytes per parameter
#   backends-bench   benchmarks/backends.py (where `make vllm` built .venv-vllm): Poise's engine vs
#                    vLLM on a Qwen2.5-0.5B-shaped random model in bf16: tokens/s, first sample,
#                    weight update, memory
#   vllm-sync        a sync 1+1 run with rollout.backend=vllm on the shared GPU (semantic)
#
# It prints a table of the steps and exits non-zero if any failed. The runs go to a scratch
# directory (GPU_CHECK_DIR=... to keep them). The CPU venv that `make env` builds has a CPU-only
# torch: install a CUDA build of the same torch version first (docs/gpus.md).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=${GPU_CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/poise-gpu-check.XXXXXX")}
mkdir -p "$WORK"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    build=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "no torch")
    echo "gpu_check: no CUDA device visible to torch ($build, via $PY); run it on a machine with a GPU" \
         "and a CUDA build of torch (docs/gpus.md)" >&2
    exit 1
fi
"$PY" -c 'import torch; print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, "
                              f"{torch.cuda.get_device_name(0)}; runs in '"$WORK"'")'

ROWS=()
FAILED=0
T0=$(date +%s)

# step NAME LIMIT_S COMMAND...: run it, log to $WORK/NAME.log, add a row to the table
step() {
    local name=$1 limit=$2
    shift 2
    local start rc status
    start=$(date +%s)
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then status=ok; elif [ $rc -eq 124 ]; then status="TIMEOUT (${limit} s)"; else status="FAILED (rc $rc)"; fi
    [ $rc -ne 0 ] && FAILED=1 && tail -n 15 "$WORK/$name.log" | sed "s/^/  $name: /" >&2
    ROWS+=("$(printf '%-17s %-18s %6s s   %s' "$name" "$status" "$(( $(date +%s) - start ))" "$WORK/$name.log")")
    return $rc
}

# the same shape for every run that is compared bit for bit
SMALL=(run.progress=false algorithm.prompts_per_step=8 algorithm.group_size=4 algorithm.micro_batch_size=8
       algorithm.updates_per_step=1 algorithm.sampling.max_new_tokens=32 rollout.num_slots=16 rollout.invariant_tile=16
       "model.path=$WORK/warmstart" cluster.device=cuda determinism=bitwise)
SHARED=(pipeline.mode=sync cluster.devices=3 cluster.gpus_per_device=0.33 "cluster.split=[2,1]"
        'resize.schedule=[{at_step: 2, split: [1, 2]}]' resize.mode=live run.checkpoint_every=2)
# two train devices on the shared GPU from step 0, then one (the optimizer state reshards)
SHARED_TWO=(pipeline.mode=sync cluster.devices=3 cluster.gpus_per_device=0.33 "cluster.split=[1,2]"
            'resize.schedule=[{at_step: 2, split: [2, 1]}]' resize.mode=live run.checkpoint_every=2)

# the model's digest in a run's latest checkpoint (weights only: what the split may not change)
weights_of() { sha256sum "$1/checkpoints/$(cat "$1/checkpoints/latest")/model.safetensors" | cut -d' ' -f1; }
# weights and optimizer state
state_of() { local d="$1/checkpoints/$(cat "$1/checkpoints/latest")"; cat "$d/model.safetensors" "$d/optimizer.safetensors" | sha256sum | cut -d' ' -f1; }

# -m cuda: only the GPU tests; -rs lists any that skipped, with the reason
step cuda-tests 240 "$PY" -m pytest -q -m cuda -rs -p no:cacheprovider tests

# the demo's warm start is made here once (sft_if_missing), then every run starts from it
step colocated 240 "$PY" -m poise train configs/demo.yaml pipeline.mode=colocated cluster.device=cuda \
    run.steps=20 run.checkpoint_every=10 run.progress=false "model.path=$WORK/warmstart" "run.dir=$WORK/colocated" \
    && step colocated-learns 10 "$PY" - "$WORK/colocated/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
first, last = (sum(r["reward_mean"] for r in part) / len(part) for part in (rows[:5], rows[-5:]))
print(f"reward {first:.3f} (first 5 steps) -> {last:.3f} (last 5)")
sys.exit(0 if len(rows) == 20 and last > first else 1)
EOF
[ -d "$WORK/colocated" ] && step colocated-resume 120 "$PY" -m poise train --resume "$WORK/colocated" run.steps=25

if [ -d "$WORK/warmstart" ]; then
    step shared-gpu 180 "$PY" -m poise train "${SMALL[@]}" "${SHARED[@]}" run.steps=4 "run.dir=$WORK/shared" \
        && step shared-resume 120 "$PY" -m poise train --resume "$WORK/shared" run.steps=6
    step bitwise-a 90 "$PY" -m poise train "${SMALL[@]}" pipeline.mode=colocated run.steps=4 "run.dir=$WORK/bitwise-a"
    step bitwise-b 90 "$PY" -m poise train "${SMALL[@]}" pipeline.mode=colocated run.steps=4 "run.dir=$WORK/bitwise-b"
    step bitwise-repeat 10 test "$(state_of "$WORK/bitwise-a")" = "$(state_of "$WORK/bitwise-b")"
    # the shared run's checkpoint of step 4 (its latest before the resume wrote step 6) against colocated's
    step bitwise-split 10 cmp "$WORK/shared/checkpoints/step_000004/model.safetensors" \
        "$WORK/bitwise-a/checkpoints/step_000004/model.safetensors"
    step sharded-bf16 180 "$PY" -m poise train "${SMALL[@]}" "${SHARED[@]}" run.steps=4 model.dtype=bfloat16 \
        cluster.shard=optimizer "run.dir=$WORK/sharded-bf16" \
        && step bf16-colocated 90 "$PY" -m poise train "${SMALL[@]}" pipeline.mode=colocated run.steps=4 \
            model.dtype=bfloat16 "run.dir=$WORK/bf16-colocated" \
        && step bitwise-bf16 10 test "$(state_of "$WORK/sharded-bf16")" = "$(state_of "$WORK/bf16-colocated")"
    step full-bf16 180 "$PY" -m poise train "${SMALL[@]}" "${SHARED[@]}" run.steps=4 model.dtype=bfloat16 \
        cluster.shard=full "run.dir=$WORK/full-bf16" \
        && step bitwise-full 10 test "$(state_of "$WORK/full-bf16")" = "$(state_of "$WORK/bf16-colocated")"
    step shared-sharded 180 "$PY" -m poise train "${SMALL[@]}" "${SHARED_TWO[@]}" run.steps=4 cluster.shard=optimizer \
        "run.dir=$WORK/shared-sharded" \
        && step bitwise-sharded 10 test "$(state_of "$WORK/shared-sharded")" = "$(state_of "$WORK/bitwise-a")"
    step shared-full 180 "$PY" -m poise train "${SMALL[@]}" "${SHARED_TWO[@]}" run.steps=4 cluster.shard=full \
        "run.dir=$WORK/shared-full" \
        && step bitwise-shared-full 10 test "$(state_of "$WORK/shared-full")" = "$(state_of "$WORK/bitwise-a")"
else
    echo "gpu_check: no warm start (the colocated step failed before making it): the runs that start from it are skipped" >&2
    FAILED=1
fi

# the engine benchmark on the GPU (wall seconds after a sync): both modes, HF generate, bare loops
step engine-bench 150 "$PY" benchmarks/engine.py --device cuda --requests 256 --repeats 2 --out "$WORK/bench"
step memory-bench 150 "$PY" benchmarks/gpu_memory.py --device cuda --out "$WORK/bench"
# vLLM next to Poise's engine on a Qwen2.5-0.5B-shaped model, where `make vllm` built its venv (on a
# GPU machine it installs the CUDA build); VLLM_PYTHON=... to use another
VPY=${VLLM_PYTHON:-.venv-vllm/bin/python}
if [ -x "$VPY" ]; then
    step backends-bench 300 "$VPY" benchmarks/backends.py --device cuda --shape qwen2.5-0.5b --context 2048 \
        --requests 256 --median 256 --slots 64
    step vllm-sync 240 "$VPY" -m poise train "${SMALL[@]}" rollout.backend=vllm determinism=semantic \
        cluster.device=cuda cluster.gpus_per_device=0.5 cluster.devices=2 cluster.split=[1,1] pipeline.mode=sync \
        algorithm.old_logprobs=recompute algorithm.rollout_is=token algorithm.updates_per_step=1 run.steps=4 \
        "run.dir=$WORK/vllm-sync"
else
    echo "gpu_check: no $VPY (make vllm): the vLLM steps are skipped" >&2
fi
grep -A4 '^phase' "$WORK/memory-bench.log" 2>/dev/null

echo
printf '%-17s %-18s %8s   %s\n' step status time log
for row in "${ROWS[@]}"; do echo "$row"; done
echo "total $(( $(date +%s) - T0 )) s"
if [ $FAILED -eq 0 ]; then echo "gpu_check: passed"; else echo "gpu_check: FAILED (see above)" >&2; fi
exit $FAILED
