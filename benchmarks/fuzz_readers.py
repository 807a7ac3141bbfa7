"""Fuzz every reader of files we do not control: mutated run directories, GGUF headers, run configs and
alert rule files, each case through the readers that take it, each in a forked process with a time limit.

    python benchmarks/fuzz_readers.py                       # 2,400 cases, seed 0
    python benchmarks/fuzz_readers.py --cases 200 --seed 5 --json fuzz.json --keep /tmp/fuzz

Per case, per reader, one verdict:
- ok: read;  refused: one UserError (the one-line message a user gets; for the CLI, exit 2 with one line);
- traceback: any other exception escaping the reader (a bug);
- hang: no answer within --timeout seconds (the child is killed);
- silent wrong: read, but what came back breaks what the reader promises: an MCP reply over its bound or
  holding a raw control character, a run status that is not one of ours, CLI output with a raw escape
  sequence, a GGUF tensor table accepted with a tensor past the end, off the alignment or overlapping
  another, a config accepted with a value outside its declared bounds (validate() on the result).
Exits 1 when any case is a traceback, a hang or silent wrong. Readers: `report --no-write`, `compare`,
`replay` (the CLI, in-process), the dashboard's RunReader, load_summary, completions, checkpoint state, the
MCP server's list_runs / read_metrics / read_alerts / read_samples; read_header and gguf_config; load_config;
load_alert_rules. The base run is a small default run trained here first (or --base RUN_DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONTROL = [chr(c) for c in range(32) if chr(c) not in "\n\t"] + ["\x7f"]
ODD_VALUES = [None, True, -1, 0, 2 ** 70, 1e308, -1e308, "x", "", [], {}, [1, [2, [3]]], "\x1b]0;T\x07\x1b[2J",
              "\ud800", "<script>", "../../../etc/passwd", 3.5, {"a": None}]
BASE_CONFIG = {"model_id": "default", "num_steps": 3, "batch_size": 2, "num_generations": 2,
               "max_generation_steps": 4, "train_size": 6, "eval_every": 2, "eval_size": 4, "checkpoint_every": 1,
               "samples_per_step": 2, "seed": 1, "wandb": False, "tensorboard": False}
ALERTS = """rules:
  - name: reward_seen
    kind: threshold
    metric: rewards/total/mean
    op: ">"
    value: -1000
    level: warning
    hint: "a hint"
  - name: kl_jump
    kind: threshold
    metric: policy/kl
    op: ">"
    value: 0.5
    level: error
