"""Reference decodes for tests/data/image_io_test.cpp.

Writes images in formats tandem must read (made with PIL, as a user's data set
would be) into DIR, then, for every .jpg/.png file in DIR, the pixels PIL
gives for Image.open(f).convert("RGB") (what torchvision's ImageFolder
loads) as FILE.rgb: "H W\n" then H*W*3 bytes.

    python image_reference.py DIR
"""
import os
import sys

import numpy as np
from PIL import Image


def main():
    d = sys.argv[1]
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    # Smooth content as well: JPEG's chroma upsampling matters there.
    yy, xx = np.mgrid[0:37, 0:53]
    smooth = np.stack([xx * 4, yy * 6, (xx + yy) * 3], axis=2).clip(0, 255).astype(np.uint8)
    Image.fromarray(rgb).save(f"{d}/pil_rgb.jpg", quality=85)
    Image.fromarray(smooth).save(f"{d}/pil_smooth_420.jpg", quality=90, subsampling=2)
    Image.fromarray(smooth).save(f"{d}/pil_smooth_444.jpg", quality=90, subsampling=0)
    Image.fromarray(rgb).save(f"{d}/pil_progressive.jpg", quality=85, progressive=True)
    Image.fromarray(rgb[:, :, 0]).save(f"{d}/pil_gray.jpg")
    Image.fromarray(smooth).convert("CMYK").save(f"{d}/pil_cmyk.jpg", quality=95)
    alpha = rng.integers(0, 256, (37, 53, 1), dtype=np.uint8)
    Image.fromarray(np.concatenate([rgb, alpha], axis=2)).save(f"{d}/pil_rgba.png")
    Image.fromarray(rgb[:, :, 1]).save(f"{d}/pil_gray.png")
    Image.fromarray(np.concatenate([rgb[:, :, :1], alpha], axis=2)).save(f"{d}/pil_la.png")
    Image.fromarray(rgb).quantize(colors=50).save(f"{d}/pil_palette.png")
    Image.fromarray(rgb[:, :, 2] > 128).save(f"{d}/pil_bilevel.png")
    # Transparency in a tRNS chunk: per palette entry, one grey level, one colour.
    palette = Image.fromarray(rgb).quantize(colors=50)
    palette.save(f"{d}/pil_palette_trns.png", transparency=bytes(range(0, 250, 5)))
    Image.fromarray(rgb[:, :, 1]).save(f"{d}/pil_gray_trns.png", transparency=17)
    Image.fromarray(rgb).save(f"{d}/pil_rgb_trns.png", transparency=(1, 2, 3))
    # Larger, photo-like, in every chroma layout: for partial decoding.
    yy, xx = np.mgrid[0:157, 0:211]
    photo = np.stack([128 + 100 * np.sin(xx / 9.0) * np.cos(yy / 13.0), (xx + 2 * yy) % 256,
                      128 + 90 * np.cos((xx - yy) / 17.0)], axis=2)
    photo = (photo + rng.normal(0, 8, photo.shape)).clip(0, 255).astype(np.uint8)
    for name, sub in (("420", 2), ("422", 1), ("444", 0)):
        Image.fromarray(photo).save(f"{d}/big_{name}.jpg", quality=88, subsampling=sub)
    Image.fromarray(photo).save(f"{d}/big_progressive.jpg", quality=88, progressive=True)
    Image.fromarray(photo[:, :, 0]).save(f"{d}/big_gray.jpg", quality=88)
    for name in sorted(os.listdir(d)):
        if not name.endswith((".jpg", ".png")):
            continue
        a = np.asarray(Image.open(f"{d}/{name}").convert("RGB"))
        with open(f"{d}/{name}.rgb", "wb") as f:
            f.write(f"{a.shape[0]} {a.shape[1]}\n".encode())
            f.write(a.tobytes())


if __name__ == "__main__":
    main()
