"""Bytes each training step sends over each dimension of the layout, counted
by tandem's process groups, against the analytic figure of each parallelism.

    bench/mesh_traffic.sh            (sets up and builds, then runs this)
    python bench/mesh_traffic.py TANDEM

A 4-rank job cannot be timed meaningfully on a machine of 2 cores, but what
it sends is deterministic. tandem's process groups count the payload every
collective is handed on each rank (Note [traffic] in dist/process_group.h),
and `tandem train --metrics-out` records rank 0's per step, by dimension and
collective (comm_bytes_per_step). This runs mlp (float64, global batch 32,
4 micro-batches) under DDP, ZeRO-1, FSDP (ZeRO-3 and ZeRO-2), a pipeline over
2 ranks, and dp=2 x pp=2 (DDP with 1F1B and interleaved, FSDP with 1F1B), and
computes from the model's tensor shapes (read from the run's exported
weights) what each should send:

  DDP       all_reduce: the stage's gradient bytes, plus one int32 used-flag
            per parameter tensor (Note [unused parameters])
  ZeRO-1    DDP's, plus a broadcast of every parameter byte by its owner
  FSDP      reduce_scatter: every unit's whole gradient; all_gather: each
            unit's shard (each parameter's ceil(rows / n) rows), twice with ZeRO-3 (forward, and again for
            backward) but once for the last unit, kept between them; once
            with ZeRO-2, and once a step for a pipeline's stage (gathered
            over all its micro-batches)
  pipeline  send and recv: per micro-batch, each piece boundary's activation
            (forward) and its gradient (backward), each after an 80-byte
            header (Note [pipeline messages]); broadcast: the loss (8 bytes)

Rank 0 holds stage 0 (pieces 0 and 2 when interleaved). It prints each
figure, the analytic one and their ratio (the goal: exactly 1), and the
bytes a ring algorithm puts on the wire for it: 2(n-1)/n of an all-reduce's
payload, (n-1)/n of a reduce-scatter's input, (n-1) times an all-gather's.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from safetensors.numpy import load_file

BATCH, MICRO, ELEM, HEADER = 32, 4, 8, 80


def write_idx(folder, train, test):
    os.makedirs(folder, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        with open(f"{folder}/{prefix}-images-idx3-ubyte", "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes((i * 7 + j) % 256 for i in range(n) for j in range(784)))
        with open(f"{folder}/{prefix}-labels-idx1-ubyte", "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))


def train(tandem, data, out, flags):
    metrics, weights = f"{out}/m.jsonl", f"{out}/w.safetensors"
    command = [tandem, "train", "--data", f"idx:{data}", "--model", "mlp", "--dtype", "float64", "--batch-size",
               str(BATCH), "--max-steps", "3", "--epochs", "1", "--progress", "off", "--metrics-out", metrics,
               "--export-weights", weights] + flags
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{run.stdout}{run.stderr}")
    with open(metrics) as f:
        record = json.loads(f.read().splitlines()[-1])
    return record.get("comm_bytes_per_step", {}), load_file(weights)


def analytic(case, w):
    layers = ["fc1", "fc2", "fc3"]
    numel = {l: w[f"{l}.weight"].size + w[f"{l}.bias"].size for l in layers}
    width = {l: w[f"{l}.weight"].shape[0] for l in layers}  # a layer's output features
    rows = BATCH // case["dp"] // MICRO  # rows of a micro-batch
    mine = case.get("stage0", layers)  # the layers with parameters on rank 0
    grad = sum(numel[l] for l in mine) * ELEM
    flags = 4 * 2 * len(mine)  # a weight and a bias per layer
    want = {}
    if case["dp"] > 1:
        n = case["dp"]
        if case.get("fsdp"):
            # Each parameter's rows cut over the n ranks, a rank's chunk ceil(rows / n) rows (FSDP2's layout).
            shards = [sum(-(-w[f"{l}.{p}"].shape[0] // n) * (w[f"{l}.{p}"].size // w[f"{l}.{p}"].shape[0]) * ELEM
                          for p in ("weight", "bias")) for l in mine]
            # ZeRO-2, and a pipeline's stage (gathered once a step): each shard once.
            gathers = sum(shards) if case["fsdp"] in ("grad-op", "pipeline") else 2 * sum(shards) - shards[-1]
            want["dp"] = {"all_gather": gathers, "reduce_scatter": grad}
        else:
            want["dp"] = {"all_reduce": grad + flags}
            if case.get("zero"):
                want["dp"]["broadcast"] = grad
    if case.get("boundaries"):  # each of rank 0's boundaries, one activation and one gradient per micro-batch
        msg = sum(MICRO * (HEADER + rows * width[b] * ELEM) for b in case["boundaries"])
        want["pp"] = {"send": msg, "recv": msg, "broadcast": 8}
    return want


def on_wire(collective, payload, n):
    return {"all_reduce": 2 * (n - 1) / n * payload, "reduce_scatter": (n - 1) / n * payload,
            "all_gather": (n - 1) * payload}.get(collective, payload)


CASES = [
    {"name": "DDP, dp=2", "flags": ["--nproc-per-node", "2"], "dp": 2},
    {"name": "DDP + ZeRO-1, dp=2", "flags": ["--nproc-per-node", "2", "--shard-optimizer"], "dp": 2, "zero": True},
    {"name": "FSDP ZeRO-3, dp=2", "flags": ["--nproc-per-node", "2", "--strategy", "fsdp", "--fsdp-min-unit-params",
                                          "0"], "dp": 2, "fsdp": "full"},
    {"name": "FSDP ZeRO-2, dp=2", "flags": ["--nproc-per-node", "2", "--strategy", "fsdp", "--fsdp-min-unit-params",
                                          "0", "--fsdp-sharding", "grad-op"], "dp": 2, "fsdp": "grad-op"},
    {"name": "pipeline 1F1B, pp=2", "flags": ["--nproc-per-node", "2", "--strategy", "pipeline", "--pipeline-split",
                                            "relu1"], "dp": 1, "stage0": ["fc1"], "boundaries": ["fc1"]},
    {"name": "DDP x 1F1B, dp=2,pp=2", "flags": ["--nproc-per-node", "4", "--mesh", "dp=2,pp=2", "--pipeline-split",
                                              "relu1"], "dp": 2, "stage0": ["fc1"], "boundaries": ["fc1"]},
    {"name": "FSDP x 1F1B, dp=2,pp=2", "flags": ["--nproc-per-node", "4", "--mesh", "dp=2,pp=2", "--strategy", "fsdp",
                                               "--fsdp-min-unit-params", "0", "--pipeline-split", "relu1"],
     "dp": 2, "fsdp": "pipeline", "stage0": ["fc1"], "boundaries": ["fc1"]},
    # Pieces flatten..fc1 | relu1 | fc2 | relu2..fc3: rank 0 runs pieces 0 and 2, so it sends fc1's
    # output and fc2's forward, and relu1's output's gradient backward (relu1 keeps fc1's width).
    {"name": "DDP x interleaved, dp=2,pp=2", "flags": ["--nproc-per-node", "4", "--mesh", "dp=2,pp=2", "--schedule",
                                                     "interleaved", "--pipeline-split", "relu1,fc2,relu2"],
     "dp": 2, "stage0": ["fc1", "fc2"], "boundaries": ["fc1", "fc1", "fc2"]},
]


def main():
    tandem = sys.argv[1]
    failures = 0
    print(f"{'layout':32} {'dim':3} {'collective':14} {'measured B/step':>16} {'analytic':>12} {'ratio':>9}"
          f" {'ring on wire':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        write_idx(f"{tmp}/data", 256, 32)
        for case in CASES:
            measured, weights = train(tandem, f"{tmp}/data", tmp, case["flags"])
            want = analytic(case, weights)
            for dim in sorted(set(measured) | set(want)):
                for collective in sorted(set(measured.get(dim, {})) | set(want.get(dim, {}))):
                    got = measured.get(dim, {}).get(collective, 0)
                    expected = want.get(dim, {}).get(collective, 0)
                    ratio = got / expected if expected else float("nan")
                    failures += got != expected
                    n = case["dp"] if dim == "dp" else 2
                    print(f"{case['name']:32} {dim:3} {collective:14} {got:16.0f} {expected:12.0f} {ratio:9.6f}"
                          f" {on_wire(collective, got, n):13.0f}")
    print(f"\n{'all figures equal the analytic ones' if failures == 0 else f'{failures} figure(s) differ'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
