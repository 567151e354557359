"""PyTorch peer of bench/ddp_step.cpp: the same model, batch and step under
torch.nn.parallel.DistributedDataParallel (Gloo), from the same wheel.

Run under torchrun (python -m torch.distributed.run), or alone with
--mode none. Rank 0 prints one JSON line with the median step time.
--mode scaling (under torchrun, 2 or more ranks) alternates DDP steps with
a plain step on the whole batch on rank 0, as ddp_step.cpp's Note [paired
scaling] says, and prints the median of the pairs' efficiencies.
--mode fsdp: PyTorch's FSDP (fully_shard, FSDP2) over a CPU mesh, with
units as near tandem's default plan as its module tree allows: for resnet18
layer1 whole, each residual block of layer2 to layer4, and the root
(conv1, bn1, fc); for convnet each layer with parameters (bench/fsdp.sh).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import resnet18_cifar, convnet  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--mode", default="ddp", choices=["none", "ddp", "paired", "scaling", "fsdp"])
    p.add_argument("--fsdp-sharding", default="full", choices=["full", "grad-op"],
                   help="--mode fsdp: reshard_after_forward True (ZeRO-3) or False (ZeRO-2)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--shard-optimizer", action="store_true",
                   help="step with ZeroRedundancyOptimizer(SGD) (bench/zero.sh)")
    p.add_argument("--zero-bucket-view", action="store_true",
                   help="with --shard-optimizer: parameters_as_bucket_view=True (one "
                        "broadcast per rank's bucket instead of one per parameter)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    world, rank = 1, 0
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
    elif a.mode == "paired":  # a group of one, in this process
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if a.mode in ("none", "paired") and world != 1:
        raise SystemExit(f"--mode {a.mode} runs one rank")
    if a.mode == "scaling" and world < 2:
        raise SystemExit(f"--mode scaling needs at least 2 ranks, got {world}")
    def make(use_ddp):
        torch.manual_seed(0)
        model = resnet18_cifar(3, 10) if a.model == "resnet18" else convnet(3, 10, a.image_size)
        model.train()
        net = model
        if a.mode == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            keep = a.fsdp_sharding == "full"
            if a.model == "resnet18":
                stages = [model.layer1] + [b for i in (2, 3, 4) for b in getattr(model, f"layer{i}")]
            else:
                stages = [m for m in model.children() if any(True for _ in m.parameters())]
            for stage in stages:
                fully_shard(stage, mesh=mesh, reshard_after_forward=keep)
            fully_shard(model, mesh=mesh, reshard_after_forward=keep)
        elif use_ddp:
            net = torch.nn.parallel.DistributedDataParallel(
                model, bucket_cap_mb=a.bucket_cap_mb,
                gradient_as_bucket_view=a.gradient_as_bucket_view)
        if a.shard_optimizer and use_ddp:
            sgd = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                          parameters_as_bucket_view=a.zero_bucket_view,
                                          lr=0.01, momentum=0.9, weight_decay=5e-4)
        else:
            sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        return net, sgd, [], []

    torch.manual_seed(1 + rank)
    x = torch.randn(a.batch // world, 3, a.image_size, a.image_size)
    y = torch.randint(0, 10, (a.batch // world,))
    if a.mode == "fsdp" and world < 2:
        raise SystemExit("--mode fsdp runs under torchrun with 2 or more ranks")
    runs = [make(a.mode in ("ddp", "paired", "scaling"))]
    if a.mode == "paired":
        runs.append(make(False))
    def timed_step(run, xb, yb, timed):
        net, sgd, times, optimizer_times = run
        t = time.perf_counter()
        sgd.zero_grad()
        F.cross_entropy(net(xb), yb).backward()
        t_optimizer = time.perf_counter()
        sgd.step()
        if timed:
            end = time.perf_counter()
            times.append((end - t) * 1e3)
            optimizer_times.append((end - t_optimizer) * 1e3)

    if a.mode == "scaling":
        plain = make(False) if rank == 0 else None
        xa = torch.randn(a.batch, 3, a.image_size, a.image_size)
        ya = torch.randint(0, 10, (a.batch,))
        for i in range(a.warmup + a.steps):
            dist.barrier()
            timed_step(runs[0], x, y, i >= a.warmup)
            dist.barrier()
            if plain is not None:
                timed_step(plain, xa, ya, i >= a.warmup)
        dist.barrier()
        if rank == 0:
            d, p_ = runs[0][2], plain[2]
            print(json.dumps({"impl": "pytorch", "mode": "scaling", "world": world, "batch": a.batch,
                              "threads": torch.get_num_threads(),
                              "plain_ms": round(statistics.median(p_), 2),
                              "step_ms": round(statistics.median(d), 2),
                              "efficiency": round(statistics.median(
                                  pp / (world * dd) for dd, pp in zip(d, p_)), 4)}), flush=True)
        dist.destroy_process_group()
        return
    for i in range(a.warmup + a.steps):
        for run in runs:
            timed_step(run, x, y, i >= a.warmup)
    times = runs[0][2]
    if a.mode == "paired":
        plain = runs[1][2]
        print(json.dumps({"impl": "pytorch", "mode": "paired", "batch": a.batch,
                          "threads": torch.get_num_threads(),
                          "plain_ms": round(statistics.median(plain), 2),
                          "ddp_ms": round(statistics.median(times), 2),
                          "ratio": round(statistics.median(d / p for d, p in zip(times, plain)), 4)}),
              flush=True)
    elif rank == 0:
        # This rank's momentum buffers (ZeroRedundancyOptimizer: its share, in .optim).
        sgd = runs[0][1]
        local = sgd.optim if isinstance(sgd, ZeroRedundancyOptimizer) else sgd
        def nbytes(t):  # this rank's part of a DTensor (FSDP), or the tensor
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size()
        state_bytes = sum(nbytes(s["momentum_buffer"])
                          for s in local.state.values() if s.get("momentum_buffer") is not None)
        # What the rank holds between steps for training: parameters (FSDP:
        # its shards), their gradients, the momentum (ddp_step.cpp's held_mib).
        held = state_bytes + sum(nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0)
                                 for g in local.param_groups for p in g["params"])
        print(json.dumps({"impl": "pytorch", "mode": a.mode, "world": world, "batch": a.batch,
                          "threads": torch.get_num_threads(),
                          "step_ms": round(statistics.median(times), 2),
                          "optimizer_ms": round(statistics.median(runs[0][3]), 2),
                          "state_mib": round(state_bytes / 1048576, 2),
                          "held_mib": round(held / 1048576, 2),
                          "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}),
              flush=True)
    if dist.is_initialized():
        # Leave without freeing the models, the optimizers or the group: on
        # 2026-11-25 a worker of a ZeroRedundancyOptimizer run hung now and
        # then for good as main() returned (gdb: the main thread, holding
        # the GIL, in ~ProcessGroupGloo reached from DDP's Reducer being
        # freed, waiting for a mutex that a Gloo run-loop thread held while
        # it waited for the GIL to free a tensor). The barrier: every rank's
        # collectives are done; the results are printed by then.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