"""


# ------------------------------------------------------------------ mutations


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["flip", "truncate", "garbage", "empty", "dup_lines", "shuffle", "nul", "bom", "crlf",
                       "utf16", "deep", "long_line", "retype", "escape"])
    if kind == "flip" and data:
        out = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == "truncate":
        return data[:rng.randrange(len(data) + 1)]
    if kind == "garbage":
        return data + os.urandom(rng.randint(1, 500))
    if kind == "empty":
        return b""
    lines = data.split(b"\n")
    if kind == "dup_lines":
        return b"\n".join(lines + rng.sample(lines, min(len(lines), 3)))
    if kind == "shuffle":
        rng.shuffle(lines)
        return b"\n".join(lines)
    if kind == "nul":
        at = rng.randrange(len(data) + 1)
        return data[:at] + b"\x00" * rng.randint(1, 8) + data[at:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "crlf":
        return data.replace(b"\n", b"\r\n")
    if kind == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000 + b"\n" + data
    if kind == "long_line":
        return data + b'{"step": 1, "x": "' + b"y" * rng.randint(1 << 20, 6 << 20) + b'"}\n'
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if isinstance(obj, dict) and obj:
            key = rng.choice(sorted(obj))
            obj[key] = rng.choice(ODD_VALUES) if kind == "retype" else f"{obj[key]}\x1b[31m\x07"
        out.append(json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass"))
    return b"\n".join(out)


def mutate_run(base: Path, dest: Path, rng: random.Random) -> list[str]:
    """A copy of `base` (weights left out) with 1-3 mutations; returns what was done."""
    shutil.copytree(base, dest, ignore=shutil.ignore_patterns("*.safetensors", "tensorboard"), symlinks=True)
    files = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    done = []
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(files)
        if not target.is_file() or target.is_symlink():  # an earlier mutation made it a FIFO, a folder, a link
            continue
        kind = rng.choice(["bytes"] * 6 + ["gzip", "fifo", "dir", "zero", "urandom", "loop", "dangling", "outside"])
        name = str(target.relative_to(dest))
        if kind == "bytes" and target.suffix != ".gz":
            target.write_bytes(mutate_bytes(target.read_bytes(), rng))
        elif kind in ("bytes", "gzip") and target.suffix == ".gz":
            with contextlib.suppress(OSError, EOFError, gzip.BadGzipFile):
                raw = gzip.decompress(target.read_bytes())
                choice = rng.choice(["inner", "flip", "truncate", "two_members", "not_gzip"])
                if choice == "inner":
                    target.write_bytes(gzip.compress(mutate_bytes(raw, rng)))
                elif choice == "flip":
                    target.write_bytes(mutate_bytes(target.read_bytes(), random.Random(rng.random())))
                elif choice == "truncate":
                    data = target.read_bytes()
                    target.write_bytes(data[:rng.randrange(len(data))])
                elif choice == "two_members":
                    target.write_bytes(gzip.compress(raw) + gzip.compress(raw))
                else:
                    target.write_bytes(raw)
                kind = f"gzip {choice}"
        else:
            target.unlink()
            if kind == "fifo":
                os.mkfifo(target)
            elif kind == "dir":
                target.mkdir()
            elif kind in ("zero", "urandom"):
                target.symlink_to(f"/dev/{kind}")
            elif kind == "loop":
                target.symlink_to(target.name)
            elif kind == "dangling":
                target.symlink_to(dest / "no_such_file")
            else:
                outside = dest.parent / f"{dest.name}.outside.jsonl"
                outside.write_text('{"step": 1, "api_key": "sk-FUZZ-SECRET"}\n')
                target.symlink_to(outside)
        done.append(f"{name}: {kind}")
    return done


def gguf_table(path: Path) -> list[tuple[int, int, int]]:
    """(where the tensor's type id is, where its offset is, header end) of each tensor of a GGUF file."""
    from gguf import GGUFReader

    out = []
    for tensor in GGUFReader(str(path)).tensors:
        parts = tensor.field.parts
        offset_at = tensor.field.offset + sum(p.nbytes for p in parts[:-1])
        out.append((offset_at - parts[-2].nbytes, offset_at))
    return out


def mutate_gguf(good: bytes, table: list[tuple[int, int]], header_end: int, rng: random.Random) -> tuple[bytes, str]:
    data = bytearray(good)
    kind = rng.choice(["flip", "field", "offset", "type", "truncate", "u64"])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(header_end)] ^= 1 << rng.randrange(8)
    elif kind in ("offset", "type", "field"):
        type_at, offset_at = rng.choice(table)
        if kind == "offset" or (kind == "field" and rng.random() < 0.5):
            current = int.from_bytes(data[offset_at:offset_at + 8], "little")
            new = rng.choice([0, current + rng.choice([1, 3, 32, -32, 64]), rng.randrange(len(good)),
                              2 ** 63, int.from_bytes(data[rng.choice(table)[1]:][:8], "little")])
            data[offset_at:offset_at + 8] = max(0, new).to_bytes(8, "little")
        else:
            type_id = rng.choice([0, 1, 2, 3, 6, 8, 10, 12, 14, 30, 99, 2 ** 31])
            data[type_at:type_at + 4] = type_id.to_bytes(4, "little")
    elif kind == "truncate":
        del data[rng.randrange(len(data)):]
    else:
        at = rng.randrange(4, header_end - 8)
        data[at:at + 8] = rng.choice([0, 1, 2 ** 31, 2 ** 62, 2 ** 64 - 1, len(good)]).to_bytes(8, "little")
    return bytes(data), kind


