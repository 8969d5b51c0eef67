#!/usr/bin/env bash
# GPU side (nvidia-h200), after ../shared/gpu's install.sh and scripts/gpu/install_ray.sh: issue 19's
# measurements (results/h200-real-models/README.md). One step per call:
#   MODE=packed   SmolLM2-135M, full HellaSwag x {hf,vllm} x {fp32,bf16,fp16}, default flags (the memory plan
#                 packs the cells on the one GPU): the whole `evalparity run`, timed
#   MODE=model    the random-weight 14B-shaped Llama (scripts/gpu/make_model.py) in /tmp/m14b
#   MODE=big      the 14B-shaped model, the 6-cell matrix on HellaSwag (LIMIT docs, default 100), default flags;
#                 TP=2 adds --tensor-parallel 2
#   MODE=graphs   the 14B-shaped model, vllm-bf16 on gsm8k (200 docs, greedy, 256 tokens), eager and with CUDA
#                 graphs; per-cell wall, load and eval times, and whether the generated token ids are identical
#   MODE=bare     SmolLM2-135M, full HellaSwag, fp32: benchmarks/bare_engine.py for BACKENDS (default hf), the
#                 bare engine against one cell alone on the same requests
#   MODE=profile  SmolLM2-135M, HellaSwag (LIMIT docs, default 2500), hf-fp32 and vllm-fp32 one at a time with
#                 EVALPARITY_PROFILE=1: each cell's profile.txt
#   MODE=identity the packed run's fp32 tables against the cells run alone by MODE=bare (same requests)
#   MODE=graphs-real  the embedded SmolLM2 (real weights), vllm-bf16 on gsm8k (200 docs, greedy, 256 tokens):
#                 eager, CUDA graphs, eager again; generated token ids of each pair compared (eager against
#                 eager is the noise floor)
#   MODE=prepare  `evalparity models prepare`: the embedded model's one-time GGUF conversion, timed apart
#   MODE=mps      MODE=packed with a CUDA MPS control daemon of this job's own (pipe and log dirs under /tmp,
#                 stopped at the end), so that the six processes' kernels may run at once: a measurement
#                 of what time-slicing costs, not something evalparity starts
# Steps leave $OUT/<mode>.tgz (spec, cell.json files, verdicts, report.md) and print a per-cell table.
set -uo pipefail
source .gpu/bin/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" EVALPARITY_CACHE=${EVALPARITY_CACHE:-/tmp/epcache}
mkdir -p "$EVALPARITY_CACHE/wheels"
cp -n /tmp/bundle/model/*.whl "$EVALPARITY_CACHE/wheels/" 2>/dev/null || true
MODE=${MODE:?MODE=packed, mps, prepare, model, big, graphs, bare, profile or identity}
BUDGET=${BUDGET:-560}
T0=$(date +%s)
EP=(python3 -m evalparity.cli)

table() {  # per cell: status, load/eval/wall s, peak GPU GiB, the memory plan's share, batch, eager
  python3 - "$1" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1], "cells").glob("*/cell.json")):
    m = json.loads(f.read_text())
    s = m.get("settings", {})
    plan = s.get("memory_plan") or {}
    t = {k: round(m[k], 1) for k in ("load_s", "eval_s", "wall_s") if k in m}
    print(f"{f.parent.name}: {m.get('status')} {t} peak_gpu={m.get('peak_gpu_gib')} "
          f"util={s.get('gpu_memory_utilization')} batch_tokens={plan.get('batch_tokens')} "
          f"batch={m.get('batch_size')} eager={s.get('enforce_eager')} probes={s.get('batch_probes')} "
          f"deferred={s.get('deferred_scoring')} {m.get('error', '')[:200]}")
    if m.get("phases"):
        print("   phases:", {k: round(v, 1) for k, v in m["phases"].items()})
PY
}

