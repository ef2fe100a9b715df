"""Read a workload file: its YAML, read within bounds (`safeyaml`), validated into a `WorkloadSpec`, relative paths
resolved, a trace's rows checked."""

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from servetune import safeyaml
from servetune.workload.spec import WorkloadError, WorkloadSpec
from servetune.workload.trace import read_trace


def load_workload(path: Path) -> WorkloadSpec:
    """Read and validate a workload YAML file; a relative dataset or trace path is taken relative to the file.
    A trace is read here too, so a bad row is refused (file:line) before a tokenizer or server is touched."""
    path = Path(path)
    try:
        raw = safeyaml.load_file(path)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text") from None
    except safeyaml.TooBig as e:
        raise WorkloadError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise WorkloadError(f"{path}: invalid YAML{where}: {problem}") from None
    try:
        spec = WorkloadSpec.model_validate(raw)
    except ValidationError as e:
        raise WorkloadError(f"{path}: {_first_error(e, raw)}") from None
    for name in ("dataset", "trace"):
        source = getattr(spec, name)
        if source is not None and not source.path.is_absolute():
            spec = spec.model_copy(update={name: source.model_copy(update={"path": path.parent / source.path})})
    if spec.trace is not None:
        read_trace(spec.trace.path)
    return spec


def reply_lengths(spec: WorkloadSpec) -> tuple[float, float] | None:
    """The longest and the mean reply (tokens) the workload asks for, where that is known before its prompts are
    built: synthetic lengths, a trace; None for a dataset."""
    if spec.trace is not None:
        outputs = [row.output_tokens for row in read_trace(spec.trace.path)]
        return max(outputs), sum(outputs) / len(outputs)
    if spec.output_len is not None:
        return spec.output_len.high, spec.output_len.mean_len
    return None


def _first_error(error: ValidationError, raw: Any) -> str:
    """The first validation error as "field.path: message", leaving out union tags like "normal"."""
    first = error.errors()[0]
    names, node = [], raw
    for part in first["loc"]:
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue  # the discriminator's tag, not a field
        names.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{'.'.join(names)}: {message}{more}" if names else f"{message}{more}"