def mutate_yaml(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    kind = rng.choice(["value", "delete", "dup", "indent", "unknown", "bytes", "tag", "anchor"])
    i = rng.randrange(len(lines))
    if kind == "value" and ":" in lines[i]:
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {json.dumps(rng.choice(ODD_VALUES), ensure_ascii=False)}"
    elif kind == "delete":
        del lines[i]
    elif kind == "dup":
        lines.insert(i, lines[i])
    elif kind == "indent":
        lines[i] = " " * rng.randint(1, 5) + lines[i]
    elif kind == "unknown":
        lines.insert(i, f"{rng.choice(['lr', 'num_step', 'reward_funcs', 'x' * 300, 'beta.x'])}: 1")
    elif kind == "tag":
        key = lines[i].split(":", 1)[0]
        tag = rng.choice(['!!float abc', '!!int 0x', '!!timestamp 2020-02-30', '!!binary x', '&a [*a]'])
        lines[i] = f"{key}: {tag}"
    elif kind == "anchor":
        lines = ["a: &a [" + ",".join(["*a"] * 1) + "]"] + lines
    else:
        return mutate_bytes(text.encode(), rng).decode("utf-8", "replace")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ readers


def _mcp_reply_problem(reply) -> str | None:
    from mlx_grpo.mcp_server import MAX_OUTPUT_CHARS

    text = json.dumps(reply, ensure_ascii=False)
    if len(text) > MAX_OUTPUT_CHARS + 2_000:
        return f"reply of {len(text)} characters"
    if any(c in text for c in CONTROL if c != "\x00") or "sk-FUZZ-SECRET" in text:
        return "a raw control character or a file from outside the run in the reply"
    return None


def _cli(argv: list[str]) -> str | None:
    from mlx_grpo.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = out.getvalue() + err.getvalue()
    if "\x1b" in text or "\x07" in text:
        return "raw escape sequence in the output"
    if code == 2 and len(err.getvalue().strip().splitlines()) != 1:
        raise RefusedBadly(f"exit 2 with {len(err.getvalue().strip().splitlines())} lines")
    return None if code in (0, 2) else f"exit {code}"


def _has_control(text: str) -> bool:
    return any(c in text for c in CONTROL)


class RefusedBadly(Exception):
    """A refusal that is not one line."""


def run_readers(case: Path, base: Path, workspace_root: Path) -> dict[str, tuple[str, str]]:
    from mlx_grpo.checkpoint import read_state
    from mlx_grpo.mcp_server import Workspace
    from mlx_grpo.telemetry.analysis.compare import load_summary
    from mlx_grpo.telemetry.rundir.completions import completion_steps, read_all
    from mlx_grpo.telemetry.rundir.reader import RunReader

    ws = Workspace(workspace_root)
    rel = str(case.relative_to(workspace_root))
    status_ok = {"running", "finished", "interrupted", "failed", "crashed", "unknown"}

    def list_runs():
        reply = ws.list_runs(str(case.parent.relative_to(workspace_root)))
        if any(r["status"] not in status_ok and r["path"] == str(case) and _has_control(r["status"])
               for r in reply["runs"]):
            return "a status with a raw control character"
        return _mcp_reply_problem(reply)

    def reader():
        rr = RunReader(case)
        rr.poll()
        rr.poll()
        return None

    def state():
        for ckpt in sorted((case / "checkpoints").glob("step_*")):
            read_state(ckpt, case)
        return None

    readers = {
        "report": lambda: _cli(["report", "--no-write", str(case)]),
        "compare": lambda: _cli(["compare", str(case), str(base)]),
        "replay": lambda: _cli(["replay", str(case)]),
        "dashboard_reader": reader,
        "load_summary": lambda: (load_summary(case), None)[1],
        "completions": lambda: (read_all(case, completion_steps(case), display=True), None)[1],
        "checkpoint_state": state,
        "mcp_list_runs": list_runs,
        "mcp_read_metrics": lambda: _mcp_reply_problem(ws.read_metrics(rel, last=10 ** 6)),
        "mcp_read_alerts": lambda: _mcp_reply_problem(ws.read_alerts(rel)),
        "mcp_read_samples": lambda: _mcp_reply_problem(ws.read_samples(rel, last=200)),
    }
    return {name: verdict(fn) for name, fn in readers.items()}


def verdict(fn) -> tuple[str, str]:
    from mlx_grpo.checkpoint import DamagedCheckpoint
    from mlx_grpo.common.errors import UserError

    try:
        problem = fn()
    except (UserError, DamagedCheckpoint) as err:
        lines = str(err).strip().splitlines()
        return ("refused", lines[0][:200]) if len(lines) == 1 else ("silent wrong", f"a {len(lines)}-line refusal")
    except RefusedBadly as err:
        return "silent wrong", str(err)
    except BaseException as err:  # noqa: BLE001 - anything else escaping a reader is what we look for
        import traceback

        return "traceback", f"{type(err).__name__}: {str(err)[:150]} @ {traceback.extract_tb(err.__traceback__)[-1]}"
    return ("silent wrong", problem) if problem else ("ok", "")


def gguf_readers(path: Path) -> dict[str, tuple[str, str]]:
    from mlx_grpo.models.gguf import gguf_config
    from mlx_grpo.models.gguf_header import read_header

    def header():
        h = read_header(path)
        ordered = sorted(h.tensors.values(), key=lambda t: t.offset)
        alignment = h.metadata.get("general.alignment", 32)
        for t in ordered:
            if t.offset + t.nbytes > h.file_size or t.offset % alignment:
                return f"tensor {t.name} accepted past the end or off the alignment"
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.offset + a.nbytes:
                return f"tensors {a.name} and {b.name} accepted overlapping"
        return None

    return {"read_header": verdict(header),
            "gguf_config": verdict(lambda: (gguf_config(path, read_header(path)), None)[1])}


def config_readers(path: Path, alerts: Path) -> dict[str, tuple[str, str]]:
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.telemetry.alerts.config import load_alert_rules

    def config():
        loaded = load_config(path)
        loaded.validate(str(path))  # what was accepted must pass its own checks again
        return None

    return {"load_config": verdict(config), "load_alert_rules": verdict(lambda: (load_alert_rules(alerts), None)[1])}


def forked(fn, timeout: float, cpu_limit: float = 60.0) -> dict[str, tuple[str, str]] | None:
    """`fn()` in a forked child; its result, or None when it used `cpu_limit` seconds of CPU (a busy loop) or
    did not answer within `timeout` seconds of wall time (blocked: on a shared machine a starved child
    looks the same, so the wall limit is generous and the CPU limit decides)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_limit), int(cpu_limit) + 5))  # a busy loop ends here
            result = fn()
        except BaseException as err:  # noqa: BLE001
            result = {"driver": ("traceback", f"{type(err).__name__}: {err}")}
        with os.fdopen(write_fd, "w") as out:
            out.write(json.dumps(result))
        os._exit(0)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_fd) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            chunk = pipe.read()
            if chunk:
                chunks.append(chunk)
            break
    _, status = os.waitpid(pid, 0)
    if chunks:
        return {k: tuple(v) for k, v in json.loads("".join(chunks)).items()}
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) not in (signal.SIGXCPU, signal.SIGKILL):
        return {"case": ("traceback", f"the process died of signal {os.WTERMSIG(status)}")}  # a crash in C
    return None


# ------------------------------------------------------------------ driver


def make_base(root: Path) -> Path:
    import yaml

    cfg = root / "base.yaml"
    cfg.write_text(yaml.safe_dump(BASE_CONFIG))
    (root / "alerts.yaml").write_text(ALERTS)
    done = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", str(cfg), "--run-name", "base",
                           "--monitoring-dir", str(root / "base_runs"), "--set", f"alerts_file={root / 'alerts.yaml'}"],
                          capture_output=True, text=True, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"the base run failed: {done.stderr[-500:]}")
    return root / "base_runs" / "base"


def make_gguf(root: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    import mlx.core as mx
    from gguf_files import byte_level_vocab, write_llama_gguf
    from mlx_lm.models import llama

    tiny = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "tie_word_embeddings": False}
    tokens, merges = byte_level_vocab(["hello", "world", "12"])
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict({**tiny, "vocab_size": len(tokens)}))
    mx.eval(model.parameters())
    return write_llama_gguf(root / "good.gguf", model, tiny, tokens, merges)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2400, help="cases in all, split 40/40/20 over run "
                                                                "directories, GGUF headers, configs and alert files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="wall seconds before a blocked case counts as a hang (60 s of CPU always does)")
    parser.add_argument("--progress", type=Path, help="append each case's verdicts here as it ends (JSON lines)")
    parser.add_argument("--base", type=Path, help="the run directory to mutate (default: train a small one here)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--json", type=Path, help="write every finding and the totals here")
    parser.add_argument("--share", type=float, nargs=2, default=(0.4, 0.4), metavar=("RUNS", "GGUF"),
                        help="the shares of run-directory and GGUF-header cases (configs take the rest)")
    args = parser.parse_args()
    result = fuzz(args.cases, args.seed, args.timeout, args.base, args.keep, args.progress, tuple(args.share))
    totals = result["totals"]
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=2))
    for finding in result["findings"][:40]:
        print(json.dumps(finding))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if totals.get("traceback", 0) or totals.get("hang", 0) or totals.get("silent wrong", 0) else 0


def fuzz(cases: int, seed: int, timeout: float = 1800.0, base: Path | None = None, keep: Path | None = None,
         progress: Path | None = None, share: tuple[float, float] = (0.4, 0.4)) -> dict:
    root = Path(tempfile.mkdtemp(prefix="fuzz-")) if keep is None else keep
    root.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    base = base or make_base(root)
    alerts_text = ALERTS
    # MLX's worker thread does not survive a fork: once this process has evaluated anything, a forked case's
    # first evaluation waits forever. So the good GGUF file is written in a child, and this process never
    # evaluates (call fuzz() from a fresh process; the slice test runs this script).
    made = forked(lambda: {"gguf": ("ok", str(make_gguf(root)))}, timeout)
    if made is None or made.get("gguf", ("",))[0] != "ok":
        raise SystemExit(f"could not write the GGUF file the header cases mutate: {made}")
    good_gguf = Path(made["gguf"][1])
    good = good_gguf.read_bytes()
    table = gguf_table(good_gguf)
    header_end = max(at for _, at in table) + 8
    config_text = (REPO / "configs" / "default.yaml").read_text() if (REPO / "configs" / "default.yaml").is_file() \
        else "\n".join(f"{k}: {json.dumps(v)}" for k, v in BASE_CONFIG.items()) + "\n"
    import mlx_grpo.cli  # noqa: E401,F401 - once, before the forks
    import mlx_grpo.commands.compare
    import mlx_grpo.commands.replay
    import mlx_grpo.commands.report
    import mlx_grpo.mcp_server
    import mlx_grpo.models.gguf
    import mlx_grpo.run.replay  # noqa: E401,F401
    rng = random.Random(seed)
    totals, by_reader, findings, kinds = Counter(), {}, [], Counter()
    work = root / "cases"
    # the families interleaved, so that a run stopped early still covers each in its share
    order = ["run directory"] * int(cases * share[0]) + ["GGUF header"] * int(cases * share[1])
    order += ["config"] * (cases - len(order))
    slots = {family: [i for i, f in enumerate(order) if f == family] for family in set(order)}
    order = [family for _, family in sorted((i / len(s), f) for f, s in slots.items() for i in range(len(s)))]
    for index, family in enumerate(order):
        case_rng = random.Random(rng.random())
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if family == "run directory":
            case = work / "runs" / "case"
            case.parent.mkdir()
            what = mutate_run(base, case, case_rng)
            result = forked(lambda: run_readers(case, base, work), timeout)
        elif family == "GGUF header":
            data, kind = mutate_gguf(good, table, header_end, case_rng)
            (work / "case.gguf").write_bytes(data)
            what = [kind]
            result = forked(lambda: gguf_readers(work / "case.gguf"), timeout)
        else:
            # a lone surrogate among the odd values is written as the invalid UTF-8 it becomes
            (work / "config.yaml").write_text(mutate_yaml(config_text, case_rng), errors="surrogatepass")
            (work / "alerts.yaml").write_text(mutate_yaml(alerts_text, case_rng), errors="surrogatepass")
            what = ["yaml"]
            result = forked(lambda: config_readers(work / "config.yaml", work / "alerts.yaml"), timeout)
        kinds[family] += 1
        if result is None:
            result = {"case": ("hang", f"no answer within {timeout:g} s or 60 s of CPU")}
        if progress is not None:
            with progress.open("a") as out:
                out.write(json.dumps({"case": index, "family": family, "mutations": what, "verdicts": result}) + "\n")
        for reader, (outcome, detail) in result.items():
            totals[outcome] += 1
            by_reader.setdefault(reader, Counter())[outcome] += 1
            if outcome in ("traceback", "hang", "silent wrong"):
                findings.append({"case": index, "family": family, "mutations": what, "reader": reader,
                                 "outcome": outcome, "detail": detail})
                if keep is not None:
                    shutil.copytree(work, root / "findings" / f"case_{index}", symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return {"cases": cases, "seed": seed, "families": dict(kinds), "reader_runs": sum(totals.values()),
            "totals": dict(totals), "by_reader": {k: dict(v) for k, v in sorted(by_reader.items())},
            "seconds": round(time.perf_counter() - began, 1), "findings": findings}


if __name__ == "__main__":
    sys.exit(main())
