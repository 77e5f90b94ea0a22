"""What the page shows of one translation: the n best, with their scores,
and each one's cross-attention (§3.2.3), as JSON.

The weights are ``kt.attention_maps``' own (the decoder fed each hypothesis
by teacher forcing), rounded to six decimals: the page draws them, and a
heat map cannot show more. An engine that computes no attention weights (a
CTranslate2 export) answers the n best with ``"attention": null`` and a
note that says why.
"""

import warnings

# Decimals kept of each weight: more than a colour scale can show, and the
# JSON of a 4-layer, 8-head map of two 50-token sentences stays under 1 MB.
DECIMALS = 6


def explanation(translator, source, hypotheses):
    """The JSON body of ``POST /explain``.

    Args:
        translator: an engine of the translator interface.
        source: the source sentence (str).
        hypotheses: ``[(translation, score), ...]``, best first (``n_best``).

    Returns:
        ``{"source", "translations": [{"text", "score"}], "attention":
        [one map per translation] or None, "attention_note"}``; a map is
        ``{"source_tokens", "target_tokens", "cross_attention"}`` with
        ``cross_attention[layer][head][target][source]``.
    """
    answer = {
        "source": source,
        "translations": [
            {"text": text, "score": round(float(score), DECIMALS)}
            for text, score in hypotheses
        ],
        "attention": None,
        "attention_note": None,
    }
    if not translator.gives_attention:
        answer["attention_note"] = (
            f"this engine ({translator.engine}) computes no attention weights: "
            "serve the .keras translator to see them"
        )
        return answer
    with warnings.catch_warnings():
        # A source cut to max_length or holding unknown characters has been
        # warned about when it was translated; these runs repeat it.
        warnings.simplefilter("ignore", UserWarning)
        answer["attention"] = [_map(translator, source, t) for t, _ in hypotheses]
    return answer


def _map(translator, source, target):
    try:
        maps = translator.attention_maps(source, target)
    except ValueError:
        # A translation that ran to the length limit, tokenized again, may
        # not fit the decoder with its start token: no map for it.
        return None
    return {
        "source_tokens": list(maps.source_tokens),
        "target_tokens": list(maps.target_tokens),
        "cross_attention": maps.cross_attention.astype("float64")
        .round(DECIMALS)
        .tolist(),
    }
