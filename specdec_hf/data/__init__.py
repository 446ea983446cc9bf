"""Data for drafter training and evaluation: text-pair loaders, tokenization, and the offline Debian corpora.

- `loading`: `load_text_pairs` turns Hub datasets (WMT14, WMT16, CNN/DailyMail, XSum), local files and the Debian
  corpora into one `(id, source, target)` schema;
- `local_files`: local data files named in their errors (an empty file, a malformed JSON Lines row and its line);
- `tokenization`: `tokenize_pairs` with the verifier's tokenizer, T5 task prefixes, vocabulary checks;
- `debian_corpus`: the offline corpus builder (`python -m specdec_hf.data.debian_corpus`).
"""

from .loading import KNOWN_DATASETS, DataArguments, KnownDataset, load_text_pair_splits, load_text_pairs
from .tokenization import check_tokenizer_matches, default_source_prefix, tokenize_pairs

__all__ = [
    "KNOWN_DATASETS",
    "DataArguments",
    "KnownDataset",
    "check_tokenizer_matches",
    "default_source_prefix",
    "load_text_pair_splits",
    "load_text_pairs",
    "tokenize_pairs",
]
