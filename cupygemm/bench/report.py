"""The results of ``cupygemm bench``: one row per provider and shape, the comparison table (text or markdown),
the notes and summary, and the JSON document."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .cases import Shape, Sizes
from .checks import CALC_DIFF_TOL, REL_ERR_TOL
from .metrics import geomean, throughput
from .providers import PROVIDER_DESCRIPTIONS, PROVIDERS, TITLES

SCHEMA = "cupygemm-bench/1"


def make_row(shape: Shape, sizes: Sizes, provider: str, stats: dict[str, float] | None, flops: int, nbytes: int,
             floor: float | None, config: str | None = None, check: dict[str, Any] | None = None,
             error: str | None = None) -> dict[str, Any]:
    """One JSON row: a provider's result on a shape."""
    row: dict[str, Any] = {
        "kind": shape.kind, "shape": list(shape.dims), "label": shape.label, "provider": provider,
        "valid_m": sizes.valid_m, "flops": flops, "bytes": nbytes,
        "floor_us": floor, "us": None, "p10": None, "p90": None, "min": None, "max": None,
        "tflops": None, "gbs": None, "pct_floor": None, "config": config,
        "check": None, "rel_err": None, "calc_diff": None, "error": error,
    }
    if sizes.group_k:
        row["k_sizes"] = list(sizes.group_k)
    if stats is not None:
        row.update(stats)
        if floor is not None:
            row.update(throughput(stats["us"], flops, nbytes, floor))
    if check is not None:
        row.update(check)
    if error is not None:
        row["check"] = "FAIL"
    return row


def row_failed(row: dict[str, Any]) -> bool:
    return row.get("check") == "FAIL" or row.get("error") is not None or row.get("us") is None


@dataclass
class ShapeResult:
    kind: str
    label: str
    by_provider: dict[str, dict[str, Any]]


def group_by_shape(rows: Sequence[dict[str, Any]]) -> list[ShapeResult]:
    """Rows grouped per (kind, shape), in first-seen order."""
    out: dict[tuple[str, str], ShapeResult] = {}
    for r in rows:
        key = (r["kind"], r.get("label") or "x".join(str(d) for d in r["shape"]))
        if key not in out:
            out[key] = ShapeResult(key[0], key[1], {})
        out[key].by_provider[r["provider"]] = r
    return list(out.values())


def providers_in(rows: Sequence[dict[str, Any]]) -> list[str]:
    seen = {r["provider"] for r in rows}
    return [p for p in PROVIDERS if p in seen] + sorted(seen - set(PROVIDERS))


def speedup(ours: dict[str, Any] | None, peer: dict[str, Any] | None) -> float | None:
    """Peer time / our time (> 1: cupygemm is faster); None when either is missing."""
    if not ours or not peer or ours.get("us") is None or peer.get("us") is None or ours.get("error"):
        return None
    if peer.get("error") or ours["us"] <= 0:
        return None
    return peer["us"] / ours["us"]


# ---- table writers ---------------------------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str, missing: str = "-") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return format(v, spec)


def fmt_us(v: float | None) -> str:
    """Microseconds with three significant digits or so ('-' when missing)."""
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _peer_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return "err"
    cell = fmt_us(row.get("us"))
    return cell + ("!" if row.get("check") == "FAIL" else "")


