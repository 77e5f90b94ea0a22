"""The end of a run: reload the saved translator, score it, write the report."""

import keras

from keras_transformer.search.options import SearchOptions
from keras_transformer.trainer.parallel import log
from keras_transformer.translate.evaluation import load_translator


def report(config, task, data, folder, trained_seconds):
    """Reload ``translator.keras`` as a user would, score it as the task
    says, print a few translations, and write ``results.json``; the run is
    finished once that is written. Returns the results."""
    translator = load_translator(folder.translator)  # keras.saving.load_model
    log(f"reloaded {folder.translator} with keras.saving.load_model")
    search = SearchOptions(
        beam_size=config.beam_size, length_penalty=config.length_penalty
    )
    results = {
        "trained_seconds": round(trained_seconds, 1),
        "backend": keras.backend.backend(),
        "beam_size": search.beam_size,
        "length_penalty": search.length_penalty,
    }
    scores, examples = task.report(translator, data, search)
    results.update(scores)
    translations = translator.translate(examples, search)
    for source, target in zip(examples, translations, strict=True):
        log(f"  {source}  ->  {target}")
    folder.finish(results)
    return results
