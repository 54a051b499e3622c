"""The Markdown the check writes beside its JSON: the device and versions, one line a part (status, seconds, reason),
then one table a part with a line for each of the JSON's rows, the row's ``id`` first."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

CPU_NOTE = "CPU, tiny sizes: not a GPU measurement"

Column = Tuple[str, str, Callable[[Any], str]]


def _num(digits: int) -> Callable[[Any], str]:
    return lambda v: "" if v is None else f"{v:.{digits}f}"


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v))
    return str(v).replace("|", "/").replace("\n", " ")


def _ratio(v: Any) -> str:
    return "" if v is None else f"{v:.2f}x"


# part -> its table's columns after the row's id: (header, row key, format)
COLUMNS: Dict[str, List[Column]] = {
    "steps": [
        ("branch", "branch", _text),
        ("architecture", "arch", _text),
        ("attention", "attention", _text),
        ("recipe / objective", "recipe", _text),
        ("precision", "precision", _text),
        ("activations", "autocast_dtype", _text),
        ("GradScaler", "grad_scaler", _text),
        ("compile", "compile", _text),
        ("batch", "batch", _text),
        ("step ms", "step_ms", _num(1)),
    ],
    "ddp": [
        ("run", "run", _text),
        ("backend", "backend", _text),
        ("world", "world_size", _text),
        ("precision", "precision", _text),
        ("device", "device", _text),
        ("NCCL", "nccl_version", _text),
        ("loss", "loss", _num(3)),
    ],
    "fid": [
        ("image px", "image_size", _text),
        ("images", "images", _text),
        ("latents", "latent_shape", _text),
        ("VAE on", "vae_device", _text),
        ("VAE s", "vae_seconds", _num(2)),
        ("Inception on", "inception_device", _text),
        ("FID dims", "fid_feature_dims", _text),
        ("FID", "fid", _num(3)),
        ("FID s", "fid_seconds", _num(2)),
    ],
    "loader": [
        ("batch", "batch", _text),
        ("device side ms", "ms", _num(2)),
        ("ms / image", "ms_per_image", _num(4)),
        ("step ms, ready batch", "plain_step_ms", _num(1)),
        ("step ms, fed", "fed_step_ms", _num(1)),
        ("images/s fed", "images_per_s", _num(0)),
        ("images/s a CPU core", "cpu_core_images_per_s", _num(0)),
        ("cores needed", "cores_needed", _num(1)),
    ],
    "cost": [
        ("recipe", "recipe", _text),
        ("precision", "precision", _text),
        ("devices", "devices", _text),
        ("recipe batch / device", "recipe_batch", _text),
        ("batch run", "batch", _text),
        ("step ms (median)", "step_ms", _num(1)),
        ("images/s", "images_per_s", _num(0)),
        ("peak GiB", "peak_gib", _num(2)),
    ],
    "attention": [
        ("layer", "layer", _text),
        ("N", "tokens", _text),
        ("kernel", "kernel", _text),
        ("fwd ms", "forward_ms", _num(3)),
        ("fwd+bwd ms", "forward_backward_ms", _num(3)),
        ("fwd / MHSA", "forward_x_mhsa", _ratio),
        ("fwd+bwd / MHSA", "forward_backward_x_mhsa", _ratio),
    ],
    "profile": [
        ("layer", "layer", _text),
        ("op", "op", _text),
        ("self ms / step", "self_ms_per_step", _num(3)),
        ("share", "share", lambda v: "" if v is None else f"{100 * v:.0f}%"),
        ("calls / step", "calls_per_step", _num(0)),
    ],
}


def table(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def part_table(part: Dict[str, Any]) -> List[str]:
    columns = COLUMNS.get(part["part"], [])
    headers = ["id", *(c[0] for c in columns), "status", "reason"]
    lines = [
        [_text(r["id"]), *(fmt(r.get(key)) for _, key, fmt in columns), r.get("status", ""), _text(r.get("reason"))]
        for r in part["rows"]
    ]
    return table(headers, lines)


def markdown(result: Dict[str, Any]) -> str:
    device, versions = result["device"], result["versions"]
    lines = [
        f"# GPU check: {device['name']}",
        "",
        f"- command: `{result['command']}`",
        f"- device: {device['name']} ({device['type']}"
        + (f", {device['memory_gib']:.0f} GiB" if device.get("memory_gib") else "")
        + (f", compute capability {device['capability']}" if device.get("capability") else "")
        + ")",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- started {result['started']}, {result['seconds']:.0f} s of a {result['budget_s']:.0f} s budget; "
        + ("every part passed" if result["passed"] else "not every part passed"),
    ]
    if result.get("note"):
        lines += ["", f"**{result['note']}**"]
    lines += ["", "## Parts", ""]
    lines += table(
        ["part", "status", "seconds", "reason"],
        [[p["part"], p["status"], f"{p['seconds']:.1f}", _text(p["reason"])] for p in result["parts"]],
    )
    for part in result["parts"]:
        lines += ["", f"## {part['part']}: {part['title']}", ""]
        if part["rows"]:
            lines += part_table(part)
        else:
            lines.append(f"(no rows: {_text(part['reason'])})")
    return "\n".join(lines) + "\n"
