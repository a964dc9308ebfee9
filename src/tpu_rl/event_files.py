"""The scalars in TensorBoard event files, read without TensorBoard.

An event file is a sequence of TFRecords (``tensorflow/core/lib/io/record_writer.cc``: a little-endian
uint64 length, the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data), each holding
one serialised ``Event`` (``tensorflow/core/util/event.proto``). Only the fields a scalar needs are decoded
from the protobuf wire format: ``Event.wall_time``, ``Event.step`` and ``Event.summary``; in ``Summary.Value``
the ``tag``, a ``simple_value`` (what tensorboardX's ``add_scalar`` writes, and so MaxText's writer) or a
``tensor`` whose ``metadata.plugin_data.plugin_name`` is ``scalars`` (TensorBoard's own summaries,
tensorboardX with ``new_style=True``).

Why not TensorBoard's reader: its current release needs protobuf >= 6.31.1 and grpcio >= 1.74, which Cloud
Composer's images do not all have, and the package must install there without moving a preinstalled
package. This reader needs only ``google-crc32c`` (a dependency of google-cloud-storage). Pure: bytes in,
values out. ``tests/unit/test_event_files.py`` reads the same files with TensorBoard's loader and compares.

A file that grows (a trainer's, flushed again and again) is read piece by piece with :class:`EventStream`: each
piece's whole records are parsed once, and only the bytes of a record cut short are kept for the next piece.
:func:`scalars` is one stream fed the whole file, so reading a file in pieces gives what reading it whole gives.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
#: ``types.proto`` DataType -> struct format of one element.
_DTYPES = {1: "f", 2: "d", 3: "i", 9: "q", 19: "e"}  # DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_HALF


@dataclass(frozen=True)
class Scalar:
    step: int
    tag: str
    value: float
    #: When the writer logged it (POSIX seconds): tensorboardX stamps each record with ``time.time()``.
    wall_time: float


def _framed(data: bytes) -> Iterator[tuple[bytes, int]]:
    """Each whole record's data and the offset where the record ends, up to the first one cut short or damaged (a
    file read while its writer flushes ends in a partial record; the records before it are whole)."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, length_crc = _HEADER.unpack_from(data, offset)
        if _masked_crc(data[offset : offset + 8]) != length_crc:
            return
        start, end = offset + _HEADER.size, offset + _HEADER.size + length
        if end + _FOOTER.size > len(data):
            return
        payload = data[start:end]
        if _masked_crc(payload) != _FOOTER.unpack_from(data, end)[0]:
            return
        offset = end + _FOOTER.size
        yield payload, offset


def _is_damaged(rest: bytes) -> bool:
    """Whether the bytes after the last whole record begin with a damaged record rather than one cut short: its
    header is whole and its length's CRC fails, or the whole record is there (so its data's CRC failed). No later
    bytes make a damaged record whole."""
    if len(rest) < _HEADER.size:
        return False
    length, length_crc = _HEADER.unpack_from(rest)
    return _masked_crc(rest[:8]) != length_crc or _HEADER.size + length + _FOOTER.size <= len(rest)


class EventStream:
    """An event file read in pieces, each the bytes that follow the pieces before: the scalars of each piece's
    whole records. Keeps only the bytes of a record cut short (at most one record's), and after a damaged record
    reads nothing more, as a whole file's reading ends there."""

    def __init__(self) -> None:
        #: How many of the file's bytes were fed.
        self.size = 0
        self.damaged = False
        self._rest = b""

    @property
    def kept(self) -> int:
        """The bytes kept of a record cut short."""
        return len(self._rest)

    def feed(self, piece: bytes) -> list[Scalar]:
        """The scalars of the records ``piece`` completes, in the order written."""
        self.size += len(piece)
        if self.damaged:
            return []
        data = self._rest + piece if self._rest else piece
        found: list[Scalar] = []
        end = 0
        for record, record_end in _framed(data):
            found.extend(_record_scalars(record))
            end = record_end
        self._rest = data[end:]
        if _is_damaged(self._rest):
            self.damaged, self._rest = True, b""
        return found


