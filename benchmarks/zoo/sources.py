"""Real evaluation data from Debian packages: photos, English and Chinese text, synthesised speech,
composed music.

Nothing here is downloaded at run time: every source is a file that a Debian package installs
(``make bench-zoo`` installs the packages). Splits are made by *source file* wherever possible so
that calibration and evaluation never share a photo, a sentence or a recording.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

DEBIAN_PACKAGES = (
    "opencv-doc",  # sample photos
    "mate-backgrounds",  # nature photos
    "espeak-ng",  # speech synthesis
    "sox",  # resampling
    "fortunes-zh",  # Chinese text
    "wamerican",  # /usr/share/dict/american-english
    "fonts-dejavu-core",  # fonts for rendered text
    "xmp",  # renders tracker music modules to audio
    "freedroid-data",  # tracker music (.mod)
    "pingus-data",  # tracker music (.it, .s3m)
)
FREEDROID_MUSIC = Path("/usr/share/games/freedroid/sound")
PINGUS_MUSIC = Path("/usr/share/games/pingus/data/music")
LICENSES = Path("/usr/share/common-licenses")
DICT = Path("/usr/share/dict/american-english")
FORTUNES_ZH = Path("/usr/share/games/fortunes")
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf")


class MissingData(Exception):
    """A Debian data file is absent; the message names the package to install."""


def need(path: Path, package: str) -> Path:
    if not path.exists():
        raise MissingData(f"{path} not found: apt-get install -y {package}")
    return path


# ----------------------------------------------------------------------------- photos


def photos() -> list[Path]:
    """The real photographs of opencv-doc and mate-backgrounds (bench_real_cnn's list)."""
    from bench_real_cnn import PHOTOS

    found = [p for p in PHOTOS if p.is_file()]
    if len(found) < 30:
        raise MissingData("photos missing: apt-get install -y opencv-doc mate-backgrounds")
    return found


def split_every(items: list, every: int = 3) -> tuple[list, list]:
    """Every ``every``-th item calibrates, the rest evaluate (disjoint by construction)."""
    return (
        [x for i, x in enumerate(items) if i % every == 0],
        [x for i, x in enumerate(items) if i % every != 0],
    )


def photo_views(path: Path) -> list[np.ndarray]:
    """RGB uint8 views of one photo: whole, mirrored, and the two central crops (60 %, 40 %)."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB"))
    views = [rgb, np.ascontiguousarray(rgb[:, ::-1])]
    h, w = rgb.shape[:2]
    for frac in (0.6, 0.4):
        ch, cw = int(h * frac), int(w * frac)
        top, left = (h - ch) // 2, (w - cw) // 2
        views.append(np.ascontiguousarray(rgb[top : top + ch, left : left + cw]))
    return views


# ----------------------------------------------------------------------------- text


def license_sentences(names: tuple[str, ...]) -> list[str]:
    """English sentences (20..200 characters) of the given /usr/share/common-licenses files."""
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        text = need(LICENSES / name, "base-files").read_text(errors="replace")
        text = re.sub(r"\s+", " ", text)
        for sentence in re.split(r"(?<=[.;:?!])\s+", text):
            sentence = sentence.strip()
            if 20 <= len(sentence) <= 200 and sentence not in seen and re.search("[a-z]", sentence):
                seen.add(sentence)
                out.append(sentence)
    return out


def dictionary_words(min_len: int = 3, max_len: int = 10) -> list[str]:
    """Plain ASCII words of wamerican's dictionary (no possessives, no accents)."""
    words = need(DICT, "wamerican").read_text(errors="replace").split()
    return [w for w in words if w.isascii() and w.isalpha() and min_len <= len(w) <= max_len]


def chinese_lines(file: str, min_len: int = 6, max_len: int = 40) -> list[str]:
    """Lines of a fortunes-zh file with ANSI colour codes removed, mostly Chinese characters."""
    raw = need(FORTUNES_ZH / file, "fortunes-zh").read_text(errors="replace")
    raw = re.sub(r"\x1b\[[0-9;]*m", "", raw)
    out = []
    for line in raw.splitlines():
        line = line.strip()
        if line == "%" or not line:
            continue
        han = sum("\u4e00" <= c <= "\u9fff" for c in line)
        if min_len <= len(line) <= max_len and han >= len(line) // 2:
            out.append(line)
    return out


# ----------------------------------------------------------------------------- rendering


def font(index: int, size: int):
    from PIL import ImageFont

    path = need(FONT_DIR / FONTS[index % len(FONTS)], "fonts-dejavu-core")
    return ImageFont.truetype(str(path), size)


def render_line(text: str, font_index: int, size: int, pad: int = 8):
    """Black text on white, tightly framed: a PIL image."""
    from PIL import Image, ImageDraw

    f = font(font_index, size)
    left, top, right, bottom = f.getbbox(text)
    image = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), "white")
    ImageDraw.Draw(image).text((pad - left, pad - top), text, fill="black", font=f)
    return image


