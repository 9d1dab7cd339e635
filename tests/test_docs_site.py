"""The documentation site: every public name has an entry, every code block is run or marked.

A fenced block in `docs/` or `README.md` is run as its language says, unless the comment on
the line before it says otherwise:

- ``python``: executed in a subprocess in a fresh folder (its exit code must be 0);
- ``sh``: run by bash in a fresh folder, with this environment's `npu-manager` on PATH;
- ``toml``: parsed; a scenario (``[[apps]]``) is validated and played with ``npu-manager
  simulate``, a configuration file (``[plugins]``, ``[importance]``) validated as one;
- ``<!-- continues the block above -->``: a python block run after the page's previous
  python block, in the same program;
- ``<!-- beside a daemon: SERVE ARGS -->``: run while ``npu-manager serve`` runs on a socket
  of its own (``$NPUMANAGER_SOCKET``), started with those arguments;
- ``<!-- checked: REASON -->``: an sh block not run (REASON says why), whose `npu-manager`
  command lines are parsed by the CLI's own parser, so a renamed option fails here;
- ``<!-- not run: REASON -->``: not run, for the reason given.

Any other language needs one of the last two. The README's quick-start blocks are run by
`.ci/run` as written (`tests/test_quickstart.py` keeps that so).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 180
"""A generous bound on one block's run, so a hung example fails instead of hanging CI."""

MARKER = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
RUN_BY_DEFAULT = {"python", "sh", "toml"}


@dataclass
class Block:
    """One fenced code block and the marker before it."""

    path: Path
    line: int
    language: str
    body: str
    marker: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        """What the marker asks: run, continues, daemon, checked or not run."""
        for kind in ("not run", "checked", "beside a daemon"):
            if self.marker.startswith(kind):
                return kind
        return "continues" if self.marker == "continues the block above" else "run"

    @property
    def reason(self) -> str:
        return self.marker.partition(":")[2].strip()


def _blocks_in(path: Path, lines: list[str], start: int) -> list[Block]:
    found: list[Block] = []
    i = start
    while i < len(lines):
        opened = OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, info = opened["fence"], opened["info"]
        end = i + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing and set(closing) == {fence[0]} and len(closing) >= len(fence):
                break
            end += 1
        body = lines[i + 1 : end]
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marked = MARKER.match(before)
        if info.startswith("{") and not info.startswith(("{code-block}", "{code}")):
            nested = _blocks_in(path, body, 0)
            found += [Block(path, b.line + i + 1, b.language, b.body, b.marker) for b in nested]
        else:
            language = info.split("}", 1)[-1].strip().split(" ")[0] if info else ""
            indent = len(opened["indent"])
            text = "\n".join(line[indent:] for line in body) + "\n"
            found.append(Block(path, i + 1, language, text, marked["text"] if marked else ""))
        i = end + 1
    return found


def pages() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]


def all_blocks() -> list[Block]:
    blocks: list[Block] = []
    for path in pages():
        blocks += _blocks_in(path, path.read_text(encoding="utf-8").splitlines(), 0)
    return blocks


def _quickstart() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / ".ci" / "quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_by_ci(block: Block) -> bool:
    """True for the README's quick-start blocks, which .ci/run runs as written."""
    if block.path != README:
        return False
    quick: list[str] = _quickstart().quickstart_blocks(README.read_text(encoding="utf-8"))
    return block.language == "sh" and block.body in quick


BLOCKS = all_blocks()


def programs() -> list[tuple[str, list[Block]]]:
    """The runnable python and sh blocks, a block continued by later ones with them."""
    chains: list[tuple[str, list[Block]]] = []
    last_python: dict[Path, list[Block]] = {}
    for block in BLOCKS:
        if run_by_ci(block) or block.kind in ("not run", "checked"):
            continue
        if block.language not in ("python", "sh"):
            continue
        if block.kind == "continues":
            chain = last_python.get(block.path)
            assert chain is not None, f"{block.where}: continues, but no python block is above"
            chain.append(block)
            continue
        chain = [block]
        chains.append((block.where, chain))
        if block.language == "python":
            last_python[block.path] = chain
    return chains


