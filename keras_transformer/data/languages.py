"""The language codes a translator records: which pair it translates.

A translator carries ``languages = (source, target)`` (codes such as ``"de"``,
``"en"``, ``"pt_br"``) or None. Servers need them: LibreTranslate's API names
the pair of every request and lists what a server offers by code and name
(``GET /languages``). The codes come from where the pair is first known:
``kt-train --source/--target``, an imported checkpoint's name or tokenizer
config, or ``kt-serve --source-lang/--target-lang``.
"""

import re

# ISO 639 codes (two or three letters), optionally a region or script after
# "-" or "_" (OPUS-MT spells them "pt_br", "zh_Hant"): what clients send.
_CODE = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?")

# The English names LibreTranslate's /languages gives beside the codes, for
# the languages of Multi30k, WMT and the most used OPUS-MT pairs; any other
# code is its own name.
NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


def check_code(code, name="language"):
    """``code`` if it is a language code; ``ValueError`` naming ``name``."""
    if not isinstance(code, str) or not _CODE.fullmatch(code):
        shown = code[:20] + "…" if isinstance(code, str) and len(code) > 20 else code
        raise ValueError(
            f"{name} must be a language code such as 'de', 'en' or 'pt_br'. "
            f"Received: {shown!r}"
        )
    return code


def check_languages(languages):
    """``(source, target)`` as a tuple of checked codes, or None."""
    if languages is None:
        return None
    if isinstance(languages, str) or len(languages) != 2:
        raise ValueError(
            "languages must be a (source, target) pair of language codes. "
            f"Received: {languages!r}"
        )
    source, target = languages
    return (
        check_code(source, "the source language"),
        check_code(target, "the target language"),
    )


def language_name(code):
    """The English name of ``code`` (its base language), or the code."""
    return NAMES.get(re.split(r"[-_]", code)[0], code)


def languages_of_name(name):
    """``(source, target)`` from a checkpoint's name in OPUS-MT's style
    (``opus-mt-de-en``, ``Helsinki-NLP/opus-mt-en-ROMANCE``'s lower-case
    pairs), or None when the name says no pair."""
    found = re.search(
        r"opus-mt-([a-z]{2,3}(?:_[A-Za-z]+)?)-([a-z]{2,3}(?:_[A-Za-z]+)?)$", name
    )
    return (found.group(1), found.group(2)) if found else None
