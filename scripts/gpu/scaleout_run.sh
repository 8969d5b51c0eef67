#!/usr/bin/env bash
# GPU side (nvidia-h200-x2), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh: the scale-out
# measurement of results/h200x2-scaleout/README.md. One step per call (each fits the 10-minute call limit):
#   MODE=prepare  start scripts/gpu/corespeed.py (one core's speed every 5 s, in /tmp/corespeed.txt, for the
#                 rest of the lease: compare_runs prints it per run), build the embedded model, then a warm-up
#                 run (all six cells and, with TF32=1, a TF32 vLLM cell, on 200 docs, over both GPUs) so that
#                 no timed run pays a cold first start of any backend or dtype; prints each cell's precision
#   MODE=two      the 6-cell matrix on both GPUs: evalparity puts the cells on a local Ray instance
#                 (TWO_OUT, default /tmp/so-2gpu: a second two-GPU run after the one-GPU run brackets it)
#   MODE=one      the same matrix on one GPU (CUDA_VISIBLE_DEVICES=0, ONE_OUT, default /tmp/so-1gpu), cells
#                 one after another. It outlasts one call, so it starts in its own session (setsid) and this
#                 call waits up to BUDGET s;
#   MODE=wait     waits (up to BUDGET s) for the one-GPU run, then compares the two runs' tables.
#   MODE=ab       on a host with 3+ GPUs (nvidia-h200-x4): the one-GPU run (GPU 0) and the two-GPU run (GPUs 1
#                 and 2) at the same time, so both see the same minutes of a host whose per-core speed drifts
#                 (results/h200x2-scaleout/README.md, fourth and fifth leases); both in their own sessions,
#                 this call waits up to BUDGET s; MODE=wait then waits for the rest and compares them
#   MODE=extras   a sharded repeat added to the two-GPU run, then drift on 100 prompts
#   MODE=probe    why cells ran slower side by side (results/h200x2-scaleout/README.md, third lease): vllm-fp32
#                 and vllm-bf16 on HellaSwag's later, long-context docs (5,001 on), one after another on one
#                 GPU, then side by side on two; prints each cell's eval wall and CPU time (cell.json eval_cpu)
# LIMIT (default: all 10,042 docs) sets HellaSwag's documents. Steps leave $OUT/<mode>.tgz.
set -uo pipefail
source .gpu/bin/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
MODE=${MODE:?MODE=prepare, two, one, ab, wait, extras or probe}
BUDGET=${BUDGET:-570}
COMMON=(--device cuda --tasks hellaswag --num-fewshot 0 --datasets-dir .gpudata --no-fail-on-inconclusive)
[[ -n ${LIMIT:-} ]] && COMMON+=(--limit "$LIMIT")
T0=$(date +%s)

precision_readback() {  # what each cell's engine reported after it started
  python3 - "$1" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1], "cells").glob("*/cell.json")):
    m = json.loads(f.read_text())
    p, t = m.get("precision", {}), {k: round(m[k], 1) for k in ("load_s", "eval_s", "wall_s") if k in m}
    keep = {k: p.get(k) for k in ("float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32",
                                   "triton_f32_default", "attention_backend")}
    print(f"{f.parent.name}: {m.get('status')} {keep} timings={t}")
PY
}

