"""Presenting a bench report: rich tables, a JSON file and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

import json
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


SINGLE_USER = "one request at a time, interleaved: the speedup a single user sees"
CONCURRENCY_NOTE = (
    "ratio = DFlash tok/s / AR tok/s of all users at that level; each mode runs its requests in one block (not "
    "interleaved), so on a busy machine its 1-user row can differ from the single-user speedup above"
)


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A right-aligned table narrow enough for 80 columns (a pipe, a CI log, `make demo`)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in columns:
        table.add_column(column, justify="right", overflow="fold")
    return table


def print_report(report: dict, console: Console) -> None:
    s, system = report["summary"], report["system"]
    settings = report["settings"]
    console.print(
        f"[bold]{system['backend']}[/] on {system['device']}: {settings['prompts']} prompts x {settings['repeats']}, "
        f"{settings['max_new_tokens']} new tokens, temperature 0, block size {settings['block_size']}"
    )
    head = _table(SINGLE_USER, ("AR tok/s", "DFlash tok/s", "speedup", "tau", "ideal", "AR step", "draft", "verify", "lossless"))
    head.add_row(
        f"{s['ar_tokens_per_second']:.1f}",
        f"{s['dflash_tokens_per_second']:.1f}",
        f"{s['speedup']:.2f}x",
        f"{s['tau']:.2f}",
        _x(s["tau_ideal_speedup"]),
        _ms(s["ar_step_ms"]),
        _ms(s["draft_ms"]),
        _ms(s["verify_ms"]),
        "[green]yes[/]" if s["lossless"] else f"[red]NO ({s['mismatched_prompts']} prompts differ)[/]",
    )
    console.print(head)
    console.print("[dim]ideal = tau x AR step / (draft + verify); AR step, draft and verify in ms per decoding step[/]")

    hist = s["tau_histogram"]
    total = max(1, sum(hist.values()))
    console.print("tau histogram (tokens per verify step): " + "  ".join(f"{k}:{100 * v / total:.0f}%" for k, v in hist.items()))

    blocks = _table(
        "block-size sweep (one request at a time)", ("block", "tau", "tok/s", "speedup", "ideal", "draft ms", "verify ms", "lossless")
    )
    for row in report["block_sizes"]:
        blocks.add_row(
            str(row["block_size"]),
            f"{row['tau']:.2f}",
            f"{row['tokens_per_second']:.1f}",
            f"{row['speedup']:.2f}x",
            _x(row["tau_ideal_speedup"]),
            _ms(row["draft_ms"]),
            _ms(row["verify_ms"]),
            "yes" if row["lossless"] else "NO",
        )
    console.print(blocks)

    conc = _table(
        "concurrency sweep: throughput vs per-user speed",
        ("users", "AR tok/s", "AR /user", "DFlash tok/s", "DFlash /user", "ratio", "tau", "same"),
    )
    for row in report["concurrency"]:
        conc.add_row(
            str(row["concurrency"]),
            f"{row['ar']['throughput']:.1f}",
            f"{row['ar']['per_user_tokens_per_second']:.1f}",
            f"{row['dflash']['throughput']:.1f}",
            f"{row['dflash']['per_user_tokens_per_second']:.1f}",
            f"{row['speedup']:.2f}x",
            f"{row['dflash']['tau']:.2f}",
            f"{row['identical_outputs']}/{row['requests']}",
        )
    console.print(conc)
    console.print(f"[dim]{CONCURRENCY_NOTE}[/]")


def write_json(report: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def write_plots(report: dict, out_dir: Path) -> list[Path]:
    """Four PNGs: Pareto curve, tau histogram, block-size sweep, step times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    title = f"{report['system']['backend']} on {report['system']['device']}"

    rows = report["concurrency"]
    curves = [
        (label, marker, [row[key] for row in rows], [row["concurrency"] for row in rows])
        for key, label, marker in (("ar", "autoregressive", "o"), ("dflash", "DFlash", "s"))
    ]
    written.append(_save(pareto_figure(curves, title, "per-user tokens/s (interactivity)"), out_dir / "pareto.png"))

    hist = report["summary"]["tau_histogram"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([int(k) for k in hist], list(hist.values()))
    ax.axvline(report["summary"]["tau"], color="red", linestyle="--", label=f"mean tau {report['summary']['tau']:.2f}")
    ax.set_xlabel("tokens committed per verify step (tau)")
    ax.set_ylabel("steps")
    ax.set_title(f"acceptance, block size {report['settings']['block_size']}")
    ax.legend()
    written.append(_save(fig, out_dir / "tau_histogram.png"))

    rows = report["block_sizes"]
    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = [r["block_size"] for r in rows]
    ax.plot(sizes, [r["speedup"] for r in rows], marker="o", label="measured speedup")
    if all(r["tau_ideal_speedup"] is not None for r in rows):
        ax.plot(sizes, [r["tau_ideal_speedup"] for r in rows], marker="^", linestyle="--", label="tau-ideal speedup")
    ax.plot(sizes, [r["tau"] for r in rows], marker="s", label="tau")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("block size")
    ax.set_title("block-size sweep")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out_dir / "block_sweep.png"))

    s = report["summary"]
    if s["ar_step_ms"] is None or s["draft_ms"] is None:
        return written  # a server reports no per-step times
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh(["autoregressive step"], [s["ar_step_ms"] or 0], color="tab:blue")
    ax.barh(["DFlash step"], [s["draft_ms"] or 0], color="tab:orange", label="draft")
    ax.barh(["DFlash step"], [s["verify_ms"] or 0], left=[s["draft_ms"] or 0], color="tab:green", label="verify")
    ax.set_xlabel("ms per step")
    ax.set_title(f"time per step (one AR step = 1 token, one DFlash step = {s['tau']:.2f} tokens)")
    ax.legend()
    written.append(_save(fig, out_dir / "step_times.png"))
    return written


def pareto_figure(curves: list[tuple[str, str, list[dict], list[int]]], title: str, xlabel: str):
    """Throughput against per-user tokens/s: one line a curve (label, marker, its rows of
    `per_user_tokens_per_second` and `throughput`, the concurrency of each row), each point labelled c=N."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, marker, rows, concurrencies in curves:
        xs, ys = [r["per_user_tokens_per_second"] for r in rows], [r["throughput"] for r in rows]
        ax.plot(xs, ys, marker=marker, label=label)
        for concurrency, x, y in zip(concurrencies, xs, ys):
            ax.annotate(f"c={concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("throughput, tokens/s")
    ax.set_title(f"throughput vs interactivity ({title})")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
