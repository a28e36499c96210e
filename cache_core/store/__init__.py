"""Where the cache keeps its vectors and entries.

``base.VectorStore`` is the small contract a vector index meets (add / search / remove /
size, plus what the background ANN check needs); ``faiss`` holds today's kinds (flat,
IVF, HNSW) behind ``VectorIndex``, chosen by an arm's ``IndexSpec``; new kinds (hashed,
compressed, a remote or disk-backed tier) plug in beside it. ``partition.Partition`` is
one store: the entries, an index per conversation scope, LRU and capacity.
``ann_check.AnnChecker`` batches the sampled ANN-vs-exact checks of a partition.
"""