def test_the_pages_have_code_blocks_to_check() -> None:
    assert len(BLOCKS) > 20
    assert {"python", "sh", "toml"} <= {b.language for b in BLOCKS}


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    problems = []
    for block in BLOCKS:
        if run_by_ci(block):
            continue
        if block.marker and block.kind == "run":
            problems.append(f"{block.where}: unknown marker {block.marker!r}")
        elif block.kind in ("not run", "checked") and not block.reason:
            problems.append(f"{block.where}: {block.kind!r} needs a reason after the colon")
        elif block.kind == "checked" and block.language != "sh":
            problems.append(f"{block.where}: only sh blocks are checked")
        elif block.kind in ("run", "continues", "beside a daemon") and (
            block.language not in RUN_BY_DEFAULT
        ):
            problems.append(
                f"{block.where}: a {block.language or 'plain'!r} block is never run; mark it "
                "<!-- not run: why -->"
            )
    assert problems == []


def test_rst_pages_hold_no_code_blocks() -> None:
    """The reStructuredText pages are generated reference; examples live in Markdown."""
    for page in DOCS.rglob("*.rst"):
        assert "code-block" not in page.read_text(), page


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path / "home")
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")
    env.pop("NPUMANAGER_CONFIG", None)
    (tmp_path / "home").mkdir()
    (tmp_path / "run").mkdir(mode=0o700)
    return env


@pytest.mark.parametrize(("where", "chain"), programs(), ids=[w for w, _ in programs()])
def test_the_block_runs(where: str, chain: list[Block], tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = chain[0]
    daemon = None
    if first.kind == "beside a daemon":
        from helpers.daemon_support import DaemonProcess

        daemon = DaemonProcess(tmp_path, *shlex.split(first.reason))
        env["NPUMANAGER_SOCKET"] = str(daemon.socket)
    try:
        if first.language == "python":
            program = "\n".join(block.body for block in chain)
            command = [sys.executable, "-c", program]
        else:
            command = ["bash", "-euo", "pipefail", "-c", first.body]
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    finally:
        if daemon is not None:
            daemon.stop()
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


def _command_lines(body: str) -> list[list[str]]:
    """Every `npu-manager ...` command of an sh block, without redirections and comments."""
    joined = body.replace("\\\n", " ")
    commands = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw)
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part)
            if ">" in words:
                words = words[: words.index(">")]
            if words and words[0] == "npu-manager":
                commands.append(words[1:])
    return commands


CHECKED = [b for b in BLOCKS if b.kind == "checked" and b.language == "sh"]


@pytest.mark.parametrize("block", CHECKED, ids=[b.where for b in CHECKED])
def test_the_checked_block_parses(block: Block) -> None:
    from npumanager.cli.program import build_parser

    commands = _command_lines(block.body)
    assert commands, f"{block.where}: a checked block with no npu-manager command"
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block.where}: `npu-manager {shlex.join(argv)}` does not parse ({exc})")


TOML = [b for b in BLOCKS if b.language == "toml" and b.kind == "run"]


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_the_toml_block_is_valid(block: Block, tmp_path: Path) -> None:
    document = tomllib.loads(block.body)
    if "apps" in document:
        from npumanager.simulation.scenario import load_scenario

        path = tmp_path / "scenario.toml"
        path.write_text(block.body)
        load_scenario(path)
        command = [sys.executable, "-m", "npumanager", "simulate", str(path), "--json"]
        played = subprocess.run(command, capture_output=True, text=True, check=False)
        assert played.returncode == 0, f"{block.where} does not play:\n{played.stderr}"
    if "plugins" in document or "importance" in document:
        from npumanager.core.plugins.config import load_config

        path = tmp_path / "config.toml"
        path.write_text(block.body)
        load_config(path, environ={})


# The API reference -----------------------------------------------------------------------


