"""tandem plan's predicted tokens/s against tandem train's measured, layout
by layout, on a profile of this machine that tandem plan --calibrate makes
first.

    bench/plan_time.sh            (sets up and builds, then runs this)
    python bench/plan_time.py TANDEM

Each layout trains 4 epochs of about 11 steps of 16 sequences of 64 tokens
(float32, AdamW) on a text of 12,288 bytes; the measured figure is the
median of the last three epochs' tokens/s (the first warms up). The
planner is asked for the same job on the calibrated profile; the ratio
measured / predicted is printed (the goal: within 25%), then, for each job
(model and ranks), the three fastest layouts as measured and as predicted.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

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


def measured_tokens_per_second(tandem, text, model, ranks, flags, tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    run = subprocess.run([tandem, "train", "--model", model, "--data", f"text:{text}",
                          "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--epochs", str(EPOCHS),
                          "--progress", "off", "--nproc-per-node", str(ranks), "--metrics-out", metrics]
                         + flags.split(), capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{model} {flags}: {run.stderr[-800:]}")
    with open(metrics) as f:
        epochs = [json.loads(line) for line in f.read().splitlines() if line]
    return statistics.median(e["tokens_per_second"] for e in epochs[1:])


def predicted_tokens_per_second(tandem, profile, model, ranks, flags, strategy, sp, micro):
    mesh = flags.split()[1]
    plan = subprocess.run([tandem, "plan", "--model", model, "--vocab-size", "256", "--seq-len", str(SEQ),
                           "--batch-size", str(BATCH), "--precision", "float32", "--optimizer", "adamw",
                           "--device", profile, "--gpus-per-node", str(ranks), "--mesh", mesh, "--json"],
                          capture_output=True, text=True, check=True)
    layout = next(l for l in json.loads(plan.stdout)["layouts"]
                  if l["strategy"] == strategy and l["sequence_parallel"] == sp and
                  not l["activation_checkpointing"] and l["micro_batches"] == micro)
    return layout["tokens_per_second"]


def main():
    tandem = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "cpu.json")
        cal = subprocess.run([tandem, "plan", "--calibrate", profile], capture_output=True, text=True)
        if cal.returncode != 0:
            sys.exit(f"tandem plan --calibrate: {cal.stderr[-800:]}")
        print(cal.stderr.strip())
        print(cal.stdout.strip())
        with open(profile) as f:
            print(f.read().strip())
        text = os.path.join(tmp, "text.txt")
        with open(os.path.join(here, "..", "README.md"), "rb") as f:
            data = f.read()
        with open(text, "wb") as f:
            f.write((data * 4)[:SEQ * BATCH * STEPS])
        print(f"\n{'model':11} {'ranks':>5} {'layout':40} {'measured tok/s':>15} {'predicted':>10} {'ratio':>6}")
        rows = []
        for model, ranks, flags, strategy, sp, micro in LAYOUTS:
            measured = measured_tokens_per_second(tandem, text, model, ranks, flags, tmp)
            predicted = predicted_tokens_per_second(tandem, profile, model, ranks, flags, strategy, sp, micro)
            rows.append((model, ranks, flags, measured, predicted))
            print(f"{model:11} {ranks:5} {flags:40} {measured:15.0f} {predicted:10.0f} {measured / predicted:6.3f}",
                  flush=True)
    within = sum(abs(m / p - 1) <= 0.25 for _, _, _, m, p in rows)
    print(f"\n{within} of {len(rows)} layouts within 25%")
    for job in sorted({(r[0], r[1]) for r in rows}):
        mine = [r for r in rows if (r[0], r[1]) == job]
        by_measured = [r[2] for r in sorted(mine, key=lambda r: -r[3])][:3]
        by_predicted = [r[2] for r in sorted(mine, key=lambda r: -r[4])][:3]
        same = "same" if by_measured == by_predicted else "DIFFERENT"
        print(f"{job[0]} on {job[1]} ranks, fastest three measured: {by_measured}; predicted: {by_predicted} "
              f"({same})")


if __name__ == "__main__":
    main()
