"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations


class DFlashError(Exception):
    """An error caused by the user's input or environment, printed without a traceback."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


class CheckpointError(DFlashError):
    """A target or drafter checkpoint that cannot be used."""


class CompatibilityError(DFlashError):
    """A drafter that does not fit its target."""


class MissingDependencyError(DFlashError):
    """An optional package or a GPU that this step needs is not present."""


class UnknownNameError(DFlashError):
    """A model, GPU or recipe name that the catalogs do not know."""


class RecipeError(DFlashError):
    """A recipe file that cannot be used (syntax, unknown key, wrong type, inconsistent values)."""


class PlanRefusedError(DFlashError):
    """A model x GPU x precision x GPU-count combination that cannot work, with the nearest one that does."""
