"""The reserved token ids, the same in every vocabulary and model of the package.

::

    0 <pad>   padding: masks hide it, losses skip it
    1 <s>     start of a decoder input
    2 </s>    end of a sequence
    3 <unk>   anything the vocabulary cannot spell

The tokenizer reserves them (``data.tokenizer``), the layers' padding masks
use ``PAD_ID``, and the searches take all of them as arguments with these as
defaults.
"""

PAD_ID = 0
START_ID = 1
END_ID = 2
UNK_ID = 3

# Each reserved id's piece, in every vocabulary of the package.
PIECES = {PAD_ID: "<pad>", START_ID: "<s>", END_ID: "</s>", UNK_ID: "<unk>"}
