"""Video frames, drawn one way for every video vlarl writes (the evaluation videos of
``vlarl.evaluation.video``): each env is a tile with its instruction on a dark
band at the top and, on the frames where its episode ended, a green (success) or red (failure) border;
the tiles of a batch are laid out in a near-square grid. Frames are uint8 [H, W, 3].
"""

from __future__ import annotations

import math

import numpy as np

SUCCESS_RGB = (40, 200, 40)
FAILURE_RGB = (220, 40, 40)
#: border width as a fraction of the tile height, and its minimum in pixels
BORDER_FRACTION = 1 / 16
MIN_BORDER_PX = 2
#: caption: pixels per text line (PIL's default bitmap font), and at most this many lines
CAPTION_LINE_PX = 11
CAPTION_LINES = 2
CAPTION_CHAR_PX = 6  # pixels per character of that font: a line holds width / CAPTION_CHAR_PX characters


def border(tile: np.ndarray, success: bool) -> np.ndarray:
    """A copy of ``tile`` [H, W, 3] with a success (green) or failure (red) border."""
    tile = tile.copy()
    c = np.array(SUCCESS_RGB if success else FAILURE_RGB, dtype=np.uint8)
    w = max(MIN_BORDER_PX, int(tile.shape[0] * BORDER_FRACTION))
    tile[:w], tile[-w:], tile[:, :w], tile[:, -w:] = c, c, c, c
    return tile


def caption(tile: np.ndarray, text: str) -> np.ndarray:
    """Write ``text`` (wrapped, at most ``CAPTION_LINES`` lines) on a dark band at the top of the tile."""
    if not text:
        return tile
    from PIL import Image, ImageDraw

    img = Image.fromarray(tile)
    draw = ImageDraw.Draw(img)
    chars = max(8, tile.shape[1] // CAPTION_CHAR_PX)
    lines = [text[k : k + chars] for k in range(0, min(len(text), CAPTION_LINES * chars), chars)]
    band = CAPTION_LINE_PX * len(lines) + 2
    draw.rectangle([0, 0, tile.shape[1], band], fill=(0, 0, 0))
    for j, line in enumerate(lines):
        draw.text((2, 1 + CAPTION_LINE_PX * j), line, fill=(255, 255, 255))
    return np.asarray(img)


def grid(tiles: list[np.ndarray]) -> np.ndarray:
    """Tiles of equal size -> one near-square grid image (unused cells black)."""
    n = len(tiles)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    h, w, _ = tiles[0].shape
    out = np.zeros((rows * h, cols * w, 3), dtype=np.uint8)
    for k, tile in enumerate(tiles):
        r, c = divmod(k, cols)
        out[r * h : (r + 1) * h, c * w : (c + 1) * w] = tile
    return out


__all__ = ["BORDER_FRACTION", "FAILURE_RGB", "SUCCESS_RGB", "border", "caption", "grid"]
