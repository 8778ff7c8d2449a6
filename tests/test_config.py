"""Strategies files: validation errors point at the line and say what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from hwbackends.config import load_config, parse_config
from hwbackends.errors import ConfigError
from hwbackends.registry import get_registry

#: The installed plugins: the strategies' targets are checked against them.
REG = get_registry()

ROOT = Path(__file__).resolve().parents[1]

GOOD = """\
[tiers.fast]
p99_us = 100

[strategies.momentum]
model = "zoo:signal"
tier = "fast"
targets = ["cpu.*", "fpga.*"]
fidelity = { corr_min = 0.999, max_abs = 1e-3 }
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "strategies.toml"
    p.write_text(text)
    return p


def test_example_config_is_valid() -> None:
    cfg = load_config(ROOT / "examples" / "strategies.toml", REG)
    assert set(cfg.tiers) == {"ultra", "fast", "standard"}
    assert cfg.strategies["momentum"].fidelity.tolerance().corr_min == 0.995
    assert cfg.router.allow_emulated is False


def test_good_config_and_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD), REG)
    s = cfg.strategies["momentum"]
    assert s.targets == ["cpu.*", "fpga.*"] and s.pin is None and s.batch_size == 1
    assert cfg.router.window == 200 and cfg.router.bench.n == 2000


def test_invalid_toml_has_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"strategies.toml:3: invalid TOML"):
        load_config(_write(tmp_path, "[tiers.fast]\np99_us = 100\np99 us = 3\n"), REG)


def test_unknown_key_lists_allowed_keys_with_line(tmp_path: Path) -> None:
    text = GOOD.replace('tier = "fast"', 'tier = "fast"\ntargetz = ["cpu.*"]')
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text), REG)
    msg = str(e.value)
    assert "strategies.toml:7: strategies.momentum.targetz: unknown key 'targetz'" in msg
    assert "allowed here: model, tier, targets, precisions, fidelity, pin" in msg


def test_fidelity_key_and_value_errors(tmp_path: Path) -> None:
    text = GOOD.replace("corr_min = 0.999", "corr = 0.999").replace("p99_us = 100", "p99_us = -5")
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text), REG)
    msg = str(e.value)
    assert ":2: tiers.fast.p99_us: Input should be greater than 0 (got -5)" in msg
    assert ":8: strategies.momentum.fidelity.corr: unknown key 'corr'; allowed here: corr_min" in msg


def test_unknown_tier_names_defined_tiers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r":6: strategies.momentum.tier: unknown tier 'fastt'; "
                                          r"defined tiers: fast"):
        load_config(_write(tmp_path, GOOD.replace('tier = "fast"', 'tier = "fastt"')), REG)


def test_unknown_target_and_precision(tmp_path: Path) -> None:
    text = GOOD.replace('["cpu.*", "fpga.*"]', '["cpu.litrt"]')
    with pytest.raises(ConfigError, match=r":7: .*unknown target 'cpu.litrt'; registered: .*cpu.litert"):
        load_config(_write(tmp_path, text), REG)
    text = GOOD.replace('["cpu.*", "fpga.*"]', '["nothing.*"]')
    with pytest.raises(ConfigError, match="match no registered target"):
        load_config(_write(tmp_path, text), REG)
    text = GOOD.replace('targets = ["cpu.*", "fpga.*"]', 'targets = ["cpu.onnxruntime"]\nprecisions = ["fp16"]')
    with pytest.raises(ConfigError, match=r"precision 'fp16' is offered by none of cpu.onnxruntime; "
                                          r"they offer fp32, int8"):
        load_config(_write(tmp_path, text), REG)


def test_pin_errors(tmp_path: Path) -> None:
    for pin, want in (("litert", "pin must be 'target:precision'"),
                      ("cpu.litert:int4", "cpu.litert offers precisions fp32"),
                      ("ref:fp32", "not in this strategy's targets"),
                      ("gpu.nope:fp32", "unknown target 'gpu.nope'")):
        text = GOOD + f'pin = "{pin}"\n'
        with pytest.raises(ConfigError, match=want):
            load_config(_write(tmp_path, text), REG)
    load_config(_write(tmp_path, GOOD + 'pin = "cpu.litert:int8"\n'), REG)


