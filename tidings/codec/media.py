"""The three media a REST body may come in, and how a Content-Type names one.

- ``application/json``: Avro ``bytes`` fields are standard base64 strings.
- ``avro/binary``: exactly CDAP TMS's schemas, so a client written for those works
  unchanged.
- ``avro/binary; schema=tidings``: those schemas extended with message keys,
  headers and per-message TTLs. Avro binary carries no field names, so the extension
  needs its own media type rather than optional fields.

One more medium exists for answers only: ``application/vnd.tidings.columns``, the
columnar poll response (:mod:`tidings.codec.columns`) a poll gets when its ``Accept``
header names it. :func:`media_for` refuses it (no request is in it);
:func:`response_media_for` reads it.
"""

from __future__ import annotations

import enum

from tidings.errors import UnsupportedMediaType

__all__ = ["AVRO", "AVRO_EXT", "COLUMNS", "JSON", "Media", "media_for", "response_media_for"]


class Media(enum.Enum):
    """A body encoding; ``value`` is the Content-Type the server answers with."""

    JSON = "application/json"
    AVRO = "avro/binary"
    AVRO_EXT = "avro/binary; schema=tidings"
    COLUMNS = "application/vnd.tidings.columns"  # poll answers only


JSON, AVRO, AVRO_EXT, COLUMNS = Media.JSON, Media.AVRO, Media.AVRO_EXT, Media.COLUMNS


def media_for(content_type: str | None) -> Media:
    """The medium a Content-Type header names; no header means JSON.

    Raises :class:`UnsupportedMediaType` for anything else.
    """
    if not content_type:
        return JSON
    main, _, params = content_type.partition(";")
    main = main.strip().lower()
    if main == "application/json":
        return JSON
    if main == "avro/binary":
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "schema" and value.strip().strip('"').lower() == "tidings":
                return AVRO_EXT
        return AVRO
    raise UnsupportedMediaType(
        f"unsupported Content-Type {content_type!r}; use application/json or avro/binary"
    )


def response_media_for(content_type: str) -> Media:
    """The medium of an answer's Content-Type: any :func:`media_for` reads, or the
    columnar poll response. Raises :class:`UnsupportedMediaType` for anything else."""
    if content_type.partition(";")[0].strip().lower() == COLUMNS.value:
        return COLUMNS
    return media_for(content_type)