def table_data(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison table (one line per shape). ``peers``: the peer columns to show
    (default: those present in ``rows``); a peer without a result for a shape shows '-'."""
    if peers is None:
        peers = [p for p in providers_in(rows) if p != "cupygemm"]
    headers = ["kind", "shape", "floor us", "cupygemm us", "p10-p90", "TFLOPS", "GB/s", "% floor"]
    headers += [f"{TITLES.get(p, p)} us" for p in peers]
    headers += [f"vs {TITLES.get(p, p)}" for p in peers]
    headers += ["calc_diff", "check"]
    body = []
    for sr in group_by_shape(rows):
        ours = sr.by_provider.get("cupygemm")
        any_row = ours or next(iter(sr.by_provider.values()))
        line = [sr.kind, sr.label, fmt_us(any_row.get("floor_us"))]
        if ours is None:
            line += ["-"] * 5
        elif ours.get("error") or ours.get("us") is None:
            line += ["error", "-", "-", "-", "-"]
        else:
            line += [fmt_us(ours["us"]), f"{fmt_us(ours['p10'])}-{fmt_us(ours['p90'])}",
                     _fmt(ours.get("tflops"), ".0f"), _fmt(ours.get("gbs"), ".0f"),
                     _fmt(ours.get("pct_floor"), ".0f") + ("%" if ours.get("pct_floor") is not None else "")]
        line += [_peer_cell(sr.by_provider.get(p)) for p in peers]
        line += [_fmt_x(speedup(ours, sr.by_provider.get(p))) for p in peers]
        line += [_fmt(ours.get("calc_diff") if ours else None, ".1e"), (ours.get("check") or "-") if ours else "-"]
        body.append(line)
    return headers, body


_LEFT_COLUMNS = {"kind", "shape", "check"}


def format_table(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    """Plain-text table, columns aligned."""
    headers, body = table_data(rows, peers)
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h) for i, h in enumerate(headers)]

    def fmt_line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if h in _LEFT_COLUMNS else c.rjust(w)
                         for c, w, h in zip(cells, widths, headers)).rstrip()

    out = [fmt_line(headers), "  ".join("-" * w for w in widths)]
    out += [fmt_line(line) for line in body]
    return "\n".join(out)


def format_markdown(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    """GitHub markdown table."""
    headers, body = table_data(rows, peers)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(out)


def _titled(parts: Sequence["Section"]) -> bool:
    """Whether sections show their titles: when a run mixes families, or a family has notes (the forward kinds
    alone print as before, one table)."""
    return len(parts) > 1 or any(sec.notes for sec in parts)


def format_sections(parts: Sequence["Section"], markdown: bool = False) -> str:
    """Each section's table (text or markdown); titled sections add a line per kind with the geometric means and
    their notes."""
    titled = _titled(parts)
    blocks = []
    for sec in parts:
        table = format_markdown(sec.rows, sec.peers) if markdown else format_table(sec.rows, sec.peers)
        if not titled:
            blocks.append(table)
            continue
        kinds = format_kind_summary(sec.rows, sec.peers).splitlines()
        if markdown:
            lines = [f"**{sec.title}**", "", table, ""]
            lines += [f"- cupygemm {line.strip()} (geometric means)" for line in kinds[1:]]
            lines += [f"- {n}" for n in sec.notes]
        else:
            lines = [f"{sec.title}:", table] + kinds
            if sec.notes:
                lines += ["notes:"] + [f"  {n}" for n in sec.notes]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_configs(rows: Sequence[dict[str, Any]]) -> str:
    """One line per shape: the kernel config cupygemm used."""
    lines = []
    for r in rows:
        if r["provider"] == "cupygemm" and r.get("config"):
            lines.append(f"  {r['kind']} {r['label']}: {r['config']}")
    return "\n".join(["cupygemm configs:"] + lines) if lines else ""


def format_notes(rows: Sequence[dict[str, Any]]) -> str:
    """Errors and failed checks, one line each."""
    lines = []
    for r in rows:
        who = f"{TITLES.get(r['provider'], r['provider'])} on {r['kind']} {r['label']}"
        if r.get("error"):
            lines.append(f"  {who}: error: {r['error']}")
        elif r.get("check") == "FAIL":
            lines.append(f"  {who}: check FAIL (rel_err {_fmt(r.get('rel_err'), '.2e', 'nan')} vs < {REL_ERR_TOL:g}, "
                         f"calc_diff {_fmt(r.get('calc_diff'), '.2e', 'nan')} vs < {CALC_DIFF_TOL:g})")
    return "\n".join(["notes:"] + lines) if lines else ""


def summary(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> dict[str, Any]:
    """Geometric means: % of floor of cupygemm, and its speedup over each peer (shapes where both ran)."""
    groups = group_by_shape(rows)
    if peers is None:
        peers = [p for p in providers_in(rows) if p != "cupygemm"]
    ours = [sr.by_provider.get("cupygemm") for sr in groups]
    ok = [r for r in ours if r is not None and not row_failed(r)]
    out: dict[str, Any] = {
        "shapes": len(groups),
        "failed": sum(1 for r in ours if r is None or row_failed(r)),
        "pct_floor_geomean": geomean(r.get("pct_floor") for r in ok),
        "speedup_geomean": {},
    }
    for p in peers:
        vals = [speedup(sr.by_provider.get("cupygemm"), sr.by_provider.get(p)) for sr in groups]
        vals = [v for v in vals if v is not None]
        out["speedup_geomean"][p] = {"geomean": geomean(vals), "shapes": len(vals)}
    return out


def summary_by_kind(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`summary` of each kind's rows, in first-seen order of the kinds."""
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    return {k: summary([r for r in rows if r["kind"] == k], peers) for k in kinds}


def format_kind_summary(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    """One line per kind: cupygemm's % of the floor and its speedup over each peer (geometric means)."""
    lines = []
    for kind, s in summary_by_kind(rows, peers).items():
        parts = [f"{_fmt(s['pct_floor_geomean'], '.0f')}% of the floor ({s['shapes'] - s['failed']} shapes)"]
        for p, v in s["speedup_geomean"].items():
            if v["shapes"]:
                parts.append(f"{_fmt(v['geomean'], '.2f')}x vs {TITLES.get(p, p)} ({v['shapes']} shapes)")
        lines.append(f"  {kind}: " + "; ".join(parts) + (f"; {s['failed']} FAILED" if s["failed"] else ""))
    return "\n".join(["cupygemm per kind (geometric means):"] + lines) if lines else ""


@dataclass
class Section:
    """The rows of one family of kinds (:class:`cupygemm.bench.kinds.BenchKind`), shown as a table of their own
    with the peers that can run them and the family's notes."""

    title: str
    kinds: list[str]
    rows: list[dict[str, Any]]
    peers: list[str]
    notes: list[str]


def sections(rows: Sequence[dict[str, Any]], peers: Sequence[str]) -> list[Section]:
    """``rows`` split by their kinds' bench code, in first-seen order; each section's peer columns are those of
    ``peers`` that its family can run (the forward kinds: all of them, as before)."""
    from ..kinds import kind_named
    from .kinds import bench_kinds, lookup

    out: dict[Any, Section] = {}
    for r in rows:
        try:
            maker = lookup(r["kind"])
        except ValueError:
            maker = None
        if maker not in out:
            if maker is None:
                out[maker] = Section("", [], [], list(peers), [])
            else:
                family = [k for k in bench_kinds() if lookup(k) is maker]
                cols = [p for p in peers if any(maker.supports(p, k) for k in family)]
                out[maker] = Section(maker.title, [], [], cols, [])
        sec = out[maker]
        sec.rows.append(r)
        if r["kind"] not in sec.kinds:
            sec.kinds.append(r["kind"])
    for maker, sec in out.items():
        if maker is not None:
            sec.notes = list(maker.notes(sec.rows))
            sec.kinds = [kind_named(k).name for k in sec.kinds]
    return list(out.values())


def format_summary(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    s = summary(rows, peers)
    parts = [f"cupygemm: {_fmt(s['pct_floor_geomean'], '.0f')}% of the floor (geometric mean, "
             f"{s['shapes'] - s['failed']} shapes)"]
    for p, v in s["speedup_geomean"].items():
        if v["shapes"]:
            parts.append(f"{_fmt(v['geomean'], '.2f')}x vs {TITLES.get(p, p)} ({v['shapes']} shapes)")
    line = "; ".join(parts)
    if s["failed"]:
        line += f"\nFAILED: {s['failed']} of {s['shapes']} shapes (wrong results or errors)"
    else:
        line += "\nall cupygemm results checked: ok"
    return line


# ---- JSON -------------------------------------------------------------------------------------------------------------

def _json_safe(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (np.floating, np.integer)):
        return _json_safe(v.item())
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def build_report(meta: dict[str, Any], rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON document: ``meta`` (device, versions, command, date, copy bandwidth, ...), the providers, the rows
    and the summary. Non-finite numbers become null."""
    provs = ["cupygemm"] + list(peers if peers is not None else [p for p in providers_in(rows) if p != "cupygemm"])
    peer_list = [p for p in provs if p != "cupygemm"]
    summ = summary(rows, peer_list)
    parts = sections(rows, peer_list)
    summ["by_kind"] = {k: v for sec in parts for k, v in summary_by_kind(sec.rows, sec.peers).items()}
    report = {"schema": SCHEMA, **meta,
              "providers": {p: PROVIDER_DESCRIPTIONS.get(p, p) for p in provs},
              "summary": summ,
              "ok": not any(row_failed(r) for r in rows if r["provider"] == "cupygemm"),
              "rows": list(rows)}
    notes = {sec.title: sec.notes for sec in parts if sec.notes}
    if notes:
        report["notes"] = notes
    return _json_safe(report)


def write_json(path: str | os.PathLike, report: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
