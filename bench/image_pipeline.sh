#!/usr/bin/env bash
# Input-pipeline throughput, tandem's loader against torchvision's
# ImageFolder/CIFAR + DataLoader (same wheel set, same files, same transforms,
# same number of workers: threads for tandem, processes for PyTorch),
# interleaved in one run.
#
#   bench/image_pipeline.sh [ROUNDS]        (default 3 rounds per pair)
#
# Data (made once, under $TANDEM_CACHE/bench-data): 10,000 CIFAR-10 binary
# records, and an ImageFolder of 640 photo-like JPEGs of about 500 x 375
# (quality 90). Prints median images/s for all workers and per worker, and
# the ratio. The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/image_pipeline.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-3}
data=$cache/bench-data
if [ ! -f "$data/cifar/test_batch.bin" ]; then
  "$py" "$repo/bench/image_pipeline.py" make-cifar "$data/cifar" 2000
fi
if [ ! -d "$data/folder/class015" ]; then
  rm -rf "$data/folder"
  "$py" "$repo/bench/image_pipeline.py" make-folder "$data/folder.tmp" 16 40 500 375
  mv "$data/folder.tmp" "$data/folder"
fi

ips() { grep -o '"images_per_second": [0-9.]*' | awk '{print $2}'; }

run_case() {
  local label=$1 workers=$2; shift 2
  local t=() p=()
  for ((i = 0; i < rounds; i++)); do
    t+=($("$build/bench/image_pipeline" "$@" --workers "$workers" | ips))
    p+=($("$py" -W ignore "$repo/bench/image_pipeline.py" run "$@" --workers "$workers" | ips))
  done
  local tm pm
  tm=$(printf '%s\n' "${t[@]}" | median)
  pm=$(printf '%s\n' "${p[@]}" | median)
  printf '%-40s %d  tandem %8.1f (%7.1f/worker)  torchvision %7.1f (%6.1f/worker)  ratio %5.2f\n' \
    "$label" "$workers" "$tm" "$(awk -v a="$tm" -v w="$workers" 'BEGIN {print a / w}')" \
    "$pm" "$(awk -v a="$pm" -v w="$workers" 'BEGIN {print a / w}')" \
    "$(awk -v a="$tm" -v b="$pm" 'BEGIN {print a / b}')"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch $("$py" -c 'import torch, torchvision; print(torch.__version__, "torchvision", torchvision.__version__)' 2>/dev/null); images/s, median of $rounds"
printf '%-40s %s\n' "case" "workers"
for w in 1 2; do
  run_case "cifar10, cifar recipe, 32 px, batch 256" $w \
    --data "cifar10:$data/cifar" --augment cifar --image-size 32 --batch 256 --batches 30
  run_case "cifar10, cifar recipe, 112 px, batch 64" $w \
    --data "cifar10:$data/cifar" --augment cifar --image-size 112 --batch 64 --batches 30
  run_case "imagefolder JPEG, imagenet, 224, batch 32" $w \
    --data "imagefolder:$data/folder" --augment imagenet --image-size 224 --batch 32 --batches 16
  run_case "imagefolder JPEG, heavy (seed 002), 224, b 32" $w \
    --data "imagefolder:$data/folder" --augment heavy --image-size 224 --batch 32 --batches 16
done
