"""PyTorch peer of bench/image_pipeline.cpp, and the data-set generator.

  image_pipeline.py make-cifar DIR N          CIFAR-10 binary records (N per batch file)
  image_pipeline.py make-folder DIR C N W H   C classes x N JPEGs of about W x H
  image_pipeline.py run --data SPEC --augment NAME --image-size S --workers W --batch B --batches K

`run` iterates torch.utils.data.DataLoader over torchvision's ImageFolder (or
a CIFAR binary Dataset shaped like torchvision's CIFAR10: PIL images from the
records) with the torchvision transforms that tandem's preset of that name
stands for (seed 002's list for "heavy"), shuffled, num_workers=W, and prints
one JSON line with images per second.
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
CIFAR10 = ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])


def make_cifar(d, n):
    rng = np.random.default_rng(0)
    os.makedirs(d, exist_ok=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        rec = np.empty((n, 3073), np.uint8)
        rec[:, 0] = rng.integers(0, 10, n)
        rec[:, 1:] = rng.integers(0, 256, (n, 3072))
        rec.tofile(f"{d}/{name}")


def photo_like(rng, w, h):
    # Smooth colour fields, a few shapes and mild noise: JPEG statistics closer
    # to photographs than white noise (which decodes far slower).
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(0.005, 0.03, 3)
        img[:, :, c] = 128 + 90 * np.sin(a * xx + p * 7) * np.cos(b * yy)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(10, min(w, h) / 3)
        img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def make_folder(d, classes, n, w, h):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(f"{d}/class{c:03d}", exist_ok=True)
        for i in range(n):
            ww, hh = w + int(rng.integers(-w // 8, w // 8)), h + int(rng.integers(-h // 8, h // 8))
            photo_like(rng, ww, hh).save(f"{d}/class{c:03d}/img{i:04d}.jpg", quality=90)


class CifarBinary(torch.utils.data.Dataset):
    """The CIFAR-10 binary batches as torchvision's CIFAR10 serves them."""

    def __init__(self, d, transform):
        recs = np.concatenate([np.fromfile(f"{d}/data_batch_{i}.bin", np.uint8).reshape(-1, 3073)
                               for i in range(1, 6)])
        self.targets = recs[:, 0].astype(np.int64)
        self.data = recs[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.data[i])), int(self.targets[i])


def pipeline(augment, size, stats):
    norm = [T.ToTensor(), T.Normalize(*stats)]
    if augment == "cifar":
        pre = [T.Resize(size)] if size != 32 else []
        return T.Compose(pre + [T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip()] + norm)
    if augment == "imagenet":
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip()] + norm)
    if augment == "heavy":  # seed 002's list
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.RandomVerticalFlip(),
                          T.RandomRotation(45), T.RandomAffine(45), T.ColorJitter()] + norm)
    raise SystemExit(f"unknown augment {augment}")


def run(args):
    opts = dict(zip(args[::2], args[1::2]))
    spec, augment = opts["--data"], opts["--augment"]
    size, workers = int(opts["--image-size"]), int(opts["--workers"])
    batch, batches = int(opts["--batch"]), int(opts["--batches"])
    kind, path = spec.split(":", 1)
    if kind == "cifar10":
        ds = CifarBinary(path, pipeline(augment, size, CIFAR10))
    else:
        ds = torchvision.datasets.ImageFolder(path, pipeline(augment, size, IMAGENET))
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         drop_last=True, persistent_workers=False)
    it = iter(loader)
    next(it)  # workers started and warm
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, _ = next(it)
        n += x.shape[0]
    dt = time.perf_counter() - t
    print(json.dumps({"impl": "torchvision", "data": kind, "augment": augment, "size": size,
                      "workers": workers, "images_per_second": round(n / dt, 1)}), flush=True)


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "make-cifar":
        make_cifar(rest[0], int(rest[1]))
    elif cmd == "make-folder":
        make_folder(rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
    else:
        run(rest)
