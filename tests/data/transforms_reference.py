"""Reference outputs for tests/data/transforms_test.cpp, from torchvision itself.

    python transforms_reference.py IMAGES.pt CASES.json OUT.pt

IMAGES.pt: a dict name -> uint8 or float32 [C, H, W] tensor (torch::pickle_save).
CASES.json: a list of {"name", "image", "args": {"op": ..., parameters}}; the
C++ test reads the same list, so both sides run the same cases.
OUT.pt: a dict case name -> the tensor torchvision.transforms.v2.functional
returns for it (to_tensor: v1's, which is what ToTensor does), and for each
case that sampled a grid (rotate, affine) "#grid_exact/NAME" -> whether
torchvision's grid equals the grid of plain float32 arithmetic that tandem
computes (see _recording_affine_grid).
"""
import json
import sys

import torch
import torch.jit._pickle
import torchvision.transforms.functional as F1
import torchvision.transforms.v2.functional as F
import torchvision.transforms.v2.functional._geometry as G
from torchvision.transforms import InterpolationMode

MODES = {"nearest": InterpolationMode.NEAREST, "bilinear": InterpolationMode.BILINEAR}


def fill_of(args):
    fill = args.get("fill")
    if isinstance(fill, list) and len(fill) == 1:
        return fill[0]
    return fill


# torchvision's affine grid is a [oh*ow, 3] x [3, 2] bmm, whose rounding
# depends on the CPU (MKL may fuse multiply-adds, e.g. with AVX-512). tandem
# computes each grid value as (x * a + y * b) + c in float32
# (src/data/transforms_geometry.cpp, affine_grid). Where the two grids agree
# the sampled images must be equal bit for bit; where this CPU's bmm rounds
# otherwise, the C++ test allows the last-bit differences that follow.
_ORIGINAL_AFFINE_GRID = G._affine_grid
_grid_exact = []  # one entry per grid of the current case


def _recording_affine_grid(theta, w, h, ow, oh):
    theta = theta.clone()  # torchvision divides its theta in place
    grid = _ORIGINAL_AFFINE_GRID(theta.clone(), w, h, ow, oh)
    x = torch.linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, ow, dtype=theta.dtype).view(1, ow)
    y = torch.linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, oh, dtype=theta.dtype).view(oh, 1)
    t = theta.reshape(2, 3).t().div(torch.tensor([0.5 * w, 0.5 * h], dtype=theta.dtype))
    exact = True
    for j in range(2):
        plane = torch.add(x * t[0][j], y * t[1][j])
        plane.add_(t[2][j])
        exact = exact and torch.equal(plane, grid[0, :, :, j])
    _grid_exact.append(exact)
    return grid


G._affine_grid = _recording_affine_grid


def apply(image, a):
    op = a["op"]
    if a.get("channels_last"):
        # The same values laid out HWC in memory, as a decoder would give them.
        image = image.permute(1, 2, 0).contiguous().permute(2, 0, 1)
    if op == "resize":
        return F.resize(image, a["size"], interpolation=MODES[a["interpolation"]],
                        max_size=a.get("max_size"), antialias=a["antialias"])
    if op == "resized_crop":
        return F.resized_crop(image, a["top"], a["left"], a["height"], a["width"], a["size"],
                              interpolation=MODES[a["interpolation"]], antialias=a["antialias"])
    if op == "crop":
        return F.crop(image, a["top"], a["left"], a["height"], a["width"])
    if op == "center_crop":
        return F.center_crop(image, a["size"])
    if op == "pad":
        return F.pad(image, a["padding"], fill=fill_of(a), padding_mode=a["padding_mode"])
    if op == "hflip":
        return F.horizontal_flip(image)
    if op == "vflip":
        return F.vertical_flip(image)
    if op == "rotate":
        return F.rotate(image, a["angle"], interpolation=MODES[a["interpolation"]],
                        expand=a["expand"], center=a.get("center"), fill=fill_of(a))
    if op == "affine":
        return F.affine(image, a["angle"], a["translate"], a["scale"], a["shear"],
                        interpolation=MODES[a["interpolation"]], fill=fill_of(a),
                        center=a.get("center"))
    if op == "adjust_brightness":
        return F.adjust_brightness(image, a["factor"])
    if op == "adjust_contrast":
        return F.adjust_contrast(image, a["factor"])
    if op == "adjust_saturation":
        return F.adjust_saturation(image, a["factor"])
    if op == "adjust_hue":
        return F.adjust_hue(image, a["factor"])
    if op == "to_tensor":
        return F1.to_tensor(image.permute(1, 2, 0).numpy())
    if op == "normalize":
        return F.normalize(image, a["mean"], a["std"])
    raise ValueError(f"unknown op {op}")


def main():
    # torch::pickle_save tags the dict's types with this (harmless) function.
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        images = torch.load(sys.argv[1], weights_only=True)
    with open(sys.argv[2]) as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        _grid_exact.clear()
        out[case["name"]] = apply(images[case["image"]], case["args"]).contiguous().clone()
        if _grid_exact:
            out["#grid_exact/" + case["name"]] = torch.tensor(all(_grid_exact))
    torch.save(out, sys.argv[3])
    print(f"torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}, "
          f"{len(out)} cases")


if __name__ == "__main__":
    main()
