"""What the language-model tests change in transformers, in one place.

transformers' RMSNorms (LLaMA's, Mistral's, Qwen2's, Qwen3's, Mixtral's,
Qwen3-MoE's) normalise in
float32 whatever the input's dtype, which rounds a float64 model's
activations to float32 and makes a float64 comparison meaningless.
keep_float64_rms_norm() makes them normalise in the wider of float32 and
the input's dtype, as tandem's RmsNorm does. The mixture-of-experts
routers take their softmax in float32 too; keep_float64_routing() makes
them take it in the wider dtype, as tandem's router does (Note [routing in
float64] in tandem/models/moe.h). For float32, bfloat16 and float16 inputs
both compute what transformers computes.
"""
import torch
import torch.nn.functional as F
import transformers.models.llama.modeling_llama as llama
import transformers.models.mistral.modeling_mistral as mistral
import transformers.models.mixtral.modeling_mixtral as mixtral
import transformers.models.qwen2.modeling_qwen2 as qwen2
import transformers.models.qwen3.modeling_qwen3 as qwen3
import transformers.models.qwen3_moe.modeling_qwen3_moe as qwen3_moe


def _rms_norm(self, h):
    dtype = h.dtype
    h = h.to(torch.promote_types(dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(dtype)


def keep_float64_rms_norm():
    for norm in (llama.LlamaRMSNorm, mistral.MistralRMSNorm, qwen2.Qwen2RMSNorm, qwen3.Qwen3RMSNorm,
                 mixtral.MixtralRMSNorm, qwen3_moe.Qwen3MoeRMSNorm):
        norm.forward = _rms_norm


def _routing(normalise, cast):
    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        if normalise(self):
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, (top.to(logits.dtype) if cast else top), index
    return forward


def keep_float64_routing():
    mixtral.MixtralTopKRouter.forward = _routing(lambda self: True, cast=False)
    qwen3_moe.Qwen3MoeTopKRouter.forward = _routing(lambda self: self.norm_topk_prob, cast=True)
