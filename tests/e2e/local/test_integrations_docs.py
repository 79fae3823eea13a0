"""Every `python` block of docs/integrations.md, run section by section against a real `serve --local`.

A framework's section is added to SECTIONS with its adapter; a block outside them fails the test, so no
snippet goes unrun. Each section's blocks run as one script, in a fresh interpreter, with the gateway
in SANDFLEET_URL and SANDFLEET_TOKEN as a user would set them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from sandfleet.client import Fleet
from sandfleet.local.artifacts import ImageRef
from tests.support.answer_task import serving

DOC = Path(__file__).resolve().parents[3] / "docs" / "integrations.md"
SECTIONS = ["Gymnasium", "SkyRL-gym", "verl", "Harbor", "E2B"]
REPO = DOC.parents[1]
# harbor requires Python 3.12: its section runs in the Harbor test environment (hack/harbor-env).
INTERPRETERS = {"Harbor": str(REPO / ".venv-harbor" / "bin" / "python")}
# verl is installed without torch and ray here: its tool modules load through this (see the section).
PRELUDES = {"verl": "from tests.support.verl_without_gpu import install\ninstall()\n"}
SNIPPET_TIMEOUT_S = 300
TOKEN = "local-token"


def python_blocks(markdown: str) -> dict[str, list[str]]:
    """The ```python blocks of a Markdown text, by the title of the `##` section they are in (its
    subsections included; "" before the first)."""
    blocks: dict[str, list[str]] = {}
    section = ""
    tokens = MarkdownIt().parse(markdown)
    for index, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag in ("h1", "h2"):
            section = tokens[index + 1].content.strip() if token.tag == "h2" else ""
        elif token.type == "fence" and token.info.split()[:1] == ["python"]:
            blocks.setdefault(section, []).append(token.content)
    return blocks


def test_python_blocks_are_found_by_section() -> None:
    markdown = (
        "# Title\n\n```python\nintro()\n```\n\n## Alpha\n\n```python\n# not a heading\na = 1\n```\n\n"
        "### Detail\n\n```python\nb = 2\n```\n\n```sh\nnot python\n```\n\n## Beta\n\ntext only\n\n"
        "## Gamma\n\n~~~python\ng = 3\n~~~\n"
    )
    assert python_blocks(markdown) == {
        "": ["intro()\n"],
        "Alpha": ["# not a heading\na = 1\n", "b = 2\n"],
        "Gamma": ["g = 3\n"],
    }


def test_every_snippet_is_in_a_section_that_is_run() -> None:
    blocks = python_blocks(DOC.read_text())
    assert set(blocks) <= set(SECTIONS), (
        f"python blocks outside the tested sections: {set(blocks) - set(SECTIONS)}"
    )
    assert [section for section in SECTIONS if not blocks.get(section)] == []


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `sandfleet serve --local` with warm sandboxes of pool `python`."""
    with serving(tmp_path_factory.mktemp("docs"), {"docs": TOKEN}) as url:
        yield url


@pytest.mark.gvisor
@pytest.mark.parametrize("section", SECTIONS)
def test_section_snippets_run(section: str, gateway: str, tmp_path: Path) -> None:
    script = "\n".join(python_blocks(DOC.read_text()).get(section, []))
    assert script, f"docs/integrations.md has no python block under '## {section}'"
    script = PRELUDES.get(section, "") + script
    environment = {**os.environ, "SANDFLEET_URL": gateway, "SANDFLEET_TOKEN": TOKEN}
    if section in PRELUDES:
        environment["PYTHONPATH"] = str(REPO)
    environment.pop("SANDFLEET_TOKEN_FILE", None)
    result = subprocess.run(
        [INTERPRETERS.get(section, sys.executable), "-c", script],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SNIPPET_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"the '{section}' snippets failed:\n{result.stdout[-2000:]}{result.stderr[-4000:]}"
    )
    with Fleet(gateway, token=TOKEN) as fleet:
        assert fleet.leases() == [], "the snippets left sandboxes leased"