def scalars(data: bytes) -> Iterator[Scalar]:
    """Every scalar of an event file, in the order written."""
    yield from EventStream().feed(data)


def _record_scalars(record: bytes) -> Iterator[Scalar]:
    """The scalars of one record (one ``Event``): none when it holds no summary."""
    step, summary, wall_time = 0, None, 0.0
    for number, value in _fields(record):
        if number == 1:
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2:
            step = _signed(value)
        elif number == 5:
            summary = value
    if summary is None:
        return
    for number, value in _fields(summary):
        if number == 1:
            scalar = _scalar_value(value)
            if scalar is not None:
                yield Scalar(step, *scalar, wall_time)


def _scalar_value(value: bytes) -> tuple[str, float] | None:
    tag, simple, tensor, plugin = "", None, None, ""
    for number, field in _fields(value):
        if number == 1:
            tag = field.decode()
        elif number == 2:
            simple = struct.unpack("<f", field)[0]
        elif number == 8:
            tensor = field
        elif number == 9:
            plugin = _plugin_name(field)
    if simple is not None:
        return tag, simple
    if tensor is not None and plugin == "scalars":
        number = _tensor_scalar(tensor)
        return None if number is None else (tag, number)
    return None


def _plugin_name(metadata: bytes) -> str:
    for number, field in _fields(metadata):
        if number == 1:  # plugin_data
            for inner, name in _fields(field):
                if inner == 1:
                    return name.decode()
    return ""


def _tensor_scalar(tensor: bytes) -> float | None:
    """A rank-0 TensorProto's value: from ``tensor_content`` or the typed repeated field of its dtype."""
    dtype, content, repeated = 0, b"", {}
    for number, field in _fields(tensor):
        if number == 1:
            dtype = field
        elif number == 4:
            content = field
        elif number in (5, 6, 7, 10, 13):  # float_val, double_val, int_val, int64_val, half_val
            repeated.setdefault(number, []).append(field)
    form = _DTYPES.get(dtype)
    if form is None:
        return None
    if content:
        return float(struct.unpack_from("<" + form, content)[0])
    # float_val and double_val are fixed-width: packed or not, the first value is the field's first bytes
    if dtype == 1 and 5 in repeated:
        return float(struct.unpack_from("<f", repeated[5][0])[0])
    if dtype == 2 and 6 in repeated:
        return float(struct.unpack_from("<d", repeated[6][0])[0])
    if dtype == 3 and 7 in repeated:
        return float(_varint_values(repeated[7])[0])
    if dtype == 9 and 10 in repeated:
        return float(_varint_values(repeated[10])[0])
    if dtype == 19 and 13 in repeated:
        return float(struct.unpack("<e", struct.pack("<H", _varint_values(repeated[13])[0] & 0xFFFF))[0])
    return None


def _varint_values(fields: list) -> list[int]:
    values: list[int] = []
    for field in fields:
        if isinstance(field, bytes):
            offset = 0
            while offset < len(field):
                value, offset = _varint(field, offset)
                values.append(_signed(value))
        else:
            values.append(_signed(field))
    return values


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of a message: ints for varints, bytes for the rest (a fixed32/64 as its
    raw little-endian bytes, a length-delimited field as its contents)."""
    offset = 0
    while offset < len(message):
        key, offset = _varint(message, offset)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, offset = _varint(message, offset)
            yield number, value
        elif wire == 1:
            yield number, message[offset : offset + 8]
            offset += 8
        elif wire == 2:
            length, offset = _varint(message, offset)
            yield number, message[offset : offset + length]
            offset += length
        elif wire == 5:
            yield number, message[offset : offset + 4]
            offset += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def _signed(value: int) -> int:
    """An int64 varint as its two's-complement value."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = int.from_bytes(google_crc32c.Checksum(data).digest(), "big")
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