def test_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r":5: strategies.momentum.model: model file .*nope.keras "
                                          r"does not exist"):
        load_config(_write(tmp_path, GOOD.replace("zoo:signal", "models/nope.keras")), REG)
    with pytest.raises(ConfigError, match="no zoo model 'signl'; zoo models: zoo:mlp"):
        load_config(_write(tmp_path, GOOD.replace("zoo:signal", "zoo:signl")), REG)


def test_retry_after_s_is_the_router_key(tmp_path: Path) -> None:
    # retry_after_s is the one name ("probe" is only Target.probe()); another name for it is
    # an unknown key at its line, listing the allowed ones (no renamed-key machinery).
    assert parse_config(GOOD + "\n[router]\nretry_after_s = 0.5\n", "x.toml").router.retry_after_s == 0.5
    with pytest.raises(ConfigError, match=r"x.toml:11: router.probe_after_s: unknown key "
                                          r"'probe_after_s'; allowed here: .*retry_after_s"):
        parse_config(GOOD + "\n[router]\nprobe_after_s = 0.5\n", "x.toml")
    with pytest.raises(ConfigError, match=r"x.toml:11: router.retry_after_s"):
        parse_config(GOOD + "\n[router]\nretry_after_s = -1.0\n", "x.toml")


def test_missing_sections_and_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tiers: missing required key 'tiers'"):
        parse_config("[strategies.a]\nmodel='zoo:signal'\ntier='x'\n")
    with pytest.raises(ConfigError, match="does not exist; see examples/strategies.toml"):
        load_config(tmp_path / "none.toml", REG)


def test_cli_check(tmp_path: Path, capsys) -> None:
    from hwbackends.cli import main

    assert main(["route", str(_write(tmp_path, GOOD)), "--check"]) == 0
    assert "valid (1 tiers, 1 strategies)" in capsys.readouterr().out
    assert main(["route", str(_write(tmp_path, GOOD.replace("fast\"", "slow\""))), "--check"]) == 1
    assert "unknown tier 'slow'" in capsys.readouterr().err


# -- hostile files ---------------------------------------------------------
def test_long_lines_are_checked_in_linear_time(tmp_path: Path) -> None:
    """A 6,000-space line made `hwb route --check` take 110 s (a backtracking line regex).
    Run in a child with a deadline far above the linear cost and far below the old one."""
    import subprocess
    import sys

    texts = [GOOD + " " * 6000 + "\n", GOOD + "x" + " " * 6000 + "y\n",
             GOOD.replace('tier = "fast"', 'tier = "fast"' + " " * 6000 + "# c"),
             GOOD + "[" + " " * 6000 + "\n", GOOD + "f = {" + "a" * 6000 + "\n"]
    paths = []
    for i, t in enumerate(texts):
        paths.append(tmp_path / f"s{i}.toml")
        paths[-1].write_text(t)
    code = ("import sys; from hwbackends.config import parse_config, ConfigError\n"
            "for p in sys.argv[1:]:\n"
            "    try: parse_config(open(p).read(), p)\n"
            "    except ConfigError as e: print(str(e).splitlines()[0][:120])\n")
    out = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_deep_nesting_is_a_config_error_with_the_line(tmp_path: Path) -> None:
    text = GOOD + "x = " + "[" * 500 + "]" * 500 + "\n"
    with pytest.raises(ConfigError, match=r"strategies\.toml:9: arrays/tables nested deeper"):
        load_config(_write(tmp_path, text), check_targets=False)


@pytest.mark.parametrize("key,value", [("timeout_us", "inf"), ("timeout_us", "nan"),
                                       ("batch_size", "inf")])
def test_numbers_must_be_finite(tmp_path: Path, key: str, value: str) -> None:
    text = GOOD.replace('tier = "fast"', f'tier = "fast"\n{key} = {value}')
    with pytest.raises(ConfigError, match=rf"strategies\.toml:7: strategies\.momentum\.{key}:"):
        load_config(_write(tmp_path, text), check_targets=False)
    tier = GOOD.replace("p99_us = 100", "p99_us = inf")
    with pytest.raises(ConfigError, match=r"strategies\.toml:2: tiers\.fast\.p99_us: .*finite"):
        load_config(_write(tmp_path, tier), check_targets=False)


