"""`dflash-trt`: the command-line face of trtllm-dflash.

Each command lives in its own module and registers itself here. User errors (DFlashError)
print one line naming the problem and the fix, and exit with status 2; nothing is half-written.
Anything else prints one line with the command, model, versions and a traceback file (crash.py),
and exits with status 1; `--debug` anywhere on the line prints the traceback instead.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.cli import (
    bench,
    build,
    demo,
    doctor,
    explain_bytes,
    generate,
    openai_front,
    plan,
    plugins,
    recipes,
    repo,
    selftest,
    serve,
    train,
)
from trtllm_dflash.errors import DFlashError


def _flags_show_no_type() -> None:
    """A flag takes no value, yet typer's rich help prints `<bool>` beside each one (--help too):
    flags get no type column; options that take a value keep theirs."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "flags_show_no_type", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_show_no_type = True
    TyperOption.display_type_rich = display_type_rich


_flags_show_no_type()

app = typer.Typer(
    name="dflash-trt",
    help=(
        "Build, verify and serve DFlash speculative decoding: a target LLM plus its block-diffusion "
        "drafter, from Hugging Face checkpoints to TensorRT engines behind Triton Inference Server."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    """DFlash speculative decoding: plan, build, serve, generate, benchmark."""
    if version:
        from trtllm_dflash import __version__

        print(__version__)
        raise typer.Exit()


# in pipeline order, as `dflash-trt --help` lists them
app.command("demo")(demo.demo)
app.command("doctor")(doctor.doctor)
app.command("plan")(plan.plan)
app.add_typer(recipes.app, name="recipes")
app.command("build")(build.build)
app.command("explain-bytes")(explain_bytes.explain_bytes)
app.add_typer(plugins.app, name="plugins")
app.command("generate")(generate.generate)
app.command("repo")(repo.repo)
app.command("serve")(serve.serve)
app.command("openai")(openai_front.openai_front)
app.command("bench")(bench.bench)
app.command("train-drafter")(train.train_drafter)
app.command("selftest")(selftest.selftest)

err_console = Console(stderr=True, highlight=False)


def main() -> None:
    """Run the app. User errors: one line, exit 2. Unforeseen errors: one line naming the command,
    the model and the versions, the traceback in a file (`--debug` anywhere, or DFLASH_TRT_DEBUG=1,
    prints it instead), exit 1."""
    debug = "--debug" in sys.argv[1:] or os.environ.get("DFLASH_TRT_DEBUG") == "1"
    sys.argv = [sys.argv[0], *(word for word in sys.argv[1:] if word != "--debug")]
    try:
        app()
    except DFlashError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a raw traceback
        if isinstance(exc, ModuleNotFoundError):  # an optional extra imported deep inside a library
            from trtllm_dflash.extras import as_missing_extra

            error = as_missing_extra(exc)
            if error is not None:
                err_console.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
                sys.exit(2)
        if debug:
            raise
        from trtllm_dflash.cli import crash

        err_console.print(f"[bold red]error:[/] {escape(crash.report(exc, sys.argv))}", soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
