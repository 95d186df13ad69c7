"""``lmlm pipeline``: a recipe that runs corpus -> annotation -> KB -> training -> evaluation -> report.

* :mod:`lmlm.pipeline.recipe`: the recipe (TOML, shipped ones in ``recipes/``), ``--set`` overrides;
* :mod:`lmlm.pipeline.run`: :func:`run_pipeline`, the stages, each resumable;
* :mod:`lmlm.pipeline.annotation`: infobox, given and LLM annotations merged into one corpus;
* :mod:`lmlm.pipeline.facts`: cloze prompts on real facts (LAMA T-REx files) per split, edits in the KB;
* :mod:`lmlm.pipeline.report`: ``report.json`` and ``report.md`` with figures.

Exercised by ``lmlm pipeline wiki-cpu --corpus enwiki.xml.bz2 --out runs/wiki-cpu``.
"""

from .recipe import Recipe, RecipeError, load_recipe, recipe_names

__all__ = ["Recipe", "RecipeError", "load_recipe", "recipe_names", "run_pipeline"]


def run_pipeline(recipe, out, fresh: bool = False, progress: bool = True) -> dict:
    """Run ``recipe`` (a :class:`Recipe`) into ``out``; see :func:`lmlm.pipeline.run.run_pipeline`."""
    from .run import run_pipeline as _run

    return _run(recipe, out, fresh=fresh, progress=progress)
