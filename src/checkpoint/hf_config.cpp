// The keys of a transformers config.json, per family (hf_config.h).
#include "hf_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tandem/util/check.h"

namespace tandem::checkpoint::internal {

namespace {

using json = nlohmann::json;

// Note [a folder's config.json]: tensors of the right shapes do not make
// the right model. Heads, key/value heads, the norms' epsilon and the
// rotary settings change the arithmetic and no shape; so do the GELU or
// SiLU that transformers reads from hidden_act or activation_function, the
// attention scaled by the inverse layer index, biases, a padding row. A
// config.json beside the weights (save_pretrained writes one) is read
// whole, and each of its keys is one of:
// - a setting of what the model computes: it must be the model's own
//   (equivalent spellings, such as a null n_inner for 4 x n_embd or
//   gelu_pytorch_tanh for gelu_new, are the same setting), else the load
//   is refused naming the key, its value and the model's;
// - a setting of something else (kInert below: the file's provenance,
//   initialisation, dropout, token ids for generation, what forward
//   returns, other tasks' heads, old generation defaults);
// - anything else, refused naming it: a key tandem does not know may
//   change what transformers computes, so it is never ignored.
// HfConfigTest (tests/checkpoint/hf_format_test.cpp) walks every key the config classes
// document with a value other than the default: each either loads and
// gives transformers' logits in float64, or is refused naming the key.
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> keys = {
      // what the file is, and which program wrote it
      "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "_commit_hash",
      // initialisation, and regularisers of training (not the trained function)
      "initializer_range", "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout", "summary_first_dropout",
      // token ids of the tokenizer and of generation
      "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id", "forced_bos_token_id",
      "forced_eos_token_id",
      // what forward returns, and its cache
      "use_cache", "output_attentions", "output_hidden_states", "return_dict", "output_scores",
      "return_dict_in_generate", "torchscript",
      // the heads of other tasks (classification, multiple choice)
      "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "summary_type", "summary_use_proj",
      "summary_activation", "summary_proj_to_labels", "task_specific_params", "prefix", "tokenizer_class",
      // generation defaults that older files carry (transformers keeps them
      // in generation_config.json now)
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      // the same arithmetic in other pieces: the feed-forward in chunks
      // (GPT-2 and LLaMA), linear layers in slices (transformers 5 no
      // longer reads it), GPT-2's old name of its context length
      "chunk_size_feed_forward", "pretraining_tp", "n_ctx",
      // memory settings of training
      "gradient_checkpointing", "use_return_dict",
      // the experts' balancing loss: whether forward returns it and its
      // weight in transformers' loss (tandem logs it and trains on the
      // cross-entropy, as transformers does by default);
      // Qwen's layers of windowed attention, read only with use_sliding_window
      "output_router_logits", "router_aux_loss_coef", "max_window_layers"};
  return keys;
}

bool same(const json& a, const json& b) {
  if (b.is_number_integer() && a.is_number()) return a.is_number_integer() && a.get<int64_t>() == b.get<int64_t>();
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

std::string family_name(HfFamily family) {
  switch (family) {
    case HfFamily::kGpt2: return "GPT-2";
    case HfFamily::kMistral: return "Mistral";
    case HfFamily::kQwen2: return "Qwen2";
    case HfFamily::kQwen3: return "Qwen3";
    case HfFamily::kMixtral: return "Mixtral";
    case HfFamily::kQwen3Moe: return "Qwen3-MoE";
    default: return "LLaMA";
  }
}

// The setting `key` of `config` in the model's spelling: what transformers
// reads for it where the file leaves it null or spells it otherwise.
json normalised(const std::string& key, const json& config) {
  const json& value = config.at(key);
  auto number = [&](const char* k) { return config.contains(k) && config.at(k).is_number() ? config.at(k) : json(); };
  if (key == "n_inner" && value.is_null() && number("n_embd").is_number()) return 4 * number("n_embd").get<int64_t>();
  if (key == "activation_function" && value == "gelu_pytorch_tanh") return "gelu_new";  // both tanh's GELU
  if (key == "hidden_act" && value == "swish") return "silu";
  if (key == "num_key_value_heads" && value.is_null()) return number("num_attention_heads");
  // Qwen's window is read only where use_sliding_window says so.
  if (key == "sliding_window" && config.contains("use_sliding_window") && config.at("use_sliding_window") == false) {
    return nullptr;
  }
  if (key == "head_dim" && value.is_null() && number("hidden_size").is_number() &&
      number("num_attention_heads").is_number() && number("num_attention_heads").get<int64_t>() > 0) {
    return number("hidden_size").get<int64_t>() / number("num_attention_heads").get<int64_t>();
  }
  return value;
}

}  // namespace

json rope_settings(const std::string& file, const json& config, std::string* where) {
  auto given = [&](const char* k) { return config.contains(k) && !config.at(k).is_null(); };
  json rope = json::object();
  *where = "rope_theta";
  // rope_scaling over rope_parameters, as transformers 5 reads a file with both.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!given(key)) continue;
    const json& part = config.at(key);
    TANDEM_CHECK(part.is_object(), file, ": ", key, " is ", part.dump(), ", expected an object of rotary settings");
    for (const auto& [k, v] : part.items()) rope[k] = v;
    *where = key;
  }
  if (!rope.contains("rope_theta") && config.contains("rope_theta")) rope["rope_theta"] = config.at("rope_theta");
  return rope;
}

