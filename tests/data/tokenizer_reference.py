"""The tokenizers tests/data/tokenizer_test.cpp checks tandem against, made
here by the packages themselves from a training text, and their encodings
of texts they never saw.

    python tokenizer_reference.py TRAIN_TEXT CASES_JSON OUT_DIR

Writes into OUT_DIR: gpt2.json (byte-level BPE with the ByteLevel
pre-tokenizer, trained by `tokenizers`), llama3.json (a Split by LLaMA 3's
regex then ByteLevel, an NFC normalizer and ignore_merges, as LLaMA 3's
and Qwen's files are), wordpiece.json (another model type, which tandem
refuses), sp_bpe.model and sp_unigram.model (trained by `sentencepiece`),
and expected.json: for each tokenizer and each case, the ids of
encode(text) without added specials and the UTF-8 bytes (hex) of
decode(ids) with the specials kept.
"""
import json
import os
import sys

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_bpe(train, special, llama3):
    tok = Tokenizer(models.BPE())
    if llama3:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([train], trainer)
    if llama3:
        # LLaMA 3's files set ignore_merges: a piece in the vocabulary is
        # that token, whatever the merges would make of it.
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def main():
    train, cases_file, out = sys.argv[1:4]
    with open(cases_file, encoding="utf-8") as f:
        cases = json.load(f)
    expected = {}

    tokenizers = {
        "gpt2.json": byte_level_bpe(train, ["<|endoftext|>"], llama3=False),
        "llama3.json": byte_level_bpe(train, ["<|begin_of_text|>", "<|end_of_text|>"], llama3=True),
    }
    for name, tok in tokenizers.items():
        tok.save(os.path.join(out, name))
        expected[name] = [{"ids": tok.encode(c, add_special_tokens=False).ids} for c in cases]
        for e in expected[name]:
            e["decoded"] = tok.decode(e["ids"], skip_special_tokens=False).encode("utf-8").hex()

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.train([train], trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"],
                                                        show_progress=False))
    wordpiece.save(os.path.join(out, "wordpiece.json"))

    for kind in ("bpe", "unigram"):
        prefix = os.path.join(out, f"sp_{kind}")
        spm.SentencePieceTrainer.train(input=train, model_prefix=prefix, vocab_size=600, model_type=kind,
                                       character_coverage=1.0, minloglevel=2, num_threads=1)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        name = f"sp_{kind}.model"
        expected[name] = [{"ids": sp.encode(c)} for c in cases]
        for e in expected[name]:
            e["decoded"] = sp.decode(e["ids"]).encode("utf-8").hex()

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
