"""A translator trained here against transformers' ``generate`` on the same
weights: BLEU, speed and memory, and the import of a base-sized checkpoint.

    python -m benchmarks.marian_parity --model runs/multi30k/translator.keras \\
        --source ../shared/data/multi30k/val.de.gz \\
        --reference ../shared/data/multi30k/val.en.gz

The translator is written as a Marian checkpoint folder
(``kt-export --format marian``) and as a CTranslate2 model under ``--work``.
Each system then translates the sentences in a process of its own, once to
warm up (Keras: all of them, so that every shape is compiled; the others: one
batch) and once timed: ``keras-<backend>``
(``Translator.translate``), ``transformers`` (``MarianMTModel.generate`` on
the written folder, PyTorch, batches of 64 sentences of similar length as
ours, each padded to its longest, with the folder's generation config) and
``ctranslate2-float32``. Searches: ``beam4`` (transformers' beam search and
length penalty, α from the generation config, on Keras and transformers;
CTranslate2's own beam search with the GNMT α), ``beam4-gnmt`` (the paper's
search here, for the BLEU it gives) and ``greedy``.

``--import-check`` also writes a Marian checkpoint of Transformer-base size
(``MarianConfig`` with OPUS-MT's sizes, random weights) and times
``Translator.from_preset`` on it per backend, with the process's peak
memory.
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

from benchmarks import child_env, python_module
from benchmarks.deploy_speed import peak_memory_bytes, read_lines

KERAS = ("keras-tensorflow", "keras-jax", "keras-torch")
SYSTEMS = (*KERAS, "transformers", "ctranslate2-float32")
SEARCHES = ("beam4", "beam4-gnmt", "greedy")
# transformers' generate is given batches of this many sentences, as the
# Keras translator searches them by default.
BATCH = 64
# OPUS-MT's Transformer-base (opus-mt-en-de): 74 M weights.
BASE = dict(
    vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
    encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
    decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
)  # fmt: skip


def batches_by_length(rows, size):
    """Indices of ``rows`` in batches of ``size``, shortest rows first."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def _transformers_translate(folder, extra_length):
    """A function of texts: ``generate`` with the folder's config, each
    batch's limit its longest source + ``extra_length`` (+1: transformers
    counts the start token)."""
    import torch
    import transformers

    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).eval()

    def translate(texts, **options):
        rows = tokenizer(texts)["input_ids"]
        outputs = [None] * len(texts)
        for batch in batches_by_length(rows, BATCH):
            encoded = tokenizer.pad({"input_ids": [rows[i] for i in batch]})
            inputs = {k: torch.tensor(v) for k, v in encoded.items()}
            longest = max(len(rows[i]) for i in batch) - 1
            with torch.no_grad():
                generated = model.generate(
                    **inputs, max_length=longest + extra_length + 1, **options
                )
            texts_out = tokenizer.batch_decode(generated, skip_special_tokens=True)
            for i, text in zip(batch, texts_out, strict=True):
                outputs[i] = text
        return outputs

    return translate, model.generation_config


def _system(system, work, model):
    """``(translate(texts, search), engine's dtype)`` of one system."""
    if system.startswith("keras-"):
        from keras_transformer.translate.evaluation import load_translator

        translator = load_translator(model)
        with open(os.path.join(work, "marian", "generation_config.json")) as file:
            marian = json.load(file)
        searches = {
            "beam4": dict(
                beam_size=4, length_penalty=marian["length_penalty"],
                length_penalty_form="transformers",
            ),
            "beam4-gnmt": dict(beam_size=4, length_penalty_form="gnmt"),
            "greedy": dict(beam_size=1, length_penalty_form="transformers"),
        }  # fmt: skip
        return (
            lambda texts, search: translator.translate(texts, **searches[search]),
            translator.search_compute_dtype,
        )
    if system == "transformers":
        translate, _ = _transformers_translate(os.path.join(work, "marian"), 50)
        searches = {"beam4": {"num_beams": 4}, "greedy": {"num_beams": 1}}
        return lambda texts, search: translate(texts, **searches[search]), "float32"
    from keras_transformer.export.ctranslate2 import load_ctranslate2

    translator = load_ctranslate2(os.path.join(work, system))
    beams = {"beam4": 4, "greedy": 1}
    return (
        lambda texts, search: translator.translate(texts, beam_size=beams[search]),
        "float32",
    )


def run_system(system, search, model, work, texts):
    translate, dtype = _system(system, work, model)
    # Warm-up: a Keras search compiles every shape the timed call meets; the
    # others compile nothing, and one batch loads their kernels.
    translate(texts if system in KERAS else texts[:BATCH], search)
    start = time.perf_counter()
    outputs = translate(texts, search)
    seconds = time.perf_counter() - start
    return {
        "system": system, "search": search, "dtype": dtype,
        "seconds": round(seconds, 2),
        "sentences_per_second": round(len(texts) / seconds, 1),
        "peak_memory_bytes": peak_memory_bytes(), "outputs": outputs,
    }  # fmt: skip


def write_folders(model, work):
    """The Marian folder and the CTranslate2 model, under ``work``."""
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.marian import write_marian
    from keras_transformer.translate.evaluation import load_translator

    translator = load_translator(model)
    write_marian(translator, os.path.join(work, "marian"), overwrite=True)
    export_ctranslate2(
        translator, os.path.join(work, "ctranslate2-float32"), overwrite=True
    )


