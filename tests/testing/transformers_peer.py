"""What the language-model tests change in transformers, in one place.

transformers' LlamaRMSNorm normalises in float32 whatever the input's
dtype, which rounds a float64 model's activations to float32 and makes a
float64 comparison meaningless. keep_float64_rms_norm() makes it
normalise in the wider of float32 and the input's dtype, as tandem's
RmsNorm does; for float32, bfloat16 and float16 inputs it computes what
transformers computes.
"""
import torch
import transformers.models.llama.modeling_llama as modeling


def _rms_norm(self, h):
    dtype = h.dtype
    h = h.to(torch.promote_types(dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(dtype)


def keep_float64_rms_norm():
    modeling.LlamaRMSNorm.forward = _rms_norm