compare_runs() {  # ALONE PAIRED: each run's cell timings and stages; does placement change what is computed?
  python3 - "${1:-$ONE_OUT}" "${2:-$TWO_OUT}" <<'PY'
import json, pathlib, sys
import pandas as pd
from datetime import datetime
alone, paired = sys.argv[1:3]
for run in (alone, paired):
    spans = []
    for f in sorted(pathlib.Path(run, "cells").glob("*/cell.json")):
        m = json.loads(f.read_text())
        if "started" in m:
            spans.append((datetime.fromisoformat(m["started"]), datetime.fromisoformat(m["finished"])))
        t = {k: round(m[k], 1) for k in ("load_s", "eval_s", "wall_s") if k in m}
        p = m.get("placement") or {}
        print(run, f.parent.name, m.get("status"), t, p.get("gpu_ids"), f"cpus={p.get('cpus')}",
              f"omp={p.get('omp_num_threads')}", f"visible={p.get('cpus_visible')}", "eval_cpu", m.get("eval_cpu"))
    if spans:
        print(f"{run}: cells' span {(max(b for _, b in spans) - min(a for a, _ in spans)).total_seconds():.0f} s")
    log = pathlib.Path(run, "run.json")
    if log.exists():  # where the run's own time went (evalparity/runlog.py)
        r = json.loads(log.read_text())
        print(f"{run}: run.json total {r['total_s']:.1f} s, outside stages {r['outside_stages_s']:.1f} s,",
              {k: round(v, 1) for k, v in r["stages_s"].items()})
        speed = pathlib.Path("/tmp/corespeed.txt")  # the host's one-core speed while the run ran
        if speed.exists():
            t0, t1 = (datetime.fromisoformat(r[k]).timestamp() for k in ("started", "finished"))
            took = sorted(float(b) for a, b in (ln.split() for ln in speed.read_text().splitlines())
                          if t0 <= float(a) <= t1)
            if took:
                print(f"{run}: core-speed workload {len(took)} samples, median {took[len(took) // 2]:.4f} s, "
                      f"mean {sum(took) / len(took):.4f} s, max {took[-1]:.4f} s")
for d in sorted(pathlib.Path(paired, "cells").glob("*/samples.parquet")):
    one = pathlib.Path(alone, "cells") / d.parent.name / "samples.parquet"
    if one.exists():
        a, b = pd.read_parquet(one), pd.read_parquet(d)
        same = a.shape == b.shape and (a["prompt_hash"].values == b["prompt_hash"].values).all()
        dl = (a["loglikelihood"] - b["loglikelihood"]).abs()
        print(f"{d.parent.name}: rows={len(a)} aligned={same} identical={bool((dl.fillna(0) == 0).all())} "
              f"max|dLL|={dl.max():.3g}")
PY
}

in_background() {  # in_background GPUS OUT LABEL: an evalparity run on those GPUs, in its own session
  date +%s > "$2.t0"
  setsid bash -c "CUDA_VISIBLE_DEVICES=$1 python3 -m evalparity.cli run ${COMMON[*]} --out $2 \
    > $2.log 2>&1; echo \"$3: exit \$? after \$(( \$(date +%s) - $T0 )) s\" > $2.done" \
    < /dev/null > /dev/null 2>&1 &
}

wait_one() {  # wait for the background run(s) (MODE=one, MODE=ab), at most until this call's budget
  local runs=("$ONE_OUT") r
  [[ -f $TWO_OUT.t0 ]] && runs+=("$TWO_OUT")
  for r in "${runs[@]}"; do
    while [[ ! -f $r.done ]] && (( $(date +%s) - T0 < BUDGET )); do sleep 5; done
  done
  for r in "${runs[@]}"; do
    if [[ -f $r.done ]]; then cat "$r.done"; tail -n 12 "$r.log"
    else echo "$r: still running after $(( $(date +%s) - $(cat "$r.t0") )) s"; tail -n 3 "$r.log"; fi
  done
  local all=1
  for r in "${runs[@]}"; do [[ -f $r.done ]] || all=0; done
  (( all )) && compare_runs
}

