#!/usr/bin/env bash
# Runs on the lent H200 through the device tool, from the repo root.
#   step 1 (carry .whl/a):              bash benchmarks/h200.sh stash
#   step 2 (carry .whl/b, .whl/c and .bench):   bash benchmarks/h200.sh setup [SIZE...]
#   step 3 (machine still warm):        bash benchmarks/h200.sh bench NAME SIZE [serve_bench args]
#   or (machine still warm):          bash benchmarks/h200.sh adapters NAME SIZE [adapters_bench args]
#     8 streams on 8 random rank-16 LoRA adapters vs 8 on one vs 8 on none, mlxspec and
#     mlx_lm.server's per-request adapters (--preset h200: under 8 minutes; $OUT/NAME.json
#     rewritten after every cell, the servers' logs beside it)
#   or (machine still warm):          bash benchmarks/h200.sh overhead NAME SIZE [stream_overhead args]
#     per-token wall time of one stream at each layer (stream_generate, engine, ASGI, serve)
#   or (carry .whl/py, the py-spy wheel): bash benchmarks/h200.sh profile SIZE [full]
#     serve + 40 bursts of 8 streams (burst_ttft.py) + py-spy (GIL-holders, then all threads);
#     `full` reads every stream to its end (sustained decode at 8 rows) instead of the first token
# Wheels are staged here by ../shared/gpu/stage-mlx-cuda.sh (see ../shared/gpu/README.md);
# .bench/tok holds tokenizer files of the converted embedded model.
set -euo pipefail
SITE=/tmp/site
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
case "$1" in
  stash)
    mkdir -p /tmp/wa && cp .whl/a/part_* /tmp/wa/ && nvidia-smi -L ;;
  setup)
    whl=/tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
    cat /tmp/wa/part_* .whl/b/part_* > "$whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE "$whl" .whl/b/*.whl
    # .whl/c: the server's pure-Python extras (pydantic for openapi-spec-validator,
    # prometheus_client); carry it with .whl/b when present
    if [ -d .whl/c ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/c/*.whl; fi
    python3 -c "import mlx.core as mx; print(mx.default_device(), mx.__version__)"
    shift; for size in ${@:-1b 8b}; do  # sizes to build: default both
      [ -f /tmp/rand$size/config.json ] || python3 benchmarks/make_random_model.py /tmp/rand$size --size $size --tokenizer-from .bench/tok
    done
    df -h /tmp | tail -1 ;;
  bench)
    name=$2 size=$3; shift 3
    python3 benchmarks/serve_bench.py --model /tmp/rand$size --name "$name" "$@"
    mkdir -p "$OUT" && cp benchmarks/results/"$name".* "$OUT"/ ;;
  adapters)
    name=$2 size=$3; shift 3; mkdir -p "$OUT"
    # the script stops starting cells at 360 s (--budget-s); timeout is the backstop
    timeout -k 20 -s INT 470 python3 benchmarks/adapters_bench.py --preset h200 \
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
esac
