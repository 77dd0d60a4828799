"""experiments/drafter_clean_eval.py: the files a training run read are exactly those its token budget reached."""

from executor.training.corpus import Corpus
from experiments.drafter_clean_eval import files_read


class WordTokenizer:
    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


def test_a_run_reads_train_documents_in_order_until_the_budget_is_filled():
    corpus = Corpus("c", [("a", "one two three"), ("b", "four five"), ("c", "six")], [("h", "held out")])
    tokenizer = WordTokenizer()
    assert files_read(corpus, tokenizer, 0) == set()
    assert files_read(corpus, tokenizer, 4) == {"a"}  # 3 tokens + end of text
    assert files_read(corpus, tokenizer, 5) == {"a", "b"}
    assert files_read(corpus, tokenizer, 100) == {"a", "b", "c"}  # never the held-out split
