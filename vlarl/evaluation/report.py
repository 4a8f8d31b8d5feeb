"""Human-readable evaluation artifacts: a Markdown table, an SVG plot of per-task success, and the
side-by-side comparison of two results with a significance test.

The comparison of two success rates ``k_a/n_a`` and ``k_b/n_b`` reports the difference ``b - a``,
its 95% Newcombe (hybrid Wilson score) interval, and the two-sided Fisher exact p-value; a
difference is called significant when p < 0.05.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

from vlarl.data.metrics import wilson_interval


# -- statistics ------------------------------------------------------------------------------------
def fisher_exact_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact test for the 2x2 table [[k_a, n_a-k_a], [k_b, n_b-k_b]]."""
    total_k, n = k_a + k_b, n_a + n_b
    if n_a == 0 or n_b == 0:
        return 1.0

    def log_p(x: int) -> float:  # hypergeometric: x successes in group a
        return (math.lgamma(total_k + 1) - math.lgamma(x + 1) - math.lgamma(total_k - x + 1)
                + math.lgamma(n - total_k + 1) - math.lgamma(n_a - x + 1) - math.lgamma(n - total_k - n_a + x + 1)
                - math.lgamma(n + 1) + math.lgamma(n_a + 1) + math.lgamma(n_b + 1))

    lo, hi = max(0, total_k - n_b), min(total_k, n_a)
    observed = log_p(k_a)
    p = sum(math.exp(log_p(x)) for x in range(lo, hi + 1) if log_p(x) <= observed + 1e-7)
    return min(1.0, p)


def newcombe_interval(k_a: int, n_a: int, k_b: int, n_b: int) -> tuple[float, float]:
    """95% interval for ``p_b - p_a`` from the two Wilson intervals (Newcombe's method 10)."""
    if n_a == 0 or n_b == 0:
        return (-1.0, 1.0)
    pa, pb = k_a / n_a, k_b / n_b
    la, ua = wilson_interval(k_a, n_a)
    lb, ub = wilson_interval(k_b, n_b)
    d = pb - pa
    lo = d - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2)
    hi = d + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)
    return (max(-1.0, lo), min(1.0, hi))


# -- markdown ---------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "nan" if x != x else f"{100 * x:.1f}%"


def _rate(s: dict[str, Any], key: str) -> str:
    lo, hi = s[f"{key}_ci95"]
    return f"{_pct(s[key])} [{_pct(lo)}, {_pct(hi)}]"


def _row(label: str, s: dict[str, Any]) -> str:
    return (f"| {label} | {s['episodes']} | {_rate(s, 'success_once')} | {_rate(s, 'success_at_end')} | "
            f"{s['return']:.2f} | {s['episode_len']:.1f} |")


def markdown_table(summary: dict[str, Any]) -> str:
    rows = ["| task | episodes | success_once [95% CI] | success_at_end [95% CI] | return | episode_len |",
            "|---|---:|---:|---:|---:|---:|"]
    tasks = summary.get("tasks") or {}
    for name, s in tasks.items():
        rows.append(_row(name, s))
        # a task whose episodes read different words: one indented row per instruction
        rows.extend(_row(f'&nbsp;&nbsp;"{words}"', w) for words, w in (s.get("instructions") or {}).items())
    if len(tasks) != 1:
        rows.append(_row("**overall**", summary))
    return "\n".join(rows)


def write_markdown(summary: dict[str, Any], path: str | Path) -> Path:
    proto = summary.get("protocol") or {}
    lines = [f"# Evaluation: {summary.get('suite') or summary.get('task') or 'tasks'}", ""]
    facts = {
        "checkpoint": summary.get("checkpoint"),
        "policy": summary.get("policy"),
        "suite": summary.get("suite"),
        "standard protocol": proto.get("standard"),
        "episodes per task": proto.get("episodes_per_task"),
        "seeds": f"{summary['seeds'][0]}..{summary['seeds'][1]} (episode k of each task: seed + k)"
        if summary.get("seeds") else None,
        "init states": proto.get("num_init_states") or None,
        "deterministic": summary.get("deterministic"),
        "wall time": f"{summary.get('wall_s', 0.0):.1f} s",
    }
    lines += [f"- {k}: {v}" for k, v in facts.items() if v is not None]
    lines += ["", markdown_table(summary), ""]
    for task, video in (summary.get("videos") or {}).items():
        lines.append(f"- video of {task}: {Path(video).name}")
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    return p


