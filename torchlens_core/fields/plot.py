"""A receptive field drawn on its input: a PNG written with NumPy and zlib alone (no plotting library needed)."""

from __future__ import annotations

import pathlib
import struct
import zlib

import numpy as np

from torchlens_core.fields.records import Box
from torchlens_core.ir.errors import FieldError

BOX_COLOUR = (255, 40, 40)
PAD_COLOUR = (255, 200, 0)  # the frame's edge where the field runs on into padding


def overlay(
    image: np.ndarray, box: Box, path: str | pathlib.Path, *, batch_index: int = 0, min_size: int = 256
) -> pathlib.Path:
    """Write ``image`` (the input array, any layout) as a PNG with ``box`` outlined; returns the path.

    The box's two spatial dims are the picture's rows and columns. Dim 0 is
    the batch (sample ``batch_index`` is drawn) unless it is spatial; one
    remaining dim of size 3 is drawn as RGB, others are averaged to grey.
    Small inputs are scaled up (nearest neighbour) to at least ``min_size``
    pixels; the edges where the field spills into padding are drawn yellow.
    """
    if len(box.axes) != 2:
        raise FieldError(f"overlay draws a box over two spatial dims, this one has {len(box.axes)}")
    rows, cols = box.axes[0].axis, box.axes[1].axis
    array = np.asarray(image, dtype=np.float64)
    if 0 not in (rows, cols) and array.ndim > 2:
        array = array[batch_index]
        rows, cols = rows - 1, cols - 1
    rest = [d for d in range(array.ndim) if d not in (rows, cols)]
    array = np.transpose(array, (rows, cols, *rest)).reshape(array.shape[rows], array.shape[cols], -1)
    rgb = array if array.shape[2] == 3 else np.repeat(array.mean(axis=2, keepdims=True), 3, axis=2)
    low, high = float(rgb.min()), float(rgb.max())
    pixels = ((rgb - low) / (high - low) * 255 if high > low else np.zeros_like(rgb)).astype(np.uint8)
    scale = max(1, -(-min_size // max(pixels.shape[:2])))
    pixels = np.ascontiguousarray(pixels.repeat(scale, axis=0).repeat(scale, axis=1))
    _outline(pixels, box, scale)
    path = pathlib.Path(path)
    path.write_bytes(png_bytes(pixels))
    return path


def _outline(pixels: np.ndarray, box: Box, scale: int) -> None:
    """Draw the box's frame (two pixels thick) into ``pixels``; an edge in padding is drawn on the border."""
    height, width = pixels.shape[:2]
    r, c = box.axes
    if r.size == 0 or c.size == 0:
        return
    top, bottom = r.start * scale, r.stop * scale - 1
    left, right = c.start * scale, c.stop * scale - 1
    edges = [
        ((slice(top, top + 2), slice(left, right + 1)), r.pad_before),
        ((slice(bottom - 1, bottom + 1), slice(left, right + 1)), r.pad_after),
        ((slice(top, bottom + 1), slice(left, left + 2)), c.pad_before),
        ((slice(top, bottom + 1), slice(right - 1, right + 1)), c.pad_after),
    ]
    for (rs, cs), padded in edges:
        rs = slice(max(rs.start, 0), min(rs.stop, height))
        cs = slice(max(cs.start, 0), min(cs.stop, width))
        pixels[rs, cs] = PAD_COLOUR if padded else BOX_COLOUR


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (height x width x 3, uint8)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise FieldError(f"png_bytes takes height x width x 3 uint8 pixels, got {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    raw = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + chunk(b"IEND", b"")
    )
