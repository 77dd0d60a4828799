"""An independent tokenizer oracle for the executor's tests: llama.cpp's "smollm" BPE in plain Python."""

from __future__ import annotations


class LlamaCppSmolLMTokenizer:
    """Independent oracle: llama.cpp's "smollm" tokenization, written from its definition in plain Python.

    llama.cpp (``src/llama-vocab.cpp``, pre-tokenizer ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``) splits the text
    with the regex ``\\p{N}`` (every digit alone), then splits the remaining pieces with the GPT-2 regex;
    each piece is mapped to the GPT-2 byte alphabet and merged by BPE, lowest merge rank first. Control
    tokens are matched literally first. Slow but plainly correct; the ``regex`` package gives Unicode classes.
    """

    # GPT-2's encoder.py pattern; its final "\s+" keeps the whitespace that llama.cpp leaves unmatched.
    GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

    def __init__(self, tokens: list[str], merges: list[str], special: list[str]) -> None:
        self.ids = {token: i for i, token in enumerate(tokens)}
        self.ranks = {tuple(merge.split(" ", 1)): rank for rank, merge in enumerate(merges)}
        self.special = sorted(special, key=len, reverse=True)
        # GPT-2's reversible byte -> printable character table (Radford et al., 2019, encoder.py).
        printable = [
            *range(ord("!"), ord("~") + 1),
            *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1),
        ]
        extra = iter(range(256, 512))
        self.byte_char = {b: chr(b if b in printable else next(extra)) for b in range(256)}

    def bpe(self, piece: str) -> list[int]:
        symbols = [self.byte_char[b] for b in piece.encode("utf-8")]
        while len(symbols) > 1:
            pairs = [
                (self.ranks.get(pair, float("inf")), i)
                for i, pair in enumerate(zip(symbols[:-1], symbols[1:], strict=True))
            ]
            rank, i = min(pairs)
            if rank == float("inf"):
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return [self.ids[s] for s in symbols]

    def encode(self, text: str) -> list[int]:
        import regex

        ids: list[int] = []
        pattern = "(" + "|".join(regex.escape(s) for s in self.special) + ")"
        for chunk_index, chunk in enumerate(regex.split(pattern, text) if self.special else [text]):
            if chunk_index % 2:  # a control token, matched whole
                ids.append(self.ids[chunk])
                continue
            for part in regex.split(r"(\p{N})", chunk):
                for piece in regex.findall(self.GPT2_SPLIT, part):
                    ids += self.bpe(piece)
        return ids
