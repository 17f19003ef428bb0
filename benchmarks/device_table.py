"""A card's launch-shape table: time the Triton kernel's candidate shapes beside sglang's Helion
kernel on this GPU (``decode.py --candidates``, KDA, VK layout, hot and cold), choose one shape per
measured row, and print (``--write``: write) the card's rules for ``DEVICE_TABLES`` in
``kernels/triton_configs.py``.

One command on the new card (sglang's kernels and helion importable, see docs/kernels.md)::

    python benchmarks/device_table.py --warm 14 --json OUT.json --write

Or from a sweep's JSON already made (on any machine, no GPU)::

    python benchmarks/device_table.py --from OUT.json [--write]

The choice per row (H, state, B), over the shapes that matched the reference: ratio = sglang-helion's
time / ours, hot and cold. A shape's floor is the lower of its two ratios, its score their geometric
mean; the best shape is the one with the highest floor (counted up to ``FLOOR``, so above it the
score decides) and then the highest score. The row keeps the shape the card picks now unless the
best one lifts the floor by ``MIN_FLOOR_GAIN`` or the score by ``MIN_SCORE_GAIN`` (the noise of a
row at a few µs is about ±1.5 %). Rows whose choice is the regime table's own shape need no rule.
Each rule covers the head counts and batches nearest its row (bands between the measured values,
split at their geometric means), for the row's state width (fp32, or 16-bit).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIGS = Path(__file__).resolve().parent.parent / "kernels" / "triton_configs.py"
BEGIN, END = "    # BEGIN GENERATED TABLES", "    # END GENERATED TABLES"
FLOOR = 0.99  # floors above this count alike (the target is 0.98: one noise step of margin)
MIN_FLOOR_GAIN = 0.005
MIN_SCORE_GAIN = 0.01
#: the candidates timed (decode.py --candidates --only): tiles of 2-32 rows, one or two warps, the
#: guards, program orders, state and activation hints, the fused output and the early state load
CANDIDATES = "base,r2,r4,r8,r16,r32,w2,r2x-w2,m,br,vf,flat,el,fo,nofo,noev,cg,ka,m-cg,r8-flat-br"


def sweep(args: argparse.Namespace, json_path: str) -> None:
    """``decode.py --candidates`` on this GPU: KDA, VK, sglang-helion the only peer."""
    import decode

    argv = ["--candidates", "--only", args.only, "--no-kv", "--no-eager", "--heads", args.heads,
            "--batches", args.batches, "--states", args.states, "--skip", "helion,fla,fla-kernel,sglang-triton",
            "--json", json_path]
    if args.warm:
        argv += ["--warm", str(args.warm)]
    if decode.main(argv):
        raise SystemExit("the sweep failed")


def rows_of(paths: list[str]) -> tuple[str, dict[tuple[int, int, str, int], dict[str, dict[str, Any]]]]:
    """(device name, {(H, HV, state, B): {backend: {"hot": row, "cold": row}}}) of our VK rows."""
    device = ""
    found: dict[tuple[int, int, str, int], dict[str, dict[str, Any]]] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        device = device or doc.get("device", "")
        for r in doc["rows"]:
            if r["layout"] != "VK" or not r["backend"].startswith("triton"):
                continue
            found.setdefault((r["H"], r["HV"], r["state"], r["B"]), {}).setdefault(r["backend"], {})[r["variant"]] = r
    return device, found


def measured(shapes: dict[str, dict[str, Any]]) -> dict[str, tuple[float, float, str]]:
    """backend -> (floor, score, config) of the shapes correct and timed hot and cold."""
    out = {}
    for name, by in shapes.items():
        if set(by) != {"hot", "cold"} or not all(r["correct"] and r["vs_main_peer"] and r.get("config")
                                                 for r in by.values()):
            continue
        hot, cold = by["hot"]["vs_main_peer"], by["cold"]["vs_main_peer"]
        out[name] = (min(hot, cold), math.sqrt(hot * cold), by["hot"]["config"])
    return out


def choose(shapes: dict[str, tuple[float, float, str]]) -> str:
    """The backend name chosen for a row (``"triton"``, the current pick, unless one is clearly better)."""
    best = max(shapes, key=lambda n: (min(shapes[n][0], FLOOR), shapes[n][1]))
    if "triton" not in shapes:
        return best
    cur, new = shapes["triton"], shapes[best]
    if min(new[0], FLOOR) >= min(cur[0], FLOOR) + MIN_FLOOR_GAIN or new[1] >= cur[1] * (1 + MIN_SCORE_GAIN):
        return best
    return "triton"


def bands(values: list[int], top: int) -> dict[int, tuple[int, int]]:
    """Each measured value's inclusive range: split at the geometric means of neighbours, from 1 to ``top``."""
    vs = sorted(set(values))
    cuts = [math.floor(math.sqrt(a * b)) for a, b in itertools.pairwise(vs)]
    lows, highs = [1, *(c + 1 for c in cuts)], [*cuts, top]
    return {v: (lo, hi) for v, lo, hi in zip(vs, lows, highs, strict=True)}


