"""tandem tokenize's throughput against tokenizers' encode_batch.

    bench/tokenize.sh            (sets up and builds, then runs this)
    python bench/tokenize_bench.py TANDEM

A byte-level BPE of 8,000 tokens (GPT-2's pre-tokenizer) is trained by
`tokenizers` on this repository's documentation; the corpus is that text
and its source files cut into documents of about 4 KB, 32 MB in all, as a
.jsonl. Both sides encode every document without special tokens on the
machine's cores (tandem --threads N; tokenizers with RAYON_NUM_THREADS=N):
tandem from the file to shards on disk, tokenizers from a list of strings
in memory (reading and writing not counted on its side). The median of 3
runs each, and the ratio tandem / tokenizers in MB/s.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS_MB = 32


def main():
    tandem = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.join(here, "..")
    threads = os.cpu_count()
    texts = []
    for pattern in ("docs/*.md", "README.md", "src/*/*.cpp", "include/tandem/*/*.h"):
        for path in sorted(glob.glob(os.path.join(repo, pattern))):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
    text = "\n".join(texts)
    with tempfile.TemporaryDirectory() as tmp:
        train = os.path.join(tmp, "train.txt")
        with open(train, "w", encoding="utf-8") as f:
            f.write(text)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train([train], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
        tokenizer = os.path.join(tmp, "tokenizer.json")
        tok.save(tokenizer)
        docs = []
        while sum(len(d) for d in docs) < CORPUS_MB << 20:
            for i in range(0, len(text), 4096):
                docs.append(text[i:i + 4096])
        corpus = os.path.join(tmp, "corpus.jsonl")
        with open(corpus, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        megabytes = sum(len(d.encode("utf-8")) for d in docs) / 1e6
        print(f"corpus: {len(docs)} documents, {megabytes:.1f} MB; {threads} threads; tokenizer of 8000 tokens")

        ours, theirs = [], []
        for run in range(3):
            out = os.path.join(tmp, f"out{run}")
            start = time.perf_counter()
            subprocess.run([tandem, "tokenize", "--tokenizer", tokenizer, "--out", out, "--threads", str(threads),
                            corpus], check=True, capture_output=True)
            ours.append(megabytes / (time.perf_counter() - start))
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
        code = ("import sys, time, json\nfrom tokenizers import Tokenizer\n"
                "tok = Tokenizer.from_file(sys.argv[1])\n"
                "docs = [json.loads(l)['text'] for l in open(sys.argv[2], encoding='utf-8')]\n"
                "start = time.perf_counter()\n"
                "tok.encode_batch(docs, add_special_tokens=False)\n"
                "print(time.perf_counter() - start)\n")
        for run in range(3):
            r = subprocess.run([sys.executable, "-c", code, tokenizer, corpus], env=env, check=True,
                               capture_output=True, text=True)
            theirs.append(megabytes / float(r.stdout.strip()))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"tandem tokenize: {a:.2f} MB/s (runs {', '.join(f'{x:.2f}' for x in ours)})")
        print(f"tokenizers encode_batch: {b:.2f} MB/s (runs {', '.join(f'{x:.2f}' for x in theirs)})")
        print(f"ratio tandem / tokenizers: {a / b:.2f}")


if __name__ == "__main__":
    main()
