import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

from dsocr_core.runtime.generate import ban_repeated_ngrams, next_tokens


def test_ngram_ban_matches_transformers_processor():
    gen = torch.Generator().manual_seed(0)
    for n in (2, 3, 5, 20):
        for length in (1, n - 1, n, n + 3, 60):
            # a small alphabet makes repeated n-grams (and so bans) frequent
            history = torch.randint(0, 4, (3, max(length, 1)), generator=gen)
            scores = torch.randn(3, 7, generator=gen)
            ours = ban_repeated_ngrams(history, scores.clone(), n)
            ref = NoRepeatNGramLogitsProcessor(n)(history, scores.clone())
            assert torch.equal(torch.isinf(ours), torch.isinf(ref)), (n, length)
            assert torch.equal(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)])


def test_ngram_ban_forbids_exact_repeat():
    history = torch.tensor([[5, 6, 7, 5, 6]])
    scores = torch.zeros(1, 10)
    out = ban_repeated_ngrams(history, scores, 3)
    assert torch.isinf(out[0, 7]) and torch.isinf(out).sum() == 1


def test_finished_rows_emit_pad():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    history = torch.zeros(2, 1, dtype=torch.long)
    tokens = next_tokens(logits, history, 0, torch.tensor([False, True]), pad_token_id=2)
    assert tokens.tolist() == [1, 2]
