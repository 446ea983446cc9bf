"""The value of `num_draft_tokens` that asks for a k chosen as decoding runs (`specdec_hf.generation.draft_length`).

It lives apart from the decoding code because the drafter's config (`specdec_hf.models`, which imports nothing of
decoding) accepts it as its default k too.
"""

AUTO = "auto"
