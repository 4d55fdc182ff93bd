#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How transformers saves fused expert stacks, per model_type, as ckfs's table.

transformers 5 holds an MoE block's experts fused in memory
(<block>.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]) and, on
save_pretrained (which verl's merger calls), reverts the load-time
conversions its conversion mapping declares per model_type
(transformers/conversion_mapping.py): a WeightConverter that merged
per-expert gate and up weights (MergeModulelist(dim=0), Concatenate(dim=1))
is reverted into per-expert tensors, a WeightRenaming of the block
(".block_sparse_moe." -> ".mlp.") is reverted on every name. A model_type
whose modeling code holds fused experts and declares no such converter
writes them as held. This script reads those declarations from the
transformers it runs with (nothing is restated by hand) and writes, per
model_type, one of:

  split   BLOCK DISK_BLOCK GATE UP DOWN   per expert, under DISK_BLOCK
  kept                                      as held in memory

Rows are kept only for the patterns ckfs implements; any other converter
touching experts (a transpose that applies, Ernie's text/vision split,
ungated stacks, sharded concatenation, renames of other weights beside the
experts) leaves the model_type out, so ckfs refuses it. Each release
writes its own JSON (tests/fixtures/experts/transformers-<version>.json);
the C table (src/layouts/experts_table.h) holds the rows every recorded
release agrees on, and a model_type they disagree on is left out.

    python tests/gen/make_experts_table.py record     # this transformers' JSON
    python tests/gen/make_experts_table.py table      # the C table (and docs/formats.md's) from all JSON
    python tests/gen/make_experts_table.py check      # exit 1 if this release's JSON
                                                      # or the C table would change
"""
import glob
import importlib
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(REPO, "tests", "fixtures", "experts")
TABLE = os.path.join(REPO, "src", "layouts", "experts_table.h")
DOC = os.path.join(REPO, "docs", "formats.md")
DOC_BEGIN, DOC_END = "<!-- experts table: begin (make_experts_table.py) -->", "<!-- experts table: end -->"
FUSED_PARAM = re.compile(r"self\.gate_up_proj\s*=\s*nn\.Parameter")


def op_desc(op):
    args = {k: v for k, v in vars(op).items() if v is not None}
    return type(op).__name__ + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(args.items())) + ")"
                                if args else "")


def rule_of(convs):
    """(rule, why): rule a dict, or None with the reason ckfs leaves it out."""
    from transformers.core_model_loading import WeightConverter

    expert_convs = [c for c in convs if isinstance(c, WeightConverter) and
                    any(".experts." in p or p.startswith("experts.") for p in
                        list(c.source_patterns) + list(c.target_patterns))]
    others = [c for c in convs if c not in expert_convs]
    if not expert_convs:
        return None, "no converter of experts"
    ops = [[op_desc(o) for o in c.operations] for c in expert_convs]
    # A transpose of a stack onto itself that only applies when the shape
    # differs from the model's own parameter: a state dict taken from the
    # model has that shape, so save_pretrained writes it as held.
    if all(list(c.source_patterns) == list(c.target_patterns) and len(c.operations) == 1
           and type(c.operations[0]).__name__ == "Transpose" and c.operations[0].check_dims
           for c in expert_convs):
        return {"kind": "kept", "why": "Transpose(check_dims) onto the same name"}, None
    gate_up = down = None
    for c, o in zip(expert_convs, ops):
        tgt = list(c.target_patterns)
        if len(tgt) != 1:
            return None, f"converter to {tgt}"
        if tgt[0].endswith("experts.gate_up_proj") and o == ["MergeModulelist(dim=0)", "Concatenate(dim=1)"] \
                and len(c.source_patterns) == 2:
            gate_up = c
        elif tgt[0].endswith("experts.down_proj") and o == ["MergeModulelist(dim=0)"] \
                and len(c.source_patterns) == 1:
            down = c
        else:
            return None, f"{list(c.source_patterns)} -> {tgt} by {o}"
    if not gate_up or not down:
        return None, "not a gate_up and a down converter"
    pat = re.compile(r"^\.?(?:(\w+)\.)?experts\.\*\.(\w+)\.weight$")
    parts, blocks = [], set()
    for p in list(gate_up.source_patterns) + list(down.source_patterns):
        m = pat.match(p)
        if not m:
            return None, f"source pattern {p}"
        blocks.add(m.group(1))
        parts.append(m.group(2))
    block = disk = blocks.pop() if len(blocks) == 1 else None
    renames = []
    for c in others:
        src, tgt = list(c.source_patterns), list(c.target_patterns)
        m = len(src) == 1 and len(tgt) == 1 and re.fullmatch(r"\.(\w+)\.", src[0]) and \
            re.fullmatch(r"\.(\w+)\.", tgt[0])
        if m and type(c).__name__ == "WeightRenaming":
            renames.append((src[0].strip("."), tgt[0].strip(".")))
        else:
            return None, f"also {type(c).__name__} {src} -> {tgt}"
    if len(renames) > 1:
        return None, f"renames {renames}"
    if renames:
        disk, held = renames[0]
        if block not in (None, held):
            return None, f"converters under {block}, renamed from {disk} to {held}"
        block = held
    if block is None:
        return None, "no block named"
    return {"kind": "split", "block": block, "disk_block": disk or block,
            "parts": parts}, None


def fused_model_types():
    """model_types whose modeling code holds fused expert parameters."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    root = os.path.dirname(transformers.__file__)
    fused = set()
    for mt, cls in CONFIG_MAPPING_NAMES.items():
        try:
            mod = importlib.import_module(
                getattr(transformers, cls).__module__.replace("configuration_", "modeling_"))
        except Exception:  # noqa: BLE001 (a package without modeling, or its extras)
            path = None
        else:
            path = getattr(mod, "__file__", None)
        if path and path.startswith(root) and FUSED_PARAM.search(open(path).read()):
            fused.add(mt)
    return fused


def sub_model_types(mt):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        subs = getattr(CONFIG_MAPPING[mt], "sub_configs", {}) or {}
    except (KeyError, ImportError):
        return []
    return [getattr(c, "model_type", None) for c in subs.values() if getattr(c, "model_type", None)]


def record():
    import transformers
    from transformers import conversion_mapping as cm

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    mapping = cm._build_checkpoint_conversion_mapping()
    rows, left_out = {}, {}
    fused = fused_model_types()
    # model_types only: the mapping also has class names, which config.json never says
    for mt in sorted((set(mapping) | fused) & set(CONFIG_MAPPING_NAMES)):
        convs = mapping.get(mt) or []
        rule, why = rule_of(convs)
        if rule is None and why == "no converter of experts":
            if mt not in fused:
                continue
            # A composite model's sub-models bring their own conversions.
            subs = sorted(s for s in sub_model_types(mt) if rule_of(mapping.get(s) or [])[1] !=
                          "no converter of experts")
            if subs:
                left_out[mt] = f"its sub-model {subs[0]} converts experts"
                continue
            rule = {"kind": "kept", "why": "fused in its modeling code, no converter"}
        if rule:
            rows[mt] = rule
        else:
            left_out[mt] = why
    return {"transformers": transformers.__version__, "rows": rows, "left_out": left_out}


def record_path(version):
    return os.path.join(RECORDS, f"transformers-{version}.json")


def agreement(records):
    """The rows every release agrees on, and the model_types they do not."""
    agreed, differ = {}, []
    for mt in sorted(set().union(*(r["rows"] for r in records))):
        # A release without a row and without a reason to leave it out holds
        # no fused experts for it (its rank files name each expert).
        rules = [{k: v for k, v in r["rows"][mt].items() if k != "why"}
                 for r in records if mt in r["rows"]]
        if all(x == rules[0] for x in rules) and not any(mt in r["left_out"] for r in records):
            agreed[mt] = rules[0]
        else:
            differ.append(mt)
    return agreed, differ


def c_table(records):
    versions = [r["transformers"] for r in records]
    agreed, differ = agreement(records)
    out = ["/* SPDX-License-Identifier: MIT */",
           "/* Generated by tests/gen/make_experts_table.py from the conversion mappings",
           " * of transformers " + ", ".join(versions) + " (tests/fixtures/experts/):",
           " * how save_pretrained writes each model_type's fused expert stacks. Do",
           f" * not edit; model_types the releases disagree on ({len(differ)}) are",
           " * left out (make_experts_table.py table --why lists them).",
           " * { model_type, block held, block written, { gate, up, down } }; NULL parts:",
           " * written as held. */",
           f'#define CKFS_EXPERTS_RELEASES "{" and ".join(versions)}"']
    for mt, r in agreed.items():
        if r["kind"] == "kept":
            out.append(f'{{ "{mt}", NULL, NULL, {{ NULL, NULL, NULL }} }},')
        else:
            g, u, d = r["parts"]
            out.append(f'{{ "{mt}", "{r["block"]}", "{r["disk_block"]}", '
                       f'{{ "{g}", "{u}", "{d}" }} }},')
    return "\n".join(out) + "\n"


def doc_section(records):
    versions = " and ".join(r["transformers"] for r in records)
    agreed, differ = agreement(records)
    split = {}
    for mt, r in agreed.items():
        if r["kind"] == "split":
            key = (r["block"], r["disk_block"], tuple(r["parts"]))
            split.setdefault(key, []).append(mt)
    kept = [mt for mt, r in agreed.items() if r["kind"] == "kept"]
    out = [DOC_BEGIN, "",
           f"From the conversion mappings of transformers {versions} "
           "(`tests/gen/make_experts_table.py`, which also writes `src/layouts/experts_table.h`):", "",
           "| model_types | held in memory | written as |", "|---|---|---|"]
    for (block, disk, (g, u, d)), mts in sorted(split.items()):
        out.append(f"| {', '.join(mts)} | `...{block}.experts.gate_up_proj` [E, 2F, H], "
                   f"`...{block}.experts.down_proj` [E, H, F] | per expert e: "
                   f"`...{disk}.experts.e.{g}.weight` = gate_up[e][0:F], `{u}.weight` = "
                   f"gate_up[e][F:2F], `{d}.weight` = down[e]"
                   + (f"; every `.{block}.` name under `.{disk}.`" if disk != block else "") + " |")
    out.append(f"| {', '.join(kept)} | fused stacks (and their biases) | as held |")
    out += ["", "Left out, so refused with one line (a release's reason; a model_type the releases "
            "disagree on is left out too):", ""]
    for r in records:
        for mt, why in sorted(r["left_out"].items()):
            out.append(f"- {r['transformers']}: `{mt}`: {why.replace('|', '/')}")
    if differ:
        out.append(f"- the releases disagree: {', '.join(f'`{d}`' for d in differ)}")
    out += ["", DOC_END]
    return "\n".join(out)


def doc_with_section(records):
    text = open(DOC).read()
    a, b = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END)
    return text[:a] + doc_section(records) + text[b:]


