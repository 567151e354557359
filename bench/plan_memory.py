"""tandem plan's predicted peak bytes a rank against tandem train's measured
peak (--count-memory, rank 0: the first pipeline stage), layout by layout.

    bench/plan_memory.sh            (sets up and builds, then runs this)
    python bench/plan_memory.py TANDEM

Each language-model layout trains 3 steps of 16 sequences of 64 tokens
(float32, SGD with momentum) on a text of 20,000 bytes, each image layout 3
steps of 64 CIFAR-10 images, and the planner is asked for the same job on
the `cpu` profile; the ratio predicted / measured is printed (the goal:
within 10%), and for the images whether the bytes a step are the counted
ones.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

SEQ, BATCH = 64, 16
LAYOUTS = [  # model, ranks, train flags, the planner's strategy, sequence parallel, micro-batches
    ("llama-tiny", 2, "--mesh dp=2", "ddp", False, 1),
    ("llama-tiny", 2, "--mesh dp=2 --shard-optimizer", "zero1", False, 1),
    ("llama-tiny", 2, "--mesh dp=2 --strategy fsdp", "fsdp", False, 1),
    ("llama-tiny", 2, "--mesh tp=2", "ddp", False, 1),
    ("llama-tiny", 2, "--mesh tp=2 --sequence-parallel", "ddp", True, 1),
    ("llama-tiny", 2, "--mesh pp=2 --micro-batches 2", "ddp", False, 2),
    ("llama-tiny", 2, "--mesh pp=2 --micro-batches 4", "ddp", False, 4),
    ("llama-tiny", 2, "--mesh pp=2 --micro-batches 8", "ddp", False, 8),
    ("llama-tiny", 4, "--mesh dp=4", "ddp", False, 1),
    ("llama-tiny", 4, "--mesh dp=4 --strategy fsdp", "fsdp", False, 1),
    ("llama-tiny", 4, "--mesh dp=2,tp=2", "ddp", False, 1),
    ("llama-tiny", 4, "--mesh pp=2,dp=2", "ddp", False, 4),
    ("llama-tiny", 4, "--mesh pp=2,tp=2 --micro-batches 2", "ddp", False, 2),
    ("gpt2-tiny", 2, "--mesh dp=2", "ddp", False, 1),
    ("gpt2-tiny", 2, "--mesh dp=2 --shard-optimizer", "zero1", False, 1),
    ("gpt2-tiny", 2, "--mesh dp=2 --strategy fsdp", "fsdp", False, 1),
    ("gpt2-tiny", 2, "--mesh tp=2", "ddp", False, 1),
    ("gpt2-tiny", 2, "--mesh tp=2 --sequence-parallel", "ddp", True, 1),
    ("gpt2-tiny", 4, "--mesh dp=2,tp=2", "ddp", False, 1),
    ("gpt2-tiny", 4, "--mesh dp=4 --strategy fsdp", "fsdp", False, 1),
    ("llama-tiny", 2, "--mesh cp=2", "ddp", False, 1),
    ("llama-tiny", 4, "--mesh dp=2,cp=2", "ddp", False, 1),
    ("llama-tiny", 4, "--mesh cp=4", "ddp", False, 1),
    ("gpt2-tiny", 4, "--mesh cp=2,tp=2", "ddp", False, 1),
    ("mixtral-tiny", 2, "--mesh dp=2", "ddp", False, 1),
    ("mixtral-tiny", 2, "--mesh dp=2,ep=2", "ddp", False, 1),
    ("mixtral-tiny", 4, "--mesh dp=4,ep=2", "ddp", False, 1),
    ("mixtral-tiny", 4, "--mesh dp=4,ep=4", "ddp", False, 1),
]


# Image classifiers on a CIFAR-10 of 640 random images (3 MB, counted in the
# measured peak only), 64 a step: model, ranks, train flags, the planner's
# flags and strategy, micro-batches.
IMAGE_BATCH = 64
IMAGE_LAYOUTS = [
    ("resnet18", 2, "--mesh dp=2", "--gpus-per-node 2", "ddp", 1),
    ("resnet18", 2, "--mesh dp=2 --strategy fsdp", "--gpus-per-node 2", "fsdp", 1),
    ("resnet18", 2, "--mesh dp=2 --shard-optimizer", "--gpus-per-node 2", "zero1", 1),
    ("resnet18", 2, "--mesh dp=2 --grad-accum 4", "--gpus-per-node 2", "ddp", 4),
    ("resnet18", 4, "--mesh dp=4", "--gpus-per-node 4", "ddp", 1),
    ("resnet18", 4, "--mesh dp=4 --strategy fsdp", "--gpus-per-node 4", "fsdp", 1),
    ("resnet18", 4, "--mesh dp_replicate=2,dp_shard=2 --strategy fsdp", "--nodes 2 --gpus-per-node 2", "hsdp", 1),
    ("convnet", 2, "--mesh dp=2", "--gpus-per-node 2", "ddp", 1),
    ("convnet", 2, "--mesh dp=2 --strategy fsdp", "--gpus-per-node 2", "fsdp", 1),
]


def write_cifar(folder, train=128, test=64):
    """A CIFAR-10 of 5 x `train` training images and `test` test images, random."""
    rng = random.Random(0)
    os.makedirs(folder)
    for name, count in [(f"data_batch_{b}.bin", train) for b in range(1, 6)] + [("test_batch.bin", test)]:
        with open(os.path.join(folder, name), "wb") as f:
            for _ in range(count):
                f.write(bytes([rng.randrange(10)]) + bytes(rng.randrange(256) for _ in range(3072)))


def measure(tandem, tmp, args):
    """tandem train ARGS with --count-memory: rank 0's last metrics line."""
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    run = subprocess.run([tandem, "train", "--max-steps", "3", "--epochs", "1", "--progress", "off",
                          "--count-memory", "--metrics-out", metrics] + args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(args)}: {run.stderr[-500:]}")
    with open(metrics) as f:
        return json.loads(f.read().splitlines()[-1])