# -- plot -------------------------------------------------------------------------------------------
def write_success_plot(summary: dict[str, Any], path: str | Path, key: str = "success_once") -> Path:
    """Horizontal bars of per-task success with 95% CI whiskers (plain SVG: no plotting dependency)."""
    rows = list((summary.get("tasks") or {}).items())
    if len(rows) != 1:
        rows.append(("overall", summary))
    label_w, bar_w, row_h, top = 190, 420, 24, 34
    width, height = label_w + bar_w + 80, top + row_h * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12">',
           f'<text x="8" y="20" font-size="14">{escape(key)} per task (95% Wilson CI)</text>']
    for i, (name, s) in enumerate(rows):
        y = top + i * row_h
        v = s[key] if s[key] == s[key] else 0.0
        lo, hi = s[f"{key}_ci95"]
        color = "#555" if name == "overall" else "#3a7bd5"
        out.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(str(name))}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{bar_w * v:.1f}" height="{row_h - 8}" fill="{color}"/>')
        x0, x1 = label_w + bar_w * lo, label_w + bar_w * hi
        yc = y + row_h / 2 - 1
        out.append(f'<line x1="{x0:.1f}" y1="{yc}" x2="{x1:.1f}" y2="{yc}" stroke="black"/>')
        out += [f'<line x1="{x:.1f}" y1="{yc - 5}" x2="{x:.1f}" y2="{yc + 5}" stroke="black"/>' for x in (x0, x1)]
        out.append(f'<text x="{label_w + bar_w + 6}" y="{y + 15}">{_pct(s[key])} (n={s["episodes"]})</text>')
    axis_y = top + row_h * len(rows) + 4
    out.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + bar_w}" y2="{axis_y}" stroke="black"/>')
    for t in range(0, 101, 25):
        x = label_w + bar_w * t / 100
        out.append(f'<text x="{x:.0f}" y="{axis_y + 16}" text-anchor="middle">{t}%</text>')
    out.append("</svg>")
    p = Path(path)
    p.write_text("\n".join(out) + "\n")
    return p


# -- comparison -------------------------------------------------------------------------------------
def load_result(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "eval.json"
    if not p.is_file():
        raise FileNotFoundError(f"--compare: '{path}' is not an eval.json (or a directory holding one)")
    data = json.loads(p.read_text())
    if "success_once" not in data or "episodes" not in data:
        raise ValueError(f"--compare: '{p}' is not a vlarl evaluation result (no success_once/episodes keys)")
    return data


def _count(s: dict[str, Any], key: str) -> int:
    if f"{key}_count" in s:
        return int(s[f"{key}_count"])
    return int(round(s[key] * s["episodes"]))  # results written before counts were stored


def compare(a: dict[str, Any], b: dict[str, Any], key: str = "success_once") -> list[dict[str, Any]]:
    """One row per task present in both results, then ``overall``: rates, difference b - a, its 95% CI,
    the Fisher exact p-value and whether the difference is significant at 0.05."""
    ta, tb = a.get("tasks") or {}, b.get("tasks") or {}
    names = [t for t in ta if t in tb]
    pairs = [(t, ta[t], tb[t]) for t in names] + [("overall", a, b)]
    rows = []
    for name, sa, sb in pairs:
        ka, na, kb, nb = _count(sa, key), sa["episodes"], _count(sb, key), sb["episodes"]
        p = fisher_exact_p(ka, na, kb, nb)
        lo, hi = newcombe_interval(ka, na, kb, nb)
        rows.append(dict(task=name, a=ka / na if na else float("nan"), n_a=na, b=kb / nb if nb else float("nan"),
                         n_b=nb, diff=(kb / nb - ka / na) if na and nb else float("nan"), diff_ci95=[lo, hi],
                         p_value=p, significant=p < 0.05))
    return rows


def compare_table(rows: list[dict[str, Any]], name_a: str, name_b: str, key: str = "success_once") -> str:
    lines = [f"{key}: A = {name_a}", f"{' ' * len(key)}  B = {name_b}", "",
             "| task | A | B | B - A [95% CI] | p (Fisher) | significant |", "|---|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lo, hi = r["diff_ci95"]
        lines.append(f"| {r['task']} | {_pct(r['a'])} (n={r['n_a']}) | {_pct(r['b'])} (n={r['n_b']}) | "
                     f"{100 * r['diff']:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] | {r['p_value']:.3g} | "
                     f"{'yes' if r['significant'] else 'no'} |")
    return "\n".join(lines)