def table(paths: list[str]) -> tuple[str, list[str], list[tuple[str, Any]]]:
    """(device, report lines, [(rule source, comment)]) from sweep JSON files."""
    import torch
    from kda_kernels.triton_configs import DecodeConfig, pick_config

    device, found = rows_of(paths)
    hv_band = bands([k[1] for k in found], 1 << 16)
    b_band = bands([k[3] for k in found], 1 << 30)
    lines = ["| H | state | B | pick now (hot / cold) | chosen | chosen (hot / cold) |", "|---|---|---|---|---|---|"]
    rules, before, after = [], [], []
    for (H, HV, state, B), shapes in sorted(found.items(), key=lambda kv: (kv[0][2], -kv[0][0], kv[0][3])):
        got = measured(shapes)
        if not got:
            lines.append(f"| {H} | {state} | {B} | — | no shape correct and timed | — |")
            continue
        name = choose(got)

        def ratios(n: str, shapes: dict[str, dict[str, Any]] = shapes) -> str:
            return f"{shapes[n]['hot']['vs_main_peer']:.3f} / {shapes[n]['cold']['vs_main_peer']:.3f}"

        now = ratios("triton") if "triton" in got else "—"
        lines.append(f"| {H} | {state} | {B} | {now} | {name} | {ratios(name)} |")
        before += [shapes["triton"][v]["vs_main_peer"] for v in ("hot", "cold")] if "triton" in got else []
        after += [shapes[name][v]["vs_main_peer"] for v in ("hot", "cold")]
        cfg = eval(got[name][2], {"__builtins__": {}, "DecodeConfig": DecodeConfig})  # our own repr
        base = pick_config(B, HV, 128, getattr(torch, state), "VK", device="default")
        if cfg != base:
            wide = getattr(torch, state).itemsize >= 4
            rules.append((f"TableRule({wide}, {hv_band[HV]}, {b_band[B]}, {short(cfg)})",
                          f"H={H} {state} B={B}: {name} {ratios(name)}"))
    for label, xs in (("pick now", before), ("chosen", after)):
        if xs:
            gm = math.exp(sum(map(math.log, xs)) / len(xs))
            lines.append(f"\n{label}: {len(xs)} ratios, worst {min(xs):.3f}x, geometric mean {gm:.3f}x "
                         "(in this sweep: the chosen figures are the best of many, re-measure them)")
    return device, lines, rules


def short(cfg: Any) -> str:
    """``DecodeConfig(...)`` with the fields that differ from their defaults only."""
    fields = [f"{k}={v!r}" for k, v in cfg._asdict().items()
              if k in ("block_v", "num_warps") or v != type(cfg)._field_defaults.get(k)]
    return f"DecodeConfig({', '.join(fields)})"


def table_name(device: str) -> str:
    """The table a card's rules go under: the one it takes now, or the first token of its name with a
    digit in it (``NVIDIA A100-SXM4-80GB`` -> ``a100``)."""
    from kda_kernels.triton_configs import table_for

    name = table_for(device)
    if name != "default":
        return name
    token = next((t for t in re.split(r"[\s\-_]+", device) if any(c.isdigit() for c in t)), device)
    return "".join(c for c in token.lower() if c.isalnum())


def entry(name: str, device: str, rules: list[tuple[str, str]]) -> str:
    day = datetime.date.today().isoformat()
    head = f'    "{name}": (  # benchmarks/device_table.py on {device}, {day}: {len(rules)} rules\n'
    body = "".join(f"        # {why}\n        {_wrapped(src)},\n" for src, why in rules)
    return head + body + "    ),\n"


def _wrapped(src: str, width: int = 110) -> str:
    """A rule's source on two lines when it is too long for one (the config on the second)."""
    return src if len(src) <= width else src.replace(", DecodeConfig(", ",\n                  DecodeConfig(", 1)


def write(name: str, text: str, path: Path = CONFIGS) -> None:
    """Put ``text`` (one table's entry) between the markers of ``path``, replacing that table's entry."""
    src = path.read_text()
    start, end = src.index(BEGIN), src.index(END)
    block_start = src.index("\n", start) + 1
    block = src[block_start:end]
    entries = re.findall(r'(?ms)^    "[^"]+": \(.*?^    \),\n', block)
    kept = [e for e in entries if not e.startswith(f'    "{name}": (')]
    path.write_text(src[:block_start] + "".join([*kept, text]) + src[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="sources", nargs="+", metavar="JSON", help="sweep JSON files to read instead "
                   "of running the sweep")
    p.add_argument("--json", default="device_table.json", help="where the sweep writes its rows")
    p.add_argument("--warm", type=int, default=0, metavar="N", help="compile every launch shape first in N processes")
    p.add_argument("--heads", default="32,16,4")
    p.add_argument("--batches", default="1,8,64,256,1024")
    p.add_argument("--states", default="float32,bfloat16")
    p.add_argument("--only", default=CANDIDATES, help="the candidate shapes (decode.py --only)")
    p.add_argument("--name", help="the table's name (default: the one the card takes, or from its name)")
    p.add_argument("--write", action="store_true", help="write the card's rules into kernels/triton_configs.py")
    args = p.parse_args(argv)
    sources = args.sources
    if not sources:
        sweep(args, args.json)
        sources = [args.json]
    device, lines, rules = table(sources)
    name = args.name or table_name(device)
    print(f"# {device}: table {name!r}")
    print("\n".join(lines))
    text = entry(name, device, rules)
    print(text, end="")
    if args.write:
        write(name, text)
        print(f"# written to {CONFIGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
