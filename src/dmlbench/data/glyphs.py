"""Offline built-in dataset: glyphs rendered from the fonts that matplotlib ships, deterministic from
``seed``. A class is one character; an image draws it in a random font, size, pose, stroke, blur, ink
and paper (ink always darker, so the demo learns shapes, not polarity). Not flip-invariant ('b', 'd').
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveInt

from dmlbench.data.base import DatasetParams, DatasetSpec, SourceParams
from dmlbench.io import atomic_dir, atomic_path

# Candidate classes, in a fixed order. Look-alikes across scripts (Latin 'A' / Greek 'Α' /
# Cyrillic 'А', 'o' / 'ο' / 'о', ...) are left out so that no two classes share a shape.
LATIN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz"  # no 'l' (looks like 'I')
DIGITS = "23456789"  # no '0' / '1' (look like 'O' / 'I')
GREEK = "ΓΔΘΛΞΠΣΦΨΩαβγδεζηθικλμξπρςστυφχψω"
CYRILLIC = "БГДЖЗИЙЛПФЦЧШЩЪЫЬЭЮЯбгджзийлпфцчшщъыьэюя"
HEBREW = "אבגדהוזחטיכלמנסעפצקרשת"
ARMENIAN = "ԲԳԴԵԶԷԸԹԺԻԼԽԾԿՀՁՂՃՄՅՆՇՈՉՊՋՌՎՐՑՒՓՖ"  # no Օ, Ս, Տ, Ք (look like O, U, S, P)
GEORGIAN = "აბგდევზთიკლმნოპჟრსტუფქღყშჩცძწჭხჯჰ"
LATIN_EXTRA = "ÆŒØÞßÐŁŊƎƐƔƩƱǂǷȜɅ"
SYMBOLS = (
    "+×÷=≠≤≥∞∑∏√∫∂∇∈∩∪⊂⊃∧∨¬∀∃∅←→↑↓↔⇒⇔♠♣♥♦★●■▲▼◆§¶†‡&@#$%?!"
    "∮∝∠∥≈≡≪≫⊕⊗⊙⊥⌂☀☁☂☃☎☺☼♀♂♪♫♯♭✓✗✚✝✠✡✦✪✫✰✱✲✳✴✵✶✷✸✹✺✻✼✽✾✿❀❁℧ℵ℘ℑℜ№™€£¥¢©®"
)
CANDIDATES = LATIN + DIGITS + GREEK + CYRILLIC + HEBREW + ARMENIAN + GEORGIAN + LATIN_EXTRA + SYMBOLS

# Fonts from matplotlib's mpl-data/fonts/ttf. Computer Modern fonts remap punctuation, so
# they are only used for ASCII letters and digits.
UNICODE_FONTS = tuple(
    f"{family}{style}.ttf"
    for family, styles in (
        ("DejaVuSans", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("DejaVuSansMono", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("DejaVuSerif", ("", "-Bold", "-Italic", "-BoldItalic")),
        ("STIXGeneral", ("", "Bol", "Italic", "BolIta")),
    )
    for style in styles
)
ASCII_FONTS = ("cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmti10.ttf", "cmtt10.ttf")
MIN_FONTS_PER_CLASS = 4


class GlyphsSource(SourceParams):
    """``num_classes`` characters x ``images_per_class`` renders of ``render_size`` px."""

    num_classes: int = Field(200, ge=4)
    images_per_class: int = Field(20, ge=2)
    render_size: PositiveInt = Field(64, le=256)
    seed: NonNegativeInt = 0


class GlyphsParams(DatasetParams):
    """Renders are square: ``max_aspect`` 1 keeps the cache ``N x S x S x 3`` with no padding."""

    source: GlyphsSource = GlyphsSource()
    image_size: PositiveInt = 36
    max_aspect: float = Field(1.0, ge=1, le=4)


@functools.lru_cache(maxsize=1)
def _font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@functools.cache
def _codepoints(font_name: str) -> frozenset[int]:
    from fontTools.ttLib import TTFont

    return frozenset(TTFont(_font_dir() / font_name, lazy=True).getBestCmap() or {})


@functools.cache
def fonts_for(char: str) -> tuple[str, ...]:
    """Fonts (file names) that contain a real glyph for ``char``."""
    names = UNICODE_FONTS + (ASCII_FONTS if char.isascii() and char.isalnum() else ())
    return tuple(name for name in names if ord(char) in _codepoints(name))


@functools.lru_cache(maxsize=4096)
def _font(name: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(str(_font_dir() / name), size=size)


def class_characters(num_classes: int, seed: int) -> list[str]:
    """The ``num_classes`` characters drawn by >= ``MIN_FONTS_PER_CLASS`` fonts, shuffled with ``seed``."""
    usable = [c for c in dict.fromkeys(CANDIDATES) if len(fonts_for(c)) >= MIN_FONTS_PER_CLASS]
    if num_classes > len(usable):
        raise ValueError(f"glyphs: num_classes must be <= {len(usable)}, got {num_classes}")
    order = np.random.default_rng(seed).permutation(len(usable))
    return [usable[i] for i in order[:num_classes]]


def class_name(char: str) -> str:
    return f"U+{ord(char):04X} {char}"


def render_glyph(char: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``size`` x ``size`` RGB uint8 image of ``char`` with random style and pose."""
    from PIL import Image, ImageDraw, ImageFilter

    scale = 2  # render at twice the size, then downsample (anti-aliasing)
    big = size * scale
    candidates = fonts_for(char)
    font = _font(candidates[rng.integers(len(candidates))], int(big * rng.uniform(0.42, 0.7)))

    background = _background(big, rng)
    foreground = rng.uniform(0, 110, size=3).astype(np.float32)  # dark ink of a random hue (luminance <= ~100)

    layer = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(layer)
    left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
    cx = big / 2 + rng.uniform(-0.12, 0.12) * big
    cy = big / 2 + rng.uniform(-0.12, 0.12) * big
    stroke = int(rng.integers(0, 3))
    draw.text(
        (cx - (left + right) / 2, cy - (top + bottom) / 2),
        char,
        fill=255,
        font=font,
        stroke_width=stroke,
        stroke_fill=255,
    )
    layer = layer.rotate(rng.uniform(-20, 20), resample=Image.BICUBIC, center=(cx, cy))
    if rng.random() < 0.3:
        layer = layer.filter(ImageFilter.GaussianBlur(radius=rng.uniform(0.5, 1.5)))

    alpha = np.asarray(layer, dtype=np.float32)[..., None] / 255.0
    image = background * (1 - alpha) + foreground[None, None, :] * alpha
    image = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).resize((size, size), Image.LANCZOS)
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0, rng.uniform(0, 8), size=pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _background(size: int, rng: np.random.Generator) -> np.ndarray:
    """Light "paper" (luminance >= ~150): flat, a linear gradient, or a smooth texture; float32 HxWx3."""
    from PIL import Image

    base = rng.uniform(150, 255, size=3)
    kind = rng.integers(3)
    if kind == 0:
        return np.broadcast_to(base, (size, size, 3)).astype(np.float32)
    if kind == 1:
        other = np.clip(base + rng.uniform(-60, 60, size=3), 150, 255)
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
        t = np.cos(angle) * xx + np.sin(angle) * yy
        t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
        return (base * (1 - t[..., None]) + other * t[..., None]).astype(np.float32)
    coarse = rng.normal(0, 20, size=(4, 4, 3)).astype(np.float32)
    channels = [Image.fromarray(coarse[..., c]) for c in range(3)]
    upsampled = np.stack([np.asarray(c.resize((size, size), Image.BICUBIC)) for c in channels], axis=-1)
    return np.clip(base + upsampled, 130, 255).astype(np.float32)


