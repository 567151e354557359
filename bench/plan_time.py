"""tandem plan's predicted tokens/s against tandem train's measured, layout
by layout, on a profile of this machine that tandem plan --calibrate makes
first.

    bench/plan_time.sh            (sets up and builds, then runs this)
    python bench/plan_time.py TANDEM

Each language-model layout trains 4 epochs of about 11 steps of 16
sequences of 64 tokens (float32, AdamW) on a text of 12,288 bytes, each
resnet18 layout 4 epochs of 10 steps of 16 random CIFAR-10 images; the
measured figure is the median of the last three epochs' tokens/s or
images/s (the first warms up). The planner is asked for the same job on
the profile calibrated with that kind of model (llama-tiny's, resnet18's);
the ratio measured / predicted is printed (the goal: within 25%) with
the range of the epochs, then, for each job (model and ranks), the three
fastest layouts as measured and as predicted: the same; the same but for
pairs the planner swaps whose epochs overlap (the run's own spread does
not order them); or different.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from plan_memory import write_cifar

SEQ, BATCH, STEPS, EPOCHS = 64, 16, 12, 4
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
    ("llama-tiny", 4, "--mesh pp=2,dp=2 --micro-batches 1", "ddp", False, 1),
    ("llama-tiny", 4, "--mesh pp=2,dp=2 --micro-batches 4", "ddp", False, 4),
    ("llama-tiny", 4, "--mesh pp=2,tp=2 --micro-batches 2", "ddp", False, 2),
    ("gpt2-tiny", 2, "--mesh dp=2", "ddp", False, 1),
    ("gpt2-tiny", 2, "--mesh dp=2 --strategy fsdp", "fsdp", False, 1),
    ("gpt2-tiny", 2, "--mesh tp=2", "ddp", False, 1),
    ("gpt2-tiny", 2, "--mesh pp=2 --micro-batches 4", "ddp", False, 4),
]


# resnet18 on a CIFAR-10 of 160 random images (plan_memory.write_cifar),
# 16 a step (10 steps an epoch), planned on a profile calibrated with
# resnet18 (a convolution reaches another share of the peak than a small
# product): model, ranks, train flags, the planner's strategy,
# micro-batches.
IMAGE_BATCH = 16
IMAGE_LAYOUTS = [
    ("resnet18", 2, "--mesh dp=2", "ddp", 1),
    ("resnet18", 2, "--mesh dp=2 --shard-optimizer", "zero1", 1),
    ("resnet18", 2, "--mesh dp=2 --strategy fsdp", "fsdp", 1),
    ("resnet18", 2, "--mesh dp=2 --grad-accum 2", "ddp", 2),
    ("resnet18", 4, "--mesh dp=4", "ddp", 1),
    ("resnet18", 4, "--mesh dp=4 --strategy fsdp", "fsdp", 1),
]


def measured_rate(tandem, data, model, ranks, flags, tmp, batch, unit):
    """The median, least and most of epochs 2-4's tokens/s or images/s (unit)."""
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    run = subprocess.run([tandem, "train", "--model", model, "--data", data, "--batch-size", str(batch),
                          "--epochs", str(EPOCHS), "--progress", "off", "--nproc-per-node", str(ranks),
                          "--metrics-out", metrics] + flags.split(), capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{model} {flags}: {run.stderr[-800:]}")
    with open(metrics) as f:
        rates = [json.loads(line)[unit] for line in f.read().splitlines() if line][1:]
    return statistics.median(rates), min(rates), max(rates)


def planned_rate(tandem, profile, model, ranks, flags, job_flags, unit, pick):
    mesh = flags.split()[1]
    plan = subprocess.run([tandem, "plan", "--model", model, "--precision", "float32", "--optimizer", "adamw",
                           "--device", profile, "--gpus-per-node", str(ranks), "--mesh", mesh, "--json"] + job_flags,
                          capture_output=True, text=True, check=True)
    return next(l for l in json.loads(plan.stdout)["layouts"] if pick(l))[unit]


def calibrate(tandem, profile, args):
    cal = subprocess.run([tandem, "plan", "--calibrate", profile] + args, capture_output=True, text=True)
    if cal.returncode != 0:
        sys.exit(f"tandem plan --calibrate: {cal.stderr[-800:]}")
    print(cal.stderr.strip())
    print(cal.stdout.strip())
    with open(profile) as f:
        print(f.read().strip())


def main():
    tandem = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        profile, image_profile = os.path.join(tmp, "cpu.json"), os.path.join(tmp, "cpu-resnet18.json")
        calibrate(tandem, profile, [])
        text = os.path.join(tmp, "text.txt")
        with open(os.path.join(here, "..", "README.md"), "rb") as f:
            data = f.read()
        with open(text, "wb") as f:
            f.write((data * 4)[:SEQ * BATCH * STEPS])
        print(f"\n{'model':11} {'ranks':>5} {'layout':40} {'measured /s':>12} {'predicted':>10} {'ratio':>6}"
              f"  epochs 2-4")
        rows = []

        def report(model, ranks, flags, measured, predicted):
            rows.append((model, ranks, flags, measured[0], predicted, measured[1], measured[2]))
            print(f"{model:11} {ranks:5} {flags:40} {measured[0]:12.1f} {predicted:10.1f} "
                  f"{measured[0] / predicted:6.3f}  {measured[1]:.1f}-{measured[2]:.1f}", flush=True)

        for model, ranks, flags, strategy, sp, micro in LAYOUTS:
            measured = measured_rate(tandem, f"text:{text}", model, ranks, flags + f" --seq-len {SEQ}", tmp, BATCH,
                                     "tokens_per_second")
            predicted = planned_rate(
                tandem, profile, model, ranks, flags,
                ["--vocab-size", "256", "--seq-len", str(SEQ), "--batch-size", str(BATCH)], "tokens_per_second",
                lambda l: l["strategy"] == strategy and l["sequence_parallel"] == sp and
                not l["activation_checkpointing"] and l["micro_batches"] == micro)
            report(model, ranks, flags, measured, predicted)
        print("\n(images/s below)\n")
        calibrate(tandem, image_profile, ["--model", "resnet18", "--image-size", "32"])
        cifar = os.path.join(tmp, "cifar")
        write_cifar(cifar, train=32, test=16)
        for model, ranks, flags, strategy, micro in IMAGE_LAYOUTS:
            measured = measured_rate(tandem, f"cifar10:{cifar}", model, ranks, flags, tmp, IMAGE_BATCH,
                                     "images_per_second")
            predicted = planned_rate(
                tandem, image_profile, model, ranks, flags,
                ["--channels", "3", "--image-size", "32", "--classes", "10", "--batch-size", str(IMAGE_BATCH)],
                "images_per_second", lambda l: l["strategy"] == strategy and l["micro_batches"] == micro)
            report(model, ranks, flags, measured, predicted)
    within = sum(abs(r[3] / r[4] - 1) <= 0.25 for r in rows)
    print(f"\n{within} of {len(rows)} layouts within 25%")
    for job in sorted({(r[0], r[1]) for r in rows}):
        mine = [r for r in rows if (r[0], r[1]) == job]
        by_measured = [r[2] for r in sorted(mine, key=lambda r: -r[3])][:3]
        by_predicted = [r[2] for r in sorted(mine, key=lambda r: -r[4])][:3]
        print(f"{job[0]} on {job[1]} ranks, fastest three measured: {by_measured}; predicted: {by_predicted} "
              f"({ranking(mine, by_measured, by_predicted)})")


def ranking(rows, by_measured, by_predicted):
    """same; or, where the planner orders two layouts of the fastest three
    the other way round from the medians, whether each such pair's epochs
    overlap (the runs' own spread cannot order them) or not."""
    if by_measured == by_predicted:
        return "same"
    top = set(by_measured) | set(by_predicted)
    swapped = [(a, b) for a in rows for b in rows
               if (a[2] in top or b[2] in top) and a[3] > b[3] and a[4] < b[4]]
    apart = [(a, b) for a, b in swapped if a[5] > b[6]]  # a's slowest epoch faster than b's fastest
    if apart:
        return "DIFFERENT: " + ", ".join(f"{a[2]} over {b[2]}" for a, b in apart)
    return "same but for " + ", ".join(f"{a[2]} and {b[2]}" for a, b in swapped) + ", whose epochs overlap"


if __name__ == "__main__":
    main()
