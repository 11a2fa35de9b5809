"""The curves of `make bench-placement` as one SVG image: a picture of what the text report's figures say.

Panels side by side, one per figure, each with a line per run (a policy, a mode, a seed): for the fill-up replay
the GPU allocated against the demand arrived (the paper's curve), and nothing else (its fragmentation is one
figure at the end); for the churn mode the GPU allocated, the expected fragment (the paper's measure) and the
pods waiting, against trace hours. Plain SVG written here (no plotting library to install): polylines on a grid,
a legend, the axes' ticks; the same runs give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
WIDTH, HEIGHT = 420, 300
DASHES = ("", "6 3", "2 2", "8 3 2 3")
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 16, 34, 46


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    points: tuple[tuple[float, float], ...]
    """(x, y); a NaN y is a gap in the line."""
    group: str = ""
    """Lines of one group share a colour and a legend entry (default: the label); `dash` tells them apart."""
    dash: int = 0
    """0: solid; 1, 2, ...: dashed patterns, for the second, third, ... line of a group."""

    @property
    def key(self) -> str:
        return self.group or self.label


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    x_label: str
    y_label: str
    lines: tuple[Line, ...]
    y_low: float | None = None
    """Where the y axis starts (default: 0 or the lowest point): a zoom, lines below it clipped."""


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not high - low > abs(low) * 1e-9:  # equal (or nearly): one unit around them
        high = low + 1
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= step * factor:
            step *= factor
            break
    ticks = [math.floor(low / step) * step]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(ticks[-1] + step)
    return [round(tick, 10) for tick in ticks]


def tag(name: str, text: str | None = None, **attributes: object) -> str:
    """One SVG element: attribute names with `_` for `-`, floats to a tenth, the text and values escaped."""
    shown = " ".join(f'{key.replace("_", "-")}="{_value(value)}"' for key, value in attributes.items())
    return f"<{name} {shown}/>" if text is None else f"<{name} {shown}>{escape(text)}</{name}>"


def _value(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else escape(str(value), {'"': "&quot;"})


def _number(value: float) -> str:
    return f"{value:g}"


def _panel(panel: Panel, left: float, colours: dict[str, str]) -> list[str]:
    shown = [(x, y) for line in panel.lines for x, y in line.points if math.isfinite(x) and math.isfinite(y)]
    xs, ys = [x for x, _ in shown], [y for _, y in shown]
    if not xs:
        xs, ys = [0.0, 1.0], [0.0, 1.0]
    low = panel.y_low if panel.y_low is not None else min(0.0, min(ys))
    x_ticks, y_ticks = _ticks(min(xs), max(xs)), _ticks(low, max(ys))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def sx(x: float) -> float:
        return left + MARGIN_LEFT + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return MARGIN_TOP + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    out = [tag("text", panel.title, x=left + WIDTH / 2, y=18, text_anchor="middle", font_weight="bold")]
    bottom, right = MARGIN_TOP + plot_h, left + MARGIN_LEFT + plot_w
    for tick in x_ticks:
        out.append(tag("line", x1=sx(tick), y1=MARGIN_TOP, x2=sx(tick), y2=bottom, stroke="#ddd"))
        out.append(tag("text", _number(tick), x=sx(tick), y=bottom + 14, text_anchor="middle"))
    for tick in y_ticks:
        out.append(tag("line", x1=left + MARGIN_LEFT, y1=sy(tick), x2=right, y2=sy(tick), stroke="#ddd"))
        out.append(tag("text", _number(tick), x=left + MARGIN_LEFT - 5, y=sy(tick) + 4, text_anchor="end"))
    out.append(tag("rect", x=left + MARGIN_LEFT, y=MARGIN_TOP, width=plot_w, height=plot_h, fill="none", stroke="#444"))
    out.append(tag("text", panel.x_label, x=left + MARGIN_LEFT + plot_w / 2, y=HEIGHT - 12, text_anchor="middle"))
    middle = MARGIN_TOP + plot_h / 2
    rotate = f"rotate(-90 {left + 14} {middle:.1f})"
    clip = f"clip{int(left)}"
    area = tag("rect", x=left + MARGIN_LEFT, y=MARGIN_TOP, width=plot_w, height=plot_h)
    out.append(f'<clipPath id="{clip}">{area}</clipPath>')
    out.append(tag("text", panel.y_label, x=left + 14, y=middle, text_anchor="middle", transform=rotate))
    for line in panel.lines:
        runs: list[list[str]] = [[]]
        for x, y in line.points:
            if not (math.isfinite(x) and math.isfinite(y)):
                runs.append([])
            else:
                runs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")
        colour, dash = colours[line.key], DASHES[line.dash % len(DASHES)]
        for run in runs:
            if len(run) > 1:
                drawn = tag("polyline", fill="none", stroke=colour, stroke_width=1.6, points=" ".join(run))
                styled = f' stroke-dasharray="{dash}"' if dash else ""
                out.append(drawn.replace("<polyline ", f'<polyline clip-path="url(#{clip})"{styled} ', 1))
            elif run:
                cx, cy = run[0].split(",")
                dot = tag("circle", cx=cx, cy=cy, r=2, fill=colour)
                out.append(dot.replace("<circle ", f'<circle clip-path="url(#{clip})" ', 1))
    return out


def svg(panels: Sequence[Panel], title: str = "") -> str:
    """The panels side by side, with one legend for the lines' groups (in their first order)."""
    labels: list[str] = []
    for panel in panels:
        for line in panel.lines:
            if line.key not in labels:
                labels.append(line.key)
    colours = {label: COLOURS[number % len(COLOURS)] for number, label in enumerate(labels)}
    legend_h = 18 * len(labels) + 10
    width, height = WIDTH * max(len(panels), 1), HEIGHT + legend_h + (22 if title else 0)
    top = 22 if title else 0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(tag("text", title, x=width / 2, y=16, text_anchor="middle", font_size=13))
    out.append(f'<g transform="translate(0 {top})">')
    for number, panel in enumerate(panels):
        out += _panel(panel, number * WIDTH, colours)
    out.append("</g>")
    for number, label in enumerate(labels):
        y = top + HEIGHT + 14 + 18 * number
        out.append(
            tag(
                "line", x1=MARGIN_LEFT, y1=y - 4, x2=MARGIN_LEFT + 24, y2=y - 4, stroke=colours[label], stroke_width=2.5
            )
        )
        out.append(tag("text", label, x=MARGIN_LEFT + 30, y=y))
    out.append("</svg>")
    return "\n".join(out) + "\n"