def fetch(params: GlyphsParams, raw_dir: Path, dropbox_dir: Path) -> None:
    """Render every image as PNG under ``raw_dir/images/<class>/`` plus ``labels.csv``."""
    from PIL import Image
    from tqdm import tqdm

    source = params.source
    chars = class_characters(source.num_classes, source.seed)
    rows = []
    with atomic_dir(raw_dir) as tmp:
        total = len(chars) * source.images_per_class
        with tqdm(total=total, desc="glyphs: render", unit="img", mininterval=1.0) as bar:
            for label, char in enumerate(chars):
                class_dir = tmp / "images" / f"{label:03d}"
                class_dir.mkdir(parents=True)
                for index in range(source.images_per_class):
                    rng = np.random.default_rng([source.seed, label, index])
                    pixels = render_glyph(char, source.render_size, rng)
                    rel = Path("images", f"{label:03d}", f"{index:03d}.png")
                    Image.fromarray(pixels).save(tmp / rel, optimize=False)
                    rows.append((rel.as_posix(), label, class_name(char)))
                    bar.update(1)
        frame = pd.DataFrame(rows, columns=["path", "label", "class_name"])
        with atomic_path(tmp / "labels.csv") as csv_tmp:
            frame.to_csv(csv_tmp, index=False)


def read_annotations(params: GlyphsParams, raw_dir: Path) -> pd.DataFrame:
    """``labels.csv`` plus the class-disjoint split: first half of the classes train, rest test."""
    frame = pd.read_csv(raw_dir / "labels.csv", keep_default_na=False)
    frame["split"] = np.where(frame["label"] < params.source.num_classes // 2, "train", "test")
    return frame


SPEC = DatasetSpec(
    name="glyphs",
    params=GlyphsParams,
    fetch=fetch,
    read_annotations=read_annotations,
    description="Offline built-in: characters rendered from matplotlib's fonts (200 classes)",
    hflip_invariant=False,
    synthetic=True,
    redistributable=True,  # rendered here from fonts under free licences (docs/datasets.md)
)
