"""PyTorch peer of bench/train_throughput.cpp: the same model, data, batch,
optimizer and step, in Python eager mode from the same torch wheel.

Prints one JSON line per round, like the C++ side.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F
import torchvision


def convnet(in_channels, num_classes, size):
    # Same layers, order and shapes as tandem's convnet (src/models/convnet.cpp).
    side = size // 4
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * side * side, 128), nn.ReLU(), nn.Linear(128, num_classes))


def resnet18_cifar(in_channels, num_classes):
    # tandem's CIFAR stem: 3x3 stride-1 conv1, no max pool.
    m = torchvision.models.resnet18(num_classes=num_classes)
    m.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape).copy())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="convnet")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--checkpoint-activations", type=int, default=0,
                   help="torch.utils.checkpoint.checkpoint_sequential over N segments (convnet only: "
                        "an nn.Sequential of the same top-level layers as tandem's; "
                        "use_reentrant=False, as PyTorch advises: the reentrant form leaves the "
                        "checkpointed segments' parameters without gradients when the input needs none)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the stretch peer)")
    a = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    if a.cudnn_benchmark:
        if device.type != "cuda":
            raise SystemExit("--cudnn-benchmark needs --device cuda")
        torch.backends.cudnn.benchmark = True

    images = labels = fixed_x = fixed_y = None
    if a.data.startswith("random:"):
        channels, size = (int(x) for x in a.data[7:].split("x"))
        fixed_x = torch.randn(a.batch, channels, size, size)
        fixed_y = torch.randint(0, 10, (a.batch,))
        classes = 10
    else:
        root = "/usr/share/datasets/fashion-mnist" if a.data == "fashion-mnist" else a.data[4:]
        images = read_idx(root + "/train-images-idx3-ubyte.gz")
        labels = read_idx(root + "/train-labels-idx1-ubyte.gz")
        pixels = images.double() / 255
        mean, std = pixels.mean().item(), pixels.std().item()
        channels, size, classes = 1, images.shape[1], int(labels.max()) + 1

    if a.model == "convnet":
        model = convnet(channels, classes, size)
    elif a.model == "resnet18":
        model = resnet18_cifar(channels, classes) if size <= 64 else torchvision.models.resnet18(num_classes=classes)
    elif a.model == "mobilenetv2":
        model = torchvision.models.mobilenet_v2(num_classes=classes)
    else:
        raise SystemExit(f"unknown model {a.model}")
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model.to(device).train()
    model.to(memory_format=fmt)
    if fixed_x is not None:  # the fixed batch lives on the device, as on the C++ side
        fixed_x, fixed_y = fixed_x.to(device).contiguous(memory_format=fmt), fixed_y.to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    forward = torch.compile(model) if a.compile else model
    if a.checkpoint_activations:
        if not isinstance(model, nn.Sequential):
            raise SystemExit("--checkpoint-activations: the peer's model must be an nn.Sequential (convnet)")
        segments = a.checkpoint_activations
        forward = lambda x: torch.utils.checkpoint.checkpoint_sequential(  # noqa: E731
            model, segments, x, use_reentrant=False)
    autocast_dtype = torch.bfloat16 if a.amp == "bf16" else None
    order = torch.randperm(images.shape[0] if images is not None else a.batch)
    cursor = 0

    def step():
        nonlocal cursor
        if images is not None:
            if cursor + a.batch > order.numel():
                cursor = 0
            idx = order[cursor:cursor + a.batch]
            cursor += a.batch
            x = images.index_select(0, idx).float().div_(255).sub_(mean).div_(std).unsqueeze(1)
            y = labels.index_select(0, idx).long()
        else:
            x, y = fixed_x, fixed_y
        x, y = x.to(device).contiguous(memory_format=fmt), y.to(device)
        sgd.zero_grad()
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        sgd.step()
        return loss

    for _ in range(a.warmup):
        step()
    for _ in range(a.rounds):
        t = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        loss.item()
        dt = time.perf_counter() - t
        print(json.dumps({"impl": "pytorch-compile" if a.compile else "pytorch", "model": a.model,
                          "batch": a.batch, "threads": torch.get_num_threads(), "amp": a.amp,
                          "channels_last": a.channels_last, "cudnn_benchmark": a.cudnn_benchmark,
                          "images_per_second": round(a.steps * a.batch / dt, 1)}), flush=True)


if __name__ == "__main__":
    main()