pack() {  # $1 run dir, $2 name
  [[ -n ${OUT:-} && -d $1 ]] && (cd "$1" && tar czf "$OUT/$2.tgz" spec.json run.json cells/*/cell.json \
    stats/verdicts.json stats/comparisons.parquet report/report.md 2>/dev/null; ls -la "$OUT" | tail -n +2)
}

case $MODE in
  bare)
    python3 benchmarks/bare_engine.py --model "$(python3 -c 'from evalparity.data import embedded; print(embedded.model_path())')" \
      --tasks hellaswag --datasets-dir .gpudata --device cuda --dtype fp32 --backends "${BACKENDS:-hf}" \
      --out /tmp/i19-bare 2>&1 | grep -v "it/s]" | tail -8
    [[ -n ${OUT:-} ]] && (cd /tmp && tar czf "$OUT/bare-$(echo "${BACKENDS:-hf}" | tr , -).tgz" i19-bare/bare_engine.json i19-bare/cell-*/cells/*/cell.json) ;;
  profile)
    for b in hf vllm; do
      RUN=/tmp/i19-profile-$b
      EVALPARITY_PROFILE=1 timeout "$(( BUDGET / 2 ))" "${EP[@]}" run --device cuda --tasks hellaswag \
        --limit "${LIMIT:-2500}" --num-fewshot 0 --datasets-dir .gpudata --backends $b --dtypes fp32 --single-cell \
        --no-fail-on-inconclusive --out "$RUN" > /dev/null 2>&1
      echo "profile $b: exit $?"; table "$RUN"
      [[ -n ${OUT:-} ]] && cp "$RUN/cells/$b-fp32/profile.txt" "$OUT/profile-$b.txt"
    done ;;
  identity)
    python3 - <<'PY'
import json, pandas as pd
for cell, alone in (("hf-fp32", "/tmp/i19-bare/cell-hf"), ("vllm-fp32", "/tmp/i19-bare/cell-vllm")):
    try:
        a = pd.read_parquet(f"{alone}/cells/{cell}/samples.parquet")
        b = pd.read_parquet(f"/tmp/i19-packed/cells/{cell}/samples.parquet")
    except OSError as err:
        print(cell, "missing:", err); continue
    ma, mb = (json.load(open(f"{d}/cells/{cell}/cell.json")) for d in (alone, "/tmp/i19-packed"))
    print(cell, "batch probes alone", ma["settings"].get("batch_probes"), "packed", mb["settings"].get("batch_probes"),
          "deferred scoring", ma["settings"].get("deferred_scoring"), mb["settings"].get("deferred_scoring"))
    j = a.merge(b, on=["task", "filter", "doc_id", "choice"], suffixes=("_alone", "_packed"))
    d = (j.loglikelihood_alone - j.loglikelihood_packed).abs()
    docs = j.groupby("doc_id").first()
    print(f"{cell}: {len(j)} requests, {(d == 0).sum()} bit-identical loglikelihoods, max |d| {d.max():.3g}, "
          f"mean |d| {d.mean():.3g}; acc differs on {(docs['m:acc_alone'] != docs['m:acc_packed']).sum()} of "
          f"{len(docs)} docs; batch alone {ma['settings'].get('memory_plan', {}).get('max_batch_size')} "
          f"packed {mb['settings'].get('memory_plan', {}).get('max_batch_size')}")
PY
    ;;
  graphs-real)
    for name in eager graphs eager2; do
      eager=True; [[ $name == graphs ]] && eager=False
      T1=$(date +%s)
      timeout 150 "${EP[@]}" run --device cuda --tasks gsm8k --limit 200 --max-gen-toks 256 --num-fewshot 0 \
        --backends vllm --dtypes bf16 --single-cell --datasets-dir .gpudata --vllm-args "enforce_eager=$eager" \
        --no-fail-on-inconclusive --out "/tmp/i19-gr-$name" > /dev/null 2>&1
      echo "graphs-real $name (enforce_eager=$eager): exit $? after $(( $(date +%s) - T1 )) s"; table "/tmp/i19-gr-$name"
      [[ -n ${OUT:-} ]] && (cd /tmp && tar czf "$OUT/graphs-real-$name.tgz" "i19-gr-$name/run.json" \
        i19-gr-$name/cells/*/cell.json i19-gr-$name/cells/*/samples.parquet 2>/dev/null)
    done
    python3 - <<'PY'
import pandas as pd
runs = {}
for n in ("eager", "graphs", "eager2"):
    try:
        runs[n] = pd.read_parquet(f"/tmp/i19-gr-{n}/cells/vllm-bf16/samples.parquet")
    except OSError:
        print(n, "missing")
for a, b in (("eager", "eager2"), ("eager", "graphs")):
    if a not in runs or b not in runs:
        continue
    j = runs[a].merge(runs[b], on=["task", "filter", "doc_id", "choice"], suffixes=("_a", "_b"))
    same = [x is not None and y is not None and list(x) == list(y)
            for x, y in zip(j["generated_ids_a"], j["generated_ids_b"])]
    em = [c for c in j.columns if c.startswith("m:exact_match") and c.endswith("_a")]
    diff = {c[:-2]: int((j[c] != j[c[:-2] + "_b"]).sum()) for c in em}
    print(f"{a} vs {b}: {sum(same)} of {len(same)} rows identical token ids; exact_match differs on {diff}; "
          f"mean length {j['generated_ids_a'].dropna().map(len).mean():.0f} tokens")
PY
    ;;
  prepare)
    "${EP[@]}" models prepare; echo "prepare: exit $? after $(( $(date +%s) - T0 )) s" ;;
  packed|mps)
    RUN=/tmp/i19-$MODE
    if [[ $MODE == mps ]]; then
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "MPS daemon started" || { echo "no MPS here"; exit 1; }
    fi
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
      > "${OUT:-/tmp}/gpu-util-$MODE.csv" 2>/dev/null & SMI=$!
    T1=$(date +%s)
    timeout "$BUDGET" "${EP[@]}" run --device cuda --tasks hellaswag --num-fewshot 0 --datasets-dir .gpudata \
      --no-fail-on-inconclusive --out "$RUN"
    echo "$MODE: exit $? after $(( $(date +%s) - T1 )) s"; kill $SMI 2>/dev/null
    [[ $MODE == mps ]] && { echo quit | nvidia-cuda-mps-control; echo "MPS daemon stopped"; }
    table "$RUN"; pack "$RUN" "$MODE" ;;
  model)
    python3 scripts/gpu/make_model.py /tmp/m14b --shape qwen2.5-14b
    du -sh /tmp/m14b; df -h /tmp | tail -1 ;;
  big)  # TP=2: --tensor-parallel 2 (both GPUs of nvidia-h200-x2 per cell)
    RUN=/tmp/i19-big${TP:+-tp$TP}
    timeout "$BUDGET" "${EP[@]}" run --device cuda --model /tmp/m14b --tasks hellaswag --limit "${LIMIT:-100}" \
      --num-fewshot 0 --datasets-dir .gpudata --no-fail-on-inconclusive ${TP:+--tensor-parallel "$TP"} --out "$RUN"
    echo "big${TP:+ TP=$TP}: exit $? after $(( $(date +%s) - T0 )) s"; table "$RUN"; pack "$RUN" "big${TP:+-tp$TP}" ;;
  graphs)
    for eager in True False; do
      RUN=/tmp/i19-graphs-$eager
      T1=$(date +%s)
      timeout "$(( BUDGET / 2 ))" "${EP[@]}" run --device cuda --model /tmp/m14b --tasks gsm8k --limit 200 \
        --max-gen-toks 256 --num-fewshot 0 --backends vllm --dtypes bf16 --single-cell --datasets-dir .gpudata \
        --vllm-args "enforce_eager=$eager" --no-fail-on-inconclusive --out "$RUN"
      echo "graphs enforce_eager=$eager: exit $? after $(( $(date +%s) - T1 )) s"; table "$RUN"
    done
    python3 - <<'PY'
import pandas as pd
a = pd.read_parquet("/tmp/i19-graphs-True/cells/vllm-bf16/samples.parquet")
b = pd.read_parquet("/tmp/i19-graphs-False/cells/vllm-bf16/samples.parquet")
j = a.merge(b, on=["task", "filter", "doc_id", "choice"], suffixes=("_eager", "_graphs"))
same = [list(x) == list(y) if x is not None and y is not None else None
        for x, y in zip(j["generated_ids_eager"], j["generated_ids_graphs"])]
n = sum(s is not None for s in same)
print(f"generations: {sum(bool(s) for s in same)} of {n} identical token ids, eager vs CUDA graphs; "
      f"mean length {j['generated_ids_eager'].dropna().map(len).mean():.0f} tokens")
PY
    [[ -n ${OUT:-} ]] && (cd /tmp && tar czf "$OUT/graphs.tgz" i19-graphs-*/cells/*/cell.json i19-graphs-*/run.json) ;;
esac
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
echo "step $MODE: $(( $(date +%s) - T0 )) s"
