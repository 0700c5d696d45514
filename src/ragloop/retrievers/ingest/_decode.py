"""Bytes to text: UTF-8 first, then a byte-order mark, then detection (charset-normalizer); NUL bytes removed.

A text file in latin-1, Windows-1252, UTF-16 or Shift-JIS is decoded instead of dropped; a stray NUL byte is
removed instead of making the file "binary"; a file that decodes to no plausible text (an image, an archive,
random bytes) is refused as binary.
"""

from __future__ import annotations

import codecs

from ragloop.retrievers.ingest._blocks import MissingExtra

__all__ = ["Undecodable", "decode_text"]

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
#: Share of NUL bytes above which a file is wide text (UTF-16/32 without a mark) or binary, never stray NULs.
_MANY_NULS = 0.05
#: Share of control characters (other than tab, newline, carriage return, form feed) that makes text binary.
_MAX_CONTROL = 0.05
_TEXT_CONTROLS = frozenset("\t\n\r\f\x0b")
_WESTERN = ("cp1252", "latin_1", "iso8859_15")


class Undecodable(Exception):
    """The bytes are not text in any encoding found (binary), with the reason."""


def decode_text(data: bytes) -> tuple[str, str]:
    """Decode a text file's bytes.

    Args:
        data: The file's bytes.

    Returns:
        ``(text, encoding)``: the text (NUL bytes removed) and the encoding it was read in.

    Raises:
        Undecodable: the bytes are binary (no encoding gives plausible text).
        MissingExtra: the text is not UTF-8 and charset-normalizer is not installed to detect its encoding.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return _checked(data.decode(encoding).replace("\x00", "")), encoding
            except UnicodeDecodeError:
                break
    nuls = data.count(b"\x00")
    if nuls <= _MANY_NULS * len(data):
        stripped = data.replace(b"\x00", b"") if nuls else data
        try:
            return _checked(stripped.decode("utf-8")), "utf-8"
        except UnicodeDecodeError:
            pass
    else:
        stripped = data
    text, encoding = _detect(stripped)
    return _checked(text.replace("\x00", "")), encoding


def _detect(data: bytes) -> tuple[str, str]:
    try:
        from charset_normalizer import from_bytes
    except ImportError as exc:
        raise MissingExtra(
            "not UTF-8, and detecting its encoding needs the [ingest] extra (charset-normalizer): "
            "pip install 'ragloop[ingest]', or convert the file to UTF-8"
        ) from exc
    matches = list(from_bytes(data))
    best = matches[0] if matches else None
    if best is not None:
        # Among equally good single-byte guesses, Windows-1252 (a superset of latin-1) is by far the most common.
        tied = [m for m in matches if m.chaos == best.chaos and m.coherence == best.coherence]
        best = next((m for m in tied if m.encoding in _WESTERN), best)
    if best is None:
        raise Undecodable("binary file (no text encoding fits its bytes); only text and supported documents are read")
    return str(best), best.encoding


def _checked(text: str) -> str:
    if text:
        controls = sum(1 for c in text if c < " " and c not in _TEXT_CONTROLS)
        if controls > _MAX_CONTROL * len(text):
            raise Undecodable(
                f"binary file ({controls} control characters in {len(text)}); only text and supported documents "
                "are read"
            )
    return text