def base_checkpoint(folder):
    """A Marian checkpoint of Transformer-base size with random weights and
    a tokenizer (one SentencePiece model of number words; ``vocab.json``
    filled up to the model's vocabulary with placeholders)."""
    import io

    import sentencepiece as spm
    import torch
    import transformers

    from keras_transformer.data.numbers import english

    torch.manual_seed(0)
    size = BASE["vocab_size"]
    config = transformers.MarianConfig(
        **BASE, pad_token_id=size - 1, decoder_start_token_id=size - 1, eos_token_id=0
    )
    transformers.MarianMTModel(config).save_pretrained(folder)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(english(n) for n in range(0, 5000, 7)),
        model_writer=proto, vocab_size=60, hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    processor = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    pieces = [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    vocabulary = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    for i in range(len(vocabulary), size - 1):
        vocabulary[f"<unused{i}>"] = i
    vocabulary["<pad>"] = size - 1
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(folder, name), "wb") as file:
            file.write(proto.getvalue())
    with open(os.path.join(folder, "vocab.json"), "w") as file:
        json.dump(vocabulary, file)


def import_once(folder):
    """Seconds to import the checkpoint (``from_preset``), after ``import
    keras_transformer``, and the process's peak memory."""
    import keras_transformer as kt

    start = time.perf_counter()
    translator = kt.Translator.from_preset(folder)
    seconds = time.perf_counter() - start
    return {
        "weights": translator.transformer.count_params(),
        "seconds": round(seconds, 2),
        "peak_memory_bytes": peak_memory_bytes(),
    }


def _child(args, *what):
    env = child_env(KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        python_module("benchmarks.marian_parity", *what), env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--source")
    parser.add_argument("--reference")
    parser.add_argument("--sentences", type=int)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    parser.add_argument("--searches", nargs="+", choices=SEARCHES, default=SEARCHES)
    parser.add_argument("--work", help="where the folders go (default: a temp dir)")
    parser.add_argument("--import-check", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="numpy", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return print(json.dumps(_run_child(args)))
    work = args.work or tempfile.mkdtemp(prefix="marian-parity-")
    results = []
    if args.model:
        results += _translations(args, work)
        _agreement(results)
        _write(args.json, results)
    if args.import_check:
        results += _imports(args, work)
        _write(args.json, results)
    return results


def _write(path, results):
    if path:
        with open(path, "w") as file:
            json.dump(results, file, indent=1, ensure_ascii=False)


def _agreement(results):
    """Per search, the fraction of each system's outputs equal to the first
    Keras system's."""
    for search in dict.fromkeys(r["search"] for r in results):
        runs = [r for r in results if r["search"] == search]
        base = next((r for r in runs if r["system"] in KERAS), None)
        if base is None:
            continue
        for r in runs:
            same = sum(
                a == b for a, b in zip(r["outputs"], base["outputs"], strict=True)
            )
            r["same_as"] = base["system"]
            r["same_fraction"] = round(same / len(base["outputs"]), 4)
            print(f"{search:10s} {r['system']:20s} same as {base['system']}: "
                  f"{same} of {len(base['outputs'])}")  # fmt: skip


def _run_child(args):
    kind, *rest = args.child
    if kind == "import":
        return import_once(rest[0])
    system, search = rest
    texts = read_lines(args.source, args.sentences)
    return run_system(system, search, args.model, args.work, texts)


def _translations(args, work):
    import sacrebleu

    write_folders(args.model, work)
    references = read_lines(args.reference, args.sentences) if args.reference else None
    results = []
    for search in args.searches:
        for system in args.systems:
            if search == "beam4-gnmt" and not system.startswith("keras-"):
                continue  # the paper's search is this package's
            args.backend = system.split("-")[1] if system in KERAS else "numpy"
            if system == "transformers":
                args.backend = "torch"
            result = _child(
                args, "--child", "translate", system, search, "--model", args.model,
                "--source", args.source, "--work", work,
                *(["--sentences", str(args.sentences)] if args.sentences else []),
            )  # fmt: skip
            if references is not None:
                bleu = sacrebleu.corpus_bleu(result["outputs"], [references])
                result["bleu"] = round(bleu.score, 2)
            results.append(result)
            print(
                f"{system:20s} {search:10s} {result['seconds']:7.2f} s "
                f"{result['sentences_per_second']:7.1f} sent/s "
                f"{result['peak_memory_bytes'] / 2**30:5.2f} GiB "
                f"BLEU {result.get('bleu', float('nan')):6.2f}",
                flush=True,
            )
    return results


def _imports(args, work):
    folder = os.path.join(work, "base")
    if not os.path.isdir(folder):
        base_checkpoint(folder)
    results = []
    for backend in ("tensorflow", "jax", "torch"):
        args.backend = backend
        result = {"backend": backend, **_child(args, "--child", "import", folder)}
        results.append(result)
        memory = result["peak_memory_bytes"] / 2**30
        print(
            f"import {backend:10s} {result['weights']:,} weights "
            f"{result['seconds']:6.2f} s {memory:5.2f} GiB",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