TWO_OUT=${TWO_OUT:-/tmp/so-2gpu} ONE_OUT=${ONE_OUT:-/tmp/so-1gpu}
RUN=$TWO_OUT
case $MODE in
  prepare)
    # one core's speed every 5 s for the rest of the lease (scripts/gpu/corespeed.py), in its own session
    setsid python3 scripts/gpu/corespeed.py /tmp/corespeed.txt 5 < /dev/null > /dev/null 2>&1 &
    python3 -m evalparity.cli models prepare 2>&1 | tail -n 3
    timeout "$BUDGET" python3 -m evalparity.cli run --device cuda --tasks hellaswag --limit 200 --num-fewshot 0 \
      --datasets-dir .gpudata --no-fail-on-inconclusive --backends vllm,hf --dtypes "${WARM_DTYPES:-fp32,bf16,fp16}" \
      ${TF32:+--tf32 vllm} --out /tmp/so-warm
    echo "warm-up: exit $? after $(( $(date +%s) - T0 )) s"
    precision_readback /tmp/so-warm; RUN=/tmp/so-warm ;;
  two)
    timeout "$BUDGET" python3 -m evalparity.cli run "${COMMON[@]}" --out "$TWO_OUT"
    echo "two GPUs: exit $? after $(( $(date +%s) - T0 )) s"; compare_runs "$ONE_OUT" "$TWO_OUT" ;;
  one)
    RUN=$ONE_OUT
    in_background 0 "$ONE_OUT" "one GPU"
    wait_one ;;
  ab)
    RUN=$TWO_OUT
    in_background 0 "$ONE_OUT" "one GPU"
    in_background 1,2 "$TWO_OUT" "two GPUs"
    wait_one ;;
  wait)
    RUN=$ONE_OUT; wait_one ;;
  probe)
    LATE=/tmp/late-data/Rowan/hellaswag/default
    mkdir -p "$LATE" && tail -n +5001 .gpudata/Rowan/hellaswag/default/validation.jsonl > "$LATE/validation.jsonl"
    P=(--device cuda --tasks hellaswag --num-fewshot 0 --datasets-dir /tmp/late-data --no-fail-on-inconclusive
       --backends vllm --dtypes fp32,bf16)
    CUDA_VISIBLE_DEVICES=0 timeout "$BUDGET" python3 -m evalparity.cli run "${P[@]}" --out /tmp/probe-alone > /dev/null 2>&1
    echo "alone: exit $? after $(( $(date +%s) - T0 )) s"
    timeout "$BUDGET" python3 -m evalparity.cli run "${P[@]}" --out /tmp/probe-pair > /dev/null 2>&1
    echo "side by side: exit $? after $(( $(date +%s) - T0 )) s"
    RUN=/tmp/probe-pair; compare_runs /tmp/probe-alone /tmp/probe-pair ;;
  extras)
    timeout "$BUDGET" python3 -m evalparity.cli run "${COMMON[@]}" --out /tmp/so-2gpu --repeat vllm:fp32:dp2
    echo "extras: exit $? after $(( $(date +%s) - T0 )) s"
    LEFT=$(( BUDGET - ($(date +%s) - T0) ))
    timeout "$LEFT" python3 -m evalparity.cli drift --run-dir /tmp/so-2gpu --device cuda \
      --cells "${DRIFT_CELLS:-vllm-bf16,vllm-fp16}" --n-prompts "${DRIFT_PROMPTS:-100}" --gen-tokens 8
    echo "drift: exit $? after $(( $(date +%s) - T0 )) s" ;;
esac
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader || true
PACK=("$MODE:$RUN")  # what comes back: MODE.tgz; after MODE=ab, the two-GPU run as two.tgz too
[[ $MODE == ab || ( $MODE == wait && -f $TWO_OUT.t0 ) ]] && PACK=("one:$ONE_OUT" "two:$TWO_OUT")
for p in "${PACK[@]}"; do
  name=${p%%:*} dir=${p#*:}
  [[ -n ${OUT:-} && -d $dir ]] || continue
  (cd "$dir" && tar czf "$OUT/$name.tgz" --ignore-failed-read spec.json run.json report stats/verdicts.json \
     stats/comparisons.parquet stats/deltas.parquet cells/*/cell.json shards/*/cell.json drift/*.json 2>/dev/null)
done
if [[ -n ${OUT:-} ]]; then
  cp /tmp/corespeed.txt "$OUT/" 2>/dev/null || true
  ls -la "$OUT"
fi