def render_page(lines: list[str], font_index: int, size: int, width: int, height: int):
    """A page of text lines (black on white), like a scanned document."""
    from PIL import Image, ImageDraw

    f = font(font_index, size)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    y = size
    for line in lines:
        if y + size > height - size:
            break
        draw.text((size, y), line, fill="black", font=f)
        y += int(size * 1.5)
    return image


# ----------------------------------------------------------------------------- speech


def speech(sentences: list[str], work: Path, name: str, rate: int = 16000) -> np.ndarray:
    """espeak-ng speaks each sentence (voices alternate), joined by 0.4-1.2 s of silence; float32
    samples in [-1, 1] at ``rate`` Hz. Cached as ``work/name.wav``."""
    out = work / f"{name}.wav"
    if not out.is_file():
        for tool, package in (("espeak-ng", "espeak-ng"), ("sox", "sox")):
            if subprocess.run(["which", tool], capture_output=True).returncode:
                raise MissingData(f"{tool} not found: apt-get install -y {package}")
        voices = ("en-us", "en", "en-us+f3", "en+m3")
        pieces: list[np.ndarray] = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, sentence in enumerate(sentences):
                raw, wav16 = Path(tmp) / "raw.wav", Path(tmp) / "s.wav"
                subprocess.run(
                    ["espeak-ng", "-v", voices[i % len(voices)], "-s", str(140 + 10 * (i % 4)),
                     "-w", str(raw), sentence],
                    check=True, capture_output=True,
                )  # fmt: skip
                subprocess.run(
                    ["sox", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(wav16)],
                    check=True,
                    capture_output=True,
                )
                pieces.append(read_wav(wav16))
                pieces.append(np.zeros(int(rate * (0.4 + 0.2 * (i % 5))), np.float32))
        write_wav(out, np.concatenate(pieces), rate)
    return read_wav(out)


# ----------------------------------------------------------------------------- music


def tracker_music(
    folder: Path, package: str, work: Path, name: str, seconds: int, rate: int
) -> list[np.ndarray]:
    """The first ``seconds`` of every tracker module (.mod, .it, .s3m, .xm) in ``folder``, mono
    float32 at ``rate`` Hz, rendered by xmp: composed music with real instrument samples.
    Cached as ``work/name-*.wav``."""
    if subprocess.run(["which", "xmp"], capture_output=True).returncode:
        raise MissingData("xmp not found: apt-get install -y xmp")
    modules = sorted(
        p for p in need(folder, package).iterdir() if p.suffix in (".mod", ".it", ".s3m", ".xm")
    )
    pieces = []
    for i, module in enumerate(modules):
        out = work / f"{name}-{i:02d}.wav"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["xmp", "-q", "--nocmd", "-f", str(rate), "-m", "-t", str(seconds),
                 "-o", str(out), str(module)],
                check=True, capture_output=True,
            )  # fmt: skip
        pieces.append(read_wav(out)[: seconds * rate])
    return pieces


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return data.astype(np.float32) / 32768.0


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


# ----------------------------------------------------------------------------- files


def sample_files(roots: tuple[str, ...], count: int, seed: int) -> list[Path]:
    """``count`` regular files (>= 64 bytes) under ``roots``, a seeded choice over sorted paths."""
    found: list[Path] = []
    for root in roots:
        base = Path(root)
        if base.is_dir():
            found += sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink())
    found = [p for p in found if p.stat().st_size >= 64]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(found), size=min(count, len(found)), replace=False)
    return [found[i] for i in sorted(pick)]
