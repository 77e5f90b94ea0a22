"""``hf://owner/name``: a checkpoint folder from the Hugging Face Hub's cache.

The files are fetched with ``huggingface_hub`` into its usual cache
(``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``), or read from it
alone when the hub is offline (``HF_HUB_OFFLINE=1``) or unreachable. Only
what an import reads is fetched: the config, the weights (safetensors, or a
PyTorch ``.bin`` where there is none) and the tokenizer's files.
"""

import os

PREFIX = "hf://"
FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "*.spm",
    "*vocab.json",
]


def is_hub_id(source):
    return isinstance(source, str) and source.startswith(PREFIX)


def local_folder(source):
    """The folder of ``source``: itself if it is a path, else the snapshot
    of the hub repository ``hf://owner/name`` (downloaded if need be)."""
    if not is_hub_id(source):
        return os.fspath(source)
    repo = source[len(PREFIX) :].strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"{source}: a hub id is hf://owner/name")
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError as error:
        raise ImportError(
            f"{source} needs the huggingface_hub package: "
            'pip install "keras-transformer-aiayn[pretrained]"'
        ) from error
    try:
        folder = huggingface_hub.snapshot_download(repo, allow_patterns=FILES)
        if not _has_weights(folder):  # an older checkpoint: PyTorch's file only
            folder = huggingface_hub.snapshot_download(
                repo, allow_patterns=[*FILES, "pytorch_model.bin"]
            )
    except Exception as error:  # the hub's errors have no common base class
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        reason = (str(error).splitlines() or [""])[0]
        raise FileNotFoundError(
            f"{source}: {repo} is not in the Hugging Face cache "
            f"{constants.HF_HUB_CACHE} and could not be downloaded{offline}: "
            f"{type(error).__name__}: {reason}"
        ) from error
    return folder


def _has_weights(folder):
    names = os.listdir(folder)
    return any(name.endswith(".safetensors") for name in names)