def load_records():
    paths = sorted(glob.glob(os.path.join(RECORDS, "transformers-*.json")),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", os.path.basename(p))])
    return [json.load(open(p)) for p in paths]


def dump(obj):
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def main(argv):
    cmd = argv[0] if argv else "record"
    if cmd == "record":
        rec = record()
        os.makedirs(RECORDS, exist_ok=True)
        with open(record_path(rec["transformers"]), "w") as f:
            f.write(dump(rec))
        print(f"transformers {rec['transformers']}: {len(rec['rows'])} model_types, "
              f"{len(rec['left_out'])} left out")
    elif cmd == "table":
        with open(TABLE, "w") as f:
            f.write(c_table(load_records()))
        doc = doc_with_section(load_records())
        with open(DOC, "w") as f:
            f.write(doc)
        print(f"wrote {TABLE} and its section of {DOC}")
        if "--why" in argv:
            for r in load_records():
                for mt, why in sorted(r["left_out"].items()):
                    print(f"  {r['transformers']}: {mt}: {why}")
    elif cmd == "check":
        rec = record()
        path = record_path(rec["transformers"])
        if not os.path.exists(path) or open(path).read() != dump(rec):
            print(f"{path}: not what transformers {rec['transformers']} declares "
                  f"(run: make_experts_table.py record)")
            return 1
        if open(TABLE).read() != c_table(load_records()) or \
                open(DOC).read() != doc_with_section(load_records()):
            print(f"{TABLE} or {DOC}: not the table of {RECORDS} (run: make_experts_table.py table)")
            return 1
        print(f"transformers {rec['transformers']}: the record and the C table agree")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
