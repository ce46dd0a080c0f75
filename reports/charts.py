"""The report's charts as inline SVG: layer drift, calibration histograms, latency, recovery.

Each function takes plain values (no results-document knowledge) and returns Markup that the
template inserts as is. Geometry is explicit pixels; wide charts scroll inside their container
rather than squeezing hundreds of layers into the page width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup

from quantbench.reports import svg
from quantbench.reports.formatting import as_finite, as_number, fmt_db, fmt_num, shorten

CHAR_WIDTH = 6.3  # average width of an 11 px system-ui glyph, for laying out labels
LABEL_HEIGHT = 14.0
#: The drift chart fills the page's 1094 px content box and widens (scrolling) past ~170 layers,
#: so each layer keeps at least 6 px.
DRIFT_MIN_PLOT_WIDTH = 1024.0
DRIFT_LAYER_WIDTH = 6.0
#: The drift chart's scale stops here: float32 rounding alone is about 140 dB, and a tensor that
#: differs from FP32 by one subnormal reads 800 dB, which pressed INT8's 10-40 dB flat against
#: the axis. Higher values are drawn at the top edge, like exact matches, and said so.
DRIFT_CEILING_DB = 100.0
#: Worst-layer labels use the tensor name when it is short, else the (shorter) node name.
LABEL_CHARS = 26
#: Histogram geometry, shared with the page's script so on-demand charts look the same.
HISTOGRAM_LAYOUT = {"width": 516, "height": 220, "left": 44, "right": 158, "top": 10, "bottom": 34}


@dataclass(frozen=True)
class DriftPoint:
    """SQNR of one layer in both views (None where the view was not measured)."""

    index: int
    name: str
    node: str
    op_type: str
    accumulated: float | None
    isolated: float | None


@dataclass(frozen=True)
class HistogramView:
    """One tensor's |x| histogram on ``[0, upper]`` and each calibrator's threshold."""

    name: str
    upper: float
    counts: Sequence[float]
    amax: Mapping[str, float]
    used: str | None
    colours: Mapping[str, str]


@dataclass(frozen=True)
class Frame:
    """A plot area and its linear value axis: where a value lands in pixels."""

    left: float
    top: float
    width: float
    height: float
    low: float
    high: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def y(self, value: float) -> float:
        span = (self.high - self.low) or 1.0
        return self.bottom - (value - self.low) / span * self.height

    def grid(self, ticks: Sequence[float], labels: Callable[[float], str] = svg.tick_label):
        """Horizontal grid lines with their labels left of the plot."""
        out = []
        for tick in ticks:
            y = self.y(tick)
            out.append(svg.line(self.left, y, self.right, y, "grid"))
            out.append(svg.label(self.left - 6, y + 3.5, labels(tick), "tick end"))
        return out


@dataclass
class _Labels:
    """Greedy label placement: move a label up until its box overlaps no placed label."""

    placed: list[tuple[float, float, float, float]] = field(default_factory=list)

    def place(self, x0: float, x1: float, baseline: float, ceiling: float) -> float:
        """The baseline for a label spanning ``[x0, x1]``: ``baseline`` or higher, but not
        above ``ceiling`` (labels then overlap rather than leave the chart)."""
        y = baseline
        while y - LABEL_HEIGHT > ceiling and any(
            x0 < b and a < x1 and y - LABEL_HEIGHT < bottom and top < y
            for a, b, top, bottom in self.placed
        ):
            y -= LABEL_HEIGHT
        self.placed.append((x0, x1, y - LABEL_HEIGHT, y))
        return y


def _clamped(value: float | None, low: float, high: float) -> float | None:
    """Infinities go to the axis edge (an exact match has SQNR +inf); NaN and None are gaps."""
    number = as_number(value)
    if number is None or math.isnan(number):
        return None
    return min(max(number, low), high)


def _series_path(xs: Sequence[float], ys: Sequence[float | None]) -> str:
    """A polyline path broken at missing values."""
    parts: list[str] = []
    pen_down = False
    for x, y in zip(xs, ys, strict=True):
        if y is None:
            pen_down = False
            continue
        parts.append(("L" if pen_down else "M") + f"{svg.num(x)} {svg.num(y)}")
        pen_down = True
    return "".join(parts)


def _legend(x: float, y: float, entries: Sequence[tuple[str, str, str]]) -> list[str]:
    """A one-row legend from ``x``: (label, colour, "line" | "dot" | "ring" | "text")."""
    out = []
    for name, colour, marker in entries:
        if marker == "line":
            out.append(svg.line(x, y - 4, x + 18, y - 4, "ser", stroke=colour))
        elif marker == "dot":
            out.append(svg.tag("circle", {"cx": x + 9, "cy": y - 4, "r": 3, "fill": colour}))
        elif marker == "ring":
            out.append(svg.tag("circle", {"cx": x + 9, "cy": y - 4, "r": 4, "class": "worst"}))
        indent = 0 if marker == "text" else 24  # "text": a note, no marker
        out.append(svg.label(x + indent, y, name, "legend"))
        x += indent + len(name) * CHAR_WIDTH + 18
    return out


def drift_chart(points: Sequence[DriftPoint], worst: Sequence[int], ranked_view: str) -> Markup:
    """SQNR along network order: accumulated as a line (it carries from layer to layer),
    isolated as dots (each layer's own error, independent of its neighbours), worst ringed."""
    count = len(points)
    finite = [
        min(v, DRIFT_CEILING_DB)
        for p in points
        for v in (as_finite(p.accumulated), as_finite(p.isolated))
        if v is not None
    ]
    ticks = svg.nice_ticks(min(finite), max(finite), 6) if finite else [0.0, 1.0]
    frame = Frame(
        54.0, 30.0, max(DRIFT_MIN_PLOT_WIDTH, count * DRIFT_LAYER_WIDTH), 260.0, ticks[0], ticks[-1]
    )
    width, height = frame.right + 16.0, frame.bottom + 42.0
    band = frame.width / max(count, 1)
    xs = [frame.left + (i + 0.5) * band for i in range(count)]

    parts = frame.grid(ticks)
    mid_y = frame.top + frame.height / 2
    parts.append(
        svg.tag(
            "text",
            {
                "x": 14,
                "y": mid_y,
                "class": "axis-title",
                "transform": f"rotate(-90 14 {svg.num(mid_y)})",
            },
            "SQNR (dB)",
        )
    )
    every = 1 if count <= 30 else max(1, round(svg.nice_step(count, int(frame.width // 44))))
    parts.extend(
        svg.label(xs[i], frame.bottom + 15, p.index, "tick mid")
        for i, p in enumerate(points)
        if i % every == 0
    )
    parts.append(svg.line(frame.left, frame.bottom, frame.right, frame.bottom, "axis"))
    parts.append(
        svg.label(
            frame.left + frame.width / 2, height - 6, "layer index (network order)", "axis-title"
        )
    )

    legend: list[tuple[str, str, str]] = []
    accumulated = [_clamped(p.accumulated, frame.low, frame.high) for p in points]
    if any(v is not None for v in accumulated):
        screen = [None if v is None else frame.y(v) for v in accumulated]
        parts.append(
            svg.tag(
                "path",
                {"d": _series_path(xs, screen), "class": "ser", "stroke": svg.ACCUMULATED_COLOUR},
            )
        )
        legend.append(("accumulated", svg.ACCUMULATED_COLOUR, "line"))
    isolated = [_clamped(p.isolated, frame.low, frame.high) for p in points]
    if any(v is not None for v in isolated):
        parts.extend(
            svg.tag("circle", {"cx": x, "cy": frame.y(v), "r": 2.6, "class": "iso"})
            for x, v in zip(xs, isolated, strict=True)
            if v is not None
        )
        legend.append(("isolated", svg.ISOLATED_COLOUR, "dot"))
    if worst:
        legend.append((f"worst {len(worst)} by {ranked_view} SQNR", svg.WORST_COLOUR, "ring"))
    if _above(points, frame.high):
        legend.append((f"top edge: exact, or above {svg.tick_label(frame.high)} dB", "", "text"))
    parts.extend(_worst_markers(points, worst, ranked_view, xs, frame))
    parts.extend(_legend(frame.left + 4, 16, legend))
    parts.extend(_hover_bands(points, xs, band, frame))
    return svg.root(width, height, "Per-layer SQNR along network order", parts, "drift")


def _above(points: Sequence[DriftPoint], high: float) -> bool:
    """Whether any value is drawn at the top edge for being above it (+inf included)."""
    return any(
        (n := as_number(v)) is not None and n > high
        for p in points
        for v in (p.accumulated, p.isolated)
    )


def _short_name(point: DriftPoint) -> str:
    if len(point.name) <= LABEL_CHARS or not point.node:
        return shorten(point.name, LABEL_CHARS)
    return shorten(point.node, LABEL_CHARS)


def _worst_markers(points, worst, ranked_view: str, xs, frame: Frame) -> list[str]:
    """Ringed points with "rank. name" labels, nudged up and inward so none overprint."""
    position = {p.index: i for i, p in enumerate(points)}
    labels = _Labels()
    markers: list[str] = []
    texts: list[str] = []
    for rank, index in enumerate(worst, 1):
        if index not in position:
            continue
        point = points[position[index]]
        value = _clamped(getattr(point, ranked_view), frame.low, frame.high)
        if value is None:
            continue
        x, y = xs[position[index]], frame.y(value)
        caption = f"{rank}. {_short_name(point)}"
        half = len(caption) * CHAR_WIDTH / 2 + 4  # bold glyphs run wider than the estimate
        centre = min(max(x, frame.left + half), frame.right - half)
        label_y = labels.place(centre - half, centre + half, y - 9, frame.top)
        markers.append(svg.tag("circle", {"cx": x, "cy": y, "r": 4.5, "class": "worst"}))
        if label_y < y - 10:
            markers.append(svg.line(x, y - 5, x, label_y + 2, "leader"))
        texts.append(svg.halo_text(centre, label_y, caption, class_="worst-label mid"))
    return markers + texts


def _hover_bands(points, xs, band: float, frame: Frame) -> list[str]:
    """One transparent column per layer carrying its tooltip (cheaper than one per point)."""
    out = []
    for point, x in zip(points, xs, strict=True):
        tip = (
            f"#{point.index} {point.name} ({point.op_type}) — accumulated "
            f"{fmt_db(point.accumulated)} · isolated {fmt_db(point.isolated)}"
        )
        rect = {
            "x": x - band / 2,
            "y": frame.top,
            "width": band,
            "height": frame.height,
            "class": "hover",
        }
        out.append(svg.tag("rect", rect, svg.title(tip)))
    return out


def _count_label(power: int) -> str:
    suffixes = {0: "", 3: "k", 6: "M", 9: "G", 12: "T"}
    return f"{10 ** (power % 3)}{suffixes.get(power - power % 3, f'e{power - power % 3}')}"


def histogram_chart(hist: HistogramView) -> Markup:
    """|x| histogram with log-scaled counts and one vertical line per calibrator's amax.

    The page's script (report.js, histogramSvg) draws the same chart for on-demand tensors;
    change both together.
    """
    lay = HISTOGRAM_LAYOUT
    counts = [max(as_finite(c) or 0.0, 0.0) for c in hist.counts]
    peak = math.log10(1 + max(counts, default=0.0)) or 1.0
    frame = Frame(
        lay["left"],
        lay["top"],
        lay["width"] - lay["left"] - lay["right"],
        lay["height"] - lay["top"] - lay["bottom"],
        0.0,
        peak,
    )
    upper = hist.upper if hist.upper > 0 else 1.0

    def to_x(value: float) -> float:
        return frame.left + min(max(value / upper, 0.0), 1.0) * frame.width

    powers = range(0, int(peak) + 1, 1 if peak <= 6 else 2)
    parts = frame.grid([float(p) for p in powers], lambda p: _count_label(round(p)))
    parts.extend(
        svg.label(to_x(tick), frame.bottom + 14, svg.tick_label(tick), "tick mid")
        for tick in svg.nice_ticks(0, upper, 5)
        if tick <= upper * (1 + 1e-9)
    )
    parts.append(svg.label(frame.left + frame.width / 2, lay["height"] - 4, "|x|", "axis-title"))
    bin_w = frame.width / max(len(counts), 1)
    steps = [f"M{svg.num(frame.left)} {svg.num(frame.bottom)}"]
    for i, count in enumerate(counts):
        y = frame.y(math.log10(1 + count))
        steps.append(f"V{svg.num(y)}H{svg.num(frame.left + (i + 1) * bin_w)}")
    steps.append(f"V{svg.num(frame.bottom)}Z")
    parts.append(svg.tag("path", {"d": "".join(steps), "class": "bars"}))
    parts.append(svg.line(frame.left, frame.bottom, frame.right, frame.bottom, "axis"))
    parts.extend(_threshold_lines(hist, to_x, frame))
    return svg.root(lay["width"], lay["height"], f"|x| histogram of {hist.name}", parts, "hist")


def _threshold_lines(hist: HistogramView, to_x, frame: Frame) -> list[str]:
    """A vertical line per method with an amax, and a legend row naming it and its value."""
    out: list[str] = []
    legend_x = frame.right + 14
    row = 0
    for method, colour in hist.colours.items():
        amax = as_finite(hist.amax.get(method))
        if amax is None:
            continue
        used = method == hist.used
        css = "thr used" if used else "thr"
        x = to_x(amax)
        out.append(
            svg.tag(
                "line",
                {
                    "x1": x,
                    "y1": frame.top,
                    "x2": x,
                    "y2": frame.bottom,
                    "class": css,
                    "stroke": colour,
                },
                svg.title(f"{method}: amax {fmt_num(amax)}"),
            )
        )
        y = frame.top + 10 + row * 15
        out.append(svg.line(legend_x, y - 4, legend_x + 16, y - 4, css, stroke=colour))
        caption = f"{shorten(method, 16)} {fmt_num(amax)}" + (" ✓" if used else "")
        out.append(svg.label(legend_x + 21, y, caption, "legend used" if used else "legend"))
        row += 1
    return out


def bar_chart(
    groups: Sequence[tuple[str, Sequence[tuple[str, float | None]]]],
    colours: Sequence[str],
    unit: str,
    label: str,
) -> Markup:
    """Horizontal grouped bars (one group per statistic, one bar per side), values at bar ends."""
    left, right, top, bar_h, gap, plot_w = 64.0, 96.0, 8.0, 14.0, 12.0, 300.0
    per_group = max((len(bars) for _, bars in groups), default=1)
    height = top + len(groups) * (per_group * (bar_h + 2) + gap) + 8
    values = [as_finite(v) for _, bars in groups for _, v in bars]
    peak = max((v for v in values if v is not None), default=0.0) or 1.0
    parts: list[str] = []
    y = top
    for group_label, bars in groups:
        parts.append(
            svg.label(left - 8, y + len(bars) * (bar_h + 2) / 2 + 3, group_label, "tick end")
        )
        for (side, value), colour in zip(bars, colours, strict=False):
            number = as_finite(value)
            bar_w = 0.0 if number is None else max(number, 0.0) / peak * plot_w
            text = f"{fmt_num(value)} {unit}" if number is not None else "—"
            parts.append(
                svg.tag(
                    "rect",
                    {
                        "x": left,
                        "y": y,
                        "width": max(bar_w, 1.0),
                        "height": bar_h,
                        "fill": colour,
                        "rx": 1.5,
                    },
                    svg.title(f"{side}: {text}"),
                )
            )
            parts.append(svg.label(left + bar_w + 5, y + bar_h - 3, text, "value"))
            y += bar_h + 2
        y += gap
    parts.append(svg.line(left, top - 4, left, y - gap + 4, "axis"))
    return svg.root(left + plot_w + right, height, label, parts, "bars")


def recovery_chart(
    steps: Sequence[tuple[int, float | None, int]], target: float | None, metric: str
) -> Markup:
    """The recovery metric after each step, with the target as a dashed line."""
    values = [as_finite(m) for _, m, _ in steps]
    finite = [v for v in values if v is not None] + ([target] if target is not None else [])
    ticks = svg.nice_ticks(min(finite), max(finite), 5) if finite else [0.0, 1.0]
    frame = Frame(54.0, 16.0, 480.0, 170.0, ticks[0], ticks[-1])
    band = frame.width / max(len(steps), 1)
    xs = [frame.left + (i + 0.5) * band for i in range(len(steps))]
    parts = frame.grid(ticks)
    if target is not None:
        ty = frame.y(target)
        parts.append(svg.line(frame.left, ty, frame.right, ty, "target"))
        parts.append(svg.halo_text(frame.left + 6, ty - 5, f"target {fmt_num(target)}"))
    screen = [None if v is None else frame.y(v) for v in values]
    parts.append(
        svg.tag("path", {"d": _series_path(xs, screen), "class": "ser", "stroke": svg.B_COLOUR})
    )
    for (step, value, kept), x, y in zip(steps, xs, screen, strict=True):
        parts.append(svg.label(x, frame.bottom + 15, step, "tick mid"))
        if y is not None:
            tip = f"step {step}: {metric} {fmt_num(value)}, {kept} kept in high precision"
            parts.append(
                svg.tag(
                    "circle", {"cx": x, "cy": y, "r": 3.5, "fill": svg.B_COLOUR}, svg.title(tip)
                )
            )
    height = frame.bottom + 40.0
    parts.append(svg.label(frame.left + frame.width / 2, height - 6, "recovery step", "axis-title"))
    return svg.root(frame.right + 24.0, height, f"{metric} per recovery step", parts, "recovery")
