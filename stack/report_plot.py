"""The report's plot, drawn with Pillow (no plotting library in the lock): held-out
pass@1 (0-1) per evaluation step; per group its mean (thick, with dots), its range
over the runs (a band) and every run (thin). With a single evaluation step, one bar
per group (mean, whisker over the range) instead of a one-dot chart."""

from __future__ import annotations

import io
import statistics

from PIL import Image, ImageDraw, ImageFont

Curve = dict[int, float | None]
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]
W, H = 960, 520
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 50, 60


def _light(color: tuple[int, int, int], amount: float) -> tuple[int, int, int]:
    r, g, b = color
    return (int(r + (255 - r) * amount), int(g + (255 - g) * amount), int(b + (255 - b) * amount))


def plot(groups: dict[str, list[tuple[str, Curve]]], title: str = "held-out pass@1 per evaluation step") -> bytes:
    steps = sorted({s for runs in groups.values() for _, curve in runs for s in curve})
    image = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    if len(steps) == 1:  # one evaluation: a curve would be a single dot
        _bars(draw, font, groups, steps[0])
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()
    x_of = _x_scale(steps)

    def y_of(v: float) -> float:
        return TOP + (1 - v) * (H - TOP - BOTTOM)

    _axes(draw, font, steps, x_of, y_of, title)
    for i, (name, runs) in enumerate(groups.items()):
        color = COLORS[i % len(COLORS)]
        per_step = {s: [v for _, c in runs if (v := c.get(s)) is not None] for s in steps}
        covered = [s for s in steps if per_step[s]]
        if len(covered) > 1:
            upper = [(x_of(s), y_of(max(per_step[s]))) for s in covered]
            lower = [(x_of(s), y_of(min(per_step[s]))) for s in reversed(covered)]
            draw.polygon(upper + lower, fill=_light(color, 0.8))
        for _, curve in runs:
            points = [(x_of(s), y_of(v)) for s in steps if (v := curve.get(s)) is not None]
            if len(points) > 1:
                draw.line(points, fill=_light(color, 0.45), width=1)
        means = [(x_of(s), y_of(statistics.fmean(per_step[s]))) for s in covered]
        if len(means) > 1:
            draw.line(means, fill=color, width=3)
        for x, y in means:
            draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill=color)
        legend_y = TOP + 8 + 16 * i
        draw.rectangle((LEFT + 10, legend_y + 2, LEFT + 24, legend_y + 10), fill=color)
        draw.text((LEFT + 30, legend_y), f"{name}: mean of {len(runs)}, band = range", fill="black", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _x_scale(steps: list[int]):  # type: ignore[no-untyped-def]
    lo, hi = (steps[0], steps[-1]) if steps else (0, 1)
    span = max(hi - lo, 1)
    return lambda s: LEFT + (s - lo) / span * (W - LEFT - RIGHT)


def _axes(draw: ImageDraw.ImageDraw, font, steps, x_of, y_of, title: str) -> None:  # type: ignore[no-untyped-def]
    draw.text((LEFT, 15), title, fill="black", font=font)
    draw.line((LEFT, TOP, LEFT, H - BOTTOM, W - RIGHT, H - BOTTOM), fill="black", width=1)
    for k in range(6):
        v = k / 5
        y = y_of(v)
        draw.line((LEFT - 4, y, W - RIGHT, y), fill=(225, 225, 225) if k else "black")
        draw.text((LEFT - 34, y - 6), f"{v:.1f}", fill="black", font=font)
    for s in steps:
        x = x_of(s)
        draw.line((x, H - BOTTOM, x, H - BOTTOM + 4), fill="black")
        draw.text((x - 6, H - BOTTOM + 8), str(s), fill="black", font=font)
    draw.text(((W - LEFT) // 2, H - 22), "optimizer step", fill="black", font=font)


def _bars(draw: ImageDraw.ImageDraw, font, groups: dict[str, list[tuple[str, Curve]]], step: int) -> None:  # type: ignore[no-untyped-def]
    """One bar per group: the mean pass@1 of its runs at the one evaluation step, a
    whisker over their range, the value written above."""
    title = f"held-out pass@1 at step {step} (the only evaluation): bar = mean, whisker = range over runs"

    def y_of(v: float) -> float:
        return TOP + (1 - v) * (H - TOP - BOTTOM)

    _axes(draw, font, [], lambda s: LEFT, y_of, title)
    slot = (W - LEFT - RIGHT) / max(len(groups), 1)
    for i, (name, runs) in enumerate(groups.items()):
        color = COLORS[i % len(COLORS)]
        values = [v for _, c in runs if (v := c.get(step)) is not None]
        x0, x1 = LEFT + slot * i + slot * 0.25, LEFT + slot * (i + 0.75)
        middle = (x0 + x1) / 2
        draw.text((x0, H - BOTTOM + 8), f"{name} ({len(runs)} run(s))", fill="black", font=font)
        if not values:
            draw.text((x0, y_of(0) - 16), "n/a", fill="black", font=font)
            continue
        mean = statistics.fmean(values)
        draw.rectangle((x0, y_of(mean), x1, y_of(0)), fill=color)
        if len(values) > 1:
            draw.line((middle, y_of(min(values)), middle, y_of(max(values))), fill="black", width=2)
        draw.text((middle - 14, y_of(max(values)) - 16), f"{mean:.3f}", fill="black", font=font)