def test_errors_after_a_multiline_string_get_their_own_line(tmp_path: Path) -> None:
    """Lines inside a multi-line string that look like keys or headers are not keys."""
    text = """\
[tiers.fast]
p99_us = 100
description = '''
[strategies.momentum]
tier = "not here"
'''

[strategies.momentum]
model = "zoo:signal"
note = \"\"\"
tier = 1 \\\"\"\" still inside
\"\"\"
tier = 5
"""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text), check_targets=False)
    msg = str(e.value)
    assert "strategies.toml:13: strategies.momentum.tier: Input should be a valid string" in msg
    assert "strategies.toml:10: strategies.momentum.note: unknown key" in msg


def test_check_reports_schema_and_semantic_problems_at_once(tmp_path: Path, capsys) -> None:
    """An unknown key hid every other problem of the file until it was
    fixed (the schema stopped the check); now `--check` lists them all in one run."""
    from hwbackends.cli import main

    text = """\
[tiers.fast]
p99_us = 100

[strategies.momentum]
model = "models/nope.keras"
tier = "fastt"
targetz = ["cpu.*"]
targets = ["cpu.litrt"]
validation_data = "val.csv"
calibration_data = "missing.npy"

[strategies.other]
model = "zoo:signal"
tier = "fast"
batch_size = true
pin = "cpu.litert:int4"
targets = ["cpu.litert"]
"""
    assert main(["route", str(_write(tmp_path, text)), "--check"]) == 1
    err = capsys.readouterr().err
    for want in (":7: strategies.momentum.targetz: unknown key 'targetz'",
                 ":15: strategies.other.batch_size: Input should be a valid integer",
                 ":6: strategies.momentum.tier: unknown tier 'fastt'; defined tiers: fast",
                 ":5: strategies.momentum.model: model file", "nope.keras does not exist",
                 ":8: strategies.momentum.targets: unknown target 'cpu.litrt'",
                 ":9: strategies.momentum.validation_data: val.csv is not a .npy/.npz file",
                 ":10: strategies.momentum.calibration_data: data file", "missing.npy does not exist",
                 ":16: strategies.other.pin: target cpu.litert offers precisions"):
        assert want in err, (want, err)


def test_fpga_fixed_point_precisions_are_accepted(tmp_path: Path) -> None:
    """``precisions = ["ap_fixed<16,6>"]`` (and a pin at it) was refused because
    the check asked the listed precisions, while ``hwb compile`` takes any ap_fixed<W,I>
    fpga.hls4ml accepts. Refused only when no allowed target accepts it, naming the rule."""
    text = GOOD.replace('targets = ["cpu.*", "fpga.*"]',
                        'targets = ["fpga.hls4ml"]\nprecisions = ["ap_fixed<16,6>"]\n'
                        'pin = "fpga.hls4ml:ap_fixed<16,6>"')
    s = load_config(_write(tmp_path, text), REG).strategies["momentum"]
    assert s.precisions == ["ap_fixed<16,6>"] and s.pin == "fpga.hls4ml:ap_fixed<16,6>"
    bad = GOOD.replace('targets = ["cpu.*", "fpga.*"]',
                       'targets = ["fpga.hls4ml"]\nprecisions = ["ap_fixed<99,6>"]')
    with pytest.raises(ConfigError, match=r"precision 'ap_fixed<99,6>' is offered by none of "
                                          r"fpga.hls4ml; .*fpga.hls4ml also takes any ap_fixed"):
        load_config(_write(tmp_path, bad), REG)
    cpu = GOOD.replace('targets = ["cpu.*", "fpga.*"]',
                       'targets = ["cpu.onnxruntime"]\nprecisions = ["ap_fixed<16,6>"]')
    with pytest.raises(ConfigError, match="precision 'ap_fixed<16,6>' is offered by none of "
                                          "cpu.onnxruntime"):
        load_config(_write(tmp_path, cpu), REG)
