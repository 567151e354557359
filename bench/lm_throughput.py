"""PyTorch peer of bench/lm_throughput.cpp: GPT-2 as nanoGPT writes it
(model.py: Linear layers, scaled_dot_product_attention with is_causal,
GELU tanh, the head tied to the token embedding), the same sizes, random
tokens, next-token cross-entropy and AdamW with nanoGPT's decay groups, in
eager mode (or torch.compile) from the same wheel.

Prints one JSON line per round, like the C++ side.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"gpt2-tiny": (256, 128, 4, 4), "gpt2": (1024, 768, 12, 12), "gpt2-medium": (1024, 1024, 24, 16)}


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, positions, width, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2-tiny", choices=sorted(SIZES))
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the stretch peer)")
    a = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    positions, width, layers, heads = SIZES[a.model]
    model = GPT(a.vocab, positions, width, layers, heads).to(device).train()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda")
    forward = torch.compile(model) if a.compile else model
    tokens = torch.randint(a.vocab, (a.batch, a.seq_len + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    dtype = torch.bfloat16 if a.amp == "bf16" else None

    def step():
        adamw.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(forward(x).reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        adamw.step()
        return loss

    for _ in range(a.warmup):
        step()
    for _ in range(a.rounds):
        t = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        loss.item()
        dt = time.perf_counter() - t
        print(json.dumps({"impl": "pytorch-compile" if a.compile else "pytorch", "model": a.model, "vocab": a.vocab,
                          "seq_len": a.seq_len, "batch": a.batch, "threads": torch.get_num_threads(), "amp": a.amp,
                          "tokens_per_second": round(a.steps * a.batch * a.seq_len / dt, 1)}), flush=True)


if __name__ == "__main__":
    main()
