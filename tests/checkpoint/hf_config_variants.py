"""Every documented key of GPT2Config, LlamaConfig, MistralConfig,
Qwen2Config and Qwen3Config, each set to a value other than its default,
as the folder transformers' save_pretrained writes (float64 weights from
one seed; each family's own base model in several shards) with the
logits and the language-model loss of the model it built on fixed
tokens; where transformers cannot build that model, the base model's
folder with the key written into its config.json, and no logits.

    hf_config_variants.py TESTING_DIR OUT_DIR

Writes OUT_DIR/tokens.safetensors, a folder per variant (logits.safetensors
beside its weights: the logits and the loss) and OUT_DIR/variants.json:
[{"family", "key", "value", "folder", "logits"}].
A key with no value to try here fails the script, naming it: a key that a
new transformers adds is tried before tandem can pass the test.
"""
import inspect
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

sys.path.insert(0, sys.argv[1])
import transformers_peer  # noqa: E402

transformers_peer.keep_float64_rms_norm()
transformers.utils.logging.disable_progress_bar()
out = sys.argv[2]

FAMILIES = {
    "gpt2": (GPT2Config, GPT2LMHeadModel,
             dict(vocab_size=61, n_positions=16, n_embd=12, n_layer=2, n_head=3, bos_token_id=None,
                  eos_token_id=None)),
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "mistral": (MistralConfig, MistralForCausalLM,
                dict(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=16, sliding_window=32, bos_token_id=None,
                     eos_token_id=None)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,
              dict(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=6, max_position_embeddings=16)),
}
# Older spellings transformers still reads from a file.
EXTRA_KEYS = {"gpt2": ["n_ctx"], "llama": ["rope_scaling", "rope_theta"], "mistral": ["rope_scaling", "rope_theta"],
              "qwen2": ["rope_scaling", "rope_theta"], "qwen3": ["rope_scaling", "rope_theta"]}
# Values to try, where flipping or changing the default says too little.
VALUES = {
    "activation_function": ["relu", "gelu", "gelu_pytorch_tanh"],
    "hidden_act": ["gelu", "swish"],
    "n_inner": [24, 48],
    "rope_parameters": [{"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                        {"rope_type": "default", "rope_theta": 5000.0},
                        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}],
    "rope_scaling": [{"rope_type": "linear", "factor": 2.0}, {"type": "default"}],
    "rope_theta": [5000.0, 10000.0],
    "head_dim": [8],
    "num_key_value_heads": [4, None],
    "architectures": [["GPT2Model"]],
    "dtype": ["float32"],
    "transformers_version": ["4.40.0"],
    "_name_or_path": ["elsewhere"],
    "id2label": [{"0": "a", "1": "b", "2": "c"}],
    "label2id": [{"a": 0, "b": 1, "c": 2}],
    "problem_type": ["regression"],
    "summary_type": ["mean"],
    "summary_activation": ["tanh"],
    "bos_token_id": [3],
    "eos_token_id": [4],
    "pad_token_id": [5],
    "n_ctx": [1024],
    # the attention window: past the 16 positions (nothing changes), none,
    # or on (layers of windowed attention tandem does not compute)
    "sliding_window": [64, None],
    "use_sliding_window": [True],
    "layer_types": [["sliding_attention", "full_attention"]],
    "max_window_layers": [1],
}


def other_values(key, default):
    if key in VALUES:
        return VALUES[key]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default + 1]
    if isinstance(default, float):
        return [default * 2 if default else 0.1]
    raise SystemExit(f"hf_config_variants.py: no value to try for {key} (default {default!r}): add one to VALUES")


torch.manual_seed(3)
tokens = torch.randint(0, 61, (2, 9))
save_file({"tokens": tokens}, os.path.join(out, "tokens.safetensors"))


def build(config_class, model_class, settings):
    torch.manual_seed(0)
    model = model_class(config_class(**settings)).to(torch.float64).eval()
    model.config.return_dict = True  # a form of forward's output (5.24's GPT-2 fails on a tuple inside)
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens, return_dict=True)
        return model, (out.logits, out.loss)


variants = []
for family, (config_class, model_class, base) in FAMILIES.items():
    base_model, _ = build(config_class, model_class, base)
    documented = set(inspect.signature(config_class.__init__).parameters) - {"self", "args", "kwargs"}
    keys = sorted(documented | set(config_class(**base).to_dict()) | set(EXTRA_KEYS[family]))
    defaults = config_class(**base).to_dict()
    for key in [None] + keys:  # None: the base itself
        if key is None:
            values = [None]
        elif key == "model_type":
            values = ["llama" if family == "gpt2" else "gpt2"]
        else:
            values = other_values(key, defaults.get(key))
        for i, value in enumerate(values):
            folder = os.path.join(out, f"{family}-{key}-{i}")
            settings = dict(base)
            if key is not None:
                settings[key] = value
            try:
                model, logits = build(config_class, model_class, settings)
            except Exception:  # transformers refuses it: tandem must too
                model, logits = base_model, None
            try:  # the base model in several shards, under an index
                model.save_pretrained(folder, max_shard_size="4KB" if key is None else "5GB")
            except Exception:  # built, but refused by save_pretrained's checks (output_attentions under sdpa)
                same = model.state_dict().keys() == base_model.state_dict().keys() and all(
                    torch.equal(a, base_model.state_dict()[k]) for k, a in model.state_dict().items())
                logits = logits if same else None
                base_model.save_pretrained(folder)
            path = os.path.join(folder, "config.json")
            with open(path) as f:
                config = json.load(f)
            if key is not None:
                config[key] = value  # as given, however transformers would write it
            with open(path, "w") as f:
                json.dump(config, f, indent=2)
            if logits is not None:
                save_file({"logits": logits[0].contiguous(), "loss": logits[1].reshape(1)},
                          os.path.join(folder, "logits.safetensors"))
            variants.append({"family": family, "key": key, "value": value, "folder": folder,
                             "logits": logits is not None})

with open(os.path.join(out, "variants.json"), "w") as f:
    json.dump(variants, f)
print(len(variants), "variants")
