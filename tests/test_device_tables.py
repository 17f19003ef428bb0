"""Per-device launch-shape tables (``kda_kernels.triton_configs.DEVICE_TABLES``): which table a GPU's
name selects, that a card's rules come before the H200 regime table and only where they apply, that
``picked_configs`` lists every table's shapes (so benchmarks/gpu_abuse.py checks them on a GPU), and
benchmarks/device_table.py's choice of shapes and rewrite of the table block. CPU only, no timing."""

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from kda_kernels import triton_configs
from kda_kernels.triton_configs import DEVICE_TABLES, DecodeConfig, TableRule, pick_config, picked_configs, table_for

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
GRID = list(itertools.product((1, 2, 8, 33, 64, 200, 256, 1024, 4096), (1, 4, 12, 16, 32, 64),
                              (torch.float32, torch.bfloat16, torch.float16), ("VK", "KV"), (False, True)))


def _device_table():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("kda_benchmarks_device_table", BENCH / "device_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_gpu_name_selects_its_table_and_an_unknown_card_the_default() -> None:
    assert table_for("NVIDIA H100 80GB HBM3") == "h100"
    assert table_for("NVIDIA H100 PCIe") == "h100"
    assert table_for("NVIDIA H200") == "h200"
    assert table_for("NVIDIA A100-SXM4-80GB") == "default"
    assert table_for("cpu (dry run)") == "default"
    assert table_for(None) == "default"
    assert table_for("h100") == "h100"  # a table's own name


def test_the_h200_and_unknown_cards_keep_the_regime_table() -> None:
    # the H200's picks are what they were before tables existed (pick_config without a device)
    for batch, hv, dtype, layout, gdn in GRID:
        base = pick_config(batch, hv, 128, dtype, layout, gdn=gdn)
        assert pick_config(batch, hv, 128, dtype, layout, gdn=gdn, device="NVIDIA H200") == base
        assert pick_config(batch, hv, 128, dtype, layout, gdn=gdn, device="Tesla T4") == base
    assert DEVICE_TABLES["h200"] == () and DEVICE_TABLES["default"] == ()


def test_each_rule_of_each_table_is_what_a_call_in_its_ranges_gets() -> None:
    assert "h100" in DEVICE_TABLES  # the H100's table (empty until measured: the regime table)
    for table, rules in DEVICE_TABLES.items():
        for i, rule in enumerate(rules):
            dtype = torch.float32 if rule.wide_state else torch.bfloat16
            for hv in rule.num_v_heads:
                for batch in rule.batch:
                    first = next(r for r in rules if r.matches(batch, hv, rule.wide_state, rule.layout, rule.gdn))
                    got = pick_config(batch, hv, 128, dtype, rule.layout, gdn=rule.gdn, device=table)
                    assert got == first.config, (table, i, batch, hv)


def test_a_card_rule_applies_only_to_its_op_layout_state_width_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = DecodeConfig(block_v=2, num_warps=2, guard="mask")
    monkeypatch.setitem(DEVICE_TABLES, "zz9", (TableRule(False, (8, 16), (1, 4), odd),))
    card = "ACME ZZ-9 Accelerator"
    assert table_for(card) == "zz9"
    assert pick_config(2, 16, 128, torch.bfloat16, device=card) == odd
    assert pick_config(4, 8, 128, torch.float16, device=card) == odd  # 16-bit state: fp16 too
    assert pick_config(2, 16, 4, torch.bfloat16, device=card).block_v == 2  # never past next_pow2(V)
    for args, kw in (((2, 16, 128, torch.float32), {}), ((5, 16, 128, torch.bfloat16), {}),
                     ((2, 32, 128, torch.bfloat16), {}), ((2, 16, 128, torch.bfloat16, "KV"), {}),
                     ((2, 16, 128, torch.bfloat16), {"gdn": True})):
        assert pick_config(*args, **kw, device=card) == pick_config(*args, **kw), (args, kw)
    assert odd in picked_configs() and odd in picked_configs(device=card)
    assert odd not in picked_configs(device="NVIDIA H200")


def test_picked_configs_lists_every_shape_of_every_table() -> None:
    every = set(picked_configs())
    for table in DEVICE_TABLES:
        assert set(picked_configs(device=table)) <= every
        assert {r.config for r in DEVICE_TABLES[table]} <= every
    for batch, hv, dtype, layout, gdn in GRID:
        for table in DEVICE_TABLES:
            assert pick_config(batch, hv, 128, dtype, layout, gdn=gdn, device=table) in every


def test_the_table_module_imports_without_triton() -> None:
    assert "triton" not in triton_configs.__dict__


def _sweep_rows(shapes: dict[str, tuple[float, float]], B: int = 8, H: int = 32, state: str = "bfloat16") -> list:
    base = pick_config(B, H, 128, getattr(torch, state), device="default")
    configs = {"triton": base, "triton:r2": base._replace(block_v=2), "triton:w2": base._replace(num_warps=2)}
    return [dict(variant=v, layout="VK", backend=n, H=H, HV=H, state=state, B=B, correct=True,
                 vs_main_peer=r[i], config=repr(configs[n]))
            for n, r in shapes.items() for i, v in enumerate(("hot", "cold"))]


def test_device_table_keeps_the_pick_unless_a_shape_is_clearly_better() -> None:
    dt = _device_table()
    assert dt.choose({"triton": (1.0, 1.0, ""), "triton:r2": (1.0, 1.005, "")}) == "triton"  # within noise
    assert dt.choose({"triton": (1.0, 1.0, ""), "triton:r2": (0.995, 1.02, "")}) == "triton:r2"  # score +2 %
    assert dt.choose({"triton": (0.95, 1.0, ""), "triton:r2": (0.97, 0.99, "")}) == "triton:r2"  # the floor
    assert dt.choose({"triton": (0.995, 1.0, ""), "triton:r2": (1.05, 1.005, "")}) == "triton"  # both over FLOOR
    assert dt.bands([1, 8, 64, 256, 1024], 1 << 30) == {1: (1, 2), 8: (3, 22), 64: (23, 128), 256: (129, 512),
                                                        1024: (513, 1 << 30)}


def test_device_table_writes_a_cards_rules_and_keeps_the_others(tmp_path: Path) -> None:
    dt = _device_table()
    sweep = tmp_path / "sweep.json"
    rows = _sweep_rows({"triton": (0.92, 0.95), "triton:r2": (1.03, 1.04), "triton:w2": (1.0, 0.9)})
    rows += _sweep_rows({"triton": (1.05, 1.06), "triton:r2": (1.0, 1.0)}, B=1, H=4, state="float32")
    sweep.write_text(json.dumps({"device": "ACME ZZ9", "rows": rows}))
    device, report, rules = dt.table([str(sweep)])
    assert device == "ACME ZZ9" and len(rules) == 1 and "triton:r2" in rules[0][1]
    assert any("| 32 | bfloat16 | 8 | 0.920 / 0.950 | triton:r2 | 1.030 / 1.040 |" == line for line in report)
    assert dt.table_name(device) == "zz9"
    configs = tmp_path / "triton_configs.py"
    configs.write_text(dt.CONFIGS.read_text())
    dt.write("zz9", dt.entry("zz9", device, rules), configs)
    dt.write("zz9", dt.entry("zz9", device, rules), configs)  # again: replaced, not added
    spec = importlib.util.spec_from_file_location("kda_kernels._written_configs", configs)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert len(mod.DEVICE_TABLES["zz9"]) == 1
    assert mod.DEVICE_TABLES["h100"] == DEVICE_TABLES["h100"]  # the other cards' tables stay
    want = pick_config(8, 32, 128, torch.bfloat16, device="default")._replace(block_v=2)
    assert mod.pick_config(8, 32, 128, torch.bfloat16, device="ACME ZZ9") == want
    assert mod.pick_config(8, 32, 128, torch.bfloat16, device="ACME ZZ9") == mod.DEVICE_TABLES["zz9"][0].config
