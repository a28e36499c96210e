"""HTTP Content-Encoding codecs, as ClickHouse's HTTP interface speaks them.

ClickHouse's ``lz4`` encoding is the LZ4 *frame* format. clickhouse-connect
compresses every insert block as its own lz4 (or zstd) frame, so a body is a
concatenation of frames and must be decoded frame after frame.
"""
from __future__ import annotations

import gzip
import zlib

import lz4.frame

try:  # clickhouse-connect's own zstd module (the stdlib one from Python 3.14)
    from backports import zstd
except ImportError:  # pragma: no cover - depends on the clickhouse-connect build
    zstd = None

RESPONSE_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")
"""Response encodings offered, in order of preference when a client accepts several."""


class UnsupportedEncoding(ValueError):
    pass


def _lz4_frames(data: bytes) -> bytes:
    out = []
    while data:
        decoder = lz4.frame.LZ4FrameDecompressor()
        out.append(decoder.decompress(data))
        if not decoder.eof:
            raise ValueError("truncated lz4 frame")
        data = decoder.unused_data
    return b"".join(out)


def _zstd_frames(data: bytes) -> bytes:
    if zstd is None:
        raise UnsupportedEncoding("zstd")
    return zstd.decompress(data)  # decodes every concatenated frame


def decode(encoding: str, data: bytes) -> bytes:
    """Decompress a request body sent with ``Content-Encoding: encoding``."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding == "lz4":
        return _lz4_frames(data)
    if encoding == "zstd":
        return _zstd_frames(data)
    if encoding in ("gzip", "x-gzip"):
        return gzip.decompress(data)  # multi-member aware
    if encoding == "deflate":
        return zlib.decompress(data)
    raise UnsupportedEncoding(encoding)


def choose(accept_encoding: str) -> str | None:
    """The first encoding in the client's Accept-Encoding list that we can produce."""
    offered = [token.split(";")[0].strip().lower() for token in accept_encoding.split(",")]
    return next((enc for enc in offered if enc in RESPONSE_ENCODINGS and (enc != "zstd" or zstd)), None)


def encode(encoding: str, data: bytes) -> bytes:
    if encoding == "lz4":
        return lz4.frame.compress(data)
    if encoding == "zstd":
        return zstd.compress(data)
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=1)
    if encoding == "deflate":
        return zlib.compress(data, 1)
    raise UnsupportedEncoding(encoding)
