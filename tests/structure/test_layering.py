"""The layering rules of docs/ARCHITECTURE.md, read from the code's own imports.

Every import counts, the lazy ones inside functions too (a lazy import is still an arrow). A module
belongs to the area of its first sub-package under `mlx_grpo/` (`telemetry/metrics/catalogue.py` is in
`telemetry`), so a new sub-package is covered the day it is made. Inside the training area (whose wings
`config/`, `models/`, `planning/`, `run/` and `measuring/` are rooms of it), inside each wing, `telemetry/`
and `rewards/` the rooms stand on floors of their own (INNER_FLOORS): no arrow runs back up one, and a
new room must be given a floor. `python tests/structure/test_layering.py` prints the house's figures.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mlx_grpo"

# Floors, bottom first: a module may import its own area and the areas on lower floors, never a higher
# floor nor another area of its own floor. Sub-packages not named here belong to "training".
FLOORS = [
    {"common"},
    {"telemetry"},
    {"training", "tui"},  # side by side: the dashboard never imports the trainer, nor the trainer the dashboard
    {"commands", "cli"},
]
# Narrower rules on top of the floors.
ONLY_IMPORTS = {
    "telemetry": {"telemetry", "common"},
    "tui": {"tui", "telemetry", "common"},
}
NO_MLX = {"telemetry", "tui"}  # the dashboard, report and compare run where mlx is not installed

# Floors inside a package, bottom first: a room (a module or sub-package named by its first component
# there; "" is the package's own __init__) imports rooms of its own floor or lower ones, never a higher one.
# "mlx_grpo" covers the training area's rooms (the other areas have the rules above).
INNER_FLOORS = {
    "mlx_grpo": [
        {"", "config", "tasks"},  # the wings are rooms here, with floors of their own below
        {"grpo", "models", "data", "head_scores", "frozen_prefix", "sampling", "lookup_decoding", "rollout",
         "multiturn", "rewards", "update", "extras", "evaluate", "checkpoint"},  # core: the model, the data, the math, a completion's worth, saving weights
        {"planning"},  # what a run needs and can reach, predicted before it loads
        {"trainer", "distributed"},  # one step, on one rank or many
        {"run"},  # a run's life
        {"measuring", "tools", "mcp_server"},  # measuring and serving the rest
    ],
    "mlx_grpo.config": [
        {"alias_table", "paths", "run_code", "name_clash"},
        {"aliases"},  # other tools' keys read by the table
        {"typed_yaml"},  # the machinery: a mapping read into declared dataclasses
        {"train_config", ""},  # "" re-exports train_config's two public names
    ],
    "mlx_grpo.models": [
        # families: no mlx
        {"", "families", "wheel_files", "gguf_header", "gguf_blocks", "cpu_kernels", "kv_cache"},
        {"gguf_config"},  # a GGUF file as a config: no mlx
        {"smollm2", "gemma3", "qwen_coder", "gguf"},  # the model sources
        {"policy"},  # a policy from any source
    ],
    "mlx_grpo.planning": [
        {"", "blas", "chips", "presets", "plan"},  # the facts and the memory model
        {"machine", "roofline", "budget"},  # budget: the settings that fit
        {"tf32", "fitting"},
    ],
    "mlx_grpo.run": [
        {"", "console", "run_lock", "resume", "replay"},
        {"signals", "export", "opening"},
        {"loop"},  # the run read as a page
    ],
    "mlx_grpo.measuring": [
        {"", "workload", "sweep", "bench_report"},
        {"benchmark"},
        {"selftest"},
        {"tf32_child"},
    ],
    "mlx_grpo.measuring.selftest": [
        {"common"},  # what the checks share
        {"environment", "numerics", "speed"},
        {"devices", "memory"},
        {"real_model"},
        {"runner"},  # the whole test
        {""},
    ],
    "mlx_grpo.data": [
        {"rows"},  # one record as a row
        {"files", "tables", "prompts"},
        {""},  # a config's datasets
    ],
    "mlx_grpo.mcp_server": [
        {"records", "runs"},  # bounded reads, a run directory's facts
        {"workspace"},  # the tools
        {""},  # the server
    ],
    "mlx_grpo.rewards": [
        {"", "builtin", "judge", "scoring"},
        {"rubric_scorers", "rubric"},
        {"rubric_reward"},
        {"loading", "correctness"},
    ],
    "mlx_grpo.telemetry": [
        {"", "events", "metrics", "output", "smoothing", "reward_names"},
        {"alerts"},
        {"rundir"},
        {"analysis"},
        {"sinks", "recorder"},
        {"monitor"},
    ],
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def area(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "training"  # mlx_grpo/__init__.py
    named = {name for floor in FLOORS for name in floor}
    return parts[1] if parts[1] in named else "training"


def imports(path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(package modules this file imports, other top-level packages it imports), lazy imports included."""
    name = module_name(path)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from . import x` imports the module x when there is one, else a name of the package
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "mlx_grpo":
                while target not in modules:  # `from .a import b` where b is a name defined in a
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    inside.add(target)
            else:
                outside.add(target.split(".")[0])
    return inside, outside


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph, external = {}, {}
    for name, path in paths.items():
        graph[name], external[name] = imports(path, set(paths))
    return graph, external


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floor(name: str) -> int:
    return next(i for i, areas in enumerate(FLOORS) if name in areas)


def broken_rules(graph: dict[str, set[str]], external: dict[str, set[str]]) -> list[str]:
    broken = []
    for module, targets in sorted(graph.items()):
        mine = area(module)
        for target in sorted(targets):
            theirs = area(target)
            if theirs == mine:
                continue
            if floor(theirs) >= floor(mine):
                broken.append(f"{module} -> {target}: {mine} may not import {theirs} (same or higher floor)")
            elif mine in ONLY_IMPORTS and theirs not in ONLY_IMPORTS[mine]:
                broken.append(f"{module} -> {target}: {mine} imports only {sorted(ONLY_IMPORTS[mine])}")
        if mine in NO_MLX and external[module] & {"mlx", "mlx_lm"}:
            broken.append(f"{module} imports mlx")
    return broken


def room(module: str, package: str) -> str | None:
    """The room of `module` inside `package` (None: not inside it, or for "mlx_grpo" not in training)."""
    if package == "mlx_grpo" and area(module) != "training":
        return None
    if module == package:
        return ""
    return module[len(package) + 1:].split(".")[0] if module.startswith(package + ".") else None


def arrows_back_up(graph: dict[str, set[str]]) -> list[str]:
    """Arrows from a room to a higher floor of the package both stand in, and rooms on no floor."""
    broken = []
    for package, floors in INNER_FLOORS.items():
        level = {name: i for i, names in enumerate(floors) for name in names}
        for module, targets in sorted(graph.items()):
            mine = room(module, package)
            if mine is None:
                continue
            if mine not in level:
                broken.append(f"{module}: room '{mine}' stands on no floor of {package} (INNER_FLOORS)")
                continue
            for target in sorted(targets):
                theirs = room(target, package)
                if theirs in level and level[theirs] > level[mine]:
                    broken.append(f"{module} -> {target}: back up from floor {level[mine] + 1} to "
                                  f"{level[theirs] + 1} of {package}")
    return broken


def figures(graph: dict[str, set[str]]) -> dict[str, int]:
    """The house in numbers: modules, named floors (the areas' and those inside packages), arrows, circles
    and arrows back up."""
    return {"modules": len(graph), "floors": len(FLOORS) + sum(len(f) for f in INNER_FLOORS.values()),
            "arrows": sum(len(targets) for targets in graph.values()), "circles": len(cycles(graph)),
            "arrows back up": len(arrows_back_up(graph)) + len(broken_rules(graph, {m: set() for m in graph}))}


def test_the_package_has_no_import_circle():
    graph, _ = import_graph()
    assert len(graph) > 90  # the walk found the package
    assert cycles(graph) == []


def test_no_import_runs_up_a_floor_or_across_to_a_neighbour():
    graph, external = import_graph()
    assert broken_rules(graph, external) == []


def test_no_arrow_runs_back_up_a_floor_inside_training_telemetry_or_rewards():
    graph, _ = import_graph()
    assert arrows_back_up(graph) == [], figures(graph)
    assert figures(graph)["circles"] == 0 and figures(graph)["arrows back up"] == 0


def test_the_inner_floors_catch_an_arrow_back_up_and_a_room_without_a_floor():
    graph, _ = import_graph()
    graph = {k: set(v) for k, v in graph.items()}
    graph["mlx_grpo.grpo"].add("mlx_grpo.trainer")
    graph["mlx_grpo.telemetry.alerts.engine"].add("mlx_grpo.telemetry.sinks")
    graph["mlx_grpo.rewards.builtin"].add("mlx_grpo.rewards.loading")
    graph["mlx_grpo.newroom"] = set()
    broken = arrows_back_up(graph)
    assert "mlx_grpo.grpo -> mlx_grpo.trainer: back up from floor 2 to 4 of mlx_grpo" in broken
    assert any(line.startswith("mlx_grpo.telemetry.alerts.engine -> mlx_grpo.telemetry.sinks") for line in broken)
    assert any(line.startswith("mlx_grpo.rewards.builtin -> mlx_grpo.rewards.loading") for line in broken)
    assert "mlx_grpo.newroom: room 'newroom' stands on no floor of mlx_grpo (INNER_FLOORS)" in broken


def test_the_checks_catch_a_circle_an_upward_import_and_mlx_in_telemetry():
    graph, external = import_graph()
    graph = {k: set(v) for k, v in graph.items()}
    graph["mlx_grpo.models.policy"].add("mlx_grpo.rollout")
    assert any({"mlx_grpo.models.policy", "mlx_grpo.rollout"} <= set(circle) for circle in cycles(graph))
    graph["mlx_grpo.telemetry.recorder"].add("mlx_grpo.trainer")
    graph["mlx_grpo.tui.board"].add("mlx_grpo.config.train_config")
    graph["mlx_grpo.trainer"].add("mlx_grpo.tui.app")
    graph.setdefault("mlx_grpo.telemetry.sinks.wandb", set())
    external = {**external, "mlx_grpo.telemetry.sinks.wandb": {"mlx"}}
    broken = broken_rules(graph, external)
    assert any(line.startswith("mlx_grpo.telemetry.recorder -> mlx_grpo.trainer") for line in broken)
    assert any(line.startswith("mlx_grpo.tui.board -> mlx_grpo.config.train_config") for line in broken)
    assert any(line.startswith("mlx_grpo.trainer -> mlx_grpo.tui.app") for line in broken)
    assert "mlx_grpo.telemetry.sinks.wandb imports mlx" in broken


def test_lazy_and_relative_imports_are_arrows():
    graph, _ = import_graph()
    # commands/ import their heavy parts inside run(); `from ..x import` climbs one package up
    assert "mlx_grpo.tui.app" in graph["mlx_grpo.commands.watch"]
    assert any("mlx_grpo.common.errors" in graph[m] for m in graph if area(m) == "telemetry")


if __name__ == "__main__":
    print(figures(import_graph()[0]))
