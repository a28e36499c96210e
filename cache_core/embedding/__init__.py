"""Encoders: the ``Embedder`` protocol and torch backend (``embedder``), the ONNX export and
backend (``onnx``, onnx-int8 by default), micro-batching (``batching``), and ``load.load_embedder``,
which picks the configured one."""
