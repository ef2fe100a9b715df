"""YAML read within bounds: a workload or config file of at most MAX_BYTES, whose aliases expand to at most
MAX_VALUES values. An alias bomb (a few lines whose aliases nest into billions of values, harmless to PyYAML, which
shares them, but not to what walks the result: JSON, pydantic) is refused before anything is built from it."""

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_VALUES = 1_000_000  # more than any file of MAX_BYTES holds without aliases (a value takes 2 bytes at least)


class TooBig(ValueError):
    """A YAML text beyond the bounds: too long, or its aliases expand to too many values."""


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, but TooBig when its aliases expand to more than MAX_VALUES values (yaml.YAMLError
    for invalid YAML, as safe_load)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_file(path: Path) -> Any:
    """`load` of the file at `path`; TooBig beyond MAX_BYTES (a device or a pipe is read no further)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise TooBig(f"more than {MAX_BYTES >> 20} MiB: not a workload or config file")
    return load(data.decode())


def _check_expansion(root: yaml.Node) -> None:
    """TooBig when the node graph, each alias counted as a copy of what it names, has more than MAX_VALUES nodes
    (a recursive alias expands without end)."""
    seen, stack = 0, [root]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise TooBig(f"its aliases expand to more than {MAX_VALUES:,} values (an alias bomb?)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
