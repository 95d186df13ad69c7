"""The one recipe format: presets, TOML files and --set assignments for quickstart and reproduce."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lmlm.cli import app
from lmlm.quickstart import QUICKSTART_PRESETS, QuickstartConfig
from lmlm.recipe import RecipeError, apply_set
from lmlm.reproduce.config import REPRODUCE_PRESETS, ReproduceConfig


def test_a_preset_row_and_python_fields_give_the_same_config_as_before():
    cfg = QuickstartConfig.from_name("smoke", seed=3)
    assert cfg == QuickstartConfig(**{"name": "smoke", **QUICKSTART_PRESETS["smoke"], "seed": 3})
    assert ReproduceConfig.from_name("tiny") == ReproduceConfig(**{"name": "tiny", **REPRODUCE_PRESETS["tiny"]})


def test_set_assignments_are_read_as_toml_and_typed_by_the_field():
    cfg = ReproduceConfig.from_name("tiny", ["n_trex=7", "seeds=[0, 3]", "bios_overrides.max_steps=9", "tofu_lr=1"])
    assert cfg.n_trex == 7 and cfg.seeds == (0, 3) and cfg.bios_overrides["max_steps"] == 9
    assert cfg.tofu_lr == 1.0 and isinstance(cfg.tofu_lr, float)
    assert REPRODUCE_PRESETS["tiny"]["bios_overrides"]["max_steps"] == 150  # the preset table is left as it was
    assert QuickstartConfig.from_name("smoke", n_cloze=None).n_cloze is None  # an optional field takes None


def test_a_toml_file_is_a_preset(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('world = "smoke"\nmax_steps = 12\n[model_overrides]\ncontext_length = 128\n')
    cfg = QuickstartConfig.from_name(str(path), ["lr=1e-3"])
    assert (cfg.name, cfg.world, cfg.max_steps, cfg.lr, cfg.model_overrides) == \
        ("mine", "smoke", 12, 1e-3, {"context_length": 128})


@pytest.mark.parametrize("sets, message", [
    (["max_stepz=3"], "unknown field 'max_stepz'"),
    (['max_steps="many"'], "max_steps must be a int, got 'many'"),
    (["max_steps"], "expected section.key=value"),
    (["model_overrides=3"], "model_overrides must be a dict"),
    (["protocol_edits=[1, 0]"], r"protocol_edits = \[1, 0\] must hold edit counts of at least 1"),
    (["protocol_sample=0"], "protocol_sample = 0 must be at least 1"),
    (["eval_batch_size=0"], "eval_batch_size = 0 must be at least 1"),
])
def test_a_bad_field_names_itself(sets, message):
    with pytest.raises(RecipeError, match=message):
        QuickstartConfig.from_name("smoke", sets)


def test_an_unknown_preset_is_a_value_error_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown reproduce preset 'huge'; known: \['cpu', 'tiny'\]"):
        ReproduceConfig.from_name("huge")
    with pytest.raises(RecipeError, match="no such recipe file"):
        QuickstartConfig.from_name(str(tmp_path / "none.toml"))


def test_apply_set_refuses_a_key_under_a_value():
    data = {"a": 1}
    with pytest.raises(RecipeError, match="a is not a table"):
        apply_set(data, "a.b=2")


def test_the_cli_reports_a_bad_set_in_one_line(tmp_path):
    for command in ("quickstart", "reproduce"):
        res = CliRunner().invoke(app, [command, "--out", str(tmp_path / command), "--set", "no_such_field=1"])
        said = res.output + ("" if isinstance(res.exception, SystemExit) else str(res.exception))
        assert res.exit_code != 0 and "unknown field 'no_such_field'" in said, (command, said)
        assert not (tmp_path / command / "config.json").exists()