def main():
    tandem = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    within = 0
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(os.path.join(here, "..", "README.md"), "rb") as f:
            data = f.read()
        with open(text, "wb") as f:
            f.write((data * 4)[:20000])
        print(f"{'model':12} {'layout':40} {'measured MB':>12} {'predicted MB':>13} {'ratio':>6}")
        for model, ranks, flags, strategy, sp, micro in LAYOUTS:
            metrics = os.path.join(tmp, "m.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            run = subprocess.run([tandem, "train", "--model", model, "--data", f"text:{text}", "--seq-len", str(SEQ),
                                  "--batch-size", str(BATCH), "--max-steps", "3", "--epochs", "1", "--progress", "off",
                                  "--optimizer", "sgd", "--nproc-per-node", str(ranks), "--count-memory",
                                  "--metrics-out", metrics]
                                 + flags.split(), capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"{model} {flags}: {run.stderr[-500:]}")
            with open(metrics) as f:
                measured = json.loads(f.read().splitlines()[-1])["peak_memory_bytes"]
            mesh = flags.split()[1]
            plan = subprocess.run([tandem, "plan", "--model", model, "--vocab-size", "256", "--seq-len", str(SEQ),
                                   "--batch-size", str(BATCH), "--precision", "float32", "--optimizer", "sgd",
                                   "--device", "cpu", "--gpus-per-node", str(ranks), "--mesh", mesh, "--json"],
                                  capture_output=True, text=True, check=True)
            layout = next(l for l in json.loads(plan.stdout)["layouts"]
                          if l["strategy"] == strategy and l["sequence_parallel"] == sp and
                          not l["activation_checkpointing"] and l["micro_batches"] == micro)
            predicted = layout["memory_bytes_by_stage"][0]
            ratio = predicted / measured
            within += abs(ratio - 1) <= 0.10
            print(f"{model:12} {flags:40} {measured / 1e6:12.2f} {predicted / 1e6:13.2f} {ratio:6.3f}")
        cifar = os.path.join(tmp, "cifar")
        write_cifar(cifar)
        for model, ranks, flags, plan_flags, strategy, micro in IMAGE_LAYOUTS:
            measured = measure(tandem, tmp, ["--model", model, "--data", f"cifar10:{cifar}", "--batch-size",
                                             str(IMAGE_BATCH), "--nproc-per-node", str(ranks)] + flags.split())
            mesh = flags.split()[1]
            plan = subprocess.run([tandem, "plan", "--model", model, "--channels", "3", "--image-size", "32",
                                   "--classes", "10", "--batch-size", str(IMAGE_BATCH), "--precision", "float32",
                                   "--optimizer", "sgd", "--device", "cpu", "--mesh", mesh, "--json"]
                                  + plan_flags.split(), capture_output=True, text=True, check=True)
            layout = next(l for l in json.loads(plan.stdout)["layouts"]
                          if l["strategy"] == strategy and l["micro_batches"] == micro)
            predicted = layout["memory_bytes_by_stage"][0]
            ratio = predicted / measured["peak_memory_bytes"]
            within += abs(ratio - 1) <= 0.10
            same = layout["bytes_per_step_by_stage"][0] == measured.get("comm_bytes_per_step")
            print(f"{model:12} {flags:40} {measured['peak_memory_bytes'] / 1e6:12.2f} {predicted / 1e6:13.2f} "
                  f"{ratio:6.3f}  bytes a step {'equal' if same else 'DIFFER'}")
    print(f"\n{within} of {len(LAYOUTS) + len(IMAGE_LAYOUTS)} layouts within 10%")


if __name__ == "__main__":
    main()