def _docsdata() -> ModuleType:
    """The data the site is generated from (`docs/_ext/docsdata.py`; no Sphinx needed)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import docsdata
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return docsdata


def test_every_public_name_has_a_reference_entry_and_a_docstring() -> None:
    docsdata = _docsdata()
    assert docsdata.unplaced() == []
    listed = [name for names in docsdata.SECTIONS.values() for name in names]
    assert len(listed) == len(set(listed)), "a name in two sections"
    api = (DOCS / "reference" / "api.rst").read_text()
    for section in [*docsdata.SECTIONS, "constants"]:
        assert f".. npu-api:: {section}\n" in api, f"section {section} is not on the page"
    undocumented = [name for name in docsdata.public_api() if not docsdata.docstring(name)]
    assert undocumented == []


def test_the_testing_package_is_in_the_reference_with_docstrings() -> None:
    from npumanager import testing

    page = (DOCS / "reference" / "testing.rst").read_text()
    for name in testing.__all__:
        assert f"npumanager.testing.{name}" in page
        assert inspect.getdoc(getattr(testing, name))


def test_every_hook_spec_is_documented() -> None:
    from npumanager.core.plugins import hookspecs

    assert (
        ".. automodule:: npumanager.core.plugins.hookspecs"
        in (DOCS / "reference" / "hooks.rst").read_text()
    )
    hooks = [name for name in dir(hookspecs) if name.startswith("npumanager_")]
    assert hooks
    assert [name for name in hooks if not inspect.getdoc(getattr(hookspecs, name))] == []


def test_the_generated_tables_follow_the_code() -> None:
    from npumanager.core.arbiter.states import TRANSITIONS
    from npumanager.daemon.wire import protocol

    docsdata = _docsdata()
    assert [row[0] for row in docsdata.transition_rows()] == [f"`{s.value}`" for s in TRANSITIONS]
    messages = [m for models in docsdata.protocol_messages().values() for m in models]
    wire = {
        cls
        for cls in vars(protocol).values()
        if isinstance(cls, type)
        and issubclass(cls, protocol.WireModel)
        and "op" in cls.model_fields
    }
    assert set(messages) == wire
    assert "op" in [row[0].strip("`") for row in docsdata.message_rows(protocol.Hello)]


def test_the_limits_table_gives_the_limits_the_code_has() -> None:
    from npumanager.schemas import limits as lim

    guide = (DOCS / "guides" / "integrators.md").read_text(encoding="utf-8")
    section = " ".join(guide.split("## Limits and quotas", 1)[1].split("\n## ", 1)[0].split())
    expected = [
        f"| {lim.DEFAULT_MAX_CONNECTIONS_PER_UID} | `--max-connections-per-uid N` |",
        f"| {lim.DEFAULT_MAX_REQUESTS_PER_UID} | `--max-requests-per-uid N` |",
        f"| {lim.DEFAULT_MAX_MODELS_PER_UID} | `--max-models-per-uid N` |",
        f"| {lim.DEFAULT_MAX_BUFFERED_BYTES >> 20} MiB | `--max-buffered-mib MIB` |",
        f"| {lim.DEFAULT_MAX_SHARED_BYTES >> 20} MiB | `--max-shared-mib MIB` |",
        f"| {lim.DEFAULT_MAX_MODEL_FILE_BYTES >> 20} MiB | `--max-model-mib MIB` |",
        f"| {lim.DEFAULT_MAX_INFERENCES_PER_CONNECTION} | `--max-inferences-per-connection N` |",
        f"{lim.MANAGEMENT_RESERVE_FDS} kept for management",
        f"within {lim.HELLO_TIMEOUT_S:g} s",
        f"at {lim.OUTBOX_PAUSE_BYTES >> 10} KiB",
        f"at {lim.MAX_OUTBOX_BYTES >> 20} MiB of undelivered callbacks",
        f"{lim.FRAMES_PER_TURN} frames or {lim.TURN_SLICE_S * 1e6:g} us a turn",
        f"a burst of {lim.REFUSED_CALLS_BURST}, then {lim.REFUSED_CALLS_PER_S} a second",
        f"room for one more ({1000 // lim.REFUSED_CALLS_PER_S} ms)",
        f"| frame | {lim.MAX_FRAME_BYTES >> 20} MiB |",
        f"at most {lim.SHUTDOWN_FLUSH_S:g} s",
        f"default {lim.DEFAULT_INFO_LIMIT}, at most {lim.MAX_INFO_LIMIT}",
        f"at most {lim.INFO_SNAPSHOT_TTL_S:g} s old",
    ]
    assert [text for text in expected if text not in section] == []


def test_the_readme_links_into_the_site() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(((?:docs/|CONTRIBUTING)[^)#]*)", text)
    assert len(links) >= 3, "the README links to each guide"
    assert [link for link in links if not (ROOT / link).is_file()] == []