namespace {

// The rotary settings (LLaMA): rope_parameters, or the older rope_scaling
// and rope_theta, as one object {rope_type, rope_theta, ...}.
void check_rope(const std::string& file, const json& config, const json& model, double default_theta) {
  std::string where;
  json rope = rope_settings(file, config, &where);
  if (!rope.contains("rope_type")) rope["rope_type"] = rope.contains("type") ? rope.at("type") : json("default");
  rope.erase("type");
  if (!rope.contains("rope_theta")) rope["rope_theta"] = default_theta;  // the family's in transformers
  const json& want = model.at("rope_parameters");
  TANDEM_CHECK(rope.at("rope_type") == want.at("rope_type"), file, ": ", where, "'s rope_type is ",
               rope.at("rope_type").dump(), ", the model's ", want.at("rope_type").dump(),
               ": tandem's LLaMA computes rotary positions as \"default\" or \"llama3\" only, as its preset says");
  for (const auto& [k, v] : rope.items()) {
    TANDEM_CHECK(want.contains(k), file, ": ", where, ".", k, " is ", v.dump(), ", a rotary setting tandem's LLaMA ",
                 "does not know for rope_type ", want.at("rope_type").dump(), ": refused rather than ignored");
    TANDEM_CHECK(same(v, want.at(k)), file, ": ", where, ".", k, " is ", v.dump(), ", the model's ", want.at(k).dump(),
                 " (weights of another configuration)");
  }
}

// Note [missing keys]: a key left out of config.json is read by
// transformers at its family's default. Where that default changes the
// arithmetic and the tensors' shapes do not show it (the routing's k, its
// renormalisation, heads, the norms' epsilon), a default other than the
// model's setting is refused, naming the key, as a different value is.
// transformers 5.24's defaults:
void check_missing(const std::string& file, const json& config, const json& model, HfFamily family) {
  static const json mixtral = {{"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"rms_norm_eps", 1e-5},
                               {"hidden_act", "silu"},      {"num_experts_per_tok", 2}, {"num_local_experts", 8},
                               {"router_jitter_noise", 0.0}, {"tie_word_embeddings", false}};
  static const json qwen3_moe = {{"num_attention_heads", 32},  {"num_key_value_heads", 4},  {"rms_norm_eps", 1e-6},
                                 {"hidden_act", "silu"},       {"num_experts_per_tok", 8},  {"num_experts", 128},
                                 {"norm_topk_prob", false},    {"moe_intermediate_size", 768},
                                 {"decoder_sparse_step", 1},   {"tie_word_embeddings", false}};
  static const json mistral = {{"num_attention_heads", 32}, {"num_key_value_heads", 8},    {"rms_norm_eps", 1e-6},
                               {"hidden_act", "silu"},      {"sliding_window", 4096},     {"tie_word_embeddings", false}};
  static const json qwen2 = {{"num_attention_heads", 32}, {"num_key_value_heads", 32}, {"rms_norm_eps", 1e-6},
                             {"hidden_act", "silu"},      {"tie_word_embeddings", false}};
  static const json qwen3 = {{"num_attention_heads", 32}, {"num_key_value_heads", 32}, {"rms_norm_eps", 1e-6},
                             {"hidden_act", "silu"},      {"head_dim", 128},           {"attention_bias", false},
                             {"tie_word_embeddings", false}};
  static const std::map<HfFamily, const json*> by_family = {{HfFamily::kMixtral, &mixtral},
                                                            {HfFamily::kQwen3Moe, &qwen3_moe},
                                                            {HfFamily::kMistral, &mistral},
                                                            {HfFamily::kQwen2, &qwen2},
                                                            {HfFamily::kQwen3, &qwen3}};
  const json* defaults = by_family.count(family) ? by_family.at(family) : nullptr;
  if (defaults == nullptr) return;
  for (const auto& [key, value] : defaults->items()) {
    // Qwen3-MoE's expert count under either of its names.
    if (config.contains(key) || (key == "num_experts" && config.contains("num_local_experts"))) continue;
    const json mine = model.contains(key) ? model.at(key) : json(nullptr);
    TANDEM_CHECK(same(value, mine), file, ": ", key, " is missing, so transformers reads its default ", value.dump(),
                 ", the model's is ", mine.dump(), " (write the key, or weights of another configuration)");
  }
}

}  // namespace

void check_hf_config(const std::string& file, const json& config, const json& model, HfFamily family) {
  TANDEM_CHECK(config.is_object(), file, ": not a JSON object (transformers' config.json)");
  // Another family's file says so first, not by the first key it lacks.
  if (config.contains("model_type")) {
    TANDEM_CHECK(config.at("model_type") == model.at("model_type"), file, ": model_type is ",
                 config.at("model_type").dump(), ", the model's ", model.at("model_type").dump(),
                 " (weights of another model)");
  }
  // The settings the model's own config.json leaves out, at the values
  // tandem computes with.
  json want = model;
  want["is_encoder_decoder"] = false;
  std::set<std::string> computed;
  if (family == HfFamily::kGpt2) {
    want["scale_attn_by_inverse_layer_idx"] = false;
    want["reorder_and_upcast_attn"] = false;
    want["add_cross_attention"] = false;
    want["pad_token_id"] = nullptr;  // read by GPT-2's classification head only
    computed = {"model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
                "activation_function", "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                "reorder_and_upcast_attn", "add_cross_attention", "tie_word_embeddings", "is_encoder_decoder"};
  } else {
    want["pad_token_id"] = nullptr;  // a padding row: its embedding gets no gradient
    if (!want.contains("attention_bias")) want["attention_bias"] = false;  // Mistral's, Qwen2's: none
    if (!want.contains("mlp_bias")) want["mlp_bias"] = false;
    computed = {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                "hidden_act", "attention_bias", "mlp_bias", "tie_word_embeddings", "is_encoder_decoder",
                "pad_token_id"};
    if (family == HfFamily::kMistral) {
      computed.insert("sliding_window");
      if (!want.contains("sliding_window")) want["sliding_window"] = nullptr;
    } else if (family == HfFamily::kQwen2 || family == HfFamily::kQwen3) {
      computed.insert({"sliding_window", "use_sliding_window", "layer_types"});
    } else if (family == HfFamily::kMixtral) {
      computed.insert({"num_local_experts", "num_experts_per_tok", "router_jitter_noise", "sliding_window"});
    } else if (family == HfFamily::kQwen3Moe) {
      computed.insert({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                       "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
                       "sliding_window"});
      want["num_local_experts"] = want.at("num_experts");  // transformers 5 saves this spelling of it
      computed.erase("intermediate_size");  // a dense layer's, and every layer has experts
    }
    check_rope(file, config, model, family == HfFamily::kMixtral ? 1e6 : 10000.0);
    check_missing(file, config, want, family);
  }
  for (const auto& [key, value] : config.items()) {
    if (inert_keys().count(key) > 0) continue;
    if (family == HfFamily::kGpt2 && key == "pad_token_id") continue;
    if (family == HfFamily::kQwen3Moe && key == "intermediate_size") continue;  // no dense layer reads it
    if (family != HfFamily::kGpt2 && (key == "rope_parameters" || key == "rope_scaling" || key == "rope_theta")) {
      continue;  // check_rope
    }
    TANDEM_CHECK(computed.count(key) > 0, file, ": ", key, " is ", value.dump(), ", a setting tandem's ",
                 family_name(family), " does not know: refused rather than ignored, as it may change what the "
                 "model computes");
    const json got = normalised(key, config);
    const json expected = want.contains(key) ? normalised(key, want) : json(nullptr);
    TANDEM_CHECK(same(got, expected), file, ": ", key, " is ", value.dump(), ", the model's ", expected.dump(),
                 " (weights of another configuration, or a setting tandem's ", family_name(family),
                 " does not compute)");
  }
}

}  // namespace tandem::checkpoint::internal
